"""Cross-entropy to the teacher estimated from tokens drawn from it (Sparse Logit Sampling:
Anshumann et al., ACL 2025, arXiv 2503.16870).

The store draws its tokens from the teacher's full distribution itself (``distill.causal.logprobs``:
inverse CDF), so the paper's importance weights ``p / r`` are all one: the proposal ``r`` is ``p``.
The estimate is then unbiased for the cross-entropy to the teacher's distribution carried through
the map (and exactly so in a shared vocabulary), with no tail lost and no head renormalised.
"""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

from lmalgebra.train.cross_tokenizer.common import (
    CausalLoss,
    LossBatch,
    Mean,
    batch_mean,
    real,
    teacher_rows,
)


def sampled_ce(
    logits: torch.Tensor,
    aligned: torch.Tensor,
    sample_ids: torch.Tensor,
    vocab_map: torch.Tensor,
    mask: torch.Tensor,
    sample_counts: torch.Tensor | None = None,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """With K tokens ``x_1..x_K`` drawn from the teacher's next-token distribution (with
    replacement) and mapped into the student vocabulary::

        CE ≈ -(1/K) sum_j log q(map(x_j))

    With ``sample_counts`` each distinct id counts that many times (``-sum_j c_j log q / sum_j
    c_j``); ids below 0 are padding.

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``sample_ids (B, T, K)``, ``vocab_map
    (V_teacher,)``, ``mask (B, S)``, ``sample_counts (B, T, K)`` or None -> scalar mean over
    aligned positions with at least one sample.
    """
    ids, has = teacher_rows(sample_ids.long(), aligned)
    logprobs = nnf.log_softmax(real(logits), dim=-1)
    if sample_counts is None:
        weights = torch.ones_like(ids, dtype=logprobs.dtype)
    else:
        weights = teacher_rows(sample_counts, aligned)[0].to(logprobs.dtype)
    weights = torch.where(ids >= 0, weights, weights.new_zeros(()))
    mapped = vocab_map.to(ids.device)[ids.clamp(min=0)]
    total = weights.sum(-1)
    keep = mask & has & (total > 0)
    estimate = -(weights * logprobs.gather(-1, mapped)).sum(-1) / total.clamp(min=1e-12)
    return mean(estimate, keep)


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    if batch.sample_ids is None:
        raise ValueError("the sampled loss needs a batch with the teacher's drawn tokens")
    identity = torch.arange(logits.shape[-1], device=logits.device)  # ids are student ids
    return sampled_ce(logits, batch.mined, batch.sample_ids, identity, batch.mask, mean=mean)


LOSS = CausalLoss(
    "sampled",
    term,
    frozenset({"mined", "samples"}),
    tempered=False,
    summary="cross-entropy to tokens drawn from the teacher (unbiased), at MinED-aligned positions",
)
