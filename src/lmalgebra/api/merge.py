"""``merge``: MergeDistill from Python: any sequence of stages in one call, evaluation as
DataFrames; ``MergeRun.load`` for a run directory made earlier.

Every ``lmalgebra merge`` command is a call of this module: the stages run through
``distill.pipeline`` (the recipe's objective chosen there, once); each resumes where it stopped
and writes the recipe's run directory, which is the product of a merge.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmalgebra.api.runtime import library_entry, refuse_keep_and_restart
from lmalgebra.core.errors import UserInputError, UserTypeError, UserValueError
from lmalgebra.core.recipe_files import Call
from lmalgebra.core.settings import revalidated
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.objective import STAGES
from lmalgebra.distill.pipeline import (
    OBJECTIVES,
    RUN_STAGES,
    evaluate_students,
    objective_of,
    plan,
    run_stages,
    training_of,
    verify,
)
from lmalgebra.distill.recipe import RECIPES, MergeRecipe, parse_recipe, run_recipe, user_recipe
from lmalgebra.distill.run.inspection import RunInspection
from lmalgebra.train.config import TrainingSpec

if TYPE_CHECKING:
    import pandas as pd

Training = TrainingSpec | Mapping[str, Any]  # settings, or keys of ``training`` to override


class MergeRun:
    """A MergeDistill run directory and what the stages run on it produced.

    Attributes:
        recipe: the validated recipe; ``run_dir`` its ``output_dir``.
        students: student name -> trained model directory (loads with ``AutoModelForMaskedLM``;
            causal runs: ``AutoModelForCausalLM``): those trained or evaluated here (every
            student saved in the run, from ``MergeRun.load``).
        scores: after ``evaluate``: every row of the run's evaluation (this call's and those
            it kept); masked runs, one row per (language, teacher tokenisation, model) with
            examples, masked_tokens, accuracy, loss, perplexity, top1_agreement, topk_overlap
            (every scored token replaced by the mask token), top1_training_masking and
            comparable (False where the teacher was not trained on the language); causal runs,
            bits per byte per (language, model) (``bits_per_byte.csv``).
        rdt: after ``evaluate``: RDT in percent (index ``student``; a column per language, then
            ``average``), positive when the student beats its teachers (masked: on accuracy,
            comparable scores only; causal: on bits per byte); a language with none is NaN.
        evaluation: after ``evaluate``: the evaluation as markdown (``evaluation.md``).
        coverage: after ``evaluate`` of a causal run: how much of each teacher each student
            carries by LMD, the columns of ``lmd_coverage.csv`` (language, teacher, student,
            pooling, teacher_from_student, student_from_teacher: test R^2; train_spans,
            test_spans).
    """

    def __init__(self, recipe: Any) -> None:
        """``recipe``: a YAML path, a mapping of its keys or a ``MergeRecipe``, as for
        :func:`merge`; ``MergeRun.load`` opens a run directory."""
        config = recipe_of(recipe, "MergeRun()")
        # its directory as it is now, the same after os.chdir
        self.recipe = config.model_copy(update={"output_dir": config.output_dir.absolute()})
        self.run_dir: Path = self.recipe.output_dir
        self.students: dict[str, Path] = {}
        self.scores: pd.DataFrame | None = None
        self.rdt: pd.DataFrame | None = None
        self.evaluation: str | None = None
        self.coverage: pd.DataFrame | None = None

    @classmethod
    @library_entry
    def load(cls, run_dir: str | Path) -> MergeRun:
        """The run in ``run_dir`` (from its ``recipe.yaml``), with the students saved there."""
        layout = RunLayout(Path(run_dir).absolute())
        run = cls(run_recipe(layout.root))
        run.students = layout.saved_students()
        return run

    @library_entry
    def evaluate(
        self,
        students: Sequence[str] | None = None,
        languages: Sequence[str] | None = None,
        pooling: str | None = None,
        overwrite: bool = False,
    ) -> MergeRun:
        """Score students (default: those trained here, else ``student``) and teachers on the
        held-out examples; write ``run_dir/evaluation`` as ``lmalgebra merge evaluate`` does.
        ``pooling`` (causal runs): how LMD coverage pools a span's token states, ``mean``
        (default) or ``last``.

        The rows of other students and languages the run's evaluation holds are kept beside
        this one's, and every table made again from them all (``scores``, ``rdt`` and
        ``evaluation`` are of them all); refused, naming what changed, when they no longer hold
        (a student trained again, other held-out examples, teachers or settings).
        ``overwrite``: this evaluation's rows alone."""
        from lmalgebra.api.frames import frame

        chosen = _chosen(students, "students", "MergeRun.evaluate()", "those trained here")
        names = chosen or list(self.students or ["student"])
        languages = _chosen(languages, "languages", "MergeRun.evaluate()")
        found = evaluate_students(self.recipe, names, languages, pooling, overwrite)
        layout = RunLayout(self.run_dir)  # each one scored is saved: ``students`` names it too
        self.students.update({name: layout.model(name) for name in names})
        self.scores = frame(found.scores.kind, found.scores.rows)
        self.rdt = rdt_frame(found.rdt)
        self.evaluation = found.markdown
        if "coverage" in found.extra:
            self.coverage = frame(found.extra["coverage"].kind, found.extra["coverage"].rows)
        return self

    @library_entry
    def bits_per_byte(
        self,
        models: Mapping[str, str | Path] | Sequence[str] | None = None,
        languages: Sequence[str] | None = None,
        context: int | None = None,
    ) -> pd.DataFrame:
        """Bits per byte and per character of causal LMs on each language's held-out examples
        (``lmalgebra merge bits-per-byte``), written to ``evaluation/scored_bits_per_byte.csv``
        (beside ``merge evaluate``'s ``bits_per_byte.csv``, which it leaves as it is), with the
        rows an earlier call wrote there of other models or languages; the frame holds this
        call's rows.

        ``models``: name -> path, or references as on the command line (``[NAME=]PATH``);
        default the run's causal teachers. ``context``: tokens per sliding window (default the
        model's). Under a launcher the main rank scores and writes; the others return its
        rows, read back."""
        from lmalgebra.api.frames import frame
        from lmalgebra.distill.causal.bits_per_byte import BITS, SCORED, evaluate_bits, run_teachers
        from lmalgebra.distributed import on_main_rank
        from lmalgebra.sources.models import ModelRef
        from lmalgebra.storage.csv_tables import read_table

        languages = _chosen(languages, "languages", "MergeRun.bits_per_byte()")
        objective_of(self.recipe)  # a run holding the other objective's store: refused
        if models is not None and not models:
            raise UserValueError(
                f"MergeRun.bits_per_byte(): models is empty: {_EMPTY.format('the teachers')}"
            )
        if models is None:
            refs = run_teachers(self.run_dir)
        elif isinstance(models, Mapping):
            refs = [ModelRef.named(name, os.fspath(path)) for name, path in models.items()]
        else:
            refs = [ModelRef.parse(m) for m in models]
        names = {ref.name for ref in refs}

        def written() -> list[Any]:  # the other ranks, under a launcher: the main rank's rows
            rows = read_table(RunLayout(self.run_dir).evaluation, SCORED) or []
            return [
                r for r in rows if r.model in names and r.language in (languages or [r.language])
            ]

        rows = on_main_rank(
            lambda: evaluate_bits(self.run_dir, refs, languages, context),
            written,
            "MergeRun.bits_per_byte()",
        )
        return frame(BITS, rows)

    @library_entry
    def bits_rdt(self, bits: pd.DataFrame) -> pd.DataFrame:
        """RDT in percent on bits per byte of every model in ``bits`` (a ``bits_per_byte``
        table) that is not one of the run's teachers, against each language's teachers as the
        recipe lists them (positive: fewer bits than the teachers); the table ``rdt`` holds
        after ``evaluate``. A language none of whose teachers ``bits`` scores is NaN."""
        import pandas as pd

        from lmalgebra.distill.causal.bits_per_byte import BITS, BitsRow
        from lmalgebra.distill.causal.evaluation import bits_rdt

        if not isinstance(bits, pd.DataFrame):
            raise UserInputError(
                f"MergeRun.bits_rdt(): bits must be a DataFrame (MergeRun.bits_per_byte's "
                f"table), got {type(bits).__name__}"
            )
        missing = [c for c in BITS.columns if c not in bits.columns]
        if missing:
            raise UserInputError(
                f"MergeRun.bits_rdt(): bits is not a bits_per_byte table, it lacks "
                f"{', '.join(missing)} (score the models with MergeRun.bits_per_byte)"
            )
        numbers = [c for c in BITS.columns if c not in ("language", "model")]
        text = [c for c in numbers if not pd.api.types.is_numeric_dtype(bits[c])]
        if text:
            raise UserInputError(
                f"MergeRun.bits_rdt(): bits column {text[0]!r} holds {bits[text[0]].dtype} "
                "values, not numbers (read a table back with pandas.read_csv, or pass "
                "MergeRun.bits_per_byte's table as it is)"
            )
        rows = [BitsRow(**{c: r[c] for c in BITS.columns}) for r in bits.to_dict("records")]
        teachers = set(self.recipe.teachers)
        if not teachers & {r.model for r in rows}:
            raise UserInputError(
                f"bits scores none of the run's teachers ({', '.join(sorted(teachers))}): "
                "score them too, e.g. MergeRun.bits_per_byte() and the students together"
            )
        if not {r.model for r in rows} - teachers:  # an empty table had come back
            raise UserInputError(
                "MergeRun.bits_rdt(): bits scores the run's teachers alone: score the students "
                "too, e.g. MergeRun.bits_per_byte(run.students) beside MergeRun.bits_per_byte()"
            )
        pairs = Counter((r.language, r.model) for r in dict.fromkeys(rows))
        if twice := next((pair for pair, n in pairs.items() if n > 1), None):
            raise UserInputError(  # the last row had been taken, whichever it was
                f"MergeRun.bits_rdt(): bits holds rows of model {twice[1]!r} on language "
                f"{twice[0]!r} that disagree (tables of two contexts, or two models of one "
                "name): keep one row per pair"
            )
        teachers_of = self.recipe.teachers_of()
        models = dict.fromkeys(r.model for r in rows if r.model not in teachers)
        return rdt_frame({m: bits_rdt(rows, m, teachers_of) for m in models})

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages of the recipe's objective, in order (a causal recipe has no ``vocab``)."""
        return OBJECTIVES[type(self.recipe)].stages

    @library_entry
    def inspect(self) -> RunInspection:
        """What the run holds (``lmalgebra merge inspect``): per (language, teacher) its examples,
        what the store holds of them and bytes per stored token (``.pairs``, ``.frame()`` a
        DataFrame), a ``.summary`` line, and the vocabulary's report (``.vocab``)."""
        return objective_of(self.recipe).inspect()

    @library_entry
    def verify(self) -> list[str]:
        """Every missing, corrupt or incomplete file of the run, named (``merge verify``)."""
        return verify(self.run_dir)

    def __repr__(self) -> str:
        done = f", students {', '.join(self.students)}" if self.students else ""
        scored = ", evaluated" if self.scores is not None else ""
        return (
            f"<MergeRun {self.run_dir}: languages {', '.join(self.recipe.languages)}{done}{scored}>"
        )


