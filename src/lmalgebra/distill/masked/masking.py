"""Per-teacher tokenisation and BERT-style masking, deterministic per (example, teacher, seed).

Each example is tokenised by each teacher of its language (one copy per teacher) and cut at the
example length. A share ``p`` of the non-special tokens (at least one) is chosen; of those, 80%
become the mask token, 10% a random non-special token of the teacher's vocabulary, 10% stay. With
``whole_word`` every piece of a chosen word is chosen together.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.recipe import MaskingSpec


@dataclass(frozen=True)
class MaskedCopy:
    """One teacher's copy of one example.

    Attributes:
        input_ids: ``(seq,) int64`` ids after masking, special tokens included.
        positions: ``(n_masked,) int64`` sorted masked positions.
        labels: ``(n_masked,) int64`` the original ids at those positions.
    """

    input_ids: np.ndarray
    positions: np.ndarray
    labels: np.ndarray


@dataclass(frozen=True)
class Encoded:
    """One example tokenised for one teacher, before masking.

    Attributes:
        input_ids: ``(seq,) int64`` ids, special tokens included, cut at the example length.
        candidates: ``(n,) int64`` positions of the non-special tokens (those that may be masked).
        word_ids: the word of each position (None for special tokens), kept for whole-word
            masking only.
    """

    input_ids: np.ndarray
    candidates: np.ndarray
    word_ids: tuple[int | None, ...] | None


def _stream_seed(seed: int, example_id: str, teacher: str) -> np.random.Generator:
    digest = hashlib.sha256(f"{example_id}\0{teacher}".encode()).digest()
    return np.random.default_rng([seed, int.from_bytes(digest[:8], "little")])


class TeacherMasker:
    """Tokenises and masks examples for one teacher."""

    def __init__(self, name: str, tokenizer: Any, spec: MaskingSpec, max_length: int):
        if tokenizer.mask_token_id is None:
            raise UserInputError(f"teacher {name!r}: tokenizer has no mask token")
        self.name, self.tokenizer, self.spec, self.max_length = name, tokenizer, spec, max_length
        special = set(tokenizer.all_special_ids)
        self.random_pool = np.array([i for i in range(len(tokenizer)) if i not in special])

    def __call__(self, example_id: str, text: str) -> MaskedCopy:
        return self.mask(example_id, self.encode(text))

    def encode(self, text: str) -> Encoded:
        """``text`` tokenised and cut at the example length, not yet masked: what
        :meth:`mask` needs, to be kept for an example masked again on a later draw."""
        return self.encode_many([text])[0]

    def encode_many(self, texts: Sequence[str]) -> list[Encoded]:
        """:meth:`encode` of each text, in one call of the tokenizer: a fast tokenizer encodes a
        list on all cores, and the per-call overhead of its Python wrapper (half the time of one
        short text) is paid once."""
        if not texts:
            return []
        enc = self.tokenizer(
            list(texts),
            truncation=True,
            max_length=self.max_length,
            return_special_tokens_mask=True,
            verbose=False,
        )
        whole_word = self.spec.whole_word
        return [
            Encoded(
                np.asarray(ids, dtype=np.int64),
                np.flatnonzero(np.asarray(special) == 0),
                tuple(enc.word_ids(i)) if whole_word else None,
            )
            for i, (ids, special) in enumerate(
                zip(enc["input_ids"], enc["special_tokens_mask"], strict=True)
            )
        ]

    def mask_many(self, example_ids: Sequence[str], texts: Sequence[str]) -> list[MaskedCopy]:
        """The masked copy of each example (as :meth:`__call__` makes it one at a time)."""
        encoded = self.encode_many(texts)
        return [self.mask(i, e) for i, e in zip(example_ids, encoded, strict=True)]

    def mask(self, example_id: str, encoded: Encoded) -> MaskedCopy:
        """The masked copy of an encoded example: the same for the same ``example_id``."""
        ids, candidates = encoded.input_ids, encoded.candidates
        rng = _stream_seed(self.spec.seed, example_id, self.name)
        if candidates.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return MaskedCopy(ids, empty, empty)
        count = max(1, round(self.spec.probability * candidates.size))
        if self.spec.whole_word:
            assert encoded.word_ids is not None  # encoded by this masker, which wanted them
            positions = self._whole_words(encoded.word_ids, candidates, count, rng)
        else:
            positions = np.sort(rng.choice(candidates, size=count, replace=False))
        labels = ids[positions].copy()
        masked = ids.copy()
        draw = rng.random(positions.size)
        to_mask = draw < self.spec.replace[0]
        to_random = (draw >= self.spec.replace[0]) & (
            draw < self.spec.replace[0] + self.spec.replace[1]
        )
        masked[positions[to_mask]] = self.tokenizer.mask_token_id
        masked[positions[to_random]] = rng.choice(self.random_pool, size=int(to_random.sum()))
        return MaskedCopy(masked, positions, labels)

    @staticmethod
    def _whole_words(
        word_ids: Sequence[int | None], candidates: np.ndarray, count: int, rng: np.random.Generator
    ) -> np.ndarray:
        groups: dict[int, list[int]] = {}
        for position in candidates:
            word = word_ids[position]
            groups.setdefault(-int(position) - 1 if word is None else word, []).append(
                int(position)
            )
        chosen: list[int] = []
        for key in rng.permutation(np.array(sorted(groups))):
            if len(chosen) >= count:
                break
            chosen.extend(groups[int(key)])
        return np.array(sorted(chosen), dtype=np.int64)


def pad_batch(copies: Sequence[MaskedCopy], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` ``(batch, width) int64`` and the masked
    positions as ``rows``/``cols`` ``(n_masked,) int64`` in copy order."""
    width = max(len(c.input_ids) for c in copies)
    ids = torch.full((len(copies), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(copies), width), dtype=torch.long)
    for row, c in enumerate(copies):
        ids[row, : len(c.input_ids)] = torch.as_tensor(c.input_ids)
        attention[row, : len(c.input_ids)] = 1
    rows = torch.cat([torch.full((len(c.positions),), r) for r, c in enumerate(copies)])
    cols = torch.cat([torch.as_tensor(c.positions, dtype=torch.long) for c in copies])
    return {"input_ids": ids, "attention_mask": attention, "rows": rows, "cols": cols}
