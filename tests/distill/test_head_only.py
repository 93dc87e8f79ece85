"""`lmalgebra pretrain head-only`: a masked-LM head fitted on a frozen encoder, as a teacher."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from hostile_helpers import assert_one_line, run_cli
from lmalgebra.distill import pipeline
from lmalgebra.distill.examples import example_id, is_heldout
from lmalgebra.distill.masked.masking import TeacherMasker, pad_batch
from lmalgebra.distill.pretrain.head_only import (
    CachedEncoder,
    cached_source,
    encoder_replaced,
    encoder_with_new_head,
    masked_states,
    pretrain_head,
)
from lmalgebra.distill.pretrain.specs import HeadOnlySpec
from lmalgebra.distill.recipe import MaskingSpec, load_recipe
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.masked_head import masked_logits
from lmalgebra.train.run_fingerprint import CheckpointMismatchError
from merge_fixtures import write_recipe
from tiny import documents

HEADS = ("cls.predictions.",)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("head-corpus") / "xx.txt"
    path.write_text("\n".join(documents(80, seed=21)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, corpus: Path, bert_dir: Path) -> Path:
    out = tmp_path_factory.mktemp("head-only") / "teacher-xx"
    args = ["head-only", "--corpus.paths", str(corpus), "--language", "xx", "--out", str(out)]
    args += [
        "--encoder",
        str(bert_dir),
        "--training.steps",
        "40",
        "--training.batch_size",
        "8",
        "--training.lr",
        "0.01",
        "--training.warmup_steps",
        "4",
        "--training.checkpoint_every",
        "8",
    ]
    args += ["--example_length", "48", "--heldout_fraction", "0.2", "--no-progress"]
    proc = subprocess.run(
        [sys.executable, "-m", "lmalgebra", "pretrain", *args],
        capture_output=True,
        text=True,
        check=False,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return out


def test_encoder_weights_are_unchanged_bit_for_bit(teacher: Path, bert_dir: Path) -> None:
    model, info = AutoModelForMaskedLM.from_pretrained(teacher, output_loading_info=True)
    assert not info["missing_keys"]
    assert model.config.architectures == ["BertForMaskedLM"]
    original = AutoModel.from_pretrained(bert_dir).state_dict()
    encoder = model.base_model.state_dict()
    assert set(encoder) <= set(original)
    for name, value in encoder.items():
        assert torch.equal(value, original[name]), name
    # the output projection is the frozen input embedding matrix (tied), not a new matrix
    decoder = model.get_output_embeddings().weight
    assert torch.equal(decoder, original["embeddings.word_embeddings.weight"])
    head = {k: v for k, v in model.state_dict().items() if k.startswith(HEADS)}
    assert not torch.equal(head["cls.predictions.bias"], torch.zeros_like(decoder[:, 0]))


def test_only_the_head_trains_and_its_loss_falls(teacher: Path) -> None:
    meta = json.loads((teacher / "lmalgebra.json").read_text())
    assert meta["kind"] == "head-only-teacher" and meta["tied_output_projection"]
    assert meta["trained_parameters"] and all(
        n.startswith(HEADS) and not n.endswith("decoder.weight") for n in meta["trained_parameters"]
    )
    log = [
        json.loads(ln) for ln in (teacher / "training" / "train_log.jsonl").read_text().splitlines()
    ]
    assert log[-1]["mlm"] < log[0]["mlm"] - 0.1
    assert all(r["kd"] == 0 for r in log)


def test_teacher_keeps_the_encoders_tokenizer_and_has_a_card(teacher: Path, bert_dir: Path) -> None:
    mine, theirs = AutoTokenizer.from_pretrained(teacher), AutoTokenizer.from_pretrained(bert_dir)
    assert mine.get_vocab() == theirs.get_vocab() and mine.mask_token == "[MASK]"
    card = (teacher / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers\npipeline_tag: fill-mask\n")
    assert "head-only teacher" in card and "(frozen; weights sha256" in card
    assert "tied to the frozen input embeddings" in card


def test_head_only_holds_out_what_the_recipe_holds_out(teacher: Path, corpus: Path) -> None:
    meta = json.loads((teacher / "lmalgebra.json").read_text())
    docs = [d.strip() for d in corpus.read_text().splitlines() if d.strip()]
    assert meta["examples"] == sum(not is_heldout(example_id("xx", d), 0.2) for d in docs)
    assert meta["heldout_fraction"] == 0.2


def test_recipe_teaches_with_the_head_only_teacher(
    teacher: Path, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    recipe = load_recipe(write_recipe(tmp_path, {"wp": teacher, "sp": teacher_dirs["sp"]}))
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)  # loads it as a masked LM with every head weight
    for lang in ("xx", "yy"):
        assert ShardSet.existing(recipe.output_dir / "topk" / lang / "wp").complete


def test_cached_states_are_the_encoders_states(bert_dir: Path, corpus: Path) -> None:
    """Parity: the cache's rows are ``output_hidden_states[-1]`` of each copy alone, unpadded."""
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    model = encoder_with_new_head(ModelRef(name="b", path=str(bert_dir)), bert_dir, seed=0)
    masker = TeacherMasker("head", tokenizer, MaskingSpec(seed=1), 48)
    texts = documents(12, seed=5)
    copies = [masker(f"id{i}", t) for i, t in enumerate(texts)]
    cached = masked_states(model.base_model, copies, tokenizer.pad_token_id, batch_size=5)
    reference = []
    with torch.no_grad():
        for c in copies:
            out = model(input_ids=torch.from_numpy(c.input_ids)[None], output_hidden_states=True)
            reference.append(out.hidden_states[-1][0, torch.from_numpy(c.positions)])
    torch.testing.assert_close(cached, torch.cat(reference), atol=1e-5, rtol=1e-5)


