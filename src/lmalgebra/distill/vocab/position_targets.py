"""A teacher's next-token distribution at every student position, in student ids: at chunk starts
the top-k by the prefix map (``prefix_map``), inside a teacher token the top-k conditioned on the
bytes of it already read.

A student token that starts at byte ``p`` inside the teacher token ``t`` (spanning ``[a, b)``,
``a < p < b``) follows ``c = data[a:p]``, which the teacher has not finished a token of. The
teacher's stored top-k of row ``t`` (its distribution over the token starting at ``a``) says
what follows ``c`` through the tokens whose bytes begin with ``c`` and go past it: such a token
``v`` continues the text with ``surface(v)[len(c):]``, whose longest student-token prefix is the
student's next token as far as ``v`` is concerned. Their probabilities, renormalised over those
tokens, are the target: the tokens that end exactly at ``p`` (whose continuation the store does
not hold) and the tail beyond the top-k drop out, so the target is the teacher's conditional on
its stored head. A position whose teacher token does not spell its bytes (an inserted space, a
lower-cased or unknown token) or whose head holds no such token gets none.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from lmalgebra.distill.vocab.token_forms import (
    backend_of,
    detect_convention,
    token_surface,
    word_marker,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast


def vocabulary_surfaces(tokenizer: PreTrainedTokenizerFast, name: str) -> list[bytes | None]:
    """The bytes each id spells (``token_forms.token_surface``); None for added tokens and ids
    without a token."""
    convention = detect_convention(tokenizer, name)
    marker = word_marker(backend_of(tokenizer, name), convention)
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=False)
    added = set(tokenizer.added_tokens_decoder)
    out: list[bytes | None] = [None] * max(len(tokenizer), max(vocab.values(), default=-1) + 1)
    for token, index in vocab.items():
        if index not in added:
            out[index] = token_surface(token, convention, marker)
    return out


@dataclass
class PositionTargets:
    """Builds each student position's target from one teacher's records (see the module doc).

    Attributes:
        teacher: the bytes of each teacher id (None: never a continuation).
        student: the bytes of each student id (None: never a target).
        prefix: ``(V_teacher,) int64`` the prefix map (chunk starts).
    """

    teacher: list[bytes | None]
    student: list[bytes | None]
    prefix: np.ndarray
    _index: dict[bytes, int] = field(init=False, repr=False)
    _longest: int = field(init=False, repr=False)
    _memo: dict[tuple[int, int], int] = field(init=False, repr=False, default_factory=dict)

    def __post_init__(self) -> None:
        self._index = {}
        for i, surface in enumerate(self.student):
            if surface:
                self._index.setdefault(surface, i)
        self._longest = max(map(len, self._index), default=0)

    def continuation(self, teacher_id: int, read: bytes) -> int:
        """The student id whose bytes are the longest prefix of what teacher token
        ``teacher_id`` spells past ``read``; -1 when it does not begin with ``read`` and go past
        it, or no student token begins its rest."""
        surface = self.teacher[teacher_id] if teacher_id < len(self.teacher) else None
        if surface is None or len(surface) <= len(read) or not surface.startswith(read):
            return -1
        key = (teacher_id, len(read))
        if (hit := self._memo.get(key)) is None:
            rest = surface[len(read) :]
            lengths = range(min(len(rest), self._longest), 0, -1)
            hit = next((self._index[p] for n in lengths if (p := rest[:n]) in self._index), -1)
            self._memo[key] = hit
        return hit

    def of_example(
        self,
        data: bytes,
        teacher_ids: np.ndarray,
        teacher_offsets: np.ndarray,
        topk_ids: np.ndarray,
        topk_logprobs: np.ndarray,
        student_offsets: np.ndarray,
        chunk_start: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(n_s, k) int64`` student ids and ``(n_s, k) float32`` log-probabilities of each
        student position's target: the prefix-mapped top-k as stored at chunk starts (its tail
        is ``1 - sum``), the conditioned head renormalised inside a teacher token (an entry left
        out repeats a kept id at probability 0); -1 and NaN where a position has none.

        ``teacher_ids (n_t,)``, ``teacher_offsets (n_t, 2)``, ``topk_* (n_t, k)`` are the
        teacher's record, ``student_offsets (n_s, 2)`` the student's byte offsets and
        ``chunk_start (n_s,)`` the chunk-start alignment (``byte_alignment``)."""
        n_s, k = len(student_offsets), topk_ids.shape[1]
        ids = np.full((n_s, k), -1, dtype=np.int64)
        values = np.full((n_s, k), np.nan, dtype=np.float32)
        starts = teacher_offsets[:, 0]
        for s in range(n_s):
            if (t := int(chunk_start[s])) >= 0:
                ids[s], values[s] = self.prefix[topk_ids[t]], topk_logprobs[t]
                continue
            p = int(student_offsets[s, 0])
            t = int(np.searchsorted(starts, p, side="right")) - 1
            if t < 0 or not starts[t] < p < teacher_offsets[t, 1]:
                continue
            a, b = int(starts[t]), int(teacher_offsets[t, 1])
            if self.teacher[int(teacher_ids[t])] != data[a:b]:
                continue
            row = self._conditioned(data[a:p], topk_ids[t], topk_logprobs[t])
            if row is not None:
                ids[s], values[s] = row
        return ids, values

    def _conditioned(
        self, read: bytes, teacher_ids: np.ndarray, logprobs: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray] | None:
        mapped = np.array([self.continuation(int(v), read) for v in teacher_ids], dtype=np.int64)
        kept = (mapped >= 0) & np.isfinite(logprobs)
        if not kept.any():
            return None
        head = logprobs[kept].astype(np.float64)
        total = head.max() + np.log(np.exp(head - head.max()).sum())
        out = np.where(kept, logprobs.astype(np.float64) - total, -np.inf).astype(np.float32)
        return np.where(kept, mapped, mapped[kept][0]), out
