"""Student vocabulary union: canonical forms, exact maps, specials, order, persistence, report."""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers.trainers import BpeTrainer, UnigramTrainer, WordPieceTrainer
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.vocab.union import (
    STUDENT_SPECIALS,
    Convention,
    UnionVocab,
    apply_map,
    build_union,
    canonical_token,
    detect_convention,
    tokens_per_language,
)
from tiny import sentences

ACCENTED = [
    "Le café naïve de Zürich est très célèbre.",
    "Naïve Zürich café, façade and crème brûlée.",
    "Über die Brücke in Zürich geht man zum Café.",
]
ROLE = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
# Teacher special token -> student special, per teacher, written out by hand.
SPECIALS = {
    "wp": {s: s for s in STUDENT_SPECIALS},
    "sp": {"<pad>": "[PAD]", "<unk>": "[UNK]", "<s>": "[CLS]", "</s>": "[SEP]", "<mask>": "[MASK]"},
    "bl": {"<eos>": "[SEP]"},
}
CONVENTION: dict[str, Convention] = {"wp": "wordpiece", "sp": "sentencepiece", "bl": "bytelevel"}


def _corpus(seed: int) -> list[str]:
    return sentences(300, seed=seed) + ACCENTED * 20


def _wordpiece_teacher() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    trainer = WordPieceTrainer(vocab_size=200, special_tokens=list(STUDENT_SPECIALS))
    tok.train_from_iterator(_corpus(0), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    roles = dict(zip(("pad", "unk", "cls", "sep", "mask"), STUDENT_SPECIALS, strict=True))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, **{f"{k}_token": v for k, v in roles.items()}
    )


