"""LMD coverage of each causal teacher by the causal student in `merge evaluate`: held-out R^2 of
the teacher's span embeddings from the student's (and back), per language, through the LMD
pipeline; teachers and students with different tokenizers read the same span text."""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict
from pathlib import Path

import pandas as pd
import pytest

import lmalgebra
from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.api.merge import MergeRun
from lmalgebra.distill import pipeline
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.evaluate.lmd_coverage import COVERAGE, CoveragePooling, CoverageSpec, lmd_coverage
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.csv_tables import read_table
from tiny import documents

STUDENT = {
    "tokenizer": "bytes",
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 320,
    "dropout": 0.0,
}
TRAINING = {"steps": 2, "batch_size": 4, "warmup_steps": 0, "checkpoint_every": 2}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))


def _coverage(
    teachers: dict[str, Path], students: dict[str, Path], pooling: CoveragePooling = "mean"
):
    texts = {"xx": documents(40, seed=3), "yy": ["Too short for a span."] * 3}
    refs = [ModelRef(name=n, path=str(p)) for n, p in teachers.items()]
    return lmd_coverage(
        texts,
        {lang: CorpusSpec(paths=[f"{lang}.txt"]) for lang in texts},
        {"xx": refs, "yy": refs},
        [ModelRef(name=n, path=str(p)) for n, p in students.items()],
        CoverageSpec(pooling=pooling),
    )


