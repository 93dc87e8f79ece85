"""Command line: parse, validate, call one library function per command.

``app.py`` holds the application; ``lmd.py``, ``merge.py`` (with ``merge_bits.py`` and
``merge_tables.py``), ``experimental.py``, ``pretrain.py``, ``evaluate.py`` and ``assets.py``
register their commands on it, with flags that ``config_options.py`` generates from the configs;
each command calls one library function, the Python API's (``lmalgebra.api``) where there is
one. ``main`` turns errors into one line and an exit status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TextIO

try:  # a Ctrl-C while the command line loads (a second of imports) ends as one later does
    import typer
    from rich.console import Console
    from rich.markup import escape

    import lmalgebra.cli.assets
    import lmalgebra.cli.evaluate
    import lmalgebra.cli.experimental
    import lmalgebra.cli.lmd
    import lmalgebra.cli.merge
    import lmalgebra.cli.merge_bits
    import lmalgebra.cli.pretrain  # noqa: F401  (registers the commands)
    from lmalgebra.api.runtime import QUIET_ENVIRONMENT
    from lmalgebra.cli.app import app
    from lmalgebra.cli.launched import placed_on_processes
    from lmalgebra.cli.path_values import read_paths
    from lmalgebra.cli.switches import refuse_switch_values
    from lmalgebra.core import interrupt
    from lmalgebra.core.errors import (
        TrainingDivergedError,
        UserInputError,
        one_line,
        refuse_missing_cwd,
    )
    from lmalgebra.core.precision import LAUNCH_VARIABLES, launch_count, wait_limit
    from lmalgebra.core.threads import pin_thread_count_when_imported
except KeyboardInterrupt:
    sys.stderr.write("interrupted; run the same command again to resume\n")
    raise SystemExit(130) from None

INTERRUPTED = 130  # 128 + SIGINT, what a shell reports for a command stopped by Ctrl-C
TERMINATED = 143  # 128 + SIGTERM


def _run() -> object:
    """Set up logging and threads, then run the command; what typer returns (see ``main``)."""
    _check_environment()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("torch").setLevel(logging.WARNING)  # its exit report, after a Ctrl-C
    _quiet_transformers()
    # same bits in every process, busy machine or not (resumed runs); torch is imported only by
    # the commands that compute, after their input is parsed and checked
    pin_thread_count_when_imported()
    interrupt.install()  # a Ctrl-C that lands in a finaliser is raised again by the loops
    # Not in standalone mode, typer turns Ctrl-C (KeyboardInterrupt) into exit code 130 and
    # ``typer.Exit(code)`` into ``code``, and *returns* them: ``main`` makes them the status.
    command = typer.main.get_command(app)
    command = placed_on_processes(read_paths(refuse_switch_values(command)))
    with warnings.catch_warnings(), _help_piped_whole():  # the caller's settings given back
        warnings.showwarning = _warning_line
        return command(standalone_mode=False)


HELP_PIPED_WIDTH = 160  # columns of --help piped: every flag's name and value whole


@contextlib.contextmanager
def _help_piped_whole() -> Iterator[None]:
    """``--help`` piped or written to a file as wide as its flags' names and values: rich takes
    80 columns where its output is no terminal, and typer's tables cut what did not fit with an
    ellipsis (``--trust-remote-c…``, ``[NAME=][random:…``). A width the user set (``COLUMNS``,
    typer's ``TERMINAL_WIDTH``) is kept, and so is a terminal's. Typer's help module is not
    imported for it (a command that prints no help does not pay for it): its ``TERMINAL_WIDTH``
    is set for the command, which the module reads when first imported, or its width directly
    where it is imported already (a process running several commands)."""
    wanted = not (os.environ.get("COLUMNS") or os.environ.get("TERMINAL_WIDTH"))
    if not wanted or sys.stdout.isatty():
        yield
        return
    help_tables = sys.modules.get("typer.rich_utils")
    kept = getattr(help_tables, "MAX_WIDTH", None)
    if help_tables is not None and kept is None:
        help_tables.MAX_WIDTH = HELP_PIPED_WIDTH  # type: ignore[attr-defined]
    os.environ["TERMINAL_WIDTH"] = str(HELP_PIPED_WIDTH)
    try:
        yield
    finally:
        os.environ.pop("TERMINAL_WIDTH", None)
        imported = sys.modules.get("typer.rich_utils")  # perhaps by this command's help
        if imported is not None:
            imported.MAX_WIDTH = kept  # type: ignore[attr-defined]


def _warning_line(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """A Python warning as one line of the command's log, as its other warnings read: its kind
    and text, not the source file and line of ours that raised it (two lines a user cannot act
    on, ``ExperimentalWarning`` under ``return command(...)``)."""
    logging.getLogger("py.warnings").warning("%s: %s", category.__name__, message)


def _check_environment() -> None:
    """Refuse, before any work and by a dry run too, a working directory removed since the
    shell entered it (relative paths are read from it, and transformers reads it as it is
    imported: a traceback), a launcher's variable that is no integer (``WORLD_SIZE``) and a
    wait limit that is no number of seconds (``$LMALGEBRA_DIST_TIMEOUT``)."""
    refuse_missing_cwd()
    for name in LAUNCH_VARIABLES:
        launch_count(name, 0)
    wait_limit()


def _quiet_transformers() -> None:
    """Hugging Face's progress bars off (ours cover loading and embedding) and its load reports
    at errors only (we check missing weights ourselves), without importing transformers: a
    command that loads no model (a cached decomposition, a table) does not pay for its import.
    Both libraries read these variables when first imported; so does tqdm, which a few of
    transformers' loops (dequantising a GGUF file) draw with directly: ``TQDM_DISABLE`` unless
    the user set it."""
    if "transformers" in sys.modules:  # imported already (an embedding caller): tell it directly
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        hf_logging.set_verbosity_error()
        return
    os.environ.update(QUIET_ENVIRONMENT)
    os.environ.setdefault("TQDM_DISABLE", "1")


def main() -> None:
    """Console entry point: bad input -> one line on stderr, exit status 2; Ctrl-C -> one line,
    exit status 130 (the run resumes when the same command is given again)."""
    run_command(_run)


def run_command(call: Callable[[], object]) -> None:
    """``call()`` with the command line's handling of what goes wrong (``main``'s): bad input
    (a full disk included) -> one ``error:`` line, exit status 2; Ctrl-C -> one line, 130; a
    diverged training run -> one line, 1. The experiment scripts run their ``main`` in it."""
    from lmalgebra.storage import stale_temporaries

    stale_temporaries.new_call()  # a process that runs several commands (the tests') lists again
    try:
        status = call()
    except UserInputError as err:
        _fail("error", str(err), 2)
    except typer.Exit as err:
        sys.exit(err.exit_code)
    except TrainingDivergedError as err:
        _fail("stopped", str(err), 1)
    except (typer.Abort, KeyboardInterrupt):
        _interrupted()
    except Exception as err:  # click usage errors
        import click

        # typer vendors its own click: recognise usage errors by their interface
        if isinstance(err, click.ClickException) or (
            hasattr(err, "show") and hasattr(err, "exit_code")
        ):
            if type(err).__name__ == "NoArgsIsHelpError":  # a group alone: its help
                err.show()
                sys.exit(2)
            _fail("error", _usage_line(err), 2)
        from lmalgebra.storage.disk_space import system_refusal

        # a write not wrapped by ``disk_space.naming_file`` (a full disk, a refused
        # permission), a path too long for the file system, or memory the machine could not give
        text = system_refusal(err)
        if text is not None:
            _fail("error", text, 2)
        raise
    if status == INTERRUPTED:
        _interrupted()
    if isinstance(status, int) and not isinstance(status, bool) and status:
        sys.exit(status)


def _usage_line(err: Any) -> str:
    """A usage error (a flag no command has, a value of another type, an argument missing) in
    click's words, as one line naming where the help is, as every other refusal reads (click
    writes three: the usage, where the help is, then the error)."""
    text = err.format_message()
    ctx = getattr(err, "ctx", None)
    return text if ctx is None else f"{text} (help: {ctx.command_path} -h)"


def _fail(label: str, text: str, status: int) -> NoReturn:
    """``label: text`` on stderr, one line, then exit with ``status``."""
    Console(stderr=True, emoji=False).print(
        f"[red]{label}:[/red] {escape(one_line(text))}", highlight=False, soft_wrap=True
    )
    sys.exit(status)


def _interrupted() -> NoReturn:
    """Ctrl-C (exit 130), or SIGTERM taken as one (128 + SIGTERM, 143): one line."""
    stop = ("terminated (SIGTERM)", TERMINATED) if interrupt.terminated() else None
    what, status = stop or ("interrupted", INTERRUPTED)
    Console(stderr=True, emoji=False).print(
        f"{what}; run the same command again to resume", highlight=False, soft_wrap=True
    )
    sys.exit(status)
