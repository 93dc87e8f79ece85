"""Masked-LM and distillation losses over masked positions.

With student logits ``z`` at the masked positions and the teacher's stored top-k ids ``j_1..j_k``
and log-probabilities ``v_1..v_k``:

- MLM: cross-entropy of the gold labels under ``softmax(z)`` over the full student vocabulary.
- KD: cross-entropy of the teacher's distribution ``p = softmax(v / T)`` (renormalised over its k
  entries) against the student's log-probabilities ``log softmax(z / T)`` over the full student
  vocabulary, gathered at the teacher's (mapped) ids: ``-sum_i p_i log q(j_i)``.

Both are means over the masked tokens that carry them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as nnf


@dataclass
class LossParts:
    """Scalar tensors; ``kd`` is zero (and ``has_kd`` False) for gold-only batches."""

    total: torch.Tensor
    mlm: torch.Tensor
    kd: torch.Tensor
    has_kd: bool


def mlm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``logits (n, vocab)``, ``labels (n,) int64`` -> mean NLL."""
    return nnf.cross_entropy(logits.float(), labels)


def kd_loss(
    logits: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``logits (n, vocab)``, ``topk_ids (n, k) int64``, ``topk_logprobs (n, k)`` -> mean CE."""
    student = nnf.log_softmax(logits.float() / temperature, dim=-1).gather(1, topk_ids)
    teacher = nnf.softmax(topk_logprobs.float() / temperature, dim=-1)
    return -(teacher * student).sum(-1).mean()


def combined_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weight: float,
    topk_ids: torch.Tensor | None = None,
    topk_logprobs: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> LossParts:
    """``weight * KD + (1 - weight) * MLM``; gold only when no teacher outputs are given."""
    mlm = mlm_loss(logits, labels)
    if topk_ids is None or topk_logprobs is None:
        return LossParts(mlm, mlm, torch.zeros((), device=mlm.device), False)
    kd = kd_loss(logits, topk_ids, topk_logprobs, temperature)
    return LossParts(weight * kd + (1 - weight) * mlm, mlm, kd, True)