def test_a_copy_of_the_teacher_carries_all_of_it(
    causal_teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    teachers = {n: causal_teacher_dirs[n] for n in ("bl", "uni")}
    copy = Path(shutil.copytree(causal_teacher_dirs["bl"], tmp_path / "copy"))
    students = {"copy": copy, "other": causal_teacher_dirs["wp"]}
    rows, skipped = _coverage(teachers, students)
    got = {(r.teacher, r.student): r for r in rows}
    assert set(got) == {(t, s) for t in teachers for s in students}
    assert all(r.language == "xx" and r.pooling == "mean" and r.test_spans > 10 for r in rows)
    # the same model under another name: R^2 1 up to the ridge's shrinkage
    assert got[("bl", "copy")].teacher_from_student > 0.99
    assert got[("bl", "copy")].student_from_teacher > 0.99
    # a random model with another tokenizer explains little of it
    assert got[("bl", "other")].teacher_from_student < 0.5
    assert (
        "too little held-out text for LMD" in skipped["yy"] and "no training span" in skipped["yy"]
    )
    last, _ = _coverage(teachers, students, pooling="last")
    assert last[0].pooling == "last" and last[0].teacher_from_student > 0.99
    assert not math.isclose(last[1].teacher_from_student, rows[1].teacher_from_student)


def test_a_student_whose_embeddings_do_not_vary_leaves_coverage_out(
    causal_teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A collapsed student (its final layer norm zero: every span's embedding the same) had
    aborted the whole evaluation; its language is left out of the coverage, as for too little
    text, naming the model, and the rest of the evaluation stands."""
    import shutil

    from safetensors.numpy import load_file, save_file

    collapsed = tmp_path / "collapsed"
    shutil.copytree(causal_teacher_dirs["bl"], collapsed)
    weights = load_file(collapsed / "model.safetensors")
    for name in ("transformer.ln_f.weight", "transformer.ln_f.bias"):
        weights[name] = weights[name] * 0
    save_file(weights, collapsed / "model.safetensors", metadata={"format": "pt"})
    rows, skipped = _coverage({"uni": causal_teacher_dirs["uni"]}, {"collapsed": collapsed})
    assert rows == []
    assert "LMD cannot score it" in skipped["xx"] and "'collapsed' does not vary" in skipped["xx"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """A causal run (half the examples held out) with a byte-level student trained two steps."""
    root = tmp_path_factory.mktemp("causal-coverage")
    path = write_causal_recipe(
        root, causal_teacher_dirs, student=STUDENT, training=TRAINING, heldout_fraction=0.5
    )
    recipe = load_recipe(path)
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    train_student(recipe, "student", progress=False)
    return recipe.output_dir


def test_merge_evaluate_reports_coverage_of_each_teacher(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = run_cli(
        ["merge", "evaluate", str(run_dir), "--pooling", "last"], monkeypatch, capsys
    )
    assert code == 0, err
    rows = read_table(run_dir / "evaluation", COVERAGE)
    assert [(r.language, r.teacher, r.student) for r in rows] == [
        ("xx", "bl", "student"),
        ("xx", "uni", "student"),
        ("yy", "wp", "student"),
    ]
    assert all(r.pooling == "last" and -5 < r.teacher_from_student <= 1 for r in rows)
    report = (run_dir / "evaluation" / "evaluation.md").read_text(encoding="utf-8")
    assert "| language | teacher | student | teacher from student |" in report
    assert f"| yy | wp | student | {rows[2].teacher_from_student:.3f} |" in report
    found = lmalgebra.merge(run_dir / "recipe.yaml", ["evaluate"])  # mean pooling
    assert isinstance(found.coverage, pd.DataFrame) and set(found.coverage["pooling"]) == {"mean"}
    again = read_table(run_dir / "evaluation", COVERAGE)
    pd.testing.assert_frame_equal(found.coverage, pd.DataFrame([asdict(r) for r in again]))
    assert (
        MergeRun(load_recipe(run_dir / "recipe.yaml"))
        .evaluate(pooling="last")
        .coverage.equals(pd.DataFrame([asdict(r) for r in rows]))
    )
    assert found.scores is not None and set(found.scores["model"]) == {"bl", "uni", "wp", "student"}


def test_bad_pooling_is_refused(
    run_dir: Path, tmp_path: Path, teacher_dirs, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from merge_fixtures import write_recipe

    code, err = run_cli(
        ["merge", "evaluate", str(run_dir), "--pooling", "max"], monkeypatch, capsys
    )
    assert_one_line(code, err, ["pooling", "'mean' or 'last'", "'max'"])
    masked = write_recipe(tmp_path, teacher_dirs).parent
    (masked / "examples").mkdir()  # a run's, as its copy of the recipe is
    code, err = run_cli(
        ["merge", "evaluate", str(masked), "--pooling", "last"], monkeypatch, capsys
    )
    assert_one_line(code, err, ["--pooling (pooling=) 'last' would be ignored", "causal runs only"])


def test_coverage_words_its_warnings_and_refusals_for_merge_evaluate(
    causal_teacher_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """The LMD run inside ``merge evaluate`` logged decompose's warnings as they are, naming
    flags that command lacks (``spans.length (-T)``, ``--study.alpha_select gcv``) and no
    language, and refused a singular basis naming ``--alpha`` and ``--products``."""
    from lmalgebra.core.errors import UserInputError

    teachers = {"bl": causal_teacher_dirs["bl"]}
    students = {"copy": Path(shutil.copytree(causal_teacher_dirs["bl"], tmp_path / "copy"))}
    with caplog.at_level("WARNING"):
        _coverage(teachers, students)  # the default counts: more spans than the text holds
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any(w.startswith("LMD coverage, xx: fewer spans than requested") for w in warned)
    assert not [w for w in warned if "-T" in w or "--study" in w or "fewer spans" in w[:15]]
    refs = [ModelRef(name=n, path=str(p)) for n, p in teachers.items()]
    with pytest.raises(UserInputError) as caught:
        lmd_coverage(
            {"xx": documents(40, seed=3)},
            {"xx": CorpusSpec(paths=["xx.txt"])},
            {"xx": refs},
            [ModelRef(name=n, path=str(p)) for n, p in students.items()],
            CoverageSpec(alpha=0.0),
        )
    assert str(caught.value).startswith("LMD coverage, xx: basis [")
    assert "use a larger alpha (now 0.0)" in str(caught.value) and "--" not in str(caught.value)
