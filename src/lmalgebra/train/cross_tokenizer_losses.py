"""Distillation losses between a causal student and a causal teacher whose tokenizers differ.

Conventions for a batch of ``B`` texts (padded):

- ``logits (B, S, V)``: row ``s`` holds the student's logits for its token ``s`` given its tokens
  before ``s`` (the model's output one input position earlier), ``student_ids (B, S) int64`` its
  tokens and ``mask (B, S) bool`` the positions that count.
- The teacher's store rows of the same texts (``distill.causal.store``): ``topk_ids (B, T, k)``,
  ``topk_logprobs (B, T, k)``, ``next_logprob (B, T)``, ``sample_ids (B, T, K)``; row ``t`` is about
  the teacher's token ``t`` given its tokens before it. Rows holding NaN (no context) are skipped.
- ``aligned (B, S) int64``: the teacher row aligned to each student position, -1 for none
  (``distill.vocab.byte_alignment``: MinED alignment or chunk starts);
  ``vocab_map (V_teacher,) int64``: the student id of each teacher id (``distill.vocab.mined_map``).

Every loss is a mean over the positions (or chunks) that count, zero when none does: by default
over this batch (:func:`batch_mean`); data-parallel ranks pass ``mean=`` one that divides by the
global batch's count (``train.data_parallel.global_mean``). Teacher tensors are detached: gradients
flow to the student logits only. Inputs in float64 are computed in float64, anything else in
float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as nnf


def _real(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.float64 else x.float()


# (values, keep) -> the mean of ``values`` where ``keep`` (entries not kept may hold NaN or inf)
Mean = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def batch_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``keep``; masked entries may hold NaN or inf; zero if none kept."""
    kept = torch.where(keep, values, values.new_zeros(()))
    return kept.sum() / keep.sum().clamp(min=1)