def _sentencepiece_teacher() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    specials = ["<s>", "</s>", "<pad>", "<unk>", "<mask>"]
    trainer = UnigramTrainer(vocab_size=250, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(_corpus(1), trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
    )


def _bytelevel_teacher() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = BpeTrainer(vocab_size=300, special_tokens=["<eos>"], initial_alphabet=alphabet)
    tok.train_from_iterator(_corpus(2), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


@pytest.fixture(scope="module")
def teachers() -> dict[str, PreTrainedTokenizerFast]:
    return {"wp": _wordpiece_teacher(), "sp": _sentencepiece_teacher(), "bl": _bytelevel_teacher()}


@pytest.fixture(scope="module")
def union(teachers: dict[str, PreTrainedTokenizerFast]) -> UnionVocab:
    return build_union(teachers)


def _expected(name: str, tokenizer: PreTrainedTokenizerFast, ids: list[int]) -> list[str]:
    """Canonical teacher tokens, computed without the maps."""
    out = []
    for token in tokenizer.convert_ids_to_tokens(ids):
        special = SPECIALS[name].get(token)
        out.append(special or canonical_token(token, CONVENTION[name]))
    return out


def _detokenize(canonical: list[str]) -> str:
    """Text back from canonical tokens: word starts get a space, byte tokens become bytes."""
    text = "".join(t[2:] if t.startswith("##") else " " + t for t in canonical)
    parts = re.split(r"(<0x[0-9A-F]{2}>)", text)
    data = b"".join(bytes([int(p[3:5], 16)]) if p.startswith("<0x") else p.encode() for p in parts)
    return data.decode("utf-8")


def test_canonical_form_agrees_across_conventions() -> None:
    word: list[tuple[str, Convention]] = [
        ("play", "wordpiece"),
        ("▁play", "sentencepiece"),
        ("Ġplay", "bytelevel"),
    ]
    piece: list[tuple[str, Convention]] = [
        ("##ing", "wordpiece"),
        ("ing", "sentencepiece"),
        ("ing", "bytelevel"),
    ]
    assert {canonical_token(t, c) for t, c in word} == {"play"}
    assert {canonical_token(t, c) for t, c in piece} == {"##ing"}
    assert canonical_token("Ġcaf", "bytelevel") == "caf"
    assert canonical_token("Ã©", "bytelevel") == "##é"  # bytes C3 A9
    assert canonical_token("ĠÃ", "bytelevel") == "<0xC3>"  # a truncated UTF-8 sequence
    assert canonical_token("Ã", "bytelevel") == canonical_token("<0xC3>", "sentencepiece")
    assert canonical_token("Ġ", "bytelevel") == canonical_token("▁", "sentencepiece") == ""
    assert canonical_token("▁New▁York", "sentencepiece") == "New York"
    assert canonical_token("@@ing", "wordpiece", marker="@@") == "##ing"


def test_conventions_and_lowercase_are_detected(
    teachers: dict[str, PreTrainedTokenizerFast], union: UnionVocab
) -> None:
    assert {name: detect_convention(tok) for name, tok in teachers.items()} == CONVENTION
    assert union.conventions == CONVENTION
    assert union.lowercase is False  # only the WordPiece teacher lower-cases
    assert build_union({"wp": teachers["wp"]}).lowercase is True
    assert build_union(teachers, lowercase=True).lowercase is True


def test_union_holds_every_teacher_token_once(
    teachers: dict[str, PreTrainedTokenizerFast], union: UnionVocab
) -> None:
    assert len(set(union.tokens)) == len(union.tokens)
    expected = set(STUDENT_SPECIALS)
    for name, tok in teachers.items():
        canonical = _expected(name, tok, list(range(len(tok))))
        assert set(canonical) <= set(union.tokens)
        expected |= set(canonical)
        assert union.maps[name].dtype == np.int32 and union.maps[name].shape == (len(tok),)
    assert set(union.tokens) == expected


def test_order_is_deterministic(teachers: dict[str, PreTrainedTokenizerFast]) -> None:
    first, again = build_union(teachers), build_union(teachers)
    assert first.tokens == again.tokens
    assert all(np.array_equal(first.maps[n], again.maps[n]) for n in teachers)
    reordered = build_union(dict(reversed(teachers.items())))
    assert reordered.tokens != first.tokens and set(reordered.tokens) == set(first.tokens)
    assert reordered.tokens[:5] == first.tokens[:5] == list(STUDENT_SPECIALS)
    for name in teachers:  # same canonical token behind every teacher id, either order
        assert [first.tokens[i] for i in first.maps[name]] == [
            reordered.tokens[i] for i in reordered.maps[name]
        ]


@pytest.mark.parametrize("name", ["wp", "sp", "bl"])
def test_maps_round_trip_teacher_tokens(
    name: str, teachers: dict[str, PreTrainedTokenizerFast], union: UnionVocab
) -> None:
    tok = teachers[name]
    texts = [*sentences(100, seed=7), *ACCENTED, "façade ☃ 東京 Ærøskøbing"]
    for text in texts:
        ids = tok(text)["input_ids"]
        student = apply_map(np.array(ids), union.maps[name])
        got = [union.tokens[i] for i in student]
        assert got == _expected(name, tok, ids), text


def test_bytelevel_round_trip_is_lossless(
    teachers: dict[str, PreTrainedTokenizerFast], union: UnionVocab
) -> None:
    tok = teachers["bl"]
    for text in [*ACCENTED, "façade ☃ 東京 Ærøskøbing", " leading space"]:
        ids = tok(text)["input_ids"]
        got = [union.tokens[i] for i in apply_map(np.array(ids), union.maps["bl"])]
        assert any(t.startswith(("<0x", "##<0x")) for t in got) or text.isascii()
        assert _detokenize(got) == text


def test_specials_map_to_their_roles(
    teachers: dict[str, PreTrainedTokenizerFast], union: UnionVocab
) -> None:
    assert union.tokens[:5] == list(STUDENT_SPECIALS)
    for name, table in SPECIALS.items():
        tok = teachers[name]
        for teacher_token, student_token in table.items():
            teacher_id = tok.convert_tokens_to_ids(teacher_token)
            assert union.maps[name][teacher_id] == ROLE[student_token], (name, teacher_token)
    assert "<s>" not in union.tokens and "<eos>" not in union.tokens


def test_other_special_tokens_get_their_own_entry(tmp_path: Path) -> None:
    tok = _hand_wordpiece()
    tok.add_special_tokens({"additional_special_tokens": ["<extra_id_0>"]})
    tok.add_tokens(["newword"])
    union = build_union({"a": tok, "b": _hand_wordpiece()})
    extra = union.maps["a"][tok.convert_tokens_to_ids("<extra_id_0>")]
    assert union.tokens[extra] == "<extra_id_0>" and union.extra_specials == ["<extra_id_0>"]
    assert union.tokens[union.maps["a"][tok.convert_tokens_to_ids("newword")]] == "newword"
    union.save(tmp_path)
    student = AutoTokenizer.from_pretrained(tmp_path)
    assert "<extra_id_0>" in student.all_special_tokens
    ids = student("the <extra_id_0> cat", add_special_tokens=False)["input_ids"]
    assert [union.tokens[i] for i in ids] == ["the", "<extra_id_0>", "cat"]


def test_apply_map_keeps_negative_ids() -> None:
    mapping = np.array([7, 5, 9], dtype=np.int32)
    ids = np.array([[0, 2, -100], [-100, 1, 1]], dtype=np.int64)
    out = apply_map(ids, mapping)
    assert out.dtype == np.int64 and out.shape == ids.shape
    assert out.tolist() == [[7, 9, -100], [-100, 5, 5]]
    assert apply_map(np.array([], dtype=np.int64), mapping).shape == (0,)
    with pytest.raises(UserInputError, match="token id 3 is outside"):
        apply_map(np.array([3]), mapping)
    with pytest.raises(UserInputError, match="integers"):
        apply_map(np.array([0.5]), mapping)


def test_save_load_round_trip(union: UnionVocab, tmp_path: Path) -> None:
    union.save(tmp_path / "student")
    loaded = UnionVocab.load(tmp_path / "student")
    assert loaded.tokens == union.tokens
    assert list(loaded.maps) == list(union.maps)
    for name, mapping in union.maps.items():
        assert loaded.maps[name].dtype == np.int32
        assert np.array_equal(loaded.maps[name], mapping)
    assert (loaded.lowercase, loaded.conventions) == (union.lowercase, union.conventions)
    assert loaded.vocab_sha256 == union.vocab_sha256 and len(loaded.vocab_sha256) == 3
    assert not list((tmp_path / "student").glob(".*"))  # no staging or temporary files left


def test_load_rejects_missing_and_altered_files(union: UnionVocab, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"vocab_union\.json"):
        UnionVocab.load(tmp_path / "nowhere")
    union.save(tmp_path)
    (tmp_path / "vocab_maps.safetensors").write_bytes(b"garbage")
    with pytest.raises(UserInputError, match=r"vocab_maps\.safetensors"):
        UnionVocab.load(tmp_path)


def test_saved_student_tokenizer_loads_with_auto_tokenizer(
    union: UnionVocab, tmp_path: Path
) -> None:
    union.save(tmp_path)
    student = AutoTokenizer.from_pretrained(tmp_path)
    assert len(student) == len(union.tokens)
    text = sentences(1, seed=3)[0]
    ids = student(text)["input_ids"]
    assert ids[0] == ROLE["[CLS]"] and ids[-1] == ROLE["[SEP]"]
    assert ROLE["[UNK]"] not in ids
    assert student.convert_ids_to_tokens(ids[1:-1]) == [union.tokens[i] for i in ids[1:-1]]
    assert student.decode(ids, skip_special_tokens=True) == text
    assert ids == union.student_tokenizer()(text)["input_ids"]
    assert (student.pad_token_id, student.mask_token_id) == (0, 4)


def _hand_wordpiece() -> PreTrainedTokenizerFast:
    vocab = [*STUDENT_SPECIALS, "play", "##ing", "the", "##s", "cat"]
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    roles = dict(zip(("pad", "unk", "cls", "sep", "mask"), STUDENT_SPECIALS, strict=True))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, **{f"{k}_token": v for k, v in roles.items()}
    )


def _hand_sentencepiece() -> PreTrainedTokenizerFast:
    pieces = ["<s>", "</s>", "<pad>", "<unk>", "<mask>", "▁play", "ing", "▁dog", "s", "▁"]
    tok = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=3, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    specials = {"bos": "<s>", "eos": "</s>", "pad": "<pad>", "unk": "<unk>", "mask": "<mask>"}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, **{f"{k}_token": v for k, v in specials.items()}
    )


