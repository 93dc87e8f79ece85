"""Teacher vocabulary -> student vocabulary by first-token prefix: each teacher token onto the
longest student token its text begins with.

At a position where both tokenisations start a chunk, a teacher token whose text begins with the
student token ``u`` continues the text with ``u`` as far as the student sees it; adding up the
teacher's probabilities by this map gives the teacher's distribution over the student's next
token (``train.cross_tokenizer.prefix``). Strings are compared in the canonical form of
``distill.vocab.token_forms`` (``play``/``##ing``; lower-cased on the teacher side when the student
lower-cases), as the MinED map compares them:

- a continuation ``##ing`` begins with a continuation (``##i``, ``##in``, ``##ing``), never with
  the word-start ``#``: the marker ``##`` counts as one unit, and a prefix holds a character
  past it;
- a byte of an invalid UTF-8 sequence (``<0xE2>``) is one unit, never cut;
- special tokens, and tokens with no student token as a prefix (an empty word start, a character
  the student lacks), keep their MinED map entry (``fallback``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from lmalgebra.distill.vocab.mined_map import vocabulary_forms
from lmalgebra.distill.vocab.union import canonical_vocabulary

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

_UNIT = re.compile(r"^##|<0x[0-9A-F]{2}>|.", re.S)


def prefix_ids(
    teacher_forms: Sequence[str],
    teacher_special: Sequence[bool],
    student_forms: Sequence[str],
    student_special: Sequence[bool],
    fallback: np.ndarray,
) -> np.ndarray:
    """``(teacher_vocab,) int64``: the ordinary student id (the smallest, among equal strings)
    whose string is the longest prefix of each ordinary teacher token's string, else
    ``fallback``'s entry."""
    index: dict[str, int] = {}
    for i, (form, special) in enumerate(zip(student_forms, student_special, strict=True)):
        if not special:
            index.setdefault(form, i)
    out = np.asarray(fallback, dtype=np.int64).copy()
    for t, (form, special) in enumerate(zip(teacher_forms, teacher_special, strict=True)):
        if special:
            continue
        units = _UNIT.findall(form)
        prefixes = list(accumulate(units))[1 if units[:1] == ["##"] else 0 :]
        for prefix in reversed(prefixes):
            if (hit := index.get(prefix)) is not None:
                out[t] = hit
                break
    return out


def prefix_map(
    teacher: PreTrainedTokenizerFast,
    student: PreTrainedTokenizerFast,
    fallback: np.ndarray,
    teacher_name: str = "teacher",
    student_name: str = "student",
) -> np.ndarray:
    """The prefix map of ``teacher``'s ids onto ``student``'s; ``fallback (teacher_vocab,)`` (the
    MinED map) for the tokens it does not place."""
    student_vocab = canonical_vocabulary(student_name, student)
    student_forms, student_special = vocabulary_forms(student_vocab, lowercase=False)
    teacher_vocab = canonical_vocabulary(teacher_name, teacher)
    teacher_forms, teacher_special = vocabulary_forms(teacher_vocab, student_vocab.lowercase)
    return prefix_ids(teacher_forms, teacher_special, student_forms, student_special, fallback)
