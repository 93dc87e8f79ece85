"""The causal losses whose recorded runs do not support them (worse than CE alone): MinED-aligned
KL and ULD. They join the loss table as entry points (``lmalgebra.causal_losses``); each module
warns when it is first loaded, so this package imports neither until one is asked for."""

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
