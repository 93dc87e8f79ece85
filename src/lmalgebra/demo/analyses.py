"""The demo's analyses beyond held-out masked-token scores: a downstream UPOS probe and LMD."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmalgebra.api.decompose import decompose
from lmalgebra.api.decomposition import Decomposition
from lmalgebra.api.merge import MergeRun
from lmalgebra.demo.plan import LANGUAGES, DemoPlan
from lmalgebra.sources.packaged import asset_path

if TYPE_CHECKING:
    import pandas as pd


# up to 4 spans a document and 15% of the documents held out for each of validation and test:
# the Spanish unseen text (the fewest documents) fills the full demo's 2,000 / 400 / 400 spans
# (at 2 a document and 10% held out, 1,839 / 212 / 221, fewer than its report said)
SPANS: dict[str, Any] = {"length": 32, "per_doc": 4, "fractions": (0.7, 0.15, 0.15)}


def _decompose(
    out: Path, models: dict[str, str], corpus: Path, spans: tuple[int, int, int], progress: bool
) -> Decomposition:
    return decompose(
        {name: {"path": path} for name, path in models.items()},
        str(corpus),
        corpus={"doc_sep": "line"},
        spans={**SPANS, "counts": list(spans)},
        out=out,
        cache_dir=out.parent / ".cache",
        progress=progress,
        save_weights=False,
    )


@dataclass(frozen=True)
class LmdFindings:
    """The demo's decompositions.

    Attributes:
        decomposition: real encoders, teachers and students on unseen English text.
        coverage: per language and student, held-out (test) R^2 of the language's teacher from
            the student (``teacher_from_student``) and of the student from the teacher
            (``student_from_teacher``), with the test spans they were scored on.
    """

    decomposition: Decomposition
    coverage: pd.DataFrame

    def as_dict(self) -> dict[str, Any]:
        """Plain values, as ``demo.json`` and the report read them."""
        result, names = self.decomposition, self.decomposition.names
        pairwise = result.pairwise("test")
        coverage: dict[str, Any] = {}
        for lang, rows in self.coverage.groupby("language", sort=False):
            coverage[str(lang)] = {
                str(r.student): {
                    "teacher_from_student": float(r.teacher_from_student),
                    "student_from_teacher": float(r.student_from_teacher),
                }
                for r in rows.itertuples()
            }
            coverage[str(lang)]["test_spans"] = int(rows["test_spans"].iloc[0])
        return {
            "models": names,
            "group_r2_test": {t: float(v) for t, v in result.group["test"].items()},
            "pairwise_r2_test": {
                t: {b: float(pairwise.loc[t, b]) for b in names if b != t} for t in names
            },
            "heatmap": str(result.heatmap),
            "coverage": coverage,
        }


def lmd_analyses(
    out: Path, union: MergeRun, teachers: dict[str, Path], plan: DemoPlan, progress: bool
) -> LmdFindings:
    """Group and pairwise R^2 of real encoders, teachers and students on unseen English text;
    per language, held-out R^2 of each teacher from the student and of the student from it."""
    import pandas as pd

    data = union.run_dir.parent / "data"
    students = {n: str(path) for n, path in union.students.items()}
    models = {
        "minilm": str(asset_path("minilm")),
        "minilm-sre": str(asset_path("minilm-sre")),
        **{f"teacher-{k}": str(v) for k, v in teachers.items()},
        **students,
    }
    result = _decompose(out / "all-en", models, data / "unseen-en.txt", plan.lmd_spans, progress)
    rows = []
    for lang in LANGUAGES:
        pair = {"teacher": str(teachers[lang]), **students}
        found = _decompose(
            out / f"coverage-{lang}", pair, data / f"unseen-{lang}.txt", plan.lmd_spans, progress
        )
        test = found.pairwise("test")
        rows += [
            {
                "language": lang,
                "student": student,
                "teacher_from_student": float(test.loc["teacher", student]),
                "student_from_teacher": float(test.loc[student, "teacher"]),
                "test_spans": found.spans["test"],
            }
            for student in found.names[1:]
        ]
    return LmdFindings(result, pd.DataFrame(rows))


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
) -> pd.DataFrame:
    """A linear UPOS probe on Portuguese (a language none of the models trained on, related to
    French and Spanish) for teachers and students: accuracy and macro-F1."""
    from dataclasses import asdict

    from lmalgebra.evaluate.conllu import split_by_document
    from lmalgebra.evaluate.pos_options import PosOptions
    from lmalgebra.evaluate.pos_tagging import evaluate_many, evaluation_identity
    from lmalgebra.sources.models import ModelRef

    splits = split_by_document(petrogold() / "annotated.conllu", out / "treebank", "pt_petrogold")
    refs = [ModelRef(name=name, path=str(path)) for name, path in models.items()]
    options = PosOptions(
        max_train_sentences=plan.pos_train_sentences,
        max_eval_sentences=plan.pos_train_sentences // 2,
        progress=progress,
    )
    # with the identity, a demo stopped in this step resumes with the models it had tagged
    identity = evaluation_identity(refs, splits, "probe", options)
    results = evaluate_many(
        refs, splits.train, splits.dev, splits.test, "probe", options, out, identity
    )
    import pandas as pd

    keep = ["model", "accuracy", "macro_f1", "majority_accuracy", "train_sentences", "test_words"]
    return pd.DataFrame([asdict(r) for r in results])[keep]