def rdt_frame(deviations: Mapping[str, Mapping[str, float]]) -> pd.DataFrame:
    """RDT per student (rows) and language (columns, then ``average``), as ``rdt.csv``."""
    import pandas as pd

    table = pd.DataFrame.from_dict({k: dict(v) for k, v in deviations.items()}, orient="index")
    table.index.name = "student"
    return table


def recipe_of(recipe: Any, call: str = "merge()") -> MergeRecipe:
    """A recipe given as a YAML path, a mapping of its keys, or a ``MergeRecipe``; ``call``: the
    call it was given to, as messages name it."""
    if isinstance(recipe, MergeRecipe):
        return revalidated(recipe, f"{call} recipe")  # a copy pydantic did not check
    if isinstance(recipe, Mapping):
        return parse_recipe(dict(recipe), f"{call} recipe")
    if isinstance(recipe, str | Path):
        return user_recipe(Path(recipe))
    raise UserTypeError(
        f"{call}: recipe must be a YAML path, a mapping or a MergeRecipe, got "
        f"{type(recipe).__name__}"
    )


_EMPTY = "name at least one, or leave it out (None: {})"


def _chosen(
    values: Sequence[str] | None, name: str, where: str, default: str = "all of them"
) -> list[str] | None:
    """``values`` as a list (None: not given, the ``default``); an empty one is refused, naming
    ``name`` of the call ``where``: it had been taken for the default."""
    if values is None:
        return None
    if not values:
        raise UserValueError(f"{where}: {name} is empty: {_EMPTY.format(default)}")
    return list(values)


