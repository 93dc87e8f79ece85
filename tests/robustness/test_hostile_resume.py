"""Resuming after the configuration changed: a checkpoint records the fingerprint of what it
depends on (recipe, store, vocabulary, model configuration, training settings) and its own
checksum; a mismatch is refused with one line naming what changed (nothing on disk changes), or
starts afresh with ``--restart``; a hand-edited state is not trusted."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from hostile_helpers import assert_one_line, built_store, digests, run_cli
from lmalgebra.distill import pipeline
from lmalgebra.distill.recipe import load_recipe
from tiny import documents


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    """A built store and a finished six-step student ``student`` (checkpoints 3 and 6)."""
    from lmalgebra.distill.pipeline import train_student

    recipe = built_store(tmp_path_factory.mktemp("resume"), teacher_dirs)
    train_student(load_recipe(recipe), "student", progress=False)
    return recipe


def _copy(recipe: Path, tmp_path: Path, **changes: dict[str, object]) -> Path:
    """The run copied under ``tmp_path``, its recipe with sections updated."""
    shutil.copytree(recipe.parent / "run", tmp_path / "run")
    data = yaml.safe_load(recipe.read_text())
    data["output_dir"] = str(tmp_path / "run")
    for section, values in changes.items():
        data[section] = {**data.get(section, {}), **values}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _weights(run: Path, name: str) -> dict[str, torch.Tensor]:
    return load_file(str(run / name / "model" / "model.safetensors"))


def test_other_student_size_is_refused_then_restarted(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    recipe = _copy(trained, tmp_path, student={"hidden_size": 48})
    student = tmp_path / "run" / "student"
    before = digests(student)
    code, stderr = run_cli(["merge", "train", str(recipe)], monkeypatch, capsys)
    line = assert_one_line(
        code, stderr, ["step-0000006", "model configuration", "hidden_size 32 -> 48", "--restart"]
    )
    assert len(line) < 400
    assert digests(student) == before
    code, stderr = run_cli(["merge", "train", str(recipe), "--restart"], monkeypatch, capsys)
    assert code == 0, stderr
    assert (
        _weights(tmp_path / "run", "student")["bert.embeddings.word_embeddings.weight"].shape[1]
        == 48
    )


def test_store_rebuilt_with_another_masking_seed_is_refused(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    recipe = _copy(trained, tmp_path, masking={"seed": 4})
    config = load_recipe(recipe)
    pipeline.prepare(config, progress=False)
    pipeline.teach(config, progress=False)
    student = tmp_path / "run" / "student"
    before = digests(student)
    code, stderr = run_cli(["merge", "train", str(recipe)], monkeypatch, capsys)
    assert_one_line(code, stderr, ["the recipe", "the teacher store", "masking.seed 3 -> 4"])
    assert digests(student) == before
    meta = json.loads((student / "model" / "lmalgebra.json").read_text())
    assert meta["recipe"]["masking"]["seed"] == 3  # still labelled with its own recipe


def test_other_training_settings_are_refused_but_more_steps_resume(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    recipe = _copy(trained, tmp_path, training={"lr": 5e-4})
    code, stderr = run_cli(["merge", "train", str(recipe)], monkeypatch, capsys)
    assert_one_line(code, stderr, ["the training settings", "lr 0.001 -> 0.0005"])
    recipe = _copy(trained, tmp_path / "longer", training={"steps": 7})
    code, stderr = run_cli(["merge", "train", str(recipe)], monkeypatch, capsys)
    assert code == 0, stderr
    log = (tmp_path / "longer" / "run" / "student" / "train_log.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in log] == [1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("edit", [("step", 5), ("lr", 0.5)])
def test_hand_edited_state_is_not_trusted(
    trained: Path,
    tmp_path: Path,
    edit: tuple[str, float],
    monkeypatch: pytest.MonkeyPatch,
    capsys,
    caplog: pytest.LogCaptureFixture,
) -> None:
    recipe = _copy(trained, tmp_path)
    state_path = tmp_path / "run" / "student" / "checkpoints" / "step-0000006" / "state.json"
    state = json.loads(state_path.read_text())
    key, value = edit
    if key == "step":
        state["step"] = value
    else:
        state["param_groups"][0]["lr"] = value
    state_path.write_text(json.dumps(state))
    with caplog.at_level(logging.WARNING):
        code, stderr = run_cli(["merge", "train", str(recipe)], monkeypatch, capsys)
    assert code == 0, stderr
    assert f"{state_path} is damaged (its content does not match its checksum" in caplog.text
    # resumed from step 3 instead, to the very same weights
    a, b = _weights(trained.parent / "run", "student"), _weights(tmp_path / "run", "student")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoint_without_fingerprint_of_another_shape(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A checkpoint written before fingerprints existed still cannot crash a run."""
    recipe = _copy(trained, tmp_path, student={"intermediate_size": 48})
    for state_path in (tmp_path / "run" / "student" / "checkpoints").glob("*/state.json"):
        state = json.loads(state_path.read_text())
        del state["fingerprint"], state["state_sha256"]
        state_path.write_text(json.dumps(state))
    before = digests(tmp_path / "run" / "student")
    code, stderr = run_cli(["merge", "train", str(recipe)], monkeypatch, capsys)
    assert_one_line(code, stderr, ["step-0000006", "does not fit this model", "--restart"])
    assert digests(tmp_path / "run" / "student") == before


