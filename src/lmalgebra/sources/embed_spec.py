"""What the embedding loop (``sources.embed``) is asked for and what it reports, apart from
the loop: a recipe is read and checked without importing torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Pooling = Literal["mean", "first", "last"]


@dataclass(frozen=True)
class EmbedSpec:
    """What, of a model's forward pass, becomes the span's vector, and where it runs.

    ``dtype``: the forward pass's compute precision (resolved: no ``auto`` here); bfloat16 runs
    under autocast with float32 weights, and pooling is float32 either way. ``device``: where the
    forward pass runs; the model must already be there. ``weights_dtype`` and ``device_map``:
    how a model named by reference is loaded (:meth:`ReferencedModel.load`).
    """

    layer: int = -1
    pooling: Pooling = "mean"
    exclude_special: bool = False
    dtype: Literal["float32", "bfloat16"] = "float32"
    batch_size: int = 32
    max_length: int | None = None
    # several hidden layers at once (one forward pass), concatenated in this order; overrides layer
    layers: tuple[int, ...] | None = None
    device: str = "cpu"
    weights_dtype: Literal["float32", "bfloat16"] = "float32"
    device_map: str | None = None


@dataclass(frozen=True)
class TokenReport:
    """Per model: mean tokens per span and spans cut at the model's maximum length."""

    mean_tokens: float
    truncated: int
    spans: int
