"""MinED-aligned KL (FuseLLM: Wan et al., ICLR 2024, arXiv 2401.10491): the teacher's top-k,
renormalised over its k entries, carried into the student vocabulary by the MinED map."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as nnf

from lmalgebra.experimental import warn_feature
from lmalgebra.train.cross_tokenizer.common import (
    CausalLoss,
    LossBatch,
    Mean,
    batch_mean,
    merged_probabilities,
    real,
    teacher_rows,
)

warn_feature("training.objective_mix: mined_kl")


def mined_kl(
    logits: torch.Tensor,
    aligned: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_logprobs: torch.Tensor,
    vocab_map: torch.Tensor,
    mask: torch.Tensor,
    temperature: float = 1.0,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """At each student position ``s`` aligned to teacher row ``t``: the teacher's top-k,
    renormalised over its k entries (the tail mass is dropped, as in the masked-LM path's KD),
    ``p_j = softmax(v_j / T)``, is carried into the student vocabulary by the map; entries mapped
    to one student token add up: ``P(u) = sum_{j: map(i_j) = u} p_j``. With ``log Q =
    log_softmax(z / T)`` over the full student vocabulary::

        KL(P || Q) = sum_u P(u) (log P(u) - log Q(u))
                   = sum_j p_j (log P(map(i_j)) - log Q(map(i_j)))

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``topk_ids (B, T, k)``, ``topk_logprobs (B, T,
    k)``, ``vocab_map (V_teacher,)``, ``mask (B, S) bool`` -> scalar mean over aligned positions.
    """
    values, has = teacher_rows(real(topk_logprobs), aligned)
    ids, _ = teacher_rows(topk_ids.long(), aligned)
    keep = mask & has & ~values.isnan().any(-1) & (values > -math.inf).any(-1)
    values = torch.where(keep[..., None], values, values.new_zeros(()))
    p = torch.softmax(values / temperature, dim=-1)
    mapped = vocab_map.to(ids.device)[ids]  # (B, S, k) student ids
    merged, _ = merged_probabilities(p, mapped)
    log_q = nnf.log_softmax(real(logits) / temperature, dim=-1).gather(-1, mapped)
    terms = torch.where(p > 0, p * (merged.log() - log_q), p.new_zeros(()))
    return mean(terms.sum(-1), keep)


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    identity = torch.arange(logits.shape[-1], device=logits.device)  # ids are student ids
    return mined_kl(
        logits,
        batch.mined,
        batch.topk_ids,
        batch.topk_logprobs,
        identity,
        batch.mask,
        temperature,
        mean=mean,
    )


LOSS = CausalLoss(
    "mined_kl",
    term,
    frozenset({"mined"}),
    tempered=True,
    summary="KL to the teacher's top-k renormalised, by the MinED map at MinED-aligned positions",
)
