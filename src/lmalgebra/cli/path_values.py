"""What a path given on the command line means, the same for every option and argument.

An empty string is refused, naming the option: ``Path("")`` is ``Path(".")``, so ``--out "$DIR"``
with ``DIR`` unset would write into the current directory, and ``merge verify ""`` read it, with
nothing said. A leading ``~`` is the home directory where no shell expanded it (a quoted flag),
as it is in a recipe (``core.settings``). Every parameter of the command tree that takes a path
has its value read so.
"""

from __future__ import annotations

import functools
import pathlib
import typing
from collections.abc import Callable
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import RECIPE_PREFIX
from lmalgebra.core.settings import EMPTY_PATH, home_expanded


def read_paths(command: Any) -> Any:
    """``command`` (a click command or group, as typer builds it) with each of its path
    parameters, and those of every sub-command, read as the module says; returns it."""
    for sub in getattr(command, "commands", {}).values():
        read_paths(sub)
    for param in getattr(command, "params", []):
        if _takes_path(param):
            param.process_value = _checked(param, param.process_value)
    return command


def _takes_path(param: Any) -> bool:
    """Whether ``param`` is declared as a path (``Path``, ``Path | None``)."""
    descriptor = getattr(param, "type_descriptor", None)
    annotation = getattr(descriptor, "annotation", None)
    if annotation is None:  # a click parameter (typer before 0.20): its type says
        return type(getattr(param, "type", None)).__name__ == "Path"
    return annotation is pathlib.Path or pathlib.Path in typing.get_args(annotation)


def _checked(param: Any, process: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(process)
    def process_value(ctx: Any, value: Any) -> Any:
        values = value if isinstance(value, list | tuple) else [value]
        if any(isinstance(v, str) and not v.strip() for v in values):
            raise UserInputError(f"{_shown(param)}: {EMPTY_PATH}")
        read = process(ctx, value)
        return _as_written(value, home_expanded(read)) if isinstance(read, pathlib.Path) else read

    return process_value


def _as_written(value: Any, path: pathlib.Path) -> pathlib.Path:
    """``path``, made absolute where ``value`` was written ``./recipe:NAME``: ``Path`` drops the
    ``./`` that names the file here, and the shipped recipe ``recipe:NAME`` had been read in its
    place."""
    if isinstance(value, str) and value.startswith("./") and str(path).startswith(RECIPE_PREFIX):
        return path.absolute()
    return path


def _shown(param: Any) -> str:
    """The parameter as a user types it: its longest option, or an argument's name."""
    opts = [o for o in getattr(param, "opts", []) if o.startswith("-")]
    return max(opts, key=len) if opts else str(param.name).upper()
