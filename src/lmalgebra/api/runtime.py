"""What every library entry point sets up, as the command line does: its arguments checked
against its annotations (one ``UserInputError`` naming the argument, never a ``TypeError`` from
deep inside), a pinned thread count (the same bits in every process) and quiet third-party
logging. Nothing happens at import time and the root logger is never configured: lmalgebra's own
messages follow the caller's logging set-up (warnings reach stderr through Python's last-resort
handler when there is none)."""

from __future__ import annotations

import functools
import inspect
import logging
import os
import sys
import threading
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

from lmalgebra.core import remote_code
from lmalgebra.core.errors import (
    UserInputError,
    UserTypeError,
    UserValueError,
    call_bound,
    refuse_missing_cwd,
)
from lmalgebra.core.interrupt import imports_whole, requested
from lmalgebra.core.settings import EMPTY_PATH, home_expanded, is_boolean
from lmalgebra.core.threads import pin_thread_count_when_imported
from lmalgebra.storage import stale_temporaries
from lmalgebra.storage.disk_space import system_refusal

Call = TypeVar("Call", bound=Callable[..., Any])
# Loggers of the libraries that load and run the models a user hands over, outside transformers'
# own verbosity setting (sentence-transformers logs under its package name).
THIRD_PARTY_LOGGERS = ("sentence_transformers",)
ENTRY_POINT = "__lmalgebra_entry_point__"  # set on every function `library_entry` wraps
# Held for the duration of every call: calls from several threads of one process run one after
# another. A call sets process-wide state (the run directory locks this process holds, the
# temporary names of its writes, which carry its pid, the libraries' verbosity it restores):
# two at once had raced on a cache file both wrote and left the libraries silenced.
_ONE_CALL_AT_A_TIME = threading.RLock()


