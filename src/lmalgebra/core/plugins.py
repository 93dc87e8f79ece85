"""Extension points that other packages fill: Python entry points (``importlib.metadata``).

A package adds a causal loss or a student initialisation by naming an object in its metadata, e.g.
in ``pyproject.toml``::

    [project.entry-points."lmalgebra.causal_losses"]
    my_loss = "my_package.my_loss:LOSS"

The names are read from the installed metadata without importing anything; an object is imported
the first time a run names it. lmalgebra's own experimental features are reached this way, so no
stable module imports ``lmalgebra.experimental`` and removing one is removing its module and its
line in ``pyproject.toml``.

A recipe's entry points load while its settings are checked, before the rest of the recipe is:
the warnings a module gives on import (an experimental loss's) are held, and given once by
:func:`announce` when a run (or a dry run) has accepted the recipe that uses it, not for a
recipe then refused. A student initialisation may carry a ``plan(vocab, directories)``
method, which the dry run calls with the union vocabulary and the teachers' directories, to
refuse what the initialisation would refuse.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from typing import Any

from lmalgebra.core.errors import UserInputError

CAUSAL_LOSSES = "lmalgebra.causal_losses"  # -> a train.cross_tokenizer.CausalLoss
EMBEDDING_INITS = "lmalgebra.embedding_inits"  # -> a masked student's init (model, recipe, vocab)

# (group, name) -> the warnings its module gave on import, until a run that uses it announces them
_HELD: dict[tuple[str, str], list[warnings.WarningMessage]] = {}


@cache
def declared(group: str) -> dict[str, EntryPoint]:
    """The entry points of ``group`` in the installed packages' metadata, by name."""
    return {point.name: point for point in entry_points(group=group)}


def load(group: str, name: str, fits: Callable[[Any], bool], wanted: str) -> Any:
    """The object entry point ``name`` of ``group`` names; refused in one line naming the entry
    point when it cannot load (whatever its module raises on import) or what it names is not
    ``wanted`` (judged by ``fits``)."""
    point = declared(group).get(name)
    if point is None:
        raise UserInputError(f"{group}: no entry point named {name!r} is installed")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            found = point.load()
        _HELD.setdefault((group, name), []).extend(caught)
    except (ImportError, AttributeError) as exc:
        raise UserInputError(
            f"{group}: entry point {name!r} ({point.value}) does not load: {exc} (is the package "
            "that declares it installed as it is now? pip install -e . refreshes lmalgebra's)"
        ) from exc
    except Exception as exc:  # the package's own code failed on import
        raise UserInputError(
            f"{group}: entry point {name!r} ({point.value}) does not load: its module raised "
            f"{type(exc).__name__}: {exc}"
        ) from exc
    if not fits(found):
        raise UserInputError(
            f"{group}: entry point {name!r} ({point.value}) is of type {type(found).__name__}, "
            f"not {wanted}"
        )
    return found


def announce(group: str, names: Iterable[str]) -> None:
    """Give, once, the warnings the entry points ``names`` of ``group`` gave when they loaded:
    a run, or a dry run, has accepted the recipe that uses them."""
    for name in names:
        for held in _HELD.pop((group, name), []):
            warnings.warn_explicit(held.message, held.category, held.filename, held.lineno)
