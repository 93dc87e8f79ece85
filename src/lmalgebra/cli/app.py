"""The command-line application object and its console, shared by the commands.

Global options (``--version``, ``-v``/``-q``) are handled here; ``-h`` works wherever ``--help``
does, and ``--install-completion`` sets up shell completion.
"""

from __future__ import annotations

import inspect
import logging
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

HELP = (
    "lmalgebra: linear algebra over language models.\n\n"
    "Two jobs. LMD: `decompose` fits every model's embeddings on the others' (ridge, closed "
    "form) and reports pairwise and group R^2, how much of one model the others contain. "
    "MergeDistill: `merge` distils several teacher LMs (masked LMs, or causal LMs with any "
    "tokenizers), each with its own tokenizer and languages, into one student, and scores it "
    "against its teachers; `pretrain` makes teachers.\n\n"
    "Example: lmalgebra decompose --models a=package:minilm --models b=package:minilm-sre "
    "--corpus.paths package:wiki-en --corpus.text_column extract --out runs/minilm"
)
CONTEXT = {"help_option_names": ["-h", "--help"]}


class CommandGroup(TyperGroup):
    """A command group whose commands' help (and the summary of each in its list of commands,
    the first paragraph) is paragraphs of one line each, which the terminal wraps: typer's rich
    help keeps a docstring's line breaks, so a paragraph broke at the docstring's width, midway
    through the terminal's line. Its own options and its commands' name their values as the
    recipe flags do (:func:`_plain_types`)."""

    # ``Any``: typer's own click types (vendored from 0.2x on, click's before)
    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None and command.help:
            paragraphs = [" ".join(p.split()) for p in inspect.cleandoc(command.help).split("\n\n")]
            command.help = "\n\n".join(paragraphs)
            command.short_help = command.short_help or paragraphs[0]
        if command is not None:
            _plain_types(command, ctx)
        return command

    def format_help(self, ctx: Any, formatter: Any) -> None:
        _plain_types(self, ctx)
        super().format_help(ctx, formatter)


# typer's names of value types (``<int>``), as the recipe flags name them (``_metavar``)
_TYPE_NAMES = {"int": "INT", "float": "FLOAT", "str": "TEXT", "path": "PATH", "bool": None}


def _plain_types(command: Any, ctx: Any) -> None:
    """``command``'s parameters shown in ``--help`` as the recipe flags are (``INT``, ``TEXT``,
    ``PATH``; a switch with none): typer showed ``<bool>`` beside every switch, and ``<str>``,
    ``<path>`` or ``<list[str]>`` beside the other options a command declares itself."""
    for param in command.get_params(ctx):
        shown = param.display_type_rich(ctx)
        if not (isinstance(shown, str) and shown.startswith("<") and shown.endswith(">")):
            continue
        kind = shown[1:-1].removeprefix("list[").removesuffix("]")
        plain = _TYPE_NAMES.get(kind, kind.upper())
        setattr(param, "display_type_rich", lambda ctx, plain=plain: plain)  # noqa: B010


app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings=CONTEXT,
    help=HELP,
)


class FoldingConsole(Console):
    """Rich's console, whose tables lose no cell: piped (where rich takes 80 columns) a table is
    as wide as its cells and a line of text is one line, and in a terminal too narrow a cell
    folds onto the next line. Cells had been cut with an ellipsis (the numbers of ``merge
    inspect``, the names ``packaged`` lists), and a path piped split over two lines."""

    def print(self, *objects: Any, **kwargs: Any) -> None:
        for table in objects:
            for column in table.columns if isinstance(table, Table) else ():
                column.overflow = "fold"
        width = self.width
        if not self.is_terminal:
            wide = self.options.update(width=WIDEST)
            for table in objects:
                if isinstance(table, Table):
                    width = max(width, Measurement.get(self, wide, table).maximum)
            if width == self.width:  # a line of text whole, as a terminal would wrap it
                kwargs.setdefault("soft_wrap", True)
        kept, self.width = self.width, width
        try:
            super().print(*objects, **kwargs)
        finally:
            self.width = kept


# no markup: what it prints holds paths, names and text of the user's, whose brackets had been
# read as styles (``o/c[red]d`` shown as ``o/cd``; ``[/x]`` a traceback after the work); no
# emoji codes either (``onnx:package:NAME`` had been shown as ``onnx📦NAME``)
console = FoldingConsole(markup=False, emoji=False)
WIDEST = 400  # columns of a table piped


def bold(text: object) -> Text:
    """``text`` in bold, as written."""
    return Text(str(text), style="bold")


def _version(value: bool) -> None:
    if value:
        from lmalgebra import __version__

        console.print(f"lmalgebra {__version__}")
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug messages too.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")] = False,
) -> None:
    """Global options: set how much the commands log."""
    if verbose and quiet:
        raise typer.BadParameter("--verbose and --quiet exclude each other")
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.getLogger().setLevel(level)