def _hand_bytelevel() -> PreTrainedTokenizerFast:
    tokens = ["<eos>", "Ġplay", "ing", "Ġdog", "Ã", "©", "Ã©", "Ġcaf"]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, []))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def test_report_on_a_hand_made_example() -> None:
    hand = {"a": _hand_wordpiece(), "b": _hand_sentencepiece(), "c": _hand_bytelevel()}
    union = build_union(hand)
    # a adds play ##ing the ##s cat; b adds dog and "" (the bare ▁); c adds 4 byte/accent tokens
    assert union.tokens[5:] == [
        "play", "##ing", "the", "##s", "cat", "dog", "", "##<0xC3>", "##<0xA9>", "##é", "caf"
    ]  # fmt: skip
    assert union.maps["c"].tolist() == [3, 5, 6, 10, 12, 13, 14, 15]
    # play / ##ing / ▁play / ing / Ġplay / ing: one student entry per canonical token
    assert union.maps["a"][5:7].tolist() == union.maps["b"][5:7].tolist() == [5, 6]
    assert union.maps["c"][1:3].tolist() == [5, 6]
    report = union.report(hand)
    assert report["union_size"] == 16
    assert report["teachers"] == {
        "a": {"convention": "wordpiece", "vocab_size": 10, "canonical_tokens": 5,
              "new_tokens": 5, "new_fraction": 0.5},
        "b": {"convention": "sentencepiece", "vocab_size": 10, "canonical_tokens": 5,
              "new_tokens": 2, "new_fraction": 0.2},
        "c": {"convention": "bytelevel", "vocab_size": 8, "canonical_tokens": 7,
              "new_tokens": 4, "new_fraction": 0.5},
    }  # fmt: skip
    overlap = {(o["a"], o["b"]): (o["shared"], o["jaccard"]) for o in report["overlap"]}
    assert overlap == {("a", "b"): (3, 3 / 7), ("a", "c"): (2, 2 / 10), ("b", "c"): (3, 3 / 9)}


