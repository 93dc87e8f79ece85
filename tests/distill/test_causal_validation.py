"""Validation while a causal student trains: a split carved from the training examples (never the
held-out ones), the best weights kept, early stopping that resumes stopped, and the KD weight
chosen on validation among candidates without reading the test text."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from causal_fixtures import (
    taught_causal_recipe,
    train_causal,
    train_log,
)
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.distill import examples
from lmalgebra.distill.causal import training
from lmalgebra.distill.causal.store import load_causal_store
from lmalgebra.distill.causal.student_data import validation_rows
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.train.config import CausalTrainingSpec
from lmalgebra.train.validation import Validation, ValidationTracker

TRAINING = {
    "steps": 8,
    "batch_size": 4,
    "lr": 3e-3,
    "warmup_steps": 0,
    "lambda_schedule": "constant",
    "lambda_value": 0.5,
    "log_every": 1,
    "checkpoint_every": 2,
    "seed": 3,
    "objective_mix": {"alm": 1.0},
    "validation_fraction": 0.2,
    "validation_every": 2,
}


@pytest.fixture(scope="module")
def recipe_path(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("causal-validation")
    return taught_causal_recipe(root, causal_teacher_dirs, TRAINING)


def _same_weights(kept: Path, model: Path) -> None:
    """The tensors both files hold are equal (a tied head is saved once by either writer)."""
    best = load_file(str(kept / "model.safetensors"))
    saved = load_file(str(model / "model.safetensors"))
    common = best.keys() & saved.keys()
    assert len(common) > 5 and all(torch.equal(best[k], saved[k]) for k in common)


def _scripted(monkeypatch: pytest.MonkeyPatch, scores: list[float], patience: int = 0) -> list:
    """Validation scores in the order given (the model is not read); returns the calls made."""
    calls: list[float] = []

    def validation_of(spec, data, context):
        def score(model):
            calls.append(scores[len(calls)])
            return calls[-1]

        return Validation(score, spec.validation_every, patience)

    monkeypatch.setattr(training, "validation_of", validation_of)
    return calls


def test_validation_rows_are_training_rows_chosen_by_id_alone(recipe_path: Path) -> None:
    store = load_causal_store(load_recipe(recipe_path).output_dir, "xx", "bl")
    kept = validation_rows(store.example_ids, store.heldout, 0.2, "xx")
    train = int((~store.heldout).sum())
    assert kept.sum() == round(0.2 * train) and not (kept & store.heldout).any()
    # the same rows whatever order or teacher: a hash of the ids, not of a seed or a position
    other = load_causal_store(load_recipe(recipe_path).output_dir, "xx", "uni")
    assert (validation_rows(other.example_ids, other.heldout, 0.2, "xx") == kept).all()
    assert not validation_rows(store.example_ids, store.heldout, 0.0, "xx").any()
    with pytest.raises(UserInputError, match="leaves language 'xx' no training example"):
        validation_rows(store.example_ids, store.heldout, 0.99, "xx")


def test_the_student_is_its_best_validation_checkpoint(recipe_path: Path, monkeypatch) -> None:
    calls = _scripted(monkeypatch, [3.0, 2.0, 2.5, 2.6])
    model = train_causal(recipe_path, "best")
    log = train_log(model)
    assert [r["validation"] for r in log if "validation" in r] == [3.0, 2.0, 2.5, 2.6]
    meta = json.loads((model / "lmalgebra.json").read_text())
    assert meta["final"]["best_step"] == 4 and meta["final"]["best_validation"] == 2.0
    _same_weights(model.parent / "best", model)
    assert len(calls) == 4


def test_validation_scores_a_student_training_in_bfloat16(recipe_path: Path, monkeypatch) -> None:
    """Accelerate wraps the forward of a bf16 student in autocast: the validation score (body
    and head in float32) still knows its head, and the run keeps its best checkpoint."""
    monkeypatch.setenv("LMALGEBRA_ALLOW_SLOW_BF16", "1")
    model = train_causal(recipe_path, "bf16", steps=4, mixed_precision="bf16")
    scored = [row["validation"] for row in train_log(model) if "validation" in row]
    assert len(scored) == 2 and all(np.isfinite(s) for s in scored)


def test_early_stopping_stops_and_stays_stopped(recipe_path: Path, monkeypatch) -> None:
    _scripted(monkeypatch, [3.0, 2.0, 2.5, 2.6], patience=2)
    model = train_causal(recipe_path, "stopped")
    assert [r["step"] for r in train_log(model)][-1] == 8  # 8 steps, checked at 2, 4, 6, 8
    calls = _scripted(monkeypatch, [3.0, 2.0, 2.5, 2.6, 9.9], patience=2)
    model = train_causal(recipe_path, "stops", steps=12)
    steps = [r["step"] for r in train_log(model)]
    assert steps[-1] == 8 and len(calls) == 4  # 2.5 and 2.6 after the best: stopped at 8
    again = _scripted(monkeypatch, [], patience=2)
    train_causal(recipe_path, "stops", steps=12)  # resumed: stopped, nothing trained or scored
    assert [r["step"] for r in train_log(model)] == steps and again == []


def test_lambda_chosen_on_validation_never_reads_the_test_text(
    recipe_path: Path, monkeypatch
) -> None:
    def no_test_text(*args, **kwargs):
        raise AssertionError("the held-out (test) text was read while training")

    monkeypatch.setattr(examples, "heldout_texts", no_test_text)
    original = examples.stored_texts

    def training_texts_only(run_dir, languages=None, heldout=True):
        assert not heldout, "the held-out (test) text was read while training"
        return original(run_dir, languages, heldout)

    monkeypatch.setattr(training, "stored_texts", training_texts_only)
    model = train_causal(recipe_path, "chosen", steps=4, lambda_candidates=[0.1, 0.9])
    meta = json.loads((model / "lmalgebra.json").read_text())
    choice = meta["lambda_choice"]
    assert set(choice) == {"0.1", "0.9"}
    best = min(choice, key=choice.get)
    assert meta["final"]["best_validation"] == choice[best]
    _same_weights(model.parent / f"lambda-{best}" / "best", model)
    assert np.isfinite(list(choice.values())).all()


@pytest.mark.parametrize(
    ("changes", "culprit"),
    [
        ({"validation_every": 0}, "validation_fraction and training.validation_every"),
        ({"validation_every": 0, "validation_fraction": 0, "patience": 2}, "patience 2"),
        ({"lambda_candidates": [0.5, 0.5]}, "repeats"),
        ({"lambda_candidates": [0.5], "lambda_schedule": "linear"}, "lambda_schedule"),
        ({"lambda_candidates": [0.5], "objective_mix": {"ce": 1.0}}, "CE alone"),
        # not "set lambda_schedule: constant", which gold_only then refuses in turn
        ({"lambda_candidates": [0.5], "lambda_schedule": "linear", "gold_only": True}, "CE alone"),
        ({"lambda_candidates": [1.5]}, r"\[0, 1\]"),
    ],
)
def test_validation_settings_that_would_do_nothing_are_refused(changes, culprit) -> None:
    spec = {k: v for k, v in TRAINING.items() if k != "lambda_value"} | changes
    with pytest.raises(UserInputError, match=culprit):
        CausalTrainingSpec.model_validate(spec)


def test_tracker_counts_misses_and_refuses_weights_it_did_not_write(tmp_path: Path) -> None:
    scores = iter([1.0, 0.5, 0.7, 0.6])
    tracker = ValidationTracker(Validation(lambda m: next(scores), 2, patience=2), tmp_path)
    model = torch.nn.Linear(2, 2)
    for step in (2, 4, 6, 8):
        tracker.check(model, step, write=True)
    state = tracker.state()  # with the sha256 of the best weights kept
    assert state.pop("best_sha256") == sha256_file(tmp_path / "best" / "model.safetensors")
    assert state == {"best": 0.5, "best_step": 4, "misses": 2, "stopped": True}
    resumed = ValidationTracker(tracker.validation, tmp_path, tracker.state())
    resumed.restore(model)
    resumed.best_step = 6
    with pytest.raises(UserInputError, match="best validation weights"):
        resumed.restore(model)


@pytest.mark.parametrize("killed", ["before the weights", "after the weights", "at the end"])
def test_a_run_killed_while_it_keeps_a_new_best_resumes_from_its_checkpoint(
    killed: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run killed while it kept a new best (step 4), or after, before the checkpoint that
    records it, resumes from its checkpoint of step 2: it had found weights of no record, or a
    record of a step after its checkpoint, and refused to resume without --restart."""
    scores = iter([1.0, 0.5, 0.5])
    tracker = ValidationTracker(Validation(lambda m: next(scores), 2), tmp_path)
    model = torch.nn.Linear(2, 2)
    tracker.check(model, 2, write=True)
    checkpoint = tracker.state()
    torch.nn.init.ones_(model.weight)
    real = Path.replace

    def replace(self: Path, target: Path) -> Path:  # the kill, about the weights' rename
        weights = Path(target).name == "model.safetensors"
        if weights and killed == "before the weights":
            raise KeyboardInterrupt
        done = real(self, target)
        if weights and killed == "after the weights":
            raise KeyboardInterrupt
        return done

    with monkeypatch.context() as patch, contextlib.suppress(KeyboardInterrupt):
        patch.setattr(Path, "replace", replace)
        tracker.check(model, 4, write=True)
    resumed = ValidationTracker(tracker.validation, tmp_path, checkpoint, start=2)
    resumed.check(model, 4, write=True)  # step 4 trained again
    resumed.restore(model)
    assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == 4


