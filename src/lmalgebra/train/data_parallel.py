"""Data-parallel training with the same global batch as one process.

Every rank builds the same global micro-batch (a source is a pure function of the batch index) and
keeps its own contiguous slice of examples. The MLM and KD losses are means over the masked tokens
of the whole global batch; a rank's mean over its own tokens is therefore weighted by
``share = size * local_tokens / global_tokens`` before backward, and Accelerate's DDP averages the
gradients over ranks: the sum is the gradient of the one-process loss, up to floating-point
reduction order. A loss of several means, each over its own positions (the causal path's
cross-tokenizer terms), cannot be weighted by one share: each of its means divides this rank's sum
by the global batch's count instead (:func:`global_mean`), and its batch slices itself
(``examples(lo, hi)``) with share 1. Dropout masks are drawn per rank, so exact agreement needs
dropout 0.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distributed import all_reduce_sum, world
from lmalgebra.train.batches import Batch
from lmalgebra.train.cross_tokenizer.common import batch_mean


def check_batch_size(batch_size: int) -> None:
    """Refuse a global batch that does not split evenly over the processes."""
    size = world()[1]
    if batch_size % size:
        raise UserInputError(
            f"batch_size {batch_size} does not split evenly over {size} processes: "
            f"use a multiple of {size}"
        )


def local_part(batch: Any) -> tuple[Any, float]:
    """This rank's slice of a global batch, and its ``share`` of the loss (1.0 in one process).

    The slice holds examples ``[rank * b, (rank + 1) * b)`` with ``b = batch / size``; of a
    :class:`Batch`, their masked tokens (``rows`` renumbered from 0) and their teacher outputs.
    ``tokens`` stays the global batch's count, for throughput logs. The padded width is the global
    batch's, so every rank runs the same shapes. Another batch type slices itself with
    ``examples(lo, hi)``, and its loss averages with :func:`global_mean`: its share is 1.
    """
    rank, size = world()
    if size == 1:
        return batch, 1.0
    per_rank = batch.input_ids.shape[0] // size
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    if not isinstance(batch, Batch):
        return batch.examples(lo, hi), 1.0
    keep = (batch.rows >= lo) & (batch.rows < hi)

    def masked(value: torch.Tensor | None) -> torch.Tensor | None:
        return None if value is None else value[keep]

    local = Batch(
        input_ids=batch.input_ids[lo:hi],
        attention_mask=batch.attention_mask[lo:hi],
        rows=batch.rows[keep] - lo,
        cols=batch.cols[keep],
        labels=batch.labels[keep],
        language=batch.language[keep],
        tokens=batch.tokens,
        topk_ids=masked(batch.topk_ids),
        topk_logprobs=masked(batch.topk_logprobs),
    )
    total = batch.labels.numel()
    return local, size * local.labels.numel() / total if total else 0.0


def global_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """This rank's part of the mean of ``values`` where ``keep`` over the global batch.

    ``sum of this rank's kept values * size / kept count of all ranks``: the ranks' parts average
    (as DDP averages their gradients) to the one-process mean. The counts are all-reduced, so every
    rank must call it for the same terms in the same order. In one process: :func:`batch_mean`.
    """
    size = world()[1]
    if size == 1:
        return batch_mean(values, keep)
    count = float(all_reduce_sum(np.array([float(keep.sum())]))[0])
    kept = torch.where(keep, values, values.new_zeros(()))
    return kept.sum() * (size / max(count, 1.0))


def local_loss(loss: torch.Tensor, share: float, model: Any) -> torch.Tensor:
    """The loss this rank back-propagates: ``loss * share``.

    A rank whose slice has no masked token (``share == 0``; its mean loss is NaN) still sends
    zero gradients for every parameter, as DDP expects from each rank.
    """
    if share == 1.0:
        return loss
    if share == 0.0:
        return torch.stack([p.sum() for p in model.parameters() if p.requires_grad]).sum() * 0.0
    return loss * share


def global_values(values: list[float], share: float) -> list[float]:
    """Loss values of the global batch from each rank's means (the values, in one process)."""
    size = world()[1]
    if size == 1:
        return values
    local = np.zeros(len(values)) if share == 0.0 else np.array(values) * share
    return [float(v) for v in all_reduce_sum(local) / size]
