"""Student training end to end on tiny teachers: data order, resume, divergence, saved model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForMaskedLM, AutoTokenizer, pipeline

from lmalgebra.core.errors import TrainingDivergedError, UserInputError
from lmalgebra.distill import pipeline as stages
from lmalgebra.distill.masked.student_data import StoreBatches
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.vocab.union import UnionVocab
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

STUDENT = TINY_STUDENT
TRAINING = TINY_TRAINING
# loss, MLM and KD of the seeded student at each of its six steps (test_pinned_loss_trajectory)
PINNED = [
    [5.77468, 5.7581, 5.77468],
    [5.75379, 5.75162, 5.75433],
    [5.73502, 5.76379, 5.71584],
    [5.71869, 5.73806, 5.68964],
    [5.71268, 5.72078, 5.68029],
    [5.73139, 5.73139, 5.65548],
]


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory, teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("student")
    path = write_recipe(root, teacher_dirs, student=STUDENT, training=TRAINING)
    recipe = load_recipe(path)
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    stages.vocab(recipe)
    return path


@pytest.fixture(scope="module")
def trained(recipe_path: Path) -> Path:
    return train_student(load_recipe(recipe_path), "student", progress=False)


def weights(directory: Path) -> dict[str, torch.Tensor]:
    return load_file(str(directory / "model.safetensors"))


def test_student_loads_in_plain_transformers_and_fills_masks(trained: Path) -> None:
    model = AutoModelForMaskedLM.from_pretrained(trained)
    tokenizer = AutoTokenizer.from_pretrained(trained)
    fill = pipeline("fill-mask", model=model, tokenizer=tokenizer)
    predictions = fill(f"the river {tokenizer.mask_token} is old")
    assert len(predictions) == 5 and all("token_str" in p for p in predictions)
    meta = json.loads((trained / "lmalgebra.json").read_text())
    assert meta["kind"] == "mergedistill-student" and set(meta["teacher_hashes"]) == {"wp", "sp"}
    assert (trained / "vocab_maps.safetensors").is_file()


def test_log_has_loss_parts_lambda_lr_and_throughput(trained: Path) -> None:
    lines = [json.loads(ln) for ln in (trained.parent / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines] == [1, 2, 3, 4, 5, 6]
    assert lines[0]["lambda"] == 1.0 and lines[-1]["lambda"] == 0.0  # teacher annealing
    assert all(r["kd"] > 0 and r["mlm"] > 0 for r in lines)
    assert {"tokens_per_s/xx", "tokens_per_s/yy"} <= set(lines[0])


def test_killed_and_resumed_run_ends_with_identical_weights(
    recipe_path: Path, trained: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = load_recipe(recipe_path)
    real = StoreBatches.batch

    def dying(self, index):
        if index == 4:  # after the step-3 checkpoint, during step 5
            raise KeyboardInterrupt
        return real(self, index)

    monkeypatch.setattr(StoreBatches, "batch", dying)
    with pytest.raises(KeyboardInterrupt):
        train_student(recipe, "resumed", progress=False)
    assert [p.name for p in (recipe.output_dir / "resumed" / "checkpoints").iterdir()] == [
        "step-0000003"
    ]
    monkeypatch.setattr(StoreBatches, "batch", real)
    resumed = train_student(recipe, "resumed", progress=False)
    a, b = weights(trained), weights(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # bit for bit on CPU


def test_parameters_move_and_runs_are_deterministic(recipe_path: Path, trained: Path) -> None:
    from lmalgebra.distill.masked.student_model import build_masked_lm

    recipe = load_recipe(recipe_path)
    initial = build_masked_lm(
        recipe.student, len(UnionVocab.load(recipe.output_dir / "vocab").tokens)
    )
    final = weights(trained)
    moved = [
        k for k, v in initial.state_dict().items() if k in final and not torch.equal(v, final[k])
    ]
    assert len(moved) > 10
    again = train_student(recipe, "again", progress=False)
    assert all(torch.equal(final[k], weights(again)[k]) for k in final)


def test_language_mix_follows_alpha(recipe_path: Path) -> None:
    recipe = load_recipe(recipe_path)
    vocab = UnionVocab.load(recipe.output_dir / "vocab")
    source = StoreBatches(
        recipe.output_dir,
        {"xx": ["wp"], "yy": ["wp", "sp"]},
        vocab,
        batch_size=64,
        alpha=0.7,
        mode="all",
        seed=1,
    )
    counts = np.zeros(2)
    for index in range(150):
        for lang, _ in source.draw(index):
            counts[lang] += 1
    expected = source.probabilities["xx"]
    assert counts[0] / counts.sum() == pytest.approx(expected, abs=0.02)
    assert expected == pytest.approx(54**0.7 / (54**0.7 + 36**0.7), abs=0.03)
    mixed = sum(len({lang for lang, _ in source.draw(i)}) == 2 for i in range(20))
    assert mixed == 20  # languages mix within batches


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(
    recipe_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = load_recipe(recipe_path)
    real = StoreBatches.batch

    def poisoned(self, index):
        batch = real(self, index)
        if index == 4:
            batch.topk_logprobs = torch.full_like(batch.topk_logprobs, float("nan"))
        return batch

    monkeypatch.setattr(StoreBatches, "batch", poisoned)
    with pytest.raises(TrainingDivergedError, match="loss is nan at step 5"):
        train_student(recipe, "diverged", progress=False)
    kept = sorted(p.name for p in (recipe.output_dir / "diverged" / "checkpoints").iterdir())
    assert kept == ["step-0000003"]
    assert not (recipe.output_dir / "diverged" / "model").exists()


def test_store_from_another_recipe_is_refused(recipe_path: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(recipe_path.read_text())
    data["masking"]["seed"] = 99
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(data))
    with pytest.raises(UserInputError, match="different recipe or teacher"):
        train_student(load_recipe(other), "x", progress=False)


def test_student_too_small_for_the_vocabulary(recipe_path: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(recipe_path.read_text())
    data["student"]["vocab_size"] = 50
    other = tmp_path / "small.yaml"
    other.write_text(yaml.safe_dump(data))
    with pytest.raises(UserInputError, match="smaller than the union vocabulary"):
        train_student(load_recipe(other), "x", progress=False)


@pytest.mark.parametrize(
    ("section", "change", "message"),
    [
        ("training", {"lambda_value": 1.5}, "lambda_value must be in"),
        ("student", {"hidden_size": 30, "num_heads": 4}, "not divisible"),
        ("student", {"embedding_size": 64}, "exceeds hidden_size"),
    ],
)
def test_bad_training_settings(recipe_path: Path, tmp_path: Path, section, change, message) -> None:
    data = yaml.safe_load(recipe_path.read_text())
    data[section].update(change)
    other = tmp_path / "bad.yaml"
    other.write_text(yaml.safe_dump(data))
    with pytest.raises(UserInputError, match=message):
        load_recipe(other)


def test_factorised_embedding_student(recipe_path: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(recipe_path.read_text())
    shutil.copytree(
        Path(data["output_dir"]),
        tmp_path / "run",
        ignore=shutil.ignore_patterns("student", "resumed", "again", "diverged"),
    )
    data["output_dir"] = str(tmp_path / "run")
    data["student"]["embedding_size"] = 16
    data["training"]["steps"] = 2
    path = tmp_path / "factorised.yaml"
    path.write_text(yaml.safe_dump(data))
    target = train_student(load_recipe(path), "factorised", progress=False)
    model = AutoModelForMaskedLM.from_pretrained(target)
    assert type(model).__name__ == "AlbertForMaskedLM"
    assert model.get_input_embeddings().weight.shape[1] == 16


def test_training_has_one_name_for_the_language_sampling_exponent() -> None:
    from lmalgebra.core.recipe_files import validate
    from lmalgebra.train.config import TrainingSpec

    assert TrainingSpec.model_validate({"sampling_exponent": 0.3}).sampling_exponent == 0.3
    with pytest.raises(UserInputError, match="unknown key 'alpha'"):
        validate(TrainingSpec, {"alpha": 0.3}, "recipe")


def test_keep_checkpoints(recipe_path: Path, trained: Path) -> None:
    """Checkpoints every three of six steps: by default the newest two stay; with
    ``keep_checkpoints: 0`` none once the model is saved, and the weights are the same."""
    from lmalgebra.train.config import TrainingSpec

    recipe = load_recipe(recipe_path)
    kept = sorted(p.name for p in (trained.parent / "checkpoints").iterdir())
    assert kept == ["step-0000003", "step-0000006"]
    spec = TrainingSpec(**{**recipe.training.model_dump(), "keep_checkpoints": 0})
    bare = train_student(recipe, "bare", spec, progress=False)
    assert not list((bare.parent / "checkpoints").iterdir())
    final = weights(trained)
    assert all(torch.equal(final[k], weights(bare)[k]) for k in final)
    # the setting is bookkeeping: a checkpoint written with another value still resumes
    one = TrainingSpec(**{**recipe.training.model_dump(), "keep_checkpoints": 1})
    assert train_student(recipe, "student", one, progress=False) == trained


def test_pinned_loss_trajectory(trained: Path) -> None:
    """The seeded masked student's loss, MLM and KD per step (lambda annealed 1 -> 0); float
    kernels may differ between machines, hence the tolerance."""
    lines = [json.loads(ln) for ln in (trained.parent / "train_log.jsonl").read_text().splitlines()]
    got = np.array([[r["loss"], r["mlm"], r["kd"]] for r in lines])
    np.testing.assert_allclose(got, PINNED, rtol=2e-3)