def test_a_checkpoint_before_the_first_validation_is_whole_and_resumes(recipe_path: Path) -> None:
    """A checkpoint written before the first validation records no best score yet (infinity,
    null in the file): its checksum had been taken over the infinity, so ``merge verify``
    named it damaged and a run resumed from it skipped it; read back, the null is no best."""
    import shutil

    from lmalgebra.train.checkpoint import damage

    model = train_causal(recipe_path, "late", steps=4, validation_every=4)
    checkpoints = model.parent / "checkpoints"
    assert damage(checkpoints / "step-0000002")[1] == ""
    shutil.rmtree(checkpoints / "step-0000004")
    shutil.rmtree(model)
    train_causal(recipe_path, "late", steps=4, validation_every=4)  # resumed from step 2
    assert [r["step"] for r in train_log(model) if "loss" in r][:2] == [1, 2]
    assert json.loads((model / "lmalgebra.json").read_text())["final"]["best_step"] == 4


def test_candidates_over_a_student_trained_without_them_are_refused(recipe_path: Path) -> None:
    """A student trained at one KD weight, then asked for ``lambda_candidates`` without
    ``--restart``: the candidates train in directories of their own, where no checkpoint is, so
    the student's own checkpoint had let the chosen candidate replace it with nothing said
    (its dry run refused). It is refused, naming the setting, and the student is kept."""
    model = train_causal(recipe_path, "switch", steps=2)
    before = (model / "model.safetensors").read_bytes()
    with pytest.raises(UserInputError, match=re.escape("lambda_candidates None -> [0.1, 0.9]")):
        train_causal(recipe_path, "switch", steps=2, lambda_candidates=[0.1, 0.9])
    assert (model / "model.safetensors").read_bytes() == before
    assert not list(model.parent.glob("lambda-*"))


