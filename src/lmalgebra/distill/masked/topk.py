"""Offline teacher inference: top-k log-probabilities at masked positions only.

The head runs on masked positions only (``masked_head``): ``(n_masked, vocab)`` logits instead of
``(batch, seq, vocab)``. Stored values are exact log-probabilities: top-k logits minus the
log-sum-exp over the full vocabulary, taken in float32 whatever the forward pass's precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmalgebra.core.allocator import reuse_freed_memory
from lmalgebra.core.precision import compute_context, module_device
from lmalgebra.distill.masked.masking import MaskedCopy, pad_batch
from lmalgebra.sources.embed import padding_id
from lmalgebra.train.masked_head import masked_logits


@dataclass(frozen=True)
class TeacherOutput:
    """Teacher predictions for one example.

    Attributes:
        topk_ids: ``(n_masked, k) int64`` the k most likely token ids, most likely first.
        topk_logprobs: ``(n_masked, k) float32`` their log-probabilities over the full vocabulary.
        loss: mean negative log-likelihood of the gold labels (NaN when nothing is masked).
    """

    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    loss: float


@torch.inference_mode()
def masked_topk(
    model: Any,
    copies: Sequence[MaskedCopy],
    k: int,
    pad_id: int,
    batch_size: int = 32,
    dtype: torch.dtype = torch.float32,
    trim_last_layer: bool = True,
    tokens: int | None = None,
) -> list[TeacherOutput]:
    """Top-k teacher outputs for each copy, batched by length, returned in input order.

    The model runs where its weights are; with ``dtype`` bfloat16 the encoder runs under
    autocast and the head in float32 on the masked rows (``masked_head``): a bfloat16 head
    reorders near-tied candidates, which changes the stored top-k set. The log-sum-exp and the
    top-k are taken in float32. ``trim_last_layer=False`` runs the last encoder layer at every
    position (see ``masked_logits``; for comparisons). ``tokens``: the tokenizer's size, where
    the model's table has rows past it (padded to a round size): the top-k is of its tokens.
    """
    reuse_freed_memory()  # each batch's logits (n_masked x vocab) faulted in once, not per batch
    device = module_device(model) or torch.device("cpu")
    pad_id = padding_id(pad_id, model)
    order = sorted(range(len(copies)), key=lambda i: -len(copies[i].input_ids))
    out: list[TeacherOutput | None] = [None] * len(copies)
    # one context for every batch: autocast casts each weight to ``dtype`` once, not per batch
    with compute_context(device, dtype):
        for start in range(0, len(order), batch_size):
            chosen = order[start : start + batch_size]
            batch = [copies[i] for i in chosen]
            inputs = {name: t.to(device) for name, t in pad_batch(batch, pad_id).items()}
            logits = masked_logits(model, inputs, True, trim_last_layer).float()
            for i, result in zip(chosen, _split_outputs(logits, batch, k, tokens), strict=True):
                out[i] = result
    return [o for o in out if o is not None]


def _split_outputs(
    logits: torch.Tensor, batch: list[MaskedCopy], k: int, tokens: int | None = None
) -> list[TeacherOutput]:
    """Per-copy outputs from ``logits (n_masked, vocab) float32`` on any device; the top-k of
    the first ``tokens`` ids (rows past the tokenizer name no token), their log-probabilities
    of the whole table."""
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    named = logits[:, :tokens]
    values, indices = named.topk(min(k, named.shape[-1]), dim=-1)
    logprobs = (values - lse).cpu().numpy()
    indices = indices.cpu()
    labels = torch.from_numpy(np.concatenate([c.labels for c in batch])).to(logits.device)
    gold = (logits.gather(1, labels.unsqueeze(1)) - lse).squeeze(1).cpu().numpy()
    outputs, start = [], 0
    for c in batch:
        stop = start + len(c.positions)
        loss = float(-gold[start:stop].mean()) if stop > start else float("nan")
        outputs.append(TeacherOutput(indices[start:stop].numpy(), logprobs[start:stop], loss))
        start = stop
    return outputs