def test_head_on_cached_states_gives_the_full_models_logits(bert_dir: Path) -> None:
    """The stand-in encoder changes nothing but the cost: logits of a cached batch equal the
    whole model's logits at the same masked positions."""
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    model = encoder_with_new_head(ModelRef(name="b", path=str(bert_dir)), bert_dir, seed=0)
    texts = documents(20, seed=6)
    ids = [f"xx-{i}" for i in range(len(texts))]
    training = TrainingSpec(batch_size=6, seed=2)
    states, source = cached_source(model, tokenizer, (ids, texts), 48, training, "xx")
    batch = source.batch(3)
    with torch.no_grad(), encoder_replaced(model, CachedEncoder(states)) as fitting:
        fast = masked_logits(fitting, batch.head_inputs())
    picks = np.random.default_rng([2, 3]).integers(len(texts), size=6)
    masker = TeacherMasker("head", tokenizer, MaskingSpec(seed=2), 48)
    copies = [masker(ids[i], texts[i]) for i in picks]
    with torch.no_grad():
        full = masked_logits(model, pad_batch(copies, tokenizer.pad_token_id))
    torch.testing.assert_close(fast, full, atol=1e-4, rtol=1e-4)
    labels = np.concatenate([c.labels for c in copies])
    assert torch.equal(batch.labels, torch.from_numpy(labels))


