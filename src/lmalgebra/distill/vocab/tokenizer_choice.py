"""What a causal student's tokenizer is: the recipe's ``student.tokenizer``, read once.

Spellings (``student.tokenizer``):

- ``teacher:NAME``, or ``NAME`` alone: the tokenizer of the recipe's teacher ``NAME``;
- ``train:KIND:SIZE``: a tokenizer of ``KIND`` (the kinds of ``pretrain causal --tokenizer.kind``;
  ``bytelevel-bpe`` is GPT-2's byte-level BPE) with ``SIZE`` entries, trained on the run's
  training examples of every language (``distill.vocab.tokenizer_trainers``);
- ``bytes``: raw UTF-8 bytes, one token per byte (256 ids) plus start, end and padding tokens;
- anything else: a model reference (directory, hub id, ``package:NAME``, ``gguf:FILE``) whose
  tokenizer is used.

This module holds the tokenizer kinds and their smallest sizes too, so that the recipe can check a
spelling when it is loaded without importing the trainers.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from lmalgebra.core.errors import UserInputError

TokenizerKind = Literal["bytelevel-bpe", "unigram", "bpe", "wordpiece"]
TOKENIZER_KINDS: tuple[TokenizerKind, ...] = ("bytelevel-bpe", "unigram", "bpe", "wordpiece")
# the smallest vocabulary of each kind: byte-level BPE holds every byte and four specials
MIN_VOCAB_SIZE = {"bytelevel-bpe": 256 + 4, "unigram": 40, "bpe": 40, "wordpiece": 31}
# the largest: the tokenizers library's trainers set aside about 70 bytes for each entry asked
# before they read the text (a size of 10**9 aborts the process, past any exception handler)
MAX_VOCAB_SIZE = 2**22
BYTES = "bytes"
Source = Literal["teacher", "train", "bytes", "model"]
_FORM = (
    f"train:KIND:SIZE (KIND one of {', '.join(TOKENIZER_KINDS)}; SIZE the vocabulary size), "
    "e.g. train:bytelevel-bpe:8000"
)


@dataclass(frozen=True)
class TokenizerChoice:
    """One reading of ``student.tokenizer``.

    Attributes:
        source: ``teacher``, ``train``, ``bytes`` or ``model``.
        name: the teacher's name (``teacher``) or the model reference (``model``).
        kind, vocab_size: what to train (``train``).
    """

    source: Source
    name: str = ""
    kind: TokenizerKind = "bytelevel-bpe"
    vocab_size: int = 0

    def __str__(self) -> str:
        """The canonical spelling (a teacher's plain name, as recipes first wrote it, so that
        checkpoints of either spelling stay valid)."""
        if self.source == "train":
            return f"train:{self.kind}:{self.vocab_size}"
        return BYTES if self.source == "bytes" else self.name


def _trained(given: str) -> TokenizerChoice:
    parts = given.split(":")
    if len(parts) != 3 or parts[1] not in TOKENIZER_KINDS or not parts[2].isdigit():
        raise UserInputError(f"student.tokenizer {given!r} must read {_FORM}")
    kind, size = parts[1], int(parts[2])
    check_vocab_size(kind, size, f"student.tokenizer {given!r}")
    return TokenizerChoice("train", kind=kind, vocab_size=size)


def check_vocab_size(kind: str, size: int, what: str) -> None:
    """Refuse a ``kind`` vocabulary of ``size`` entries that cannot be trained: fewer than its
    specials and alphabet, or more than ``MAX_VOCAB_SIZE``; ``what`` names the setting."""
    if size < MIN_VOCAB_SIZE[kind]:
        raise UserInputError(
            f"{what} is too small for a {kind} vocabulary: it needs at least "
            f"{MIN_VOCAB_SIZE[kind]} entries"
        )
    if size > MAX_VOCAB_SIZE:
        raise UserInputError(
            f"{what} is too large for a {kind} vocabulary trained here: at most {MAX_VOCAB_SIZE} "
            "entries (the trainer sets memory aside for each entry asked, and a text gives no "
            "more entries than it has pieces)"
        )


def parse_student_tokenizer(given: str, teachers: Collection[str]) -> TokenizerChoice:
    """Read ``student.tokenizer`` against the recipe's teacher names; one line naming the value
    when it is malformed, names no teacher, or could mean both the byte tokenizer and a teacher."""
    if given.startswith("train:"):
        return _trained(given)
    if given.startswith("teacher:"):
        name = given.removeprefix("teacher:")
        if name not in teachers:
            raise UserInputError(
                f"student.tokenizer {given!r} names no teacher of the recipe "
                f"(teachers: {', '.join(sorted(teachers))})"
            )
        return TokenizerChoice("teacher", name)
    if given == BYTES:
        if BYTES in teachers:
            raise UserInputError(
                f"student.tokenizer {given!r} is both the byte tokenizer and a teacher's name: "
                f"write teacher:{BYTES} for the teacher's tokenizer"
            )
        return TokenizerChoice("bytes")
    return TokenizerChoice("teacher" if given in teachers else "model", given)
