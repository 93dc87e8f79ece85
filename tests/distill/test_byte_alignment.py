"""Byte offsets, shared boundaries, chunks and MinED sequence alignment of two tokenizations."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.vocab.byte_alignment import (
    byte_offsets,
    chunk_ids,
    chunk_start_alignment,
    chunks,
    encode_with_offsets,
    mined_alignment,
    mined_alignments,
    shared_boundaries,
    token_texts,
)
from lmalgebra.distill.vocab.token_forms import detect_convention, token_surface
from tiny import build_tokenizer_kinds

TEXTS = [
    "Le café de Zürich 🙂 est très célèbre.",
    "naïve façade — crème brûlée 👩‍👩‍👧 ok",
    " über  die\tBrücke\n neue Straße ",
    "The river runs north. The old king sings!",
]


@pytest.fixture(scope="module")
def kinds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PreTrainedTokenizerFast]:
    paths = build_tokenizer_kinds(tmp_path_factory.mktemp("kinds"))
    return {kind: AutoTokenizer.from_pretrained(path) for kind, path in paths.items()}


def _offsets(*pairs: tuple[int, int]) -> np.ndarray:
    return np.array(pairs, dtype=np.int32).reshape(-1, 2)


# -- byte offsets of hand-made tokenizations ---------------------------------------------------
def test_byte_level_pieces_of_one_character_split_its_bytes() -> None:
    # "café": é = C3 A9 is two byte-level tokens that both report the character é
    got = byte_offsets(
        "café", [(0, 1), (1, 2), (2, 3), (3, 4), (3, 4)], [b"c", b"a", b"f", b"\xc3", b"\xa9"]
    )
    assert got.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5]]
    # a token holding "f" and the first half of é, then one holding the second half
    got = byte_offsets("café", [(0, 2), (2, 4), (3, 4)], [b"ca", b"f\xc3", b"\xa9"])
    assert got.tolist() == [[0, 2], [2, 4], [4, 5]]


def test_an_emoji_in_four_byte_tokens_tiles_its_four_bytes() -> None:
    surfaces = [b"a", b"\xf0", b"\x9f", b"\x99", b"\x82", b"b"]
    got = byte_offsets("a🙂b", [(0, 1), (1, 2), (1, 2), (1, 2), (1, 2), (2, 3)], surfaces)
    assert got.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [5, 6]]


def test_inserted_word_start_marker_covers_no_byte() -> None:
    # SentencePiece prepends ▁ to the text: the bare ▁ reports the character after it
    got = byte_offsets("Le", [(0, 1), (0, 1), (1, 2)], [b" ", b"L", b"e"])
    assert got.tolist() == [[0, 0], [0, 1], [1, 2]]
    # a real space at the start is held by the ▁
    got = byte_offsets(" the", [(0, 1), (0, 4)], [b" ", b" the"])
    assert got.tolist() == [[0, 1], [1, 4]]


def test_unknown_token_keeps_its_reported_bytes() -> None:
    # WordPiece: [UNK] for the emoji; the spaces belong to no token
    got = byte_offsets("a 🙂 b", [(0, 1), (2, 3), (4, 5)], [b"a", None, b"b"])
    assert got.tolist() == [[0, 1], [2, 6], [7, 8]]
    # SentencePiece: an inserted ▁ then <unk> for an emoji at the start
    got = byte_offsets("🙂x", [(0, 1), (0, 1), (1, 2)], [b" ", None, b"x"])
    assert got.tolist() == [[0, 0], [0, 4], [4, 5]]


def test_space_trimmed_from_offsets_is_given_back() -> None:
    # ByteLevel(trim_offsets=True) reports "Ġcd" without its space and a lone "Ġ" as empty
    got = byte_offsets("ab cd  e", [(0, 2), (3, 5), (6, 6), (7, 8)], [b"ab", b" cd", b" ", b" e"])
    assert got.tolist() == [[0, 2], [2, 5], [5, 6], [6, 8]]


def test_offsets_outside_the_text_are_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        byte_offsets("ab", [(0, 3)], [b"abc"])


# -- real tokenizers --------------------------------------------------------------------------
@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("kind", ["wp", "bl", "sp"])
def test_real_tokenizer_offsets_hold_the_tokens_bytes(
    kinds: dict[str, PreTrainedTokenizerFast], kind: str, text: str
) -> None:
    tok = kinds[kind]
    data = text.encode()
    got = encode_with_offsets(tok, text, kind)
    offsets = got.offsets.astype(int)
    assert got.ids.tolist() == tok(text, add_special_tokens=False)["input_ids"]
    assert (offsets[:, 0] <= offsets[:, 1]).all()
    assert (offsets[1:, 0] >= offsets[:-1, 1]).all(), "ranges overlap or go back"
    convention = detect_convention(tok)
    for token, token_id, (start, end) in zip(got.tokens, got.ids, offsets, strict=True):
        held = data[start:end]
        if token_id == tok.unk_token_id:
            assert held and held.decode(), (token, held)  # whole characters
            continue
        surface = token_surface(token, convention)
        if kind == "wp":
            assert tok.backend_tokenizer.normalizer.normalize_str(held.decode()) == surface.decode()
        elif kind == "sp":
            assert held in (surface, surface[1:] if surface[:1] == b" " else surface), (token, held)
        else:
            assert held == surface, (token, held)
    if kind == "bl":  # byte-level tokens tile the text
        assert offsets[0, 0] == 0 and offsets[-1, 1] == len(data)
        assert (offsets[1:, 0] == offsets[:-1, 1]).all()
    covered = np.zeros(len(data), dtype=bool)
    for start, end in offsets:
        covered[start:end] = True
    assert all(covered[i] for i in range(len(data)) if not chr(data[i]).isspace())


def test_slow_tokenizer_is_refused_by_name(tmp_path: Path) -> None:
    from transformers import BertTokenizerLegacy

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "the", "river"]) + "\n")
    slow = BertTokenizerLegacy(str(vocab))
    with pytest.raises(UserInputError, match=r"tokenizer 'legacy-bert' reports no token offsets"):
        encode_with_offsets(slow, "the river", "legacy-bert")


# -- shared boundaries and chunks ------------------------------------------------------------
def test_chunks_of_a_token_spanning_two_of_the_other_side() -> None:
    text = "the river"
    teacher = _offsets((0, 3), (3, 9))  # "the", " river"
    student = _offsets((0, 3), (4, 6), (6, 9))  # WordPiece: "the", "ri", "##ver" (no space)
    assert shared_boundaries(teacher, student).tolist() == [3, 9]
    assert chunks(teacher, student) == [((0, 1), (0, 1)), ((1, 2), (1, 3))]
    assert chunks(student, teacher) == [((0, 1), (0, 1)), ((1, 3), (1, 2))]
    assert token_texts(text, student) == ["the", "ri", "ver"]


def test_chunks_with_half_characters_meet_at_the_character_end() -> None:
    # teacher: byte-level c a f Ã © ; student: "caf", "é"
    teacher = byte_offsets(
        "café", [(0, 1), (1, 2), (2, 3), (3, 4), (3, 4)], [b"c", b"a", b"f", b"\xc3", b"\xa9"]
    )
    student = _offsets((0, 3), (3, 5))
    assert chunks(teacher, student) == [((0, 3), (0, 1)), ((3, 5), (1, 2))]
    # the half-character end (byte 4) is no boundary: the student has no token ending there
    assert 4 not in shared_boundaries(teacher, student)


def test_empty_and_trailing_tokens_join_a_chunk() -> None:
    # teacher: an inserted ▁ (empty at 0), "a", an empty token at 1, " b", trailing " "
    teacher = _offsets((0, 0), (0, 1), (1, 1), (1, 3), (3, 4))
    student = _offsets((0, 1), (2, 3))  # "a", "b": spaces dropped
    assert chunks(teacher, student) == [((0, 2), (0, 1)), ((2, 5), (1, 2))]
    t_ids, s_ids = chunk_ids(chunks(teacher, student), 5, 2)
    assert t_ids.tolist() == [0, 0, 1, 1, 1] and s_ids.tolist() == [0, 1]
    assert chunk_start_alignment(chunks(teacher, student), 2).tolist() == [0, 2]


def test_no_tokens_no_chunks() -> None:
    assert chunks(_offsets(), _offsets((0, 1))) == []


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize(("t_kind", "s_kind"), [("bl", "wp"), ("sp", "bl"), ("wp", "sp")])
def test_real_chunks_cover_the_same_bytes(
    kinds: dict[str, PreTrainedTokenizerFast], t_kind: str, s_kind: str, text: str
) -> None:
    data = text.encode()
    teacher = encode_with_offsets(kinds[t_kind], text).offsets
    student = encode_with_offsets(kinds[s_kind], text).offsets
    found = chunks(teacher, student)
    assert found and found[0][0][0] == 0 and found[0][1][0] == 0
    assert found[-1][0][1] == len(teacher) and found[-1][1][1] == len(student)
    for before, after in itertools.pairwise(found):  # consecutive, no gap, no overlap
        assert before[0][1] == after[0][0] and before[1][1] == after[1][0]

    def visible(offsets: np.ndarray, a: int, b: int) -> set[int]:
        held = {i for start, end in offsets[a:b] for i in range(start, end)}
        return {i for i in held if not chr(data[i]).isspace()}

    for (a, b), (c, d) in found:
        assert a < b and c < d
        assert visible(teacher, a, b) == visible(student, c, d)


# -- MinED sequence alignment ----------------------------------------------------------------
def _levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def _naive_fusellm_alignment(teacher: list[str], student: list[str]) -> list[int]:
    """FuseLLM's DTW written out cell by cell; a student position paired with one teacher."""
    n, m = len(teacher), len(student)
    inf = float("inf")
    total = [[inf] * (m + 1) for _ in range(n + 1)]
    total[0][0] = 0.0
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            best = min(total[i - 1][j - 1], total[i - 1][j], total[i][j - 1])
            total[i][j] = _levenshtein(teacher[i - 1], student[j - 1]) + best
    pairs: list[list[int]] = [[] for _ in range(m)]
    i, j = n, m
    while True:
        pairs[j - 1].append(i - 1)
        if i == 1 and j == 1:
            break
        options = [
            total[i - 1][j - 1] if i > 1 and j > 1 else inf,
            total[i - 1][j] if i > 1 else inf,
            total[i][j - 1] if j > 1 else inf,
        ]
        step = options.index(min(options))
        i, j = i - (step != 2), j - (step != 1)
    return [p[0] if len(p) == 1 else -1 for p in pairs]


