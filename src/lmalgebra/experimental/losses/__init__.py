"""The causal losses whose recorded runs do not support them (worse than CE alone): MinED-aligned
KL and ULD. They join the loss table as entry points (``lmalgebra.causal_losses``)."""

from lmalgebra.experimental.losses.mined import mined_kl
from lmalgebra.experimental.losses.uld import uld_loss

__all__ = ["mined_kl", "uld_loss"]
