"""The table of a causal student's losses: every name ``training.objective_mix`` accepts, what a
batch must carry for it, and how it is computed. A new loss is one module beside this one and one
line below; the settings, the training step, the batch builder and the tests all read this table.
"""

from __future__ import annotations

from collections.abc import Iterable

from lmalgebra.train.cross_tokenizer import alm, ce, mined, prefix, sampled, tail, uld
from lmalgebra.train.cross_tokenizer.common import CausalLoss

LOSSES: dict[str, CausalLoss] = {}


def register(loss: CausalLoss) -> CausalLoss:
    """Add ``loss`` to the table (refused if its name is taken); returns it."""
    if loss.name in LOSSES:
        raise ValueError(f"a loss named {loss.name!r} is registered already")
    LOSSES[loss.name] = loss
    return loss


register(ce.LOSS)
register(mined.LOSS)
register(uld.LOSS)
register(alm.LOSS)
register(sampled.LOSS)
register(tail.LOSS)
register(prefix.LOSS)


def needs_of(names: Iterable[str]) -> frozenset[str]:
    """What a batch must carry for the losses ``names``."""
    return frozenset(need for name in names for need in LOSSES[name].needs)