def _teacher_rows(values: torch.Tensor, aligned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``values (B, T, ...)`` at ``aligned (B, S)`` -> ``(B, S, ...)``, and ``(B, S) bool`` where a
    row is aligned."""
    has = aligned >= 0
    batch = torch.arange(aligned.shape[0], device=aligned.device)[:, None]
    return values.detach()[batch, aligned.clamp(min=0)], has


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, stable at both ends (Mächler 2012)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def ce_loss(
    logits: torch.Tensor, student_ids: torch.Tensor, mask: torch.Tensor, mean: Mean = batch_mean
) -> torch.Tensor:
    """Next-token cross-entropy on the text (the baseline): ``mean_s -log q(x_s | x_<s)``.

    ``logits (B, S, V)``, ``student_ids (B, S) int64``, ``mask (B, S) bool`` -> scalar.
    """
    logprobs = nnf.log_softmax(_real(logits), dim=-1)
    picked = logprobs.gather(-1, student_ids.clamp(min=0)[..., None])[..., 0]
    return mean(-picked, mask)


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
    """MinED-aligned KL (FuseLLM: Wan et al., ICLR 2024, arXiv 2401.10491).

    At each student position ``s`` aligned to teacher row ``t``: the teacher's top-k, renormalised
    over its k entries (the tail mass is dropped, as in the masked-LM path's KD), ``p_j =
    softmax(v_j / T)``, is carried into the student vocabulary by the MinED map; entries mapped to
    one student token add up: ``P(u) = sum_{j: map(i_j) = u} p_j``. With ``log Q = log_softmax(z /
    T)`` over the full student vocabulary::

        KL(P || Q) = sum_u P(u) (log P(u) - log Q(u))
                   = sum_j p_j (log P(map(i_j)) - log Q(map(i_j)))

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``topk_ids (B, T, k)``, ``topk_logprobs (B, T,
    k)``, ``vocab_map (V_teacher,)``, ``mask (B, S) bool`` -> scalar mean over aligned positions.
    Memory: one ``(B, S, k, k)`` comparison to add up merged entries.
    """
    values, has = _teacher_rows(_real(topk_logprobs), aligned)
    ids, _ = _teacher_rows(topk_ids.long(), aligned)
    keep = mask & has & ~values.isnan().any(-1) & (values > -math.inf).any(-1)
    values = torch.where(keep[..., None], values, values.new_zeros(()))
    p = torch.softmax(values / temperature, dim=-1)
    mapped = vocab_map.to(ids.device)[ids]  # (B, S, k) student ids
    same = mapped[..., :, None] == mapped[..., None, :]
    merged = (same.to(p.dtype) * p[..., None, :]).sum(-1)
    log_q = nnf.log_softmax(_real(logits) / temperature, dim=-1).gather(-1, mapped)
    terms = torch.where(p > 0, p * (merged.log() - log_q), p.new_zeros(()))
    return mean(terms.sum(-1), keep)


def uld_loss(
    logits: torch.Tensor,
    aligned: torch.Tensor,
    topk_logprobs: torch.Tensor,
    mask: torch.Tensor,
    student_top: int | None = None,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """Universal Logit Distillation (Boizard et al. 2024, arXiv 2402.12030).

    The Wasserstein distance with uniform transport cost between two next-token distributions has
    the closed form ``sum_r |t_(r) - s_(r)|`` over both probability vectors sorted decreasingly, the
    shorter padded with zeros, whatever the tokens are. The teacher's vector is its k stored
    probabilities ``exp(v)`` as they are: its tail (``1 - sum exp(v)``) counts as zeros, so the
    loss exceeds the full-distribution distance by at most that tail mass. The student's vector is
    its whole distribution (``student_top=None``: the ranks past k add ``1 - sum of its top k``) or
    its top ``student_top`` probabilities.

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``topk_logprobs (B, T, k)``, ``mask (B, S)``
    -> scalar mean over aligned positions.
    """
    values, has = _teacher_rows(_real(topk_logprobs), aligned)
    keep = mask & has & ~values.isnan().any(-1)
    teacher = torch.where(keep[..., None], values.exp(), values.new_zeros(()))
    teacher = teacher.sort(dim=-1, descending=True).values
    probs = torch.softmax(_real(logits), dim=-1)
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


def alm_loss(
    logits: torch.Tensor,
    student_ids: torch.Tensor,
    mask: torch.Tensor,
    student_chunk: torch.Tensor,
    next_logprob: torch.Tensor,
    teacher_chunk: torch.Tensor,
    temperature: float = 1.0,
    epsilon: float = 1e-6,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """Approximate Likelihood Matching on aligned chunks (Minixhofer, Vulić and Ponti 2025,
    arXiv 2503.20083).

    A chunk's log-likelihood is the sum of its tokens' next-token log-probabilities: ``l_t`` from
    the teacher's stored ``next_logprob``, ``l_s = sum log q(x_s | x_<s)`` from the student. Each
    is read as a Bernoulli probability ``p = exp(l / τ - ε)`` (``ε`` keeps ``p < 1``, shifting both
    sides alike) and the chunks' binary KL is averaged::

        KL(Bern(p_t) || Bern(p_s)) = p_t (log p_t - log p_s)
                                     + (1 - p_t) (log1mexp(log p_t) - log1mexp(log p_s))

    It is zero exactly when the chunk likelihoods agree, and needs no top-k. The paper's
    reference code (tokenkit) uses the binary cross-entropy, which differs from this by the
    teacher's binary entropy (a constant: same gradients).

    Shapes: ``logits (B, S, V)``, ``student_ids (B, S)``, ``mask (B, S) bool``, ``student_chunk
    (B, S) int64`` and ``teacher_chunk (B, T) int64`` chunk indices (-1: no chunk, padding),
    ``next_logprob (B, T)`` -> scalar mean over the chunks with tokens on both sides, every student
    token in ``mask`` and no NaN teacher row (a token without context spoils its chunk).
    """
    picked = nnf.log_softmax(_real(logits), dim=-1).gather(-1, student_ids.clamp(min=0)[..., None])
    student = picked[..., 0]
    teacher = _real(next_logprob).detach()
    chunks = 1 + max(
        (int(c.max()) for c in (student_chunk, teacher_chunk) if c.numel()), default=-1
    )
    l_s, n_s = _chunk_sums(student, student_chunk, chunks)
    masked, _ = _chunk_sums((~mask).to(student.dtype), student_chunk, chunks)
    missing = teacher.isnan()
    l_t, n_t = _chunk_sums(torch.where(missing, 0.0, teacher), teacher_chunk, chunks)
    holes, _ = _chunk_sums(missing.to(teacher.dtype), teacher_chunk, chunks)
    keep = (n_s > 0) & (n_t > 0) & (holes == 0) & (masked == 0)
    x_t = l_t.clamp(max=0) / temperature - epsilon
    x_s = l_s.clamp(max=0) / temperature - epsilon
    binary_kl = x_t.exp() * (x_t - x_s) - torch.expm1(x_t) * (log1mexp(x_t) - log1mexp(x_s))
    return mean(binary_kl, keep)


def _chunk_sums(
    values: torch.Tensor, chunk: torch.Tensor, chunks: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-chunk sums and token counts: ``values (B, N)``, ``chunk (B, N)`` (-1: none) ->
    ``(B, chunks)`` twice."""
    slot = torch.where(chunk >= 0, chunk, chunks)  # a spare last slot takes the unchunked
    sums = values.new_zeros(values.shape[0], chunks + 1).scatter_add(1, slot, values)
    counts = values.new_zeros(values.shape[0], chunks + 1).scatter_add(
        1, slot, torch.ones_like(values)
    )
    return sums[:, :chunks], counts[:, :chunks]


def sampled_ce(
    logits: torch.Tensor,
    aligned: torch.Tensor,
    sample_ids: torch.Tensor,
    vocab_map: torch.Tensor,
    mask: torch.Tensor,
    sample_counts: torch.Tensor | None = None,
    mean: Mean = batch_mean,
) -> torch.Tensor:
    """Cross-entropy to the teacher estimated from sampled tokens (Sparse Logit Sampling:
    Anshumann et al., ACL 2025, arXiv 2503.16870).

    With K tokens ``x_1..x_K`` drawn from the teacher's next-token distribution (with replacement)
    and mapped into the student vocabulary by the MinED map::

        CE ≈ -(1/K) sum_j log q(map(x_j))

    unbiased for the cross-entropy to the teacher's distribution carried through the map. With
    ``sample_counts`` each distinct id counts that many times (``-sum_j c_j log q / sum_j c_j``);
    ids below 0 are padding.

    Shapes: ``logits (B, S, V)``, ``aligned (B, S)``, ``sample_ids (B, T, K)``, ``vocab_map
    (V_teacher,)``, ``mask (B, S)``, ``sample_counts (B, T, K)`` or None -> scalar mean over
    aligned positions with at least one sample.
    """
    ids, has = _teacher_rows(sample_ids.long(), aligned)
    logprobs = nnf.log_softmax(_real(logits), dim=-1)
    if sample_counts is None:
        weights = torch.ones_like(ids, dtype=logprobs.dtype)
    else:
        weights = _teacher_rows(sample_counts, aligned)[0].to(logprobs.dtype)
    weights = torch.where(ids >= 0, weights, weights.new_zeros(()))
    mapped = vocab_map.to(ids.device)[ids.clamp(min=0)]
    total = weights.sum(-1)
    keep = mask & has & (total > 0)
    estimate = -(weights * logprobs.gather(-1, mapped)).sum(-1) / total.clamp(min=1e-12)
    return mean(estimate, keep)
