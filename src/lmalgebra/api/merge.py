"""``merge``: MergeDistill from Python: any sequence of stages in one call, evaluation as
DataFrames; ``MergeRun.load`` for a run directory made earlier.

Every ``lmalgebra merge`` command is a call of this module: the stages run through
``distill.pipeline.run_stages`` and ``evaluate.distill_scores.evaluate_students``; each resumes
where it stopped and writes the recipe's run directory, which is the product of a merge.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmalgebra.api.runtime import library_call
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import validate
from lmalgebra.distill.masked.plan import plan_merge
from lmalgebra.distill.pipeline import STAGES as PIPELINE_STAGES
from lmalgebra.distill.pipeline import Stage, run_stages
from lmalgebra.distill.recipe import MergeRecipe, load_recipe
from lmalgebra.distill.run.inspection import inspect_run, verify_run
from lmalgebra.evaluate.bits_per_byte import BITS
from lmalgebra.evaluate.causal_evaluation import causal_markdown, evaluate_causal_run
from lmalgebra.evaluate.distill_scores import Score, evaluate_students, markdown
from lmalgebra.evaluate.lmd_coverage import COVERAGE, CoveragePooling, CoverageSpec
from lmalgebra.train.config import TrainingSpec

if TYPE_CHECKING:
    import pandas as pd

STAGES = ("prepare", "teach", "vocab", "train", "evaluate")
RECIPE_COPY = "recipe.yaml"  # the recipe as validated, in every run directory


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
        evaluation: after ``evaluate``: the evaluation as markdown (``evaluation.md``).
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
        self.evaluation: str | None = None
        self.coverage: pd.DataFrame | None = None

    @classmethod
    def load(cls, run_dir: str | Path) -> MergeRun:
        """The run in ``run_dir`` (from its ``recipe.yaml``), with the students saved there."""
        directory = Path(run_dir)
        path = directory / RECIPE_COPY
        if not path.is_file():
            raise UserInputError(
                f"{directory} is not a merge run directory (no {RECIPE_COPY}): "
                "run `lmalgebra merge prepare RECIPE` first"
            )
        run = cls(load_recipe(path).model_copy(update={"output_dir": directory}))
        saved = sorted(directory.glob("*/model/lmalgebra.json"))
        run.students = {p.parent.parent.name: p.parent for p in saved}
        return run

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
                import pandas as pd

                found = evaluate_causal_run(
                    self.run_dir, names, chosen, CoverageSpec(pooling=pooling)
                )
                self.scores = pd.DataFrame([asdict(r) for r in found.bits], columns=BITS.columns)
                self.rdt = rdt_frame(found.rdt)
                self.coverage = pd.DataFrame(
                    [asdict(r) for r in found.coverage], columns=COVERAGE.columns
                )
                self.evaluation = causal_markdown(found)
                return self
            scores, deviations = evaluate_students(self.run_dir, names, chosen)
        self.scores = score_frame(scores)
        self.rdt = rdt_frame(deviations)
        self.evaluation = markdown(scores, deviations)
        return self

    def inspect(self) -> dict[str, Any]:
        """Counts, bytes per masked token and vocabulary overlap (``lmalgebra merge inspect``)."""
        return inspect_run(self.run_dir)

    def verify(self) -> list[str]:
        """Every missing, corrupt or incomplete file of the run, named (``merge verify``)."""
        return verify_run(self.run_dir)

    def __repr__(self) -> str:
        done = f", students {', '.join(self.students)}" if self.students else ""
        scored = ", evaluated" if self.scores is not None else ""
        return (
            f"<MergeRun {self.run_dir}: languages {', '.join(self.recipe.languages)}{done}{scored}>"
        )


def score_frame(scores: Sequence[Score]) -> pd.DataFrame:
    """Scores as a DataFrame, the columns of ``scores.csv``."""
    import pandas as pd  # here, not at import: the stage commands need no DataFrame

    columns = list(Score.__dataclass_fields__)
    return pd.DataFrame([asdict(s) for s in scores], columns=columns)


def rdt_frame(deviations: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """RDT per student (rows) and language (columns, then ``average``), as ``rdt.csv``."""
    import pandas as pd

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
    training: TrainingSpec | Mapping[str, Any] | None = None,
    restart: bool = False,
    languages: Sequence[str] | None = None,
    progress: bool = False,
) -> MergeRun:
    """Run MergeDistill stages in pipeline order and return the run, evaluated if asked.

    Args:
        recipe: a YAML recipe path, a mapping of its keys, or a ``MergeRecipe``.
        stages: any of ``prepare``, ``teach``, ``vocab``, ``train``, ``evaluate`` (default all);
            each resumes from what earlier calls left in the run directory.
        name: the student's subdirectory (``train``) and the student evaluated (``evaluate``).
        gold_only, steps: override ``training.gold_only`` / ``training.steps`` for ``train``.
        training: the student's training settings, or a mapping of those that override the
            recipe's (``lmalgebra merge train --training.KEY``); ``gold_only``/``steps`` on top.
        restart: train from step 0, dropping the student's checkpoints.
        languages: evaluate only these languages.
        progress: progress bars (drawn only on a terminal).
    """
    config = recipe_of(recipe)
    run = MergeRun(config)
    chosen = _stages(stages)
    students = {name: _training(config, training, gold_only, steps)} if "train" in chosen else None
    with library_call():
        work: list[Stage] = [s for s in PIPELINE_STAGES if s in chosen]
        run.students = run_stages(
            config, work, students, progress, keep_saved=False, restart=restart
        )
    if "evaluate" in chosen:
        run.evaluate([name], languages)
    return run


def merge_plan(
    recipe: Any,
    *,
    gold_only: bool | None = None,
    steps: int | None = None,
    training: TrainingSpec | Mapping[str, Any] | None = None,
) -> pd.DataFrame:
    """What :func:`merge` would do with ``recipe``, found before anything runs; nothing is
    written and no teacher weights are read (``lmalgebra merge ... --dry-run``).

    One row per (language, teacher): ``examples`` (``heldout`` of them), input ``tokens`` and
    ``masked_tokens`` of the teacher's copies, exactly as ``prepare`` makes them;
    ``store_bytes``, the teacher store's shard files exactly as ``teach`` writes them; and
    seconds per stage spent on the pair, ``prepare_s``, ``teach_s``, ``vocab_s``, ``train_s``,
    ``evaluate_s`` (a column's sum is the stage's time): ``prepare`` and ``vocab`` timed doing
    their work in memory, the others estimated (``lmalgebra.distill.run.time_estimate`` states the
    model). ``gold_only``, ``steps``, ``training``: the student's training, as for :func:`merge`.
    """
    import pandas as pd

    config = recipe_of(recipe)
    spec = _training(config, training, gold_only, steps)
    with library_call():
        return pd.DataFrame(plan_merge(config, spec))


def _training(
    config: MergeRecipe,
    training: TrainingSpec | Mapping[str, Any] | None,
    gold_only: bool | None,
    steps: int | None,
) -> TrainingSpec:
    base = training.model_dump() if isinstance(training, TrainingSpec) else {}
    overrides = dict(training) if isinstance(training, Mapping) else {}
    update: dict[str, Any] = {**(base or config.training.model_dump()), **overrides}
    if gold_only is not None:
        update["gold_only"] = gold_only
    if steps is not None:
        update["steps"] = steps
    return validate(TrainingSpec, update, "merge()")
