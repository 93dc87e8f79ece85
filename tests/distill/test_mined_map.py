"""MinED vocabulary map: edit distances, nearest strings with their tie-breaks, specials, cache."""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
from test_byte_alignment import _levenshtein
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.vocab import mined_map as mm
from lmalgebra.distill.vocab.edit_distance import by_length, distance_matrix
from lmalgebra.distill.vocab.union import canonical_vocabulary
from tiny import build_tokenizer_kinds

ALPHABET = "abcé🙂"


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PreTrainedTokenizerFast]:
    paths = build_tokenizer_kinds(tmp_path_factory.mktemp("kinds"))
    return {kind: AutoTokenizer.from_pretrained(path) for kind, path in paths.items()}


def _words(rng: random.Random, count: int, longest: int = 6) -> list[str]:
    return [
        "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, longest))) for _ in range(count)
    ]


def test_distance_matrix_equals_the_textbook_levenshtein() -> None:
    rng = random.Random(0)
    a, b = _words(rng, 60), _words(rng, 45)
    expected = np.array([[_levenshtein(x, y) for y in b] for x in a])
    assert (distance_matrix(a, b) == expected).all()


def test_threads_and_cutoff_keep_the_textbook_levenshtein() -> None:
    """On two threads the same matrix; with a cutoff, every distance at or below it exact and
    every one above it read as cutoff + 1; empty sides give empty matrices."""
    rng = random.Random(2)
    a, b = _words(rng, 150, 9), _words(rng, 200, 9)
    expected = np.array([[_levenshtein(x, y) for y in b] for x in a])
    assert (distance_matrix(a, b, workers=2) == expected).all()
    for cutoff in (0, 1, 3):
        got = distance_matrix(a, b, workers=2, cutoff=cutoff)
        assert (got == np.where(expected <= cutoff, expected, cutoff + 1)).all()
    assert distance_matrix([], b).shape == (0, 200) and distance_matrix(a, []).shape == (150, 0)
    # strings as they are: no case folding, no trimming of spaces or punctuation
    assert distance_matrix(["A", " a!"], ["a"]).tolist() == [[1], [2]]
    groups = by_length(a)
    assert list(groups) == sorted({len(x) for x in a})
    assert sorted(np.concatenate(list(groups.values())).tolist()) == list(range(len(a)))
    assert all(len(a[i]) == n for n, rows in groups.items() for i in rows)


def test_nearest_strings_equals_brute_force_with_its_tie_breaks() -> None:
    rng = random.Random(1)
    for _ in range(4):
        queries, pool = _words(rng, 120), _words(rng, 50)
        index, distance = mm.nearest_strings(queries, pool, workers=2)
        for q, text in enumerate(queries):
            best = min(
                range(len(pool)),
                key=lambda p: (_levenshtein(text, pool[p]), abs(len(text) - len(pool[p])), p),
            )
            assert (index[q], distance[q]) == (best, _levenshtein(text, pool[best])), text


def test_tie_breaks_by_length_difference_then_id() -> None:
    # all at distance 1: same length first ("abd" over "ab"), then the smaller id
    index, distance = mm.nearest_strings(["abc", "abc"], ["ab", "xbc", "abd"])
    assert index.tolist() == [1, 1] and distance.tolist() == [1, 1]
    index, _ = mm.nearest_strings(["abc"], ["ab", "abcd"])
    assert index.tolist() == [0]
    with pytest.raises(UserInputError, match="empty vocabulary"):
        mm.nearest_strings(["a"], [])


@pytest.mark.parametrize("kind", ["wp", "bl", "sp"])
def test_identical_vocabularies_map_to_themselves(
    kinds: dict[str, PreTrainedTokenizerFast], kind: str, tmp_path
) -> None:
    tok = kinds[kind]
    forms = canonical_vocabulary(kind, tok).canonical
    assert len(set(forms)) == len(forms), "the fixture's canonical forms must be distinct"
    found = mm.mined_map(tok, tok, kind, kind, cache_dir=tmp_path)
    assert found.student_ids.tolist() == list(range(len(forms)))
    assert (found.distances == 0).all() and found.exact_fraction == 1.0


def test_across_conventions_specials_and_case(
    kinds: dict[str, PreTrainedTokenizerFast], tmp_path
) -> None:
    bl, sp, wp = kinds["bl"], kinds["sp"], kinds["wp"]
    found = mm.mined_map(bl, sp, "bl", "sp", cache_dir=tmp_path)
    assert found.student_ids[bl.eos_token_id] == sp.eos_token_id  # role onto role
    sp_special = canonical_vocabulary("sp", sp).special_ids
    bl_special = canonical_vocabulary("bl", bl).special_ids
    ordinary = [i for i in range(len(bl)) if i not in bl_special]
    assert not set(found.student_ids[ordinary].tolist()) & sp_special
    # a lower-casing student: a cased teacher token maps to its lower-cased form
    to_wp = mm.mined_map(bl, wp, "bl", "wp", cache_dir=tmp_path)
    wp_forms = canonical_vocabulary("wp", wp).canonical
    bl_forms = canonical_vocabulary("bl", bl).canonical
    cased = [i for i in ordinary if bl_forms[i] != bl_forms[i].lower()]
    assert cased, "the fixture must have cased tokens"
    for i in cased:
        if bl_forms[i].lower() in wp_forms:
            assert wp_forms[to_wp.student_ids[i]] == bl_forms[i].lower()
            assert to_wp.distances[i] == 0
    # every pair is at its recorded distance, and none closer exists (spot check)
    for i in ordinary[::25]:
        target = wp_forms[to_wp.student_ids[i]]
        assert _levenshtein(bl_forms[i].lower(), target) == to_wp.distances[i]


def test_map_is_cached_and_a_broken_cache_is_recomputed(
    kinds: dict[str, PreTrainedTokenizerFast], tmp_path, monkeypatch, caplog
) -> None:
    first = mm.mined_map(kinds["sp"], kinds["bl"], "sp", "bl", cache_dir=tmp_path)
    files = list(tmp_path.glob("mined-*.safetensors"))
    assert [f.name for f in files] == [f"mined-{first.key[:32]}.safetensors"]

    def no_compute(*args: object) -> None:
        raise AssertionError("the cached map was not used")

    with monkeypatch.context() as patch:
        patch.setattr(mm, "compute_map", no_compute)
        again = mm.mined_map(kinds["sp"], kinds["bl"], "sp", "bl", cache_dir=tmp_path)
    assert (again.student_ids == first.student_ids).all()
    assert (again.distances == first.distances).all()
    files[0].write_bytes(b"not a safetensors file")
    with caplog.at_level(logging.WARNING, logger="lmalgebra.distill.vocab.mined_map"):
        rebuilt = mm.mined_map(kinds["sp"], kinds["bl"], "sp", "bl", cache_dir=tmp_path)
    assert "unreadable" in caplog.text
    assert (rebuilt.student_ids == first.student_ids).all()
    other = mm.mined_map(kinds["sp"], kinds["wp"], "sp", "wp", cache_dir=tmp_path)
    assert other.key != first.key and len(list(tmp_path.glob("mined-*.safetensors"))) == 2
