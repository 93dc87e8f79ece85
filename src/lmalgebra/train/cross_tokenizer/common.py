"""What every cross-tokenizer loss shares: the batch it reads, the mean it takes, teacher rows
gathered at aligned positions, and a stable ``log(1 - exp(x))``.

Conventions for a batch of ``B`` texts (padded):

- ``logits (B, S, V)``: row ``s`` holds the student's logits for its token ``s`` given its tokens
  before ``s`` (the model's output one input position earlier), ``student_ids (B, S) int64`` its
  tokens and ``mask (B, S) bool`` the positions that count.
- The teacher's store rows of the same texts (``distill.causal.store``): ``topk_ids (B, T, k)``,
  ``topk_logprobs (B, T, k)``, ``next_logprob (B, T)``, ``sample_ids (B, T, K)``; row ``t`` is about
  the teacher's token ``t`` given its tokens before it. Rows holding NaN (no context) are skipped.
- ``aligned (B, S) int64``: the teacher row aligned to each student position, -1 for none
  (``distill.vocab.byte_alignment``: MinED alignment or chunk starts);
  ``vocab_map (V_teacher,) int64``: the student id of each teacher id (``distill.vocab``).

Every loss is a mean over the positions (or chunks) that count, zero when none does: by default
over this batch (:func:`batch_mean`); data-parallel ranks pass ``mean=`` one that divides by the
global batch's count (``train.data_parallel.global_mean``). Teacher tensors are detached: gradients
flow to the student logits only. Inputs in float64 are computed in float64, anything else in
float32.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

# (values, keep) -> the mean of ``values`` where ``keep`` (entries not kept may hold NaN or inf)
Mean = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class LossBatch(Protocol):
    """What a loss term reads of a training batch (``distill.causal.student_data.CausalBatch``);
    a field the batch was not asked to carry holds -1 (alignments) or None."""

    targets: torch.Tensor  # (B, S) int64: the student's tokens
    mask: torch.Tensor  # (B, S) bool
    mined: torch.Tensor  # (B, S) int64: MinED-aligned teacher row
    chunk_start: torch.Tensor  # (B, S) int64: the chunk's first teacher row at its first token
    student_chunk: torch.Tensor  # (B, S) int64
    teacher_chunk: torch.Tensor  # (B, T) int64
    next_logprob: torch.Tensor  # (B, T)
    topk_ids: torch.Tensor  # (B, T, k) int64, student ids by the MinED map
    topk_logprobs: torch.Tensor  # (B, T, k)
    prefix_ids: torch.Tensor | None  # (B, T, k) int64, student ids by the prefix map
    # (B, S, k): each student position's target (``distill.vocab.position_targets``)
    position_ids: torch.Tensor | None  # int64, student ids (-1: no target)
    position_logprobs: torch.Tensor | None  # log-probabilities (NaN: no target)
    sample_ids: torch.Tensor | None  # (B, T, K) int64, student ids by the MinED map


def real(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float64 if it is, else in float32 (the precision losses are computed in)."""
    return x if x.dtype == torch.float64 else x.float()


def batch_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean of ``values`` where ``keep``; masked entries may hold NaN or inf; zero if none kept."""
    kept = torch.where(keep, values, values.new_zeros(()))
    return kept.sum() / keep.sum().clamp(min=1)


def teacher_rows(values: torch.Tensor, aligned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``values (B, T, ...)`` at ``aligned (B, S)`` -> ``(B, S, ...)``, and ``(B, S) bool`` where a
    row is aligned."""
    has = aligned >= 0
    batch = torch.arange(aligned.shape[0], device=aligned.device)[:, None]
    return values.detach()[batch, aligned.clamp(min=0)], has


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, stable at both ends (Mächler 2012)."""
    return torch.where(x > -math.log(2.0), torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def merged_probabilities(
    p: torch.Tensor, mapped: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Teacher entries carried into student ids: ``p (..., k)`` at ``mapped (..., k)`` -> for each
    entry the total probability of its student id (entries on one id add up), and ``(..., k)
    bool`` the first entry of each id (to count an id once). Memory: one ``(..., k, k)``
    comparison."""
    same = mapped[..., :, None] == mapped[..., None, :]
    merged = (same.to(p.dtype) * p[..., None, :]).sum(-1)
    earlier = torch.ones(same.shape[-2:], dtype=torch.bool, device=p.device).tril(-1)
    first = ~(same & earlier).any(-1)
    return merged, first


# (student logits (B, S, V), batch, temperature, mean) -> the loss term, a scalar
Term = Callable[[torch.Tensor, LossBatch, float, Mean], torch.Tensor]
# what a batch can carry for a loss: ALM's chunks and ULD's chunk starts, the MinED alignment, the
# teacher's drawn tokens, its top-k carried by the prefix map, a target at every student position
NEEDS = frozenset({"chunks", "mined", "samples", "prefix", "positions"})


@dataclass(frozen=True)
class CausalLoss:
    """One entry of the table of distillation losses (``registry.LOSSES``).

    Attributes:
        name: the key in ``training.objective_mix``.
        term: computes the loss of a batch.
        needs: what the batch must carry for it (a subset of ``NEEDS``).
        tempered: whether ``training.temperature`` changes it.
        summary: one line for the settings' help and the docs.
    """

    name: str
    term: Term
    needs: frozenset[str]
    tempered: bool
    summary: str

    def __post_init__(self) -> None:
        if not self.needs <= NEEDS:
            raise ValueError(f"loss {self.name!r} needs {sorted(self.needs - NEEDS)}: unknown")
