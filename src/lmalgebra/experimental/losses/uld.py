"""Universal Logit Distillation (Boizard et al. 2024, arXiv 2402.12030): the Wasserstein distance
with uniform transport cost between sorted next-token distributions, token identities ignored."""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

from lmalgebra.experimental import warn_feature
from lmalgebra.train.cross_tokenizer.common import (
    CausalLoss,
    LossBatch,
    Mean,
    batch_mean,
    real,
    teacher_rows,
)

warn_feature("training.objective_mix: uld")


def uld_loss(
    logits: torch.Tensor,
    aligned: torch.Tensor,
    topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    student_top: int | None = None,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """The closed form ``sum_r |t_(r) - s_(r)|`` over both probability vectors sorted decreasingly,
    the shorter padded with zeros, whatever the tokens are. The teacher's vector is its k stored
    probabilities ``exp(v)`` as they are: its tail (``1 - sum exp(v)``) counts as zeros, so the
    loss exceeds the full-distribution distance by at most that tail mass. The student's vector is
    its whole distribution (``student_top=None``: the ranks past k add ``1 - sum of its top k``) or
    its top ``student_top`` probabilities.

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``topk_logprobs (B, T, k)``, ``mask (B, S)``
    -> scalar mean over aligned positions.
    """
    values, has = teacher_rows(real(topk_logprobs), aligned)
    keep = mask & has & ~values.isnan().any(-1)
    teacher = torch.where(keep[..., None], values.exp(), values.new_zeros(()))
    teacher = teacher.sort(dim=-1, descending=True).values
    probs = torch.softmax(real(logits), dim=-1)
    vocab, k = probs.shape[-1], teacher.shape[-1]
    kept = vocab if student_top is None else min(student_top, vocab)
    head = min(k if student_top is None else max(k, kept), vocab)
    student = probs.topk(head, dim=-1).values
    if head > kept:
        student = torch.cat([student[..., :kept], torch.zeros_like(student[..., kept:])], -1)
    width = max(k, head)
    gaps = nnf.pad(teacher, (0, width - k)) - nnf.pad(student, (0, width - head))
    distance = gaps.abs().sum(-1)
    if student_top is None:  # the student's ranks past k face the teacher's zeros
        distance = distance + (1 - student.sum(-1)).clamp(min=0)
    return mean(distance, keep)


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    return uld_loss(logits, batch.chunk_start, batch.topk_logprobs, batch.mask, mean=mean)


LOSS = CausalLoss(
    "uld",
    term,
    frozenset({"chunks"}),
    tempered=False,
    summary="sorted-probability (Wasserstein) distance at chunk starts, token identities ignored",
)
