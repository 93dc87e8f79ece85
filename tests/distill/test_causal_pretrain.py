"""`lmalgebra pretrain causal`: a causal teacher from scratch, with a tokenizer of each kind,
trained by the one loop; it loads with AutoModelForCausalLM, generates text and is accepted by a
causal recipe."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.distill import pipeline as stages
from lmalgebra.distill.causal.student_model import build_causal_lm
from lmalgebra.distill.pretrain.causal import CausalTextBatches
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.student import ModelSpec
from lmalgebra.distill.vocab.tokenizer_choice import TOKENIZER_KINDS
from lmalgebra.distill.vocab.tokenizer_trainers import _settled_unigram, train_causal_tokenizer
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import _step_loss
from tiny import documents, sentences

ROOT = Path(__file__).resolve().parents[2]
TINY = ModelSpec(
    hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=64
)


def _pretrain_args(corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "pretrain",
        "causal",
        "--corpus.paths",
        str(corpus),
        "--language",
        "fr",
        "--tokenizer.vocab_size",
        "300",
        "--out",
        str(out),
        "--training.steps",
        "30",
        "--training.batch_size",
        "8",
        "--training.lr",
        "3e-3",
        "--training.warmup_steps",
        "3",
        "--training.checkpoint_every",
        "6",
        "--model.hidden_size",
        "32",
        "--model.num_layers",
        "1",
        "--model.intermediate_size",
        "128",
        "--example_length",
        "48",
        "--heldout_fraction",
        "0.2",
        "--no-progress",
        *extra,
    ]


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("causal-pretrain")
    corpus = root / "fr.txt"
    corpus.write_text("\n".join(documents(80, seed=21)) + "\n", encoding="utf-8")
    out = root / "teacher-fr"
    args = _pretrain_args(corpus, out, "--tokenizer.kind", "unigram")
    proc = subprocess.run(
        [sys.executable, "-m", "lmalgebra", *args],
        capture_output=True,
        text=True,
        check=False,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_pretrained_causal_teacher_loads_and_generates(teacher: Path) -> None:
    _, info = AutoModelForCausalLM.from_pretrained(teacher, output_loading_info=True)
    assert not info["missing_keys"]
    generate = pipeline("text-generation", model=str(teacher))
    text = generate("The river", max_new_tokens=6, do_sample=False)[0]["generated_text"]
    assert text.startswith("The river") and len(text) > len("The river")
    log = [
        json.loads(ln) for ln in (teacher / "training" / "train_log.jsonl").read_text().splitlines()
    ]
    assert log[-1]["mlm"] < log[0]["mlm"] - 0.2  # it learned something
    meta = json.loads((teacher / "lmalgebra.json").read_text())
    assert meta["kind"] == "pretrained-causal-teacher" and meta["tokenizer_kind"] == "unigram"
    card = (teacher / "README.md").read_text(encoding="utf-8")
    assert "pipeline_tag: text-generation" in card and "unigram" in card


def test_recipe_accepts_the_pretrained_causal_teacher(teacher, tmp_path, causal_teacher_dirs):
    recipe = load_recipe(write_causal_recipe(tmp_path, {**causal_teacher_dirs, "uni": teacher}))
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    assert (recipe.output_dir / "logprobs" / "xx" / "uni" / "manifest.json").is_file()


def test_the_loops_loss_is_the_models_own_causal_loss() -> None:
    tok = train_causal_tokenizer(sentences(200), "bytelevel-bpe", 300, 64)
    model = build_causal_lm(TINY.model_copy(update={"dropout": 0.0}), tok).eval()
    sequences = [np.asarray([*tok(t)["input_ids"], tok.eos_token_id]) for t in documents(20)]
    batch = CausalTextBatches(sequences, 40, 6, seed=3, language="fr", pad_id=0).batch(5)
    labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
    with torch.no_grad():
        ours = _step_loss(model, batch, TrainingSpec(gold_only=True), 0.0).mlm
        theirs = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels
        )
    assert float(ours) == pytest.approx(float(theirs.loss), abs=1e-5)


def test_batches_are_next_token_windows_drawn_from_the_index() -> None:
    sequences = [np.arange(100, 100 + n) for n in (3, 50, 120)]
    source = CausalTextBatches(sequences, 32, 8, seed=1, language="fr", pad_id=0)
    batch = source.batch(7)
    assert torch.equal(batch.labels, batch.input_ids[batch.rows, batch.cols + 1])
    assert torch.equal(batch.labels, batch.labels.clamp(min=100))  # never a padding id
    assert int(batch.tokens) == int(batch.attention_mask.sum())
    assert batch.input_ids.shape[1] <= 32
    again = source.batch(7)
    assert torch.equal(batch.input_ids, again.input_ids)
    assert not torch.equal(batch.input_ids, source.batch(8).input_ids)


@pytest.mark.parametrize("kind", TOKENIZER_KINDS)
def test_each_tokenizer_kind_starts_with_its_bos_and_reports_offsets(kind: str) -> None:
    tok = train_causal_tokenizer(sentences(300), kind, 300, 64)
    encoded = tok("The river runs.", return_offsets_mapping=True)
    assert encoded["input_ids"][0] == tok.bos_token_id and tok.eos_token_id is not None
    assert encoded["offset_mapping"][-1][1] == len("The river runs.")
    plain = tok("The river runs.", add_special_tokens=False)["input_ids"]
    assert plain == encoded["input_ids"][1:]
    assert tok.decode(plain).replace(" .", ".") == "The river runs."


def test_tokenizer_training_gives_the_same_vocabulary_in_every_process() -> None:
    """The unigram trainer sums in hash order and appends characters in hash-set order."""
    code = (
        "import sys, hashlib; sys.path.insert(0, 'tests');"
        "from tiny import documents;"
        "from lmalgebra.distill.vocab.tokenizer_choice import TOKENIZER_KINDS;"
        "from lmalgebra.distill.vocab.tokenizer_trainers import train_causal_tokenizer;"
        "[print(hashlib.sha256(train_causal_tokenizer(documents(200), k, 400, 64)"
        ".backend_tokenizer.to_str().encode()).hexdigest()) for k in TOKENIZER_KINDS]"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
        ).stdout.split()[-4:]
        for _ in range(3)
    ]
    assert runs[0] == runs[1] == runs[2]


@pytest.mark.parametrize("order", ["".join(p) for p in itertools.permutations("zßé")])
def test_the_characters_the_unigram_trainer_appends_get_one_order(order: str) -> None:
    """The trainer appends uncovered characters in hash-set order, 1e-4 apart; a trained piece
    scored between them (``ab``) does not keep them from being put in character order."""
    from tokenizers import Tokenizer

    backend = train_causal_tokenizer(sentences(300), "unigram", 300, 64).backend_tokenizer
    data = json.loads(backend.to_str())
    specials = data["model"]["vocab"][:4]
    trained = [["▁the", -2.0], [order[0], -5.0], ["ab", -5.00005], [order[1], -5.0001]]
    data["model"]["vocab"] = [*specials, *trained, [order[2], -5.0002]]
    settled = _settled_unigram(Tokenizer.from_str(json.dumps(data)))
    pieces = json.loads(settled.to_str())["model"]["vocab"][4:]
    assert pieces == [["▁the", -2.0], ["z", -5.0], ["ab", -5.00005], ["ß", -5.0001], ["é", -5.0002]]


@pytest.mark.parametrize(
    ("extra", "needles"),
    [
        (
            ["--tokenizer.kind", "sentencepiece"],
            ["tokenizer.kind", "'bytelevel-bpe', 'unigram', 'bpe' or 'wordpiece'"],
        ),
        (["--tokenizer.vocab_size", "100"], ["tokenizer.vocab_size 100 is too small for a"]),
        (["--example_length", "1"], ["--example_length '1'", "greater than or equal to 2"]),
        (["--example_length", "600"], ["example_length 600 exceeds the model's 512 positions"]),
    ],
)
def test_bad_causal_pretrain_flags(tmp_path, monkeypatch, capsys, extra, needles) -> None:
    corpus = tmp_path / "fr.txt"
    corpus.write_text("\n".join(documents(20)) + "\n", encoding="utf-8")
    code, err = run_cli(_pretrain_args(corpus, tmp_path / "out", *extra), monkeypatch, capsys)
    assert_one_line(code, err, needles)
    assert not (tmp_path / "out" / "config.json").exists()


def test_tokenizer_of_the_pretrained_teacher_has_a_start_token(teacher: Path) -> None:
    tok = AutoTokenizer.from_pretrained(teacher)
    assert tok.bos_token == "<s>" and tok.eos_token == "</s>" and tok.pad_token == "<pad>"
