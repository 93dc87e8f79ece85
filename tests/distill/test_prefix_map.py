"""The prefix map: each teacher token onto the longest student token its text begins with."""

from __future__ import annotations

import re

import numpy as np
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from lmalgebra.distill.vocab.mined_map import mined_map, vocabulary_forms
from lmalgebra.distill.vocab.prefix_map import prefix_ids, prefix_map
from lmalgebra.distill.vocab.union import canonical_vocabulary
from tiny import build_tokenizer_kinds


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PreTrainedTokenizerFast]:
    paths = build_tokenizer_kinds(tmp_path_factory.mktemp("kinds"))
    return {kind: AutoTokenizer.from_pretrained(path) for kind, path in paths.items()}


def test_longest_prefix_with_markers_and_bytes_kept_whole() -> None:
    student = ["pl", "play", "##in", "##i", "#", "<", "a", "play", "[CLS]"]
    special = [False] * 8 + [True]
    teacher = ["playing", "##ing", "##x", "<0xE2>", "", "zz", "[CLS]", "a<0xE2>", "play"]
    fallback = np.arange(100, 100 + len(teacher))
    got = prefix_ids(teacher, [t == "[CLS]" for t in teacher], student, special, fallback)
    # play (the first of equal strings), ##in, then what nothing prefixes keeps the fallback: "#"
    # is no prefix of a continuation, "<" none of a byte, the special stays as the MinED map put it
    assert got.tolist() == [1, 2, 102, 103, 104, 105, 106, 6, 1]


def _naive_longest_prefix(form: str, student: list[str], special: list[bool]) -> str | None:
    """The longest ordinary student string that begins ``form``, keeps its ``##`` marker's kind
    and holds a character past it, and ends on no byte's ``<0xHH>`` spelling; None if none."""
    cuts = {m.end() for m in re.finditer(r"<0x[0-9A-F]{2}>|.", form, re.S)}
    found = [
        f
        for f, sp in zip(student, special, strict=True)
        if not sp
        and f
        and form.startswith(f)
        and len(f) in cuts
        and f.startswith("##") == form.startswith("##")
        and f != "##"
    ]
    return max(found, key=len, default=None)


@pytest.mark.parametrize("pair", [("wp", "bl"), ("sp", "wp"), ("bl", "sp"), ("sp", "bl")])
def test_each_token_maps_to_its_longest_prefix_or_keeps_the_mined_entry(kinds, pair) -> None:
    teacher, student = kinds[pair[0]], kinds[pair[1]]
    mined = mined_map(teacher, student).student_ids
    mapped = prefix_map(teacher, student, mined)
    s_vocab = canonical_vocabulary("s", student)
    t_forms, t_special = vocabulary_forms(canonical_vocabulary("t", teacher), s_vocab.lowercase)
    s_forms, s_special = vocabulary_forms(s_vocab, False)
    placed = 0
    for t, (form, special) in enumerate(zip(t_forms, t_special, strict=True)):
        longest = None if special else _naive_longest_prefix(form, s_forms, s_special)
        if longest is None:
            assert mapped[t] == mined[t]
        else:
            assert s_forms[mapped[t]] == longest
            placed += 1
    assert placed > 0


def test_a_tokenizer_onto_itself_is_the_identity_where_strings_are_unique(kinds) -> None:
    tokenizer = kinds["bl"]
    mapped = prefix_map(tokenizer, tokenizer, mined_map(tokenizer, tokenizer).student_ids)
    forms, special = vocabulary_forms(canonical_vocabulary("t", tokenizer), False)
    unique = [i for i, f in enumerate(forms) if forms.count(f) == 1 and not special[i]]
    assert (mapped[unique] == np.asarray(unique)).all()
