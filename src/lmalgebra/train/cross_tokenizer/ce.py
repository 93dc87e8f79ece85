"""CE only (the baseline): the student's next-token cross-entropy on the text, optionally with
label smoothing (the regularisation of soft targets without a teacher)."""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

from lmalgebra.train.cross_tokenizer.common import CausalLoss, LossBatch, Mean, batch_mean, real


def ce_loss(
    logits: torch.Tensor,
    student_ids: torch.Tensor,
    mask: torch.Tensor,
    mean: Mean = batch_mean,
    smoothing: float = 0.0,
) -> torch.Tensor:
    """``mean_s [(1 - ε) (-log q(x_s | x_<s)) + ε mean_v (-log q(v | x_<s))]``, ``ε`` =
    ``smoothing`` (0: plain cross-entropy; the convention of ``torch.nn.CrossEntropyLoss``).

    ``logits (B, S, V)``, ``student_ids (B, S) int64``, ``mask (B, S) bool`` -> scalar.
    """
    logprobs = nnf.log_softmax(real(logits), dim=-1)
    nll = -logprobs.gather(-1, student_ids.clamp(min=0)[..., None])[..., 0]
    if smoothing:
        nll = (1 - smoothing) * nll - smoothing * logprobs.mean(-1)
    return mean(nll, mask)


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    return ce_loss(logits, batch.targets, batch.mask, mean)


LOSS = CausalLoss(
    "ce",
    term,
    frozenset(),
    tempered=False,
    summary="CE only: no teacher (the baseline; stands alone in a mix)",
)