def _stages(stages: Sequence[str] | str, call: str) -> list[str]:
    """``stages`` as a list, refused naming the argument of ``call`` (``merge()``) where one is
    no stage or none is given (it had named neither the call nor its argument)."""
    chosen = [stages] if isinstance(stages, str) else list(stages)
    unknown = [s for s in chosen if s not in STAGES]
    if unknown:
        raise UserInputError(
            f"{call}: stages: unknown stage {unknown[0]!r} (stages: {', '.join(STAGES)})"
        )
    if not chosen:
        raise UserInputError(f"{call}: stages: no stage given (stages: {', '.join(STAGES)})")
    return chosen


def _training(config: MergeRecipe, training: Training | None, source: str) -> TrainingSpec:
    """The recipe's training settings, overridden by the keys ``training`` gives (a
    ``TrainingSpec``'s, those it was built with: ``TrainingSpec(steps=3)`` sets the steps alone,
    as ``{"steps": 3}`` and ``--training.steps 3`` do); settings of the other objective's type
    are refused, naming it (a ``CausalTrainingSpec`` for a masked recipe)."""
    own = type(config.training)
    if isinstance(training, TrainingSpec) and set(type(training).model_fields) - set(
        own.model_fields
    ):
        raise UserInputError(
            f"{source}: a {type(training).__name__} holds the training of "
            f"{_objective_of(type(training))} recipes, and this recipe's objective is "
            f"{_objective_of(own)}: give a {own.__name__} or a mapping of its keys"
        )
    if isinstance(training, TrainingSpec):  # the keys it was given, as a mapping's and flags'
        return training_of(config, training.model_dump(exclude_unset=True), source)
    return training_of(config, dict(training or {}), source)


