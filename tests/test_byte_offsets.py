"""Token offsets in UTF-8 bytes: characters of several bytes, pieces of one character (byte-level
BPE, byte fallback), tokens that cover no byte, and tokenizers that report no offsets."""

from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.byte_offsets import ByteOffsets, _split_runs, char_to_byte_offsets


def _offsets(tokenizer, text: str) -> np.ndarray:
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    offsets = ByteOffsets(tokenizer, "t")
    return offsets(text, encoded["input_ids"], np.asarray(encoded["offset_mapping"]))


def test_character_offsets_become_byte_offsets() -> None:
    text = "aé😀b"  # 1, 2, 4 and 1 bytes
    spans = char_to_byte_offsets(text, np.array([[0, 1], [1, 2], [2, 3], [3, 4], [1, 3]]))
    assert spans.tolist() == [[0, 1], [1, 3], [3, 7], [7, 8], [1, 7]]


def test_byte_level_pieces_of_a_character_get_their_own_bytes(gpt2_dir) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(gpt2_dir)
    text = "café 😀 東京 naïve"
    spans = _offsets(tokenizer, text)
    data = text.encode("utf-8")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.convert_tokens_to_string([t]) for t in tokenizer.convert_ids_to_tokens(ids)]
    assert len(spans) > len(text.split()) + 4  # several characters were split into bytes
    assert b"".join(data[s:e] for s, e in spans) == data  # each byte once, in order
    for (start, end), piece in zip(spans, pieces, strict=True):
        if "\ufffd" not in piece:  # a whole-character piece: exactly its text
            assert data[start:end].decode("utf-8") == piece


def test_byte_fallback_pieces_get_one_byte_each() -> None:
    vocab = {"<unk>": 0, "a": 1, "<0xC3>": 2, "<0xA9>": 3, "b": 4}
    tok = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    spans = _offsets(tokenizer, "aéb")
    assert tokenizer.convert_ids_to_tokens(tokenizer("aéb")["input_ids"]) == [
        "a",
        "<0xC3>",
        "<0xA9>",
        "b",
    ]
    assert spans.tolist() == [[0, 1], [1, 2], [2, 3], [3, 4]]


def test_a_lone_word_start_mark_covers_no_byte() -> None:
    vocab = {"<unk>": 0, "▁": 1, "a": 2, "b": 3, "▁b": 4, "é": 5, "▁é": 6}
    tok = Tokenizer(models.BPE(vocab, [("▁", "b"), ("▁", "é")], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")
    assert _offsets(tokenizer, "é b").tolist() == [[0, 2], [2, 4]]  # "▁é", "▁b"
    # "▁", "a", "b", "▁b": the tokenizer gives "▁" the span of "a"
    assert _offsets(tokenizer, "ab b").tolist() == [[0, 0], [0, 1], [1, 2], [2, 4]]


def test_overlapping_pieces_of_unknown_length_leave_the_bytes_to_the_last() -> None:
    spans = np.array([[0, 1], [1, 3], [1, 3], [1, 3], [3, 4]])
    split = _split_runs(spans, [1, None, None, None, 1])
    assert split.tolist() == [[0, 1], [1, 1], [1, 1], [1, 3], [3, 4]]


def test_a_tokenizer_without_offsets_is_refused() -> None:
    from transformers import CanineTokenizer

    with pytest.raises(
        UserInputError, match=r"teacher 'c': the tokenizer is not a fast .* offsets"
    ):
        ByteOffsets(CanineTokenizer(), "teacher 'c'")


def test_offsets_all_zero_are_refused(gpt2_dir) -> None:
    tokenizer = PreTrainedTokenizerFast.from_pretrained(gpt2_dir)
    offsets = ByteOffsets(tokenizer, "teacher 'z'")
    with pytest.raises(UserInputError, match="teacher 'z': the tokenizer reports no token offsets"):
        offsets("ab", [5, 6], np.zeros((2, 2), dtype=np.int64))
