"""MergeDistill recipes (typed, errors naming key and file) and per-teacher masking."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
from transformers import AutoTokenizer

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.examples import language_examples
from lmalgebra.distill.masked.masking import TeacherMasker
from lmalgebra.distill.recipe import MaskingSpec, load_recipe
from merge_fixtures import write_recipe
from tiny import sentences


def edit(path: Path, change) -> Path:
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: d["masking"].update(probabilty=0.2), "unknown key 'masking.probabilty'"),
        (lambda d: d["languages"]["xx"].update(teachers=[]), "language 'xx' has no teacher"),
        (lambda d: d["languages"]["xx"].update(teachers=["ghost"]), "teacher 'ghost'"),
        (lambda d: d["teachers"].update(extra={"path": "x"}), "teacher 'extra' is defined but"),
        (lambda d: d.update(top_k=0), "key 'top_k'"),
        (lambda d: d["masking"].update(replace=[0.5, 0.5, 0.5]), "masking.replace"),
    ],
)
def test_bad_recipes_name_the_key(tmp_path: Path, teacher_dirs, change, message: str) -> None:
    path = edit(write_recipe(tmp_path, teacher_dirs), change)
    with pytest.raises(UserInputError, match=message) as info:
        load_recipe(path)
    assert str(info.value).startswith(f"{path}: ")  # a check across keys names the file too


def test_examples_have_stable_ids_and_a_heldout_share(tmp_path: Path, teacher_dirs) -> None:
    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs, heldout_fraction=0.3))
    first, again = language_examples(recipe, "xx"), language_examples(recipe, "xx")
    assert first == again and len({e.id for e in first}) == len(first) == 60
    assert all(e.id.startswith("xx-") for e in first)
    assert 0.1 < np.mean([e.heldout for e in first]) < 0.5


@pytest.fixture(scope="module")
def wp_tokenizer(teacher_dirs):
    return AutoTokenizer.from_pretrained(teacher_dirs["wp"])


def test_masking_is_deterministic_and_bert_like(wp_tokenizer) -> None:
    spec = MaskingSpec(seed=1)
    masker = TeacherMasker("wp", wp_tokenizer, spec, max_length=64)
    texts = sentences(400, seed=9)
    copies = [masker(f"id{i}", t) for i, t in enumerate(texts)]
    again = TeacherMasker("wp", wp_tokenizer, spec, max_length=64)("id0", texts[0])
    np.testing.assert_array_equal(again.input_ids, copies[0].input_ids)
    other_teacher = TeacherMasker("sp", wp_tokenizer, spec, max_length=64)("id0", texts[0])
    other_seed = TeacherMasker("wp", wp_tokenizer, MaskingSpec(seed=2), 64)("id0", texts[0])
    assert not (
        np.array_equal(other_teacher.positions, copies[0].positions)
        and np.array_equal(other_seed.positions, copies[0].positions)
    )
    candidates = masked = kept = replaced_mask = 0
    for text, c in zip(texts, copies, strict=True):
        original = np.asarray(wp_tokenizer(text, truncation=True, max_length=64)["input_ids"])
        np.testing.assert_array_equal(c.labels, original[c.positions])  # gold labels kept
        outside = np.setdiff1d(np.arange(len(original)), c.positions)
        np.testing.assert_array_equal(c.input_ids[outside], original[outside])
        assert 0 not in c.positions and len(original) - 1 not in c.positions  # never [CLS]/[SEP]
        candidates += len(original) - 2
        masked += c.positions.size
        replaced_mask += int((c.input_ids[c.positions] == wp_tokenizer.mask_token_id).sum())
        kept += int((c.input_ids[c.positions] == c.labels).sum())
    assert masked / candidates == pytest.approx(0.15, abs=0.02)
    assert replaced_mask / masked == pytest.approx(0.8, abs=0.04)
    # 10% unchanged, plus random replacements that happen to draw the original token
    assert kept / masked == pytest.approx(0.1, abs=0.04)


def test_whole_word_masking_takes_every_piece(wp_tokenizer) -> None:
    masker = TeacherMasker("wp", wp_tokenizer, MaskingSpec(whole_word=True, probability=0.3), 64)
    for i, text in enumerate(sentences(50, seed=4)):
        enc = wp_tokenizer(text, truncation=True, max_length=64)
        words = enc.word_ids()
        chosen = set(masker(f"w{i}", text).positions.tolist())
        for position in chosen:
            same_word = {p for p, w in enumerate(words) if w == words[position]}
            assert same_word <= chosen


@pytest.mark.parametrize("whole_word", [False, True])
def test_pretraining_batches_mask_kept_encodings_as_fresh_ones(
    wp_tokenizer, whole_word: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pretrain masked`` tokenises an example once and masks it again on later draws: every
    batch equals the one masked from the text, whether its examples were kept or not."""
    from lmalgebra.distill.pretrain import masked

    texts = sentences(12, seed=5)
    ids = [f"d{i}" for i in range(len(texts))]
    spec = MaskingSpec(whole_word=whole_word, probability=0.3)

    def batches(kept_tokens: int) -> list[dict[str, np.ndarray]]:
        monkeypatch.setattr(masked, "ENCODED_TOKENS_KEPT", kept_tokens)
        source = masked.TextBatches(ids, texts, wp_tokenizer, spec, 32, 8, seed=3, language="x")
        drawn = [source.batch(index) for index in range(6)]  # 48 draws of 12 examples
        assert (len(source.encoded) == 12) == (kept_tokens > 10**6)
        return [{k: v.numpy() for k, v in vars(b).items() if hasattr(v, "numpy")} for b in drawn]

    kept, fresh = batches(10**9), batches(0)
    masker = TeacherMasker("pretrain", wp_tokenizer, spec, 32)
    for index, (a, b) in enumerate(zip(kept, fresh, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
        picks = np.random.default_rng([3, index]).integers(len(texts), size=8)
        first = masker(f"{ids[picks[0]]}@{index}", texts[picks[0]])
        np.testing.assert_array_equal(a["labels"][: first.labels.size], first.labels)


def test_tokenizer_without_mask_token_is_refused(tmp_path: Path) -> None:
    from tiny import build_gpt2

    tok = AutoTokenizer.from_pretrained(build_gpt2(tmp_path / "g"))
    with pytest.raises(UserInputError, match="teacher 'g': tokenizer has no mask token"):
        TeacherMasker("g", tok, MaskingSpec(), 32)


def test_language_left_empty_by_the_heldout_split_is_refused(tmp_path: Path, teacher_dirs) -> None:
    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs, heldout_fraction=0.999))
    with pytest.raises(UserInputError, match="language 'xx': no training example left"):
        language_examples(recipe, "xx")


