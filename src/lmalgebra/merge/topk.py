"""Offline teacher inference: top-k log-probabilities at masked positions only.

The masked-LM head (a vocabulary-sized projection) dominates the cost of a forward pass on CPU when
applied to every position. Here the encoder runs on the whole batch, its output is gathered at the
masked positions, and only those rows go through the head: ``(n_masked, vocab)`` logits instead of
``(batch, seq, vocab)``. This works for any ``*ForMaskedLM`` whose head is applied to the base
model's first output, by a forward hook on the base model that replaces that output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmalgebra.merge.masking import MaskedCopy


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


def _gathering_hook(selector: dict[str, torch.Tensor]) -> Any:
    def hook(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        picked = hidden[selector["rows"], selector["cols"]].unsqueeze(0)  # (1, n_masked, hidden)
        if isinstance(output, tuple):
            return (picked, *output[1:])
        output.last_hidden_state = picked
        return output

    return hook


@torch.inference_mode()
def masked_topk(
    model: Any, copies: Sequence[MaskedCopy], k: int, pad_id: int, batch_size: int = 32
) -> list[TeacherOutput]:
    """Top-k teacher outputs for each copy, batched by length, returned in input order."""
    order = sorted(range(len(copies)), key=lambda i: -len(copies[i].input_ids))
    out: list[TeacherOutput | None] = [None] * len(copies)
    selector: dict[str, torch.Tensor] = {}
    handle = model.base_model.register_forward_hook(_gathering_hook(selector))
    try:
        for start in range(0, len(order), batch_size):
            batch = [copies[i] for i in order[start : start + batch_size]]
            for i, result in zip(
                order[start : start + batch_size],
                _batch(model, batch, k, pad_id, selector),
                strict=True,
            ):
                out[i] = result
    finally:
        handle.remove()
    return [o for o in out if o is not None]


def _batch(
    model: Any, batch: list[MaskedCopy], k: int, pad_id: int, selector: dict[str, torch.Tensor]
) -> list[TeacherOutput]:
    width = max(len(c.input_ids) for c in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, c in enumerate(batch):
        ids[row, : len(c.input_ids)] = torch.from_numpy(c.input_ids)
        attention[row, : len(c.input_ids)] = 1
    selector["rows"] = torch.cat([torch.full((len(c.positions),), r) for r, c in enumerate(batch)])
    selector["cols"] = torch.cat([torch.from_numpy(c.positions) for c in batch])
    logits = model(input_ids=ids, attention_mask=attention).logits[0].float()  # (n_masked, vocab)
    return _split_outputs(logits, batch, k)


def _split_outputs(logits: torch.Tensor, batch: list[MaskedCopy], k: int) -> list[TeacherOutput]:
    lse = torch.logsumexp(logits, dim=-1, keepdim=True)
    values, indices = logits.topk(min(k, logits.shape[-1]), dim=-1)
    logprobs = (values - lse).numpy()
    labels = torch.from_numpy(np.concatenate([c.labels for c in batch]))
    gold = (logits.gather(1, labels.unsqueeze(1)) - lse).squeeze(1).numpy()
    outputs, start = [], 0
    for c in batch:
        stop = start + len(c.positions)
        loss = float(-gold[start:stop].mean()) if stop > start else float("nan")
        outputs.append(TeacherOutput(indices[start:stop].numpy(), logprobs[start:stop], loss))
        start = stop
    return outputs


@torch.inference_mode()
def naive_topk(model: Any, copy: MaskedCopy, k: int) -> TeacherOutput:
    """Reference: full-vocabulary logits at every position, then top-k (tests and benchmarks)."""
    logits = model(input_ids=torch.from_numpy(copy.input_ids)[None]).logits[0].float()
    return _split_outputs(logits[torch.from_numpy(copy.positions)], [copy], k)[0]
