"""Approximate Likelihood Matching on aligned chunks (Minixhofer, Vulić and Ponti 2025, arXiv
2503.20083): chunk likelihoods matched as Bernoulli probabilities; needs no top-k."""

from __future__ import annotations

import torch
import torch.nn.functional as nnf

from lmalgebra.train.cross_tokenizer.common import (
    CausalLoss,
    LossBatch,
    Mean,
    batch_mean,
    log1mexp,
    real,
)


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
    """A chunk's log-likelihood is the sum of its tokens' next-token log-probabilities: ``l_t`` from
    the teacher's stored ``next_logprob``, ``l_s = sum log q(x_s | x_<s)`` from the student. Each
    is read as a Bernoulli probability ``p = exp(l / τ - ε)`` (``ε`` keeps ``p < 1``, shifting both
    sides alike) and the chunks' binary KL is averaged::

        KL(Bern(p_t) || Bern(p_s)) = p_t (log p_t - log p_s)
                                     + (1 - p_t) (log1mexp(log p_t) - log1mexp(log p_s))

    It is zero exactly when the chunk likelihoods agree. The paper's reference code (tokenkit)
    uses the binary cross-entropy, which differs from this by the teacher's binary entropy (a
    constant: same gradients).

    Shapes: ``logits (B, S, V)``, ``student_ids (B, S)``, ``mask (B, S) bool``, ``student_chunk
    (B, S) int64`` and ``teacher_chunk (B, T) int64`` chunk indices (-1: no chunk, padding),
    ``next_logprob (B, T)`` -> scalar mean over the chunks with tokens on both sides, every student
    token in ``mask`` and no NaN teacher row (a token without context spoils its chunk).
    """
    picked = nnf.log_softmax(real(logits), dim=-1).gather(-1, student_ids.clamp(min=0)[..., None])
    student = picked[..., 0]
    teacher = real(next_logprob).detach()
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


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    return alm_loss(
        logits,
        batch.targets,
        batch.mask,
        batch.student_chunk,
        batch.next_logprob,
        batch.teacher_chunk,
        temperature,
        mean=mean,
    )


LOSS = CausalLoss(
    "alm",
    term,
    frozenset({"chunks"}),
    tempered=True,
    summary="binary KL between chunk likelihoods on aligned chunks (no top-k needed)",
)