def _refuse_idle(chosen: list[str], given: Mapping[str, Any] | None, **settings: Any) -> None:
    """Refuse what none of the ``chosen`` stages would read: ``settings`` of training
    (``given``: each student's training, which ``evaluate`` reads the names of alone) or, where
    ``given`` is None, of evaluation, set other than to their defaults."""
    stage = "train" if given is not None else "evaluate"
    if stage in chosen:
        return
    named = [k for k, v in settings.items() if v not in (None, False)]
    named += [f"students[{n!r}]'s training" for n, t in (given or {}).items() if t is not None]
    if named:
        remedy = "give it as None" if named[0].startswith("students[") else "leave it out"
        raise UserValueError(
            f"merge(): {named[0]} would be ignored: stages {', '.join(chosen)} hold no "
            f"{stage!r}; {remedy}, or add {stage!r} to stages"
        )


def _objective_of(spec: type[TrainingSpec]) -> str:
    """The objective whose recipes' training ``spec`` is."""
    return next(
        name
        for name, recipe in RECIPES.items()
        if recipe.model_fields["training"].annotation is spec
    )


@library_entry
def merge(
    recipe: Any,
    stages: Sequence[str] | str = STAGES,
    *,
    students: Mapping[str, TrainingSpec | Mapping[str, Any] | None] | None = None,
    keep_saved: bool = False,
    restart: bool = False,
    languages: Sequence[str] | None = None,
    pooling: str | None = None,
    progress: bool = False,
) -> MergeRun:
    """Run MergeDistill stages in pipeline order and return the run, evaluated if asked.

    Args:
        recipe: a YAML recipe path, a mapping of its keys, or a ``MergeRecipe``.
        stages: any of ``prepare``, ``teach``, ``vocab``, ``train``, ``evaluate`` (default all);
            each resumes from what earlier calls left in the run directory. A stage the
            recipe's objective does not have (a causal recipe's ``vocab``) is skipped.
        students: for ``train`` (and ``evaluate``): student name (its run subdirectory) -> its
            training: the keys of the recipe's ``training`` it overrides (a mapping, or a
            ``TrainingSpec``: the keys it was built with), or None (the recipe's). Default
            ``{"student": None}``.
        keep_saved: a student whose model is already saved is not trained again; otherwise it
            is resumed from its last checkpoint (to more steps, say).
        restart: train from step 0, dropping the students' checkpoints.
        languages: evaluate only these languages.
        pooling: causal runs: how ``evaluate``'s LMD coverage pools span states.
        progress: progress bars (drawn only on a terminal).
    """
    config = recipe_of(recipe)
    run = MergeRun(config)
    chosen = _stages(stages, "merge()")
    languages = _chosen(languages, "languages", "merge()")
    given = dict(students) if students is not None else {"student": None}
    if not given:
        raise UserValueError(
            "merge(): students is empty: name at least one student, or leave it out (the "
            "recipe's training, as 'student')"
        )
    _refuse_idle(chosen, given, restart=restart, keep_saved=keep_saved)
    refuse_keep_and_restart("merge()", keep_saved, restart)
    _refuse_idle(chosen, None, languages=languages, pooling=pooling)
    trainings = {name: _training(config, t, Call("merge() students")) for name, t in given.items()}
    work = [s for s in RUN_STAGES if s in chosen]
    saved = run_stages(
        config,
        work,
        trainings if "train" in chosen else None,
        progress,
        keep_saved=keep_saved,
        restart=restart,
    )
    run.students = {name: path.absolute() for name, path in saved.items()}
    if "evaluate" in chosen:
        run.evaluate(list(given), languages, pooling)
    return run