def test_pretrain_with_another_size_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(documents(40)) + "\n", encoding="utf-8")
    out = tmp_path / "teacher"
    args = [
        "pretrain",
        "masked",
        "--corpus.paths",
        str(corpus),
        "--language",
        "xx",
        "--tokenizer.vocab_size",
        "120",
    ]
    args += [
        "--out",
        str(out),
        "--training.steps",
        "3",
        "--example_length",
        "32",
        "--training.batch_size",
        "4",
    ]
    args += ["--no-progress", "--model.num_heads", "2"]
    code, stderr = run_cli([*args, "--model.hidden_size", "16"], monkeypatch, capsys)
    assert code == 0, stderr
    before = digests(out)
    code, stderr = run_cli([*args, "--model.hidden_size", "24"], monkeypatch, capsys)
    assert_one_line(code, stderr, ["model configuration", "hidden_size 16 -> 24", "--restart"])
    assert digests(out) == before
    corpus.write_text("\n".join(documents(40, seed=5)) + "\n", encoding="utf-8")
    code, stderr = run_cli([*args, "--model.hidden_size", "16"], monkeypatch, capsys)
    assert_one_line(code, stderr, ["the corpus changed"])
    assert digests(out) == before


def test_a_corpus_edited_after_prepare_is_refused(
    teacher_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """The store comes from the stored examples: a corpus that no longer gives them is refused,
    naming language and file, and nothing on disk changes; by the dry run too, while a dry run
    of a later stage, which reads no corpus, plans it."""
    recipe = built_store(tmp_path, teacher_dirs)
    corpus, run = tmp_path / "xx.txt", tmp_path / "run"
    before = digests(run)
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("A document added after the examples were drawn.\n")
    for command in (
        ["merge", "run", str(recipe)],
        ["merge", "prepare", str(recipe)],
        ["merge", "prepare", str(recipe), "--dry-run"],
        ["merge", "run", str(recipe), "--dry-run"],
    ):
        code, stderr = run_cli(command, monkeypatch, capsys)
        assert_one_line(code, stderr, ["language 'xx'", str(corpus), "changed", "output_dir"])
    assert run_cli(["merge", "teach", str(recipe), "--dry-run"], monkeypatch, capsys)[0] == 0
    assert digests(run) == before


def test_a_corpus_that_gives_the_same_examples_resumes(
    teacher_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Resumed where provably equal: spaces around the documents are not part of an example."""
    recipe = built_store(tmp_path, teacher_dirs)
    corpus, run = tmp_path / "xx.txt", tmp_path / "run"
    before = digests(run)
    lines = corpus.read_text(encoding="utf-8").splitlines()
    corpus.write_text("\n".join(f"  {line} " for line in lines) + "\n", encoding="utf-8")
    code, stderr = run_cli(["merge", "prepare", str(recipe)], monkeypatch, capsys)
    assert code == 0, stderr
    assert digests(run) == before


def test_a_training_log_holding_bytes_that_are_not_utf8_is_cut_back_as_a_torn_one(
    tmp_path: Path,
) -> None:
    """A resumed run reads its ``train_log.jsonl`` to cut it back to the step it resumes from:
    a line of bytes that are not UTF-8 had stopped training with a ``UnicodeDecodeError``
    traceback. It is dropped, as a line torn by a killed run is."""
    from lmalgebra.train.loop import TRAIN_LOG, _has_logged_steps, _Log

    log = tmp_path / TRAIN_LOG
    log.write_bytes(b'{"step": 1}\n\x00\xff{garbage\n{"step": 2}\n{"step": 3}\n')
    assert _has_logged_steps(tmp_path)
    resumed = _Log(tmp_path, 2)
    assert log.read_text().splitlines() == ['{"step": 1}', '{"step": 2}']
    assert resumed.last == {"step": 2}


def test_a_run_stopped_before_it_logs_a_step_leaves_no_training_log(tmp_path: Path) -> None:
    """Training wrote an empty ``train_log.jsonl`` before its first step: a run stopped there
    (a setting refused at the first step, Ctrl-C, ``kill -9``) left it behind, in a student's
    directory that held nothing else. The log is made by the first step it records now, and one
    cut back to no step at all (``--restart``, or only a torn line) is removed."""
    from lmalgebra.train.loop import TRAIN_LOG, _Log

    log = tmp_path / TRAIN_LOG
    _Log(tmp_path, 0)
    assert not log.exists()
    log.write_text('{"step": 3}\n{"step": 4, "lo', encoding="utf-8")
    _Log(tmp_path, 0)
    assert not log.exists()
    _Log(tmp_path, 0).write({"step": 1, "loss": 2.5})
    assert log.read_text(encoding="utf-8").splitlines() == ['{"step": 1, "loss": 2.5}']


def test_the_demos_corpora_resume_after_a_kill_at_any_write(tmp_path: Path) -> None:
    """A demo's corpora (``data/<lang>.txt`` beside ``unseen-<lang>.txt``), killed at each of
    their writes and written again, are those of a run never stopped: a kill just after
    ``en.txt`` was opened had left it empty beside a complete ``unseen-en.txt``, and every rerun
    of the demo stopped at "corpus ... holds no text"."""
    from collections.abc import Callable
    from dataclasses import replace

    from kill_helpers import count_points, killed_after
    from lmalgebra.demo.plan import QUICK
    from lmalgebra.demo.workflow import write_corpora

    plan = replace(QUICK, docs_per_language=30)

    def corpora(out: Path) -> dict[str, bytes]:
        return {p.name: p.read_bytes() for p in out.iterdir() if not p.name.startswith(".")}

    def writer(out: Path) -> Callable[[], tuple[int, str]]:  # the runner kill_helpers takes
        return lambda: (write_corpora(out, plan), (0, ""))[1]

    reference = tmp_path / "reference"
    points = count_points(reference, writer(reference))
    expected = corpora(reference)
    assert len(expected) == 6
    for k in range(1, len(points) + 1):
        out = tmp_path / f"killed-{k}"
        code, said = killed_after(k, out, writer(out), tmp_path / "killed.log")
        assert code == 137, said
        write_corpora(out, plan)
        assert corpora(out) == expected, said