@pytest.mark.parametrize("kind", ["file", "link"])
def test_a_candidates_directory_in_the_way_is_refused_by_training_and_its_dry_run(
    recipe_path: Path, tmp_path: Path, kind: str
) -> None:
    """``<student>/lambda-0.1`` a file had stopped training with a ``FileExistsError``
    traceback while its dry run planned it; a link there had been trained through, over what
    it names. Both are refused, by the plan too, before anything is written."""
    from lmalgebra.distill.pipeline import plan, training_of

    student = recipe_path.parent / "run" / f"blocked-{kind}"
    student.mkdir(parents=True)
    if kind == "file":
        (student / "lambda-0.1").write_text("mine\n")
    else:
        (student / "lambda-0.1").symlink_to(tmp_path)
    said = "is a file, not a directory" if kind == "file" else "is a symbolic link to"
    recipe = load_recipe(recipe_path)
    changes = {"steps": 2, "lambda_candidates": [0.1, 0.9]}
    with pytest.raises(UserInputError, match=said):
        plan(recipe, training_of(recipe, changes, "test"), ["train"], student.name)
    with pytest.raises(UserInputError, match=said):
        train_causal(recipe_path, student.name, **changes)
    assert sorted(p.name for p in student.iterdir()) == ["lambda-0.1"]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("damage", ["removed", "emptied", "no-step"])
def test_a_finished_student_trained_again_keeps_its_record_whatever_its_log_holds(
    recipe_path: Path, damage: str
) -> None:
    """A finished student trained again resumes from its last checkpoint with no step left,
    and returns the record of that step: read from the training log alone, a log removed or
    damaged since (which ``merge verify`` passes) had given an empty record, and the student
    was saved again with none of its last step's figures (``final``: the best step alone).
    The checkpoint holds the record, checksummed with it; the student is saved as it was."""
    model = train_causal(recipe_path, f"relogged-{damage}", steps=2)
    before = json.loads((model / "lmalgebra.json").read_text())["final"]
    assert {"loss", "step", "validation", "best_step"} <= set(before)
    log = model.parent / "train_log.jsonl"
    if damage == "removed":
        log.unlink()
    else:
        log.write_text("" if damage == "emptied" else "{}\n")  # a line of no step
    train_causal(recipe_path, f"relogged-{damage}", steps=2)
    assert json.loads((model / "lmalgebra.json").read_text())["final"] == before
