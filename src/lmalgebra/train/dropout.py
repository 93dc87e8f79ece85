"""Dropout for training on the CPU, its masks cut from 64-bit draws of torch's generator.

torch's CPU dropout draws a Bernoulli sample per element (``bernoulli_``: a generator call and a
conversion each). On a demo layer's 262,144 activations that is 2.5 ms (15% of a demo teacher's
training step on one thread went to ``bernoulli_``); swapping the five dropout modules of its
two-layer BERT made the step 6% faster (``bench/bench_dropout.py``).
:class:`LaneDropout` draws one 64-bit word per four elements from the same generator
(``random_`` over the full range) and reads each word as four 16-bit lanes: an element is kept
when its lane is at or above ``round(p * 65536)`` (counted from the lane's least value). The drop
probability is then ``round(p * 65536) / 65536``, within 7.7e-6 of ``p``, and the kept elements
are scaled by the inverse of the keep probability, so the output's expectation is the input's, as
with torch's dropout. Masks follow ``torch.manual_seed`` and the generator state that checkpoints
save, so a run is repeatable and resumes to the same bits; they are not torch's masks.

Only the ``torch.nn.Dropout`` modules of a model training on the CPU are swapped
(:func:`lane_dropout`), for the span of the training and put back after; dropout a model calls as
a function (BERT's attention probabilities) stays torch's, and so does every other device (their
generators are not the cost).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

LANE = 1 << 16  # one mask element per 16-bit lane, four lanes per 64-bit draw


def drop_threshold(p: float) -> int:
    """Lanes below this count (of ``LANE``) are dropped: ``round(p * LANE)``."""
    return round(p * LANE)


def keep_mask(shape: torch.Size | tuple[int, ...], p: float) -> torch.Tensor:
    """``shape`` bool, True where kept, each with probability ``1 - drop_threshold(p) / LANE``,
    from ``ceil(numel / 4)`` 64-bit draws of torch's default CPU generator."""
    count = math.prod(shape)
    words = torch.empty((count + 3) // 4, dtype=torch.int64).random_(-(1 << 63), (1 << 63) - 1)
    lanes = words.view(torch.int16)[:count]  # each lane uniform on [-32768, 32767]
    return (lanes >= drop_threshold(p) - LANE // 2).view(shape)


class _Scaled(torch.autograd.Function):
    """``x * mask`` with ``mask`` (0 or the keep scale) saved for the backward pass."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def lane_dropout_function(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """Dropout of ``x`` with a :func:`keep_mask` (see the module); torch's own dropout off the
    CPU, and nothing at all outside training or at ``p`` 0."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return torch.nn.functional.dropout(x, p, training)
    dropped = drop_threshold(p)
    if dropped == LANE:  # p within 7.7e-6 of 1
        return x * 0.0
    scale = LANE / (LANE - dropped)
    mask = keep_mask(x.shape, p).to(x.dtype).mul_(scale)
    return _Scaled.apply(x, mask)


class LaneDropout(torch.nn.Dropout):
    """``torch.nn.Dropout`` whose masks come from :func:`keep_mask` on the CPU; ``p`` as the
    module it replaces (modules that read ``dropout.p`` read the same)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return lane_dropout_function(input, self.p, self.training)


@contextlib.contextmanager
def lane_dropout(model: torch.nn.Module) -> Iterator[int]:
    """Within the block, every ``torch.nn.Dropout`` of ``model`` (its exact type, not a
    subclass) is a :class:`LaneDropout` of the same ``p``; put back on leaving. Yields how many
    were swapped; none for a model whose parameters are not all on the CPU."""
    devices = {parameter.device.type for parameter in model.parameters()}
    swapped: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []
    if devices <= {"cpu"}:
        for parent in list(model.modules()):
            for name, child in list(parent.named_children()):
                if type(child) is torch.nn.Dropout:
                    swapped.append((parent, name, child))
                    lanes = LaneDropout(child.p, child.inplace)
                    setattr(parent, name, lanes.train(child.training))
    try:
        yield len(swapped)
    finally:
        for parent, name, child in swapped:
            setattr(parent, name, child)
