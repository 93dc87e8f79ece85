"""The table of a causal student's losses: every name ``training.objective_mix`` accepts, what a
batch must carry for it, and how it is computed. A new loss is one module beside this one and one
line below, or, from another package (and for lmalgebra's experimental losses), one entry point of
the group ``lmalgebra.causal_losses`` (``core.plugins``); the settings, the training step, the
batch builder and the tests all read this table.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, MutableMapping

from lmalgebra.core import plugins
from lmalgebra.core.errors import UserInputError
from lmalgebra.train.cross_tokenizer import alm, ce, prefix, sampled, tail
from lmalgebra.train.cross_tokenizer.common import CausalLoss


class LossTable(MutableMapping[str, CausalLoss]):
    """The losses by name: those registered here, then the installed entry points, each imported
    the first time it is looked up (listing the names imports nothing)."""

    def __init__(self) -> None:
        self._losses: dict[str, CausalLoss] = {}

    def register(self, loss: CausalLoss) -> CausalLoss:
        """Add ``loss`` to the table (refused if its name is taken); returns it."""
        if loss.name in self._losses:
            raise ValueError(f"a loss named {loss.name!r} is registered already")
        self._losses[loss.name] = loss
        return loss

    def __getitem__(self, name: str) -> CausalLoss:
        if name not in self._losses:
            if name not in plugins.declared(plugins.CAUSAL_LOSSES):
                raise KeyError(name)
            group = plugins.CAUSAL_LOSSES
            loss = plugins.load(group, name, lambda found: isinstance(found, CausalLoss), "a loss")
            if loss.name != name:
                raise UserInputError(
                    f"{group}: entry point {name!r} names the loss {loss.name!r}: an entry "
                    "point and its loss have one name"
                )
            self._losses[name] = loss
        return self._losses[name]

    def __setitem__(self, name: str, loss: CausalLoss) -> None:
        if loss.name != name:
            raise ValueError(f"loss {loss.name!r} filed under another name, {name!r}")
        self._losses[name] = loss

    def __delitem__(self, name: str) -> None:
        del self._losses[name]

    def __iter__(self) -> Iterator[str]:
        yield from self._losses
        yield from (n for n in plugins.declared(plugins.CAUSAL_LOSSES) if n not in self._losses)

    def __len__(self) -> int:
        return sum(1 for _ in self)


LOSSES = LossTable()
register = LOSSES.register

register(ce.LOSS)
register(alm.LOSS)
register(sampled.LOSS)
register(tail.LOSS)
register(prefix.LOSS)


def tempered_names() -> list[str]:
    """The names of the tempered losses among those that load: an installed entry point that
    does not load is named when a recipe names it, not in a message about other losses."""
    found = []
    for name in LOSSES:
        try:
            loss = LOSSES[name]
        except UserInputError:
            continue
        if loss.tempered:
            found.append(name)
    return found


def needs_of(names: Iterable[str]) -> frozenset[str]:
    """What a batch must carry for the losses ``names``."""
    return frozenset(need for name in names for need in LOSSES[name].needs)