def test_report_rejects_other_tokenizers(
    teachers: dict[str, PreTrainedTokenizerFast], union: UnionVocab
) -> None:
    other = {**teachers, "bl": _hand_bytelevel()}
    with pytest.raises(UserInputError, match="tokenizer 'bl' is not the one"):
        union.report(other)
    with pytest.raises(UserInputError, match="needs the teachers"):
        union.report({"wp": teachers["wp"]})
    assert union.report(teachers)["union_size"] == len(union.tokens)


def test_tokens_per_language() -> None:
    student = build_union({"a": _hand_wordpiece()}).student_tokenizer()
    got = tokens_per_language({"en": ["the cat", "the plays"], "xx": ["cat"]}, student)
    assert got == {"en": (2 + 3) / 4, "xx": 1.0}
    with pytest.raises(UserInputError, match="'empty'"):
        tokens_per_language({"empty": ["  "]}, student)


def test_unknown_convention_names_the_tokenizer() -> None:
    tok = Tokenizer(models.WordLevel({"[UNK]": 0, "word": 1}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    wordlevel = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    with pytest.raises(UserInputError, match="'my-wordlevel' has an unknown"):
        build_union({"ok": _hand_wordpiece(), "my-wordlevel": wordlevel})
    with pytest.raises(UserInputError, match="at least one"):
        build_union({})


def test_sentencepiece_bpe_is_detected() -> None:
    tok = Tokenizer(models.BPE({"▁a": 0, "b": 1}, []))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    assert detect_convention(PreTrainedTokenizerFast(tokenizer_object=tok)) == "sentencepiece"
    llama = Tokenizer(models.BPE({"▁a": 0, "b": 1}, []))  # no Metaspace: ▁ written by hand
    llama.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    llama.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
    assert detect_convention(PreTrainedTokenizerFast(tokenizer_object=llama)) == "sentencepiece"


def test_slow_tokenizer_is_refused() -> None:
    with pytest.raises(UserInputError, match="'slow-one' is not a fast"):
        detect_convention(SimpleNamespace(name_or_path="slow-one"))  # type: ignore[arg-type]


def test_large_vocabularies_build_in_seconds() -> None:
    """Two 100k-token teachers: linear time, not quadratic (that would take hours)."""
    rng = random.Random(0)
    words = list(
        dict.fromkeys("".join(rng.choices("abcdefghijklmnoprstuvz", k=7)) for _ in range(210_000))
    )
    pieces = ["<unk>", *(("▁" if i % 2 else "") + w for i, w in enumerate(words[:100_000]))]
    sp = Tokenizer(models.Unigram([(p, -1.0) for p in pieces], unk_id=0))
    sp.pre_tokenizer = pre_tokenizers.Metaspace()
    bl_vocab = {("Ġ" if i % 3 else "") + w: i for i, w in enumerate(words[100_000:200_000])}
    bl = Tokenizer(models.BPE(bl_vocab, []))
    bl.pre_tokenizer = pre_tokenizers.ByteLevel()
    teachers = {
        "sp": PreTrainedTokenizerFast(tokenizer_object=sp, unk_token="<unk>"),
        "bl": PreTrainedTokenizerFast(tokenizer_object=bl),
    }
    start = time.perf_counter()
    union = build_union(teachers)
    assert time.perf_counter() - start < 30
    assert len(union.tokens) > 190_000 and union.maps["bl"].shape == (100_000,)