def test_mined_alignment_matches_the_naive_dtw() -> None:
    rng = random.Random(3)
    for _ in range(20):
        teacher = [
            "".join(rng.choice("ab é") for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(1, 12))
        ]
        student = [
            "".join(rng.choice("ab é") for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(1, 12))
        ]
        assert mined_alignment(teacher, student).tolist() == _naive_fusellm_alignment(
            teacher, student
        )


def test_a_batch_of_alignments_equals_each_alone() -> None:
    """``mined_alignments`` pads a batch's cost matrices to one shape; each pair's alignment is
    the naive DTW's, whatever the other pairs' sizes (empty sides included)."""
    rng = random.Random(4)

    def tokens(most: int) -> list[str]:
        return [
            "".join(rng.choice("ab é") for _ in range(rng.randint(0, 4)))
            for _ in range(rng.randint(0, most))
        ]

    for _ in range(10):
        pairs = [(tokens(15), tokens(15)) for _ in range(rng.randint(1, 6))]
        got = mined_alignments(pairs)
        for (teacher, student), aligned in zip(pairs, got, strict=True):
            expected = (
                _naive_fusellm_alignment(teacher, student) if teacher else [-1] * len(student)
            )
            assert aligned.dtype == np.int64 and aligned.tolist() == expected


def test_mined_alignment_of_split_and_merged_tokens() -> None:
    teacher = ["the", " riverbank", " zzzzzzz"]
    student = ["the", " river", "bank", " zzzzzzz"]
    assert mined_alignment(teacher, student).tolist() == [0, 1, 1, 2]
    # the other way round " riverbank" is paired with two teacher tokens: unaligned
    assert mined_alignment(student, teacher).tolist() == [0, -1, 3]
    assert mined_alignment(teacher, teacher).tolist() == [0, 1, 2]
    assert mined_alignment([], teacher).tolist() == [-1, -1, -1]
