"""The one exception type for bad user input: the CLI prints its message on one line and exits 2."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

Function = TypeVar("Function", bound=Callable[..., Any])


class UserInputError(Exception):
    """Input a user gave is unusable; the message names the culprit, on one line (a path or
    value holding a line break shows it escaped: from Python too, where it had broken the
    message in two, as the command line's print did not)."""

    def __str__(self) -> str:
        return one_line(super().__str__())


def one_line(text: str) -> str:
    """``text`` with its control characters written as escapes (``\\n``): a message is one line,
    and a newline in a path it names (a directory named so) had broken it in two."""
    return "".join(c if c.isprintable() or c == "\t" else repr(c)[1:-1] for c in text)


class UserValueError(UserInputError, ValueError):
    """Unusable values given to a scikit-learn style estimator (arrays of the wrong shape, NaN,
    strings where numbers go): a ``UserInputError`` that is also the ``ValueError`` scikit-learn's
    conventions, and so ``Pipeline``, ``GridSearchCV`` and its estimator checks, expect."""


class UserTypeError(UserInputError, TypeError):
    """Objects that are not numbers in an estimator's arrays: a ``UserInputError`` that is also
    the ``TypeError`` numpy and scikit-learn raise for them."""


class TrainingDivergedError(RuntimeError):
    """The training loss became NaN or infinite; the last good checkpoint is kept."""


def refuse_missing_cwd() -> None:
    """Refuse a working directory removed since the shell or the notebook entered it: relative
    paths are read from it, and transformers reads it as it is imported (a bare
    ``FileNotFoundError``)."""
    from pathlib import Path

    try:
        Path.cwd()
    except FileNotFoundError:
        raise UserInputError(
            "the working directory no longer exists (it was removed after the shell entered "
            "it): cd into a directory that exists, then run the command again"
        ) from None


def either(flag: str, keyword: str) -> str:
    """A choice the command line and the Python API both offer, as a message reached from both
    names it: the flag, then the keyword argument (``--overwrite (overwrite=True)``)."""
    return f"{flag} ({keyword})"


def merge_stage(stage: str, name: str | None = None, *, restart: bool = False) -> str:
    """A merge stage to run, as a message reached from the command line and from Python names
    it: the command, then the call (``lmalgebra merge train RECIPE --name s2``
    (``merge(recipe, 'train', students={'s2': None})``)); ``name``: the student to train."""
    flags = (f" --name {name}" if name else "") + (" --restart" if restart else "")
    keywords = (f", students={{{name!r}: None}}" if name else "") + (
        ", restart=True" if restart else ""
    )
    return either(f"`lmalgebra merge {stage} RECIPE{flags}`", f"merge(recipe, {stage!r}{keywords})")


OVERWRITE = either("--overwrite", "overwrite=True")
# how a decomposition's model is named, on the command line, in a recipe and from Python
MODEL_NAMING = "--models NAME=REFERENCE, a recipe's name:, or the key of decompose()'s models"
TRUST_REMOTE_CODE = either("--trust-remote-code", "trust_remote_code=True")
RESTART = either("--restart", "restart=True")


def counted(count: int, noun: str, plural: str = "") -> str:
    """``count`` and ``noun``, in the plural (``plural``, or ``noun`` with an s) unless it is 1:
    a message had said "1 weights", "1 teachers"."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def did_you_mean(name: str, known: list[str]) -> str:
    """`` (did you mean X?)`` for the closest of ``known`` to ``name``, or nothing."""
    import difflib

    match = difflib.get_close_matches(name, known, n=1, cutoff=0.5)
    return f" (did you mean {match[0]!r}?)" if match else ""


def call_bound(function: Function) -> Function:
    """``function``, a call of which Python refuses (an argument too many, unknown or missing)
    raised as one ``UserTypeError`` naming the function (``quiet(): too many positional
    arguments``): a public function or method that checks nothing else of its arguments, as
    the API's entry points name theirs (``check_arguments``)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            inspect.signature(function).bind(*args, **kwargs)
        except TypeError as err:
            raise UserTypeError(_unbound(function, args, err)) from None
        return function(*args, **kwargs)

    return call  # type: ignore[return-value]


def _unbound(function: Callable[..., Any], args: tuple[Any, ...], err: TypeError) -> str:
    """Why ``function`` refuses ``args`` (``err``: Python's words), naming an argument too many
    (``quiet(True)``: ``quiet(): takes no argument, got True``)."""
    where = f"{function.__qualname__}()"
    parameters = inspect.signature(function).parameters.values()
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return f"{where}: {err}"
    positional = [
        p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if len(args) <= len(positional):
        return f"{where}: {err}"
    own = [name for name in positional if name not in ("self", "cls")]
    takes = f"takes {', '.join(own)} alone" if own else "takes no argument"
    extra = args[len(positional)]
    shown = repr(extra) if len(repr(extra)) <= 60 else type(extra).__name__
    return f"{where}: {takes}, got {shown}"
