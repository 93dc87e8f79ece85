"""The demo's analyses beyond held-out masked-token scores: a downstream UPOS probe and LMD."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmalgebra.api.decompose import decompose
from lmalgebra.api.merge import MergeRun
from lmalgebra.demo.plan import LANGUAGES, DemoPlan
from lmalgebra.sources.packaged import asset_path

log = logging.getLogger(__name__)


def _decompose(
    out: Path, models: dict[str, str], corpus: Path, spans: tuple[int, int, int], progress: bool
) -> Any:
    return decompose(
        {name: {"path": path} for name, path in models.items()},
        str(corpus),
        corpus={"doc_sep": "line"},
        spans={"length": 32, "counts": list(spans), "per_doc": 2},
        out=out,
        cache_dir=out.parent / ".cache",
        progress=progress,
        save_weights=False,
    )


def lmd_analyses(
    out: Path, union: MergeRun, teachers: dict[str, Path], plan: DemoPlan, progress: bool
) -> dict[str, Any]:
    """Group and pairwise R^2 of real encoders, teachers and students on unseen English text;
    per language, held-out R^2 of each teacher from the student and of the student from it."""
    data = union.run_dir.parent / "data"
    students = {n: str(path) for n, path in union.students.items()}
    models = {
        "minilm": str(asset_path("minilm")),
        "minilm-sre": str(asset_path("minilm-sre")),
        **{f"teacher-{k}": str(v) for k, v in teachers.items()},
        **students,
    }
    result = _decompose(out / "all-en", models, data / "unseen-en.txt", plan.lmd_spans, progress)
    names = result.names
    pairwise = result.pairwise("test")
    summary: dict[str, Any] = {
        "models": names,
        "group_r2_test": {t: float(v) for t, v in result.group["test"].items()},
        "pairwise_r2_test": {
            t: {b: float(pairwise.loc[t, b]) for b in names if b != t} for t in names
        },
        "heatmap": str(result.heatmap),
        "coverage": {},
    }
    for lang in LANGUAGES:
        pair = {"teacher": str(teachers[lang]), **students}
        found = _decompose(
            out / f"coverage-{lang}", pair, data / f"unseen-{lang}.txt", plan.lmd_spans, progress
        )
        test = found.pairwise("test")
        summary["coverage"][lang] = {
            student: {
                "teacher_from_student": float(test.loc["teacher", student]),
                "student_from_teacher": float(test.loc[student, "teacher"]),
            }
            for student in found.names[1:]
        }
        summary["coverage"][lang]["test_spans"] = found.spans["test"]
    return summary


def petrogold() -> Path:
    """The Portuguese PetroGold UD treebank of the packaged dante-corpora."""
    import importlib.util

    from lmalgebra.core.errors import UserInputError

    spec = importlib.util.find_spec("dante")
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError("the UPOS treebank is not installed: pip install dante-corpora==2.0.5")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "petrogold"


def downstream_pos(
    out: Path, models: dict[str, Path], plan: DemoPlan, progress: bool
) -> list[dict[str, Any]]:
    """A linear UPOS probe on Portuguese (a language none of the models trained on, related to
    French and Spanish) for teachers and students: accuracy and macro-F1."""
    from dataclasses import asdict

    from lmalgebra.evaluate.conllu import split_by_document
    from lmalgebra.evaluate.pos_options import PosOptions
    from lmalgebra.evaluate.pos_tagging import evaluate_many
    from lmalgebra.sources.models import ModelRef

    splits = split_by_document(petrogold() / "annotated.conllu", out / "treebank", "pt_petrogold")
    refs = [ModelRef(name=name, path=str(path)) for name, path in models.items()]
    options = PosOptions(
        max_train_sentences=plan.pos_train_sentences,
        max_eval_sentences=plan.pos_train_sentences // 2,
        progress=progress,
    )
    results = evaluate_many(refs, splits.train, splits.dev, splits.test, "probe", options, out)
    keep = ("model", "accuracy", "macro_f1", "majority_accuracy", "train_sentences", "test_words")
    return [{k: v for k, v in asdict(r).items() if k in keep} for r in results]