@pytest.mark.parametrize("whole_word", [False, True])
@pytest.mark.parametrize("teacher", ["wp", "sp"])
def test_a_list_of_texts_is_encoded_and_masked_as_each_text_alone(
    teacher_dirs, teacher: str, whole_word: bool
) -> None:
    """``prepare`` hands the tokenizer a shard of texts at once: each copy equals the one made
    from the tokenizer called on its text alone (ids, maskable positions, words), and an empty
    text or an empty list takes no special path."""
    tokenizer = AutoTokenizer.from_pretrained(teacher_dirs[teacher])
    spec = MaskingSpec(whole_word=whole_word, probability=0.3)
    masker = TeacherMasker(teacher, tokenizer, spec, 24)
    texts = [*sentences(20, seed=6), "", "a " * 200]  # an empty one, one cut at 24 tokens
    ids = [f"e{i}" for i in range(len(texts))]
    assert masker.encode_many([]) == [] and masker.mask_many([], []) == []
    for text, got in zip(texts, masker.encode_many(texts), strict=True):
        want = tokenizer(text, truncation=True, max_length=24, return_special_tokens_mask=True)
        np.testing.assert_array_equal(got.input_ids, want["input_ids"])
        special = np.asarray(want["special_tokens_mask"])
        np.testing.assert_array_equal(got.candidates, np.flatnonzero(special == 0))
        assert got.word_ids == (tuple(want.word_ids()) if whole_word else None)
    assert len(masker.encode_many(texts)[-1].input_ids) == 24
    for i, text, copy in zip(ids, texts, masker.mask_many(ids, texts), strict=True):
        alone = masker(i, text)
        for field in ("input_ids", "positions", "labels"):
            np.testing.assert_array_equal(getattr(copy, field), getattr(alone, field))
