"""Every script in examples/ runs, on the tiny models and corpora of the session fixtures, through
the public API alone."""

from __future__ import annotations

import ast
import math
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import lmalgebra
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SMALL = ["--text-column", "text", "--length", "8", "--counts", "40,10,20"]


@pytest.fixture(autouse=True)
def _scratch_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))


def _main(name: str) -> Callable[[list[str]], Any]:
    """The example's ``main``, loaded as a script is (not imported as a module)."""
    return runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="example")["main"]


def test_every_example_is_tested_and_uses_the_public_api_only() -> None:
    tested = {
        "compare_models",
        "sentence_transformer_and_arrays",
        "grid_search_alpha",
        "merge_teachers",
        "evaluate_student",
    }
    assert {path.stem for path in EXAMPLES.glob("*.py")} == tested
    for path in EXAMPLES.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            for name in names:
                if name.startswith("lmalgebra"):
                    assert name in ("lmalgebra", "lmalgebra.experimental"), (path.name, name)


def test_compare_models(bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path) -> None:
    models = ["--model", f"a={bert_dir}", "--model", f"b={bert2_dir}"]
    out = tmp_path / "run"
    result = _main("compare_models")(
        [*models, "--corpus", str(corpus_txt), *SMALL, "--out", str(out)]
    )
    assert list(result.group.index) == ["a", "b"]
    assert all(math.isfinite(r) for r in result.group["test"])
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()


def test_sentence_transformer_and_arrays(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("sentence_transformers")
    arguments = ["--st-model", str(bert_dir), "--reference", str(bert2_dir)]
    result = _main("sentence_transformer_and_arrays")(
        [*arguments, "--corpus", str(corpus_txt), *SMALL]
    )
    assert list(result.group.index) == ["st", "reference", "api"]
    pairwise = result.pairwise("test")
    assert math.isfinite(pairwise.loc["api", "st"]) and math.isfinite(pairwise.loc["st", "api"])
    assert "Loading weights" not in capsys.readouterr().err  # the load ran inside quiet()


def test_grid_search_alpha(bert_dir: Path, bert2_dir: Path, corpus_txt: Path) -> None:
    pytest.importorskip("sentence_transformers")
    main = _main("grid_search_alpha")
    arguments = ["--target", str(bert_dir), "--basis", str(bert2_dir), "--corpus", str(corpus_txt)]
    search = main([*arguments, *SMALL[:4], "--counts", "60,5,20", "--folds", "3"])
    assert search.best_params_["alpha"] in main.__globals__["ALPHAS"]
    scores = search.cv_results_["mean_test_score"]
    assert search.best_score_ == max(scores) and len(set(scores.round(6))) > 1


def test_merge_teachers_then_evaluate_the_student(
    teacher_dirs: dict[str, Path], corpus_txt: Path, tmp_path: Path
) -> None:
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)
    run = _main("merge_teachers")([str(recipe), "--steps", "4"])
    assert isinstance(run, lmalgebra.MergeRun)
    assert (run.students["student"] / "config.json").is_file()

    arguments = [str(run.run_dir), "--texts", str(corpus_txt), *SMALL]
    evaluated = _main("evaluate_student")(arguments)
    assert set(evaluated.rdt.columns) >= {"xx", "yy", "average"}
    assert set(evaluated.scores["model"]) >= {"student", "wp", "sp"}
