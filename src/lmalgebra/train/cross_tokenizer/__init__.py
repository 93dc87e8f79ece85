"""A causal student's losses against teachers whose tokenizers may differ: one module per loss,
one table of them (``registry.LOSSES``, which the experimental losses join as entry points), and
what they share (``common``)."""

from lmalgebra.train.cross_tokenizer.alm import alm_loss
from lmalgebra.train.cross_tokenizer.ce import ce_loss
from lmalgebra.train.cross_tokenizer.common import (
    NEEDS,
    CausalLoss,
    LossBatch,
    Mean,
    batch_mean,
    log1mexp,
)
from lmalgebra.train.cross_tokenizer.registry import LOSSES, needs_of, register
from lmalgebra.train.cross_tokenizer.sampled import sampled_ce
from lmalgebra.train.cross_tokenizer.tail import tail_kl

__all__ = [
    "LOSSES",
    "NEEDS",
    "CausalLoss",
    "LossBatch",
    "Mean",
    "alm_loss",
    "batch_mean",
    "ce_loss",
    "log1mexp",
    "needs_of",
    "register",
    "sampled_ce",
    "tail_kl",
]
