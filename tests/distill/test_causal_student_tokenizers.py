"""The causal student's tokenizer (``student.tokenizer``): a teacher's, one trained on the run's
training text, or raw bytes. Each student directory loads with AutoModelForCausalLM and
AutoTokenizer and generates in a text-generation pipeline; bad spellings are refused with one line
when the recipe is loaded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill import pipeline as stages
from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
from lmalgebra.distill.examples import stored_texts
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.vocab.tokenizer_choice import TokenizerChoice, parse_student_tokenizer
from lmalgebra.distill.vocab.tokenizer_trainers import byte_tokenizer, train_causal_tokenizer

STUDENT = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 320,  # 300 bytes of example and the start token
    "dropout": 0.0,
}
TRAINING = {"steps": 2, "batch_size": 4, "lr": 3e-3, "warmup_steps": 0, "checkpoint_every": 2}
KINDS = {"teacher": "teacher:bl", "train": "train:bytelevel-bpe:300", "bytes": "bytes"}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """A causal run whose store is built (prepare, teach); the recipe's path."""
    root = tmp_path_factory.mktemp("student-tokenizers")
    path = write_causal_recipe(root, causal_teacher_dirs, student=STUDENT, training=TRAINING)
    recipe = load_recipe(path)
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    return path


def _with_tokenizer(store: Path, tokenizer: str) -> Path:
    """The store's recipe with ``student.tokenizer`` set, written beside it."""
    data = yaml.safe_load(store.read_text(encoding="utf-8"))
    data["student"]["tokenizer"] = tokenizer
    path = store.parent / f"recipe-{tokenizer.replace(':', '-')}.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def _training(recipe: Any) -> dict[str, list[str]]:
    """The run's training texts, as ``merge train`` reads them."""
    return stored_texts(recipe.output_dir, sorted(recipe.languages), heldout=False)


@pytest.mark.parametrize("kind", list(KINDS))
def test_student_of_each_tokenizer_kind_loads_and_generates(store: Path, kind: str) -> None:
    recipe = load_recipe(_with_tokenizer(store, KINDS[kind]))
    model_dir = train_student(recipe, f"student-{kind}", progress=False)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    assert model.config.vocab_size == len(tokenizer)
    made, _ = student_tokenizer(recipe, lambda: _training(recipe))
    text = "Ça coûte 5 €, señor."
    assert tokenizer(text)["input_ids"] == made(text)["input_ids"]  # saved as trained
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    out = generate("the river", max_new_tokens=4, do_sample=False)[0]["generated_text"]
    assert out.startswith("the river") and len(out) > len("the river")
    meta = json.loads((model_dir / "lmalgebra.json").read_text())
    assert meta["student_tokenizer"]["tokenizer"] == KINDS[kind].removeprefix("teacher:")


def test_trained_tokenizer_learns_from_the_training_examples_alone(store: Path) -> None:
    recipe = load_recipe(_with_tokenizer(store, "train:unigram:200"))
    made, identity = student_tokenizer(recipe, lambda: _training(recipe))
    texts = stored_texts(recipe.output_dir, heldout=False)
    want = train_causal_tokenizer([*texts["xx"], *texts["yy"]], "unigram", 200, 320)
    assert made.backend_tokenizer.to_str() == want.backend_tokenizer.to_str()
    assert identity["tokenizer"] == "train:unigram:200"
    assert (
        student_tokenizer(recipe, lambda: _training(recipe))[1] == identity
    )  # the same text, the same vocabulary


def test_byte_tokenizer_ids_are_the_utf8_bytes(tmp_path: Path) -> None:
    tokenizer = byte_tokenizer(64)
    text = "naïve 東京 😀"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id == 257 and ids[1:] == list(text.encode("utf-8"))
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id, len(tokenizer)) == (256, 258, 259)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    tokenizer.save_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path)(text)["input_ids"] == ids


def test_a_teachers_name_alone_is_still_its_tokenizer(store: Path) -> None:
    old, new = (load_recipe(_with_tokenizer(store, t)) for t in ("bl", "teacher:bl"))
    assert (
        student_tokenizer(old, lambda: _training(old))[1]
        == student_tokenizer(new, lambda: _training(new))[1]
    )  # checkpoints stay valid
    assert parse_student_tokenizer("bl", ["bl"]) == TokenizerChoice("teacher", "bl")
    assert parse_student_tokenizer("./bl", ["bl"]) == TokenizerChoice("model", "./bl")


@pytest.mark.parametrize(
    ("given", "teachers", "needles"),
    [
        ("train:bpe", ["bl"], ["'train:bpe' must read train:KIND:SIZE", "bytelevel-bpe"]),
        ("train:sentencepiece:800", ["bl"], ["must read train:KIND:SIZE"]),
        ("train:bytelevel-bpe:eight", ["bl"], ["must read train:KIND:SIZE"]),
        ("train:bytelevel-bpe:100", ["bl"], ["needs at least 260 entries"]),
        ("teacher:gpt", ["bl", "uni"], ["'teacher:gpt' names no teacher", "bl, uni"]),
        ("bytes", ["bytes"], ["both the byte tokenizer and a teacher", "teacher:bytes"]),
    ],
)
def test_bad_spellings_are_refused(given: str, teachers: list[str], needles: list[str]) -> None:
    with pytest.raises(UserInputError) as refused:
        parse_student_tokenizer(given, teachers)
    assert all(n in str(refused.value) for n in needles), str(refused.value)


def test_bad_spelling_in_a_recipe_stops_merge_train_with_one_line(
    store: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _with_tokenizer(store, "train:bytelevel-bpe:10")
    code, err = run_cli(["merge", "train", str(path), "--no-progress"], monkeypatch, capsys)
    assert_one_line(code, err, ["student.tokenizer 'train:bytelevel-bpe:10'", "at least 260"])


@pytest.mark.parametrize("kind", ["bytelevel-bpe", "unigram", "wordpiece"])
def test_a_tokenizer_far_smaller_than_asked_is_named(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """``pretrain --tokenizer.vocab_size 8000`` (or ``train:KIND:8000``) on little text had given
    a tokenizer of a few hundred entries without a word; one as large as asked says nothing."""
    import logging

    from tiny import sentences

    texts = sentences(100, seed=1)
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        small = train_causal_tokenizer(texts, kind, 8000, 64)
        train_causal_tokenizer(texts, kind, len(small), 64)  # what the text gives
    said = [r.getMessage() for r in caplog.records]
    assert said == [
        f"a tokenizer of 8000 entries was asked, but the text gives {len(small)} alone (every "
        f"character and merge it holds): the tokenizer has {len(small)}; give more text, or "
        "ask for fewer"
    ]
