"""Masked-LM and distillation losses over masked positions, from one normalisation of the logits.

With student logits ``z`` at the masked positions and the teacher's stored top-k ids ``j_1..j_k``
and log-probabilities ``v_1..v_k``:

- MLM: cross-entropy of the gold labels under ``softmax(z)`` over the full student vocabulary.
- KD: cross-entropy of the teacher's distribution ``p = softmax(v / T)`` (renormalised over its k
  entries) against the student's log-probabilities ``log softmax(z / T)`` over the full student
  vocabulary, gathered at the teacher's (mapped) ids: ``-sum_i p_i log q(j_i)``.

Both are means over the masked tokens that carry them. ``combined_loss`` computes them in one
autograd node: one log-softmax of the logits serves both terms (at ``T = 1``; another temperature
needs its own), and the backward pass writes the gradient, ``(softmax(z) - target) / n`` with a
target mixing the gold one-hot and the teacher's top-k, into one buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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


class _MaskedLosses(torch.autograd.Function):
    """``(mlm, kd)`` means from ``logits (n, vocab)``; ``kd`` is 0 without teacher outputs."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        topk_ids: torch.Tensor | None,
        teacher: torch.Tensor | None,
        temperature: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = logits.float()
        logprobs = torch.log_softmax(z, dim=-1)  # (n, vocab), freed after the forward pass
        mlm = -logprobs.gather(1, labels[:, None]).mean()
        kd = torch.zeros((), device=z.device)
        if topk_ids is not None and teacher is not None:
            if temperature != 1.0:
                logprobs = torch.log_softmax(z / temperature, dim=-1)
            kd = -(teacher * logprobs.gather(1, topk_ids)).sum(dim=-1).mean()
        ctx.save_for_backward(logits, labels, topk_ids, teacher)
        ctx.temperature = temperature
        return mlm, kd

    @staticmethod
    def backward(
        ctx: Any, grad_mlm: torch.Tensor, grad_kd: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        logits, labels, topk_ids, teacher = ctx.saved_tensors
        temperature, rows = ctx.temperature, logits.shape[0]
        z = logits.float()
        g_mlm = grad_mlm / rows
        g_kd = grad_kd / (rows * temperature) if teacher is not None else torch.zeros_like(g_mlm)
        if temperature == 1.0:  # one softmax serves both terms
            grad = torch.softmax(z, dim=-1).mul_(g_mlm + g_kd)
        else:
            grad = torch.softmax(z, dim=-1).mul_(g_mlm)
            grad.add_(torch.softmax(z / temperature, dim=-1).mul_(g_kd))
        grad.scatter_add_(1, labels[:, None], (-g_mlm).expand(rows, 1).contiguous())
        if teacher is not None:
            grad.scatter_add_(1, topk_ids, teacher * -g_kd)
        return grad.to(logits.dtype), None, None, None, None


def combined_loss(
    logits: torch.Tensor,
    labels: torch.Tensor,
    weight: float,
    topk_ids: torch.Tensor | None = None,
    topk_logprobs: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> LossParts:
    """``weight * KD + (1 - weight) * MLM``; gold only when no teacher outputs are given.

    ``logits (n, vocab)`` (any float dtype; the losses are computed in float32), ``labels (n,)
    int64``, ``topk_ids (n, k) int64``, ``topk_logprobs (n, k)``.
    """
    if topk_ids is None or topk_logprobs is None:
        mlm, _ = _MaskedLosses.apply(logits, labels, None, None, 1.0)
        return LossParts(mlm, mlm, torch.zeros((), device=mlm.device), False)
    teacher = torch.softmax(topk_logprobs.float() / temperature, dim=-1)
    mlm, kd = _MaskedLosses.apply(logits, labels, topk_ids, teacher, float(temperature))
    return LossParts(weight * kd + (1 - weight) * mlm, mlm, kd, True)
