"""`merge train` on a causal recipe refuses a teacher store built for another recipe or other
teachers (as the masked path does): one line naming what changed and the stage to run again,
exit status 2, nothing written."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, digests, run_cli
from lmalgebra.distill import pipeline
from lmalgebra.distill.recipe import load_recipe

STUDENT = {
    "tokenizer": "bl",
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 320,
    "dropout": 0.0,
}
TRAINING = {"steps": 2, "batch_size": 4, "warmup_steps": 0, "checkpoint_every": 2}


@pytest.fixture
def taught(tmp_path: Path, causal_teacher_dirs: dict[str, Path]) -> Path:
    """A recipe whose store is built, its teacher 'bl' a copy this test may change."""
    teachers = dict(causal_teacher_dirs)
    teachers["bl"] = Path(shutil.copytree(causal_teacher_dirs["bl"], tmp_path / "bl"))
    path = write_causal_recipe(tmp_path, teachers, student=STUDENT, training=TRAINING)
    recipe = load_recipe(path)
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    return path


def _store(run: Path) -> dict[str, str]:
    """Digests of the run's files (the memo of teacher weight hashes left out: a cache)."""
    return {k: v for k, v in digests(run).items() if not k.startswith(".hashes/")}


def _refused(path: Path, needles: list[str], monkeypatch, capsys) -> None:
    run = load_recipe(path).output_dir
    before = _store(run)
    code, err = run_cli(["merge", "train", str(path), "--no-progress"], monkeypatch, capsys)
    assert_one_line(code, err, ["was built with a different recipe or teacher", *needles])
    assert _store(run) == before and not (run / "student").exists()


def test_other_top_k_after_teach_is_refused(taught: Path, monkeypatch, capsys) -> None:
    data = yaml.safe_load(taught.read_text(encoding="utf-8"))
    data["top_k"] = 3
    taught.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    _refused(taught, ["logprobs/xx/bl", "top_k 5 -> 3", "merge teach RECIPE"], monkeypatch, capsys)


def test_teacher_retrained_after_teach_is_refused(taught: Path, monkeypatch, capsys) -> None:
    weights = taught.parent / "bl" / "model.safetensors"
    tensors = load_file(str(weights))
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 0.01  # another training run: other weights, same tokenizer
    save_file(tensors, str(weights), metadata={"format": "pt"})
    _refused(taught, ["logprobs/xx/bl", "weights", "merge teach RECIPE"], monkeypatch, capsys)


def test_teacher_with_another_tokenizer_sends_back_to_prepare(
    taught: Path, causal_teacher_dirs: dict[str, Path], monkeypatch, capsys
) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(causal_teacher_dirs["uni"] / name, taught.parent / "bl" / name)
    _refused(taught, ["tokens/xx/bl", "tokenizer", "merge prepare RECIPE"], monkeypatch, capsys)


def test_store_of_this_recipe_trains(taught: Path, monkeypatch, capsys) -> None:
    code, err = run_cli(["merge", "train", str(taught), "--no-progress"], monkeypatch, capsys)
    assert code == 0, err
    assert (load_recipe(taught).output_dir / "student" / "model" / "lmalgebra.json").is_file()