@library_entry
def merge_plan(
    recipe: Any,
    *,
    training: TrainingSpec | Mapping[str, Any] | None = None,
    stages: Sequence[str] | str = STAGES,
    student: str = "student",
    restart: bool = False,
) -> pd.DataFrame:
    """What :func:`merge` would do with ``recipe``, found before anything runs; nothing is
    written and no teacher weights are read (``lmalgebra merge ... --dry-run``). Refused as
    the run would refuse it, ``student`` (trained unless ``restart``) included: fewer
    ``training.steps`` than it has trained.

    One row per (language, teacher): ``examples`` (``heldout`` of them), input ``tokens`` and
    ``predicted_tokens`` (masked tokens, or every token of a causal teacher) of the teacher's
    copies, exactly as ``prepare`` makes them; ``store_bytes``, the shard files of the
    teachers' outputs exactly as ``teach`` writes them; and seconds per stage spent on the pair,
    ``prepare_s``, ``teach_s``, ``vocab_s``, ``train_s``, ``evaluate_s`` (a column's sum is the
    stage's time): ``prepare`` and ``vocab`` timed doing their work in memory, the others
    estimated (``lmalgebra.distill.run.time_estimate`` states the model); a causal recipe,
    which has no ``vocab`` stage, has no ``vocab_s``. ``training``: the student's training, as
    for a student of :func:`merge`; ``stages``: those the :func:`merge` call would run, refused
    as it refuses them.
    """
    import pandas as pd

    config = recipe_of(recipe, "merge_plan()")
    chosen = _stages(stages, "merge_plan()")
    spec = _training(config, training, Call("merge_plan() training"))
    runs = [s for s in STAGES if s in chosen]  # evaluate too: alone, it refuses what it lacks
    return pd.DataFrame(plan(config, spec, runs, student, restart))
