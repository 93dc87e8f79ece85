"""The causal losses whose recorded runs do not support them: MinED-aligned KL and ULD (worse
than CE alone), and the prefix projection at every student position (``prefix_all_kl``: worse
than ``prefix_kl``, the chunk starts' alone). They join the loss table as entry points
(``lmalgebra.causal_losses``); each module warns when it is first loaded, so this package imports
none until one is asked for."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "mined_kl": "lmalgebra.experimental.losses.mined",
    "uld_loss": "lmalgebra.experimental.losses.uld",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'lmalgebra.experimental.losses' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)


__all__ = ["mined_kl", "uld_loss"]
