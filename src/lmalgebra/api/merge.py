"""``merge``: MergeDistill from Python: any sequence of stages in one call, evaluation as
DataFrames.

The stages are those of ``lmalgebra merge``, run by the same functions (``distill.stages``,
``distill.train_student``, ``evaluate.distill_scores``): each resumes where it stopped and writes
the recipe's run directory, which is the product of a merge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from lmalgebra.api.runtime import library_call
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import validate
from lmalgebra.distill import stages as distill_stages
from lmalgebra.distill.recipe import MergeRecipe, load_recipe
from lmalgebra.distill.run_inspect import inspect_run
from lmalgebra.distill.train_student import train_student
from lmalgebra.evaluate.bits_per_byte import BITS
from lmalgebra.evaluate.causal_evaluation import evaluate_causal_run
from lmalgebra.evaluate.distill_scores import Score, evaluate_run, write_evaluation
from lmalgebra.evaluate.lmd_coverage import COVERAGE, CoveragePooling, CoverageSpec
from lmalgebra.train.config import TrainingSpec

STAGES = ("prepare", "teach", "vocab", "train", "evaluate")


class MergeRun:
    """A MergeDistill run directory and what the stages run on it produced.

    Attributes:
        recipe: the validated recipe; ``run_dir`` its ``output_dir``.
        students: student name -> trained model directory (loads with ``AutoModelForMaskedLM``;
            causal runs: ``AutoModelForCausalLM``).
        scores: after ``evaluate``: one row per (language, teacher tokenisation, model) with
            examples, masked_tokens, accuracy, loss, perplexity, top1_agreement, topk_overlap
            (every scored token replaced by the mask token), top1_training_masking and
            comparable (False where the teacher was not trained on the language).
        rdt: after ``evaluate``: RDT in percent (index ``student``; a column per language, then
            ``average``), positive when the student beats its teachers; comparable scores
            only (a language with none is NaN).
        coverage: after ``evaluate`` of a causal run: how much of each teacher each student
            carries by LMD, the columns of ``lmd_coverage.csv`` (language, teacher, student,
            pooling, teacher_from_student, student_from_teacher: test R^2; train_spans,
            test_spans). Causal runs' ``scores`` are bits per byte (``bits_per_byte.csv``) and
            their ``rdt`` is on bits per byte.
    """

    def __init__(self, recipe: MergeRecipe) -> None:
        self.recipe = recipe
        self.run_dir: Path = recipe.output_dir
        self.students: dict[str, Path] = {}
        self.scores: pd.DataFrame | None = None
        self.rdt: pd.DataFrame | None = None
        self.coverage: pd.DataFrame | None = None

    def evaluate(
        self,
        students: Sequence[str] | None = None,
        languages: Sequence[str] | None = None,
        pooling: CoveragePooling = "mean",
    ) -> MergeRun:
        """Score students (default: those trained here, else ``student``) and teachers on the
        held-out examples; write ``run_dir/evaluation`` as ``lmalgebra merge evaluate`` does.
        ``pooling`` (causal runs): how LMD coverage pools a span's token states."""
        names = list(students or self.students or ["student"])
        chosen = list(languages) if languages else None
        with library_call():
            if self.recipe.objective == "causal":
                found = evaluate_causal_run(
                    self.run_dir, names, chosen, CoverageSpec(pooling=pooling)
                )
                self.scores = pd.DataFrame([asdict(r) for r in found.bits], columns=BITS.columns)
                self.rdt = rdt_frame(found.rdt)
                self.coverage = pd.DataFrame(
                    [asdict(r) for r in found.coverage], columns=COVERAGE.columns
                )
                return self
            scores, deviations = evaluate_run(self.run_dir, names, chosen)
            write_evaluation(self.run_dir / "evaluation", scores, deviations)
        self.scores = score_frame(scores)
        self.rdt = rdt_frame(deviations)
        return self

    def inspect(self) -> dict[str, Any]:
        """Counts, bytes per masked token and vocabulary overlap (``lmalgebra merge inspect``)."""
        return inspect_run(self.run_dir)

    def __repr__(self) -> str:
        done = f", students {', '.join(self.students)}" if self.students else ""
        scored = ", evaluated" if self.scores is not None else ""
        return (
            f"<MergeRun {self.run_dir}: languages {', '.join(self.recipe.languages)}{done}{scored}>"
        )


def score_frame(scores: Sequence[Score]) -> pd.DataFrame:
    """Scores as a DataFrame, the columns of ``scores.csv``."""
    columns = list(Score.__dataclass_fields__)
    return pd.DataFrame([asdict(s) for s in scores], columns=columns)


def rdt_frame(deviations: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """RDT per student (rows) and language (columns, then ``average``), as ``rdt.csv``."""
    table = pd.DataFrame.from_dict({k: dict(v) for k, v in deviations.items()}, orient="index")
    table.index.name = "student"
    return table


def recipe_of(recipe: Any) -> MergeRecipe:
    """A recipe given as a YAML path, a mapping of its keys, or a ``MergeRecipe``."""
    if isinstance(recipe, MergeRecipe):
        return recipe
    if isinstance(recipe, Mapping):
        return validate(MergeRecipe, dict(recipe), "merge() recipe")
    if isinstance(recipe, str | Path):
        return load_recipe(Path(recipe))
    raise UserInputError(
        f"recipe must be a YAML path, a mapping or a MergeRecipe, got {type(recipe).__name__}"
    )


def _stages(stages: Sequence[str] | str) -> list[str]:
    chosen = [stages] if isinstance(stages, str) else list(stages)
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        raise UserInputError(f"unknown stage {unknown[0]!r} (stages: {', '.join(STAGES)})")
    if not chosen:
        raise UserInputError(f"no stage given (stages: {', '.join(STAGES)})")
    return chosen


def merge(
    recipe: Any,
    stages: Sequence[str] | str = STAGES,
    *,
    name: str = "student",
    gold_only: bool | None = None,
    steps: int | None = None,
    languages: Sequence[str] | None = None,
    progress: bool = False,
) -> MergeRun:
    """Run MergeDistill stages in the order given and return the run, evaluated if asked.

    Args:
        recipe: a YAML recipe path, a mapping of its keys, or a ``MergeRecipe``.
        stages: any of ``prepare``, ``teach``, ``vocab``, ``train``, ``evaluate`` (default all,
            in that order); each resumes from what earlier calls left in the run directory.
        name: the student's subdirectory (``train``) and the student evaluated (``evaluate``).
        gold_only, steps: override ``training.gold_only`` / ``training.steps`` for ``train``.
        languages: evaluate only these languages.
        progress: progress bars (drawn only on a terminal).
    """
    config = recipe_of(recipe)
    run = MergeRun(config)
    chosen = _stages(stages)
    with library_call():
        for stage in chosen:
            if stage == "prepare":
                distill_stages.prepare(config, progress)
            elif stage == "teach":
                distill_stages.teach(config, progress)
            elif stage == "vocab":
                distill_stages.vocab(config)
            elif stage == "train":
                run.students[name] = train_student(
                    config, name, _training(config, gold_only, steps), progress
                )
    if "evaluate" in chosen:
        run.evaluate([name], languages)
    return run


def _training(config: MergeRecipe, gold_only: bool | None, steps: int | None) -> TrainingSpec:
    update: dict[str, Any] = {}
    if gold_only is not None:
        update["gold_only"] = gold_only
    if steps is not None:
        update["steps"] = steps
    return validate(TrainingSpec, {**config.training.model_dump(), **update}, "merge()")