@pytest.mark.parametrize(
    ("kind", "extra", "needles"),
    [
        ("head-only", [], ["command line: missing --encoder"]),
        ("head-only", ["--encoder", "{gpt2}"], ["encoder", "not an encoder with a masked-LM form"]),
        ("head-only", ["--encoder", "/no/such/dir"], ["/no/such/dir", "does not exist"]),
        # the keys it needs, where it had named the section ("missing key 'tokenizer'")
        ("masked", [], ["give tokenizer.vocab_size", "or tokenizer.path"]),
        ("causal", [], ["command line: missing --tokenizer.vocab_size"]),
        (
            "masked",
            ["--tokenizer.vocab_size", "100", "--tokenizer.path", "{bert}"],
            ["tokenizer.vocab_size or tokenizer.path, not both"],
        ),
        ("causal", ["--tokenizer.vocab_size", "20"], ["too small for a bytelevel-bpe"]),
    ],
)
def test_bad_pretrain_inputs_exit_2_naming_the_culprit(
    kind: str,
    extra: list[str],
    needles: list[str],
    corpus: Path,
    bert_dir: Path,
    gpt2_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "t"
    args = ["pretrain", kind, "--corpus.paths", str(corpus), "--language", "xx", "--out", str(out)]
    args += [a.format(bert=bert_dir, gpt2=gpt2_dir) for a in extra] + ["--no-progress"]
    code, stderr = run_cli(args, monkeypatch, capsys)
    assert_one_line(code, stderr, needles)
    assert not (out / "lmalgebra.json").exists()


@pytest.mark.parametrize(
    ("kind", "flag"),
    [("head-only", "--tokenizer.vocab_size"), ("masked", "--encoder"), ("causal", "--lowercase")],
)
def test_a_setting_of_another_kind_of_teacher_is_no_flag(
    kind: str, flag: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, stderr = run_cli(["pretrain", kind, flag, "1"], monkeypatch, capsys)
    assert code == 2 and f"No such option: {flag}" in stderr


def test_a_second_run_resumes_from_the_checkpoints_and_refuses_other_inputs(
    bert_dir: Path, corpus: Path, tmp_path: Path
) -> None:
    """Checkpoints hold the head (the stand-in encoder has no weights) and load back into it."""
    out = tmp_path / "teacher"
    data = {
        "corpus": {"paths": [str(corpus)]},
        "language": "xx",
        "out": out,
        "encoder": str(bert_dir),
        "example_length": 48,
        "training": {"steps": 4, "batch_size": 4, "warmup_steps": 0, "checkpoint_every": 2},
    }
    spec = HeadOnlySpec.model_validate(data)
    pretrain_head(spec, progress=False)
    first = load_file(str(out / "model.safetensors"))
    checkpoint = load_file(
        str(out / "training" / "checkpoints" / "step-0000004" / "model.safetensors")
    )
    assert not any(k.startswith("bert.") for k in checkpoint)
    pretrain_head(spec, progress=False)  # nothing to do
    again = load_file(str(out / "model.safetensors"))
    assert all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(CheckpointMismatchError, match="the corpus changed"):
        pretrain_head(HeadOnlySpec.model_validate({**data, "max_examples": 10}), progress=False)


def test_an_encoder_written_here_and_damaged_since_is_refused(
    teacher: Path, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A model written here whose files no longer match its record, as the encoder: a head had
    been trained on it, as on the model it was (its ``config.json`` edited since)."""
    import shutil

    encoder = tmp_path / "encoder"
    shutil.copytree(teacher, encoder, ignore=shutil.ignore_patterns("training"))
    config = json.loads((encoder / "config.json").read_text(encoding="utf-8"))
    (encoder / "config.json").write_text(json.dumps({**config, "hidden_act": "relu"}))
    out = tmp_path / "head"
    args = ["pretrain", "head-only", "--corpus.paths", str(corpus), "--language", "xx"]
    args += ["--encoder", str(encoder), "--out", str(out), "--training.steps", "1"]
    code, stderr = run_cli(args, monkeypatch, capsys)
    assert_one_line(code, stderr, [f"encoder {encoder}", "config.json is damaged"])
    assert not out.exists()


def test_keep_saved_refuses_a_head_fitted_on_an_encoder_replaced_since(
    corpus: Path, bert_dir: Path, tmp_path: Path
) -> None:
    """A head-only teacher records the hashes of the encoder it was fitted on: another encoder
    at the same place (weights changed) had it kept by ``keep_saved``, and replaced from step 0
    when it kept no checkpoint, unsaid."""
    import shutil

    from safetensors.torch import save_file

    from lmalgebra.api.pretrain import pretrain
    from lmalgebra.core.errors import UserInputError

    encoder = tmp_path / "encoder"
    shutil.copytree(bert_dir, encoder)
    spec = HeadOnlySpec(
        corpus={"paths": [str(corpus)]},
        language="xx",
        out=tmp_path / "head",
        encoder=str(encoder),
        example_length=16,
        training={"steps": 1, "keep_checkpoints": 0},
    )
    saved = pretrain(spec)
    weights = load_file(encoder / "model.safetensors")
    first = sorted(weights)[0]
    save_file({**weights, first: weights[first] + 0.5}, encoder / "model.safetensors")
    with pytest.raises(UserInputError, match=r"other inputs \(encoder\.weights '"):
        pretrain(spec, keep_saved=True)
    with pytest.raises(UserInputError, match=r"kept no checkpoint"):
        pretrain(spec)
    assert saved.is_dir()