# Environment variables under which transformers and the model hub start quiet when imported
# (the command line sets them first thing): a call made under them need not import either.
QUIET_ENVIRONMENT = {"TRANSFORMERS_VERBOSITY": "error", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


@call_bound  # quiet(True) named, as an entry point's arguments are
@contextmanager
def quiet() -> Iterator[None]:
    """Silence transformers' load reports and progress bars (``Loading weights``), the model
    hub's progress bars and sentence-transformers' log messages for the duration; the caller's
    settings come back afterwards. Every API call runs inside it; wrap your own model loading
    in it to keep a notebook quiet too. Where transformers is not imported yet and the
    environment already makes it quiet (``QUIET_ENVIRONMENT``), it is not imported here: a call
    that loads no model never pays for its import."""
    levels = {name: logging.getLogger(name).level for name in THIRD_PARTY_LOGGERS}
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        if "transformers" not in sys.modules and all(
            os.environ.get(key) == value for key, value in QUIET_ENVIRONMENT.items()
        ):
            yield
        else:
            with _quiet_transformers():
                yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def _quiet_transformers() -> Iterator[None]:
    """transformers' verbosity and progress bars (and the hub's) off, then back as they were."""
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # transformers' tqdm, and the hub's
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_bars_off:  # transformers' switch drives the hub's too: set it back on its own
            hub_utils.disable_progress_bars()
        else:
            hub_utils.enable_progress_bars()


@contextmanager
def library_call() -> Iterator[None]:
    """Pin torch's thread count (now, or when torch is imported) and run :func:`quiet` and
    :func:`_torch_as_a_command_finds_it` for the duration of the call."""
    refuse_missing_cwd()  # as the command line refuses it, before transformers reads it
    pin_thread_count_when_imported()
    remote_code.new_call()
    stale_temporaries.new_call()
    with quiet(), _torch_as_a_command_finds_it():
        yield


@contextmanager
def _torch_as_a_command_finds_it() -> Iterator[None]:
    """torch's gradients on for the call, as a command starts with them (a notebook's
    ``torch.set_grad_enabled(False)`` or ``torch.inference_mode()`` had ended training and
    ``merge_plan``'s timing in "element 0 of tensors does not require grad"), and its global
    random generators given back as the caller left them: the stages seed them
    (``torch.manual_seed(training.seed)``), and a notebook's own draws after a call had
    followed the call's seed, and whether it trained or found its work done. Where torch was
    not imported before the call, it is seeded afresh after it, as an import seeds it."""
    if "torch" not in sys.modules:
        try:
            yield
        finally:
            if "torch" in sys.modules:
                sys.modules["torch"].seed()
        return
    import torch

    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else []
    with (
        torch.random.fork_rng(devices=list(cuda)),
        torch.inference_mode(False),
        torch.enable_grad(),
    ):
        yield


Check = Callable[[Any], bool]


def _annotation_check(function: Callable[..., Any], annotation: str) -> tuple[Check, str] | None:
    """Whether a value fits ``annotation`` (as written in ``function``'s module), judged by
    pydantic without converting anything; None where it cannot judge (``Any``, a name known to
    type checkers only).

    Strings and booleans are judged strictly: the function receives the value as given, so
    ``"no"`` is no ``bool`` (it is true) and ``"3"`` no ``int``; other values laxly, so a numpy
    integer is an ``int`` and an ``int`` a ``float``. Also what a message says the value must
    be: ``annotation``, or the values of a ``Literal`` it names (``DocSep``: ``'auto', 'line'
    or 'blank'``)."""
    from pydantic import ConfigDict, TypeAdapter, ValidationError

    holder = types.SimpleNamespace(__annotations__={"value": annotation})
    try:
        hint = typing.get_type_hints(holder, globalns=function.__globals__)["value"]
        lax, strict = (
            TypeAdapter(hint, config=ConfigDict(arbitrary_types_allowed=True, strict=mode))
            for mode in (False, True)
        )
    except Exception:  # an annotation pydantic has no schema for: nothing to check against
        return None
    if hint is Any:
        return None

    def fits(value: Any) -> bool:
        if is_boolean(value):  # numpy's too, which a lax check reads as the number 0 or 1
            value = bool(value)
        adapter = strict if isinstance(value, str | bytes | bool) else lax
        try:
            adapter.validate_python(value)
        except ValidationError:
            return False
        except (AttributeError, TypeError, ValueError, UserInputError):
            # an unchecked settings object (a ``model_copy(update=...)``) whose own validators
            # trip on a value it holds, misread it (a ``None`` taken for 0 by a refusal of
            # settings that do nothing), or a rule across its keys: the function checks it
            # again, naming the key and the call
            return True
        return True

    if typing.get_origin(hint) is typing.Literal:
        *first, last = (repr(v) for v in typing.get_args(hint))
        return fits, f"{', '.join(first)} or {last}" if first else last
    return fits, annotation


@functools.cache
def _argument_checks(function: Callable[..., Any]) -> dict[str, tuple[str, Check, str]]:
    """Per annotated parameter of ``function``: its annotation as written, its check, and what
    a message says the value must be."""
    checks: dict[str, tuple[str, Check, str]] = {}
    for name, parameter in inspect.signature(function).parameters.items():
        written = parameter.annotation
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if isinstance(written, str) and (found := _annotation_check(function, written)):
            checks[name] = (written, *found)
    return checks


def check_arguments(
    function: Callable[..., Any], *args: Any, **kwargs: Any
) -> inspect.BoundArguments:
    """Raise ``UserTypeError`` (a ``UserInputError`` and the ``TypeError`` Python raises for a
    bad call) naming the first argument of a call of ``function`` that is not of its annotated
    type (``merge(recipe, None)``: stages must be a sequence of names). The arguments, a path's
    leading ``~`` read as the home directory (as settings read theirs), as the call receives
    them."""
    where = f"{function.__qualname__}()"
    try:
        bound = inspect.signature(function).bind(*args, **kwargs)
    except TypeError as err:  # a missing or unknown argument: Python's words name it
        raise UserTypeError(f"{where}: {err}") from None
    for name, (written, fits, expected) in _argument_checks(function).items():
        if isinstance(bound.arguments.get(name), Mapping):  # read before the check consumes it
            bound.arguments[name] = _iterators_listed(bound.arguments[name])
        if name in bound.arguments and not fits(value := bound.arguments[name]):
            shown = repr(value) if len(repr(value)) <= 60 else type(value).__name__
            raise UserTypeError(f"{where}: {name} must be {expected}, got {shown}")
        if name in bound.arguments and _blank_path(written, bound.arguments[name]):
            raise UserInputError(f"{where}: {name}: {EMPTY_PATH}")  # not Path("."): here
        if name in bound.arguments and "Path" in written.split(" | "):
            bound.arguments[name] = _home_expanded(bound.arguments[name])
    return bound


def _iterators_listed(value: Any) -> Any:
    """``value`` with each one-shot iterator inside it (a generator where a list goes:
    ``training={"teachers": (t for t in names)}``) read into a list, mappings copied: the check
    of its type had read the iterator, and the call had found it empty."""
    if isinstance(value, Iterator):
        return list(value)
    if isinstance(value, Mapping):
        return {key: _iterators_listed(item) for key, item in value.items()}
    return value


def _home_expanded(value: Any) -> Any:
    """A path's leading ``~`` (``~user``) read as that home directory, of the type given; any
    other value as it is (a directory named ``~`` had been made in the current one)."""
    if isinstance(value, str | Path) and str(value).startswith("~"):
        expanded = home_expanded(Path(value))
        return str(expanded) if isinstance(value, str) else expanded
    return value


def _blank_path(written: str, value: Any) -> bool:
    """Whether ``value`` is a blank string given where the annotation ``written`` admits a
    path."""
    return isinstance(value, str) and not value.strip() and "Path" in written.split(" | ")


def library_entry(function: Call) -> Call:
    """``function`` run inside :func:`library_call`, its arguments checked first by
    :func:`check_arguments`, one call at a time in the process (a call from another thread
    waits for the one running), a Ctrl-C during an import it makes raised once the import is
    done (``imports_whole``): every public API function and method."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with imports_whole(sys._getframe().f_code):
            bound = check_arguments(function, *args, **kwargs)
            with _ONE_CALL_AT_A_TIME, library_call():
                try:
                    return function(*bound.args, **bound.kwargs)
                except Exception as err:
                    if requested():  # a Ctrl-C a library made an error of (pydantic's, say)
                        raise KeyboardInterrupt from err
                    if isinstance(err, UserInputError):
                        raise
                    text = system_refusal(err)  # what the command line words in one line
                    if text is None:
                        raise
                    raise UserInputError(text) from err

    setattr(call, ENTRY_POINT, True)
    return cast(Call, call)


def refuse_keep_and_restart(call: str, keep_saved: bool, restart: bool) -> None:
    """Refuse ``keep_saved`` beside ``restart`` (``merge()``, ``pretrain()``): one keeps a saved
    model as it is, the other trains it again from step 0, and ``restart`` had won in silence."""
    if keep_saved and restart:
        raise UserValueError(
            f"{call}: keep_saved=True would be ignored: restart=True trains again from step 0 "
            "what keep_saved keeps as it is; give one of the two"
        )
