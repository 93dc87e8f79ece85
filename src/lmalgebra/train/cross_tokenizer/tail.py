"""KL to the teacher's top-k with its remaining mass kept as one bucket, so that the target is a
distribution (the tail is neither dropped nor spread over the head by renormalisation).

The teacher's stored top-k log-probabilities are exact (over its full vocabulary), so the tail
mass ``1 - sum_j p_j`` is known without storing anything more. Carried into the student's
vocabulary, the top-k entries land on a set ``U`` of student ids (entries on one id add up) and
the tail faces the student's mass outside ``U``::

    KL = sum_{u in U} P(u) log(P(u) / Q(u)) + P_tail log(P_tail / Q_tail),
    P_tail = 1 - sum_u P(u),  Q_tail = 1 - sum_{u in U} Q(u)

which is the KL between the two full distributions coarse-grained to the partition ``{u} for u in
U, the rest``: zero when the student matches the teacher on it. With the student's own tokenizer
and ``k`` large, it is same-tokenizer KD (the ceiling cross-tokenizer losses are measured
against). The temperature is one (a tempered tail needs the full distribution).
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

from lmalgebra.train.cross_tokenizer.common import (
    CausalLoss,
    LossBatch,
    Mean,
    batch_mean,
    log1mexp,
    merged_probabilities,
    real,
    teacher_rows,
)

# the student's mass outside the teacher's ids is taken as at least this (log space), so that a
# student sure of the head still gets a finite loss and gradient from a teacher's tail
_LEAST_TAIL = -1e-6


def tail_kl(
    logits: torch.Tensor,
    aligned: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """The top-k-plus-tail KL above at each student position ``s`` aligned to teacher row ``t``.

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``topk_ids (B, T, k) int64`` in student ids,
    ``topk_logprobs (B, T, k)`` (the teacher's log-probabilities, not renormalised), ``mask (B, S)
    bool`` -> scalar mean over aligned positions whose row has no NaN.
    """
    values, has = teacher_rows(real(topk_logprobs), aligned)
    ids, _ = teacher_rows(topk_ids.long(), aligned)
    keep = mask & has & ~values.isnan().any(-1)
    p = torch.where(keep[..., None], values.exp(), values.new_zeros(()))
    merged, first = merged_probabilities(p, ids)
    log_q = nnf.log_softmax(real(logits), dim=-1).gather(-1, ids)
    head = torch.where(p > 0, p * (merged.log() - log_q), p.new_zeros(())).sum(-1)
    p_tail = (1 - p.sum(-1)).clamp(min=0)
    inside = torch.where(first, log_q, log_q.new_full((), -torch.inf)).logsumexp(-1)
    log_q_tail = log1mexp(inside.clamp(max=_LEAST_TAIL))
    safe = torch.where(p_tail > 0, p_tail, p_tail.new_ones(()))
    tail = torch.where(p_tail > 0, p_tail * (safe.log() - log_q_tail), p_tail.new_zeros(()))
    return mean(head + tail, keep)


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    return tail_kl(logits, batch.mined, batch.topk_ids, batch.topk_logprobs, batch.mask, mean)


LOSS = CausalLoss(
    "tail_kl",
    term,
    frozenset({"mined"}),
    tempered=False,
    summary="KL to the teacher's top-k plus its remaining mass, by the MinED map at MinED-aligned "
    "positions (same-tokenizer KD when the teacher shares the student's tokenizer)",
)
