"""The MergeDistill stage sequence, written once: prepare -> teach -> vocab -> train.

The objective is chosen here, once, from the recipe (``objective_of``): every stage of every
command, of the Python API, of the demos and the experiments runs through it. Each stage skips
the work an earlier run finished (complete shard sets, a vocabulary built from the same
tokenizers, a student already saved), so a sequence cut short continues where it stopped when
run again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import RESTART, UserInputError, UserValueError, merge_stage
from lmalgebra.core.recipe_files import Call, validate
from lmalgebra.core.settings import keys_alone, spelled_as_flags
from lmalgebra.core.text_files import absent, not_a_directory
from lmalgebra.distill.causal.objective import CausalObjective
from lmalgebra.distill.causal.student_init import refuse_init_inside
from lmalgebra.distill.causal.student_tokenizer import refuse_tokenless
from lmalgebra.distill.layout import (
    ANOTHER_STUDENT,
    BEST,
    CHECKPOINTS,
    HASHES,
    MODEL,
    RECIPE,
    RESERVED,
    SHARD_SETS,
    RunLayout,
    check_student_name,
    is_complete,
    refuse_special_entries,
    saved_steps,
    saved_training,
)
from lmalgebra.distill.masked.objective import MaskedObjective
from lmalgebra.distill.objective import STAGES, Evaluation, Objective, Stage
from lmalgebra.distill.recipe import (
    TEACHER_CHOICE,
    CausalRecipe,
    MaskedRecipe,
    MergeRecipe,
    key_owner,
    run_recipe,
)
from lmalgebra.distill.run.evaluation_record import record_problems
from lmalgebra.distill.run.inspection import RunInspection
from lmalgebra.distill.run.verify import verify_run
from lmalgebra.distill.teachers import inference_setup
from lmalgebra.distill.vocab.union import MAPS_FILE, META_FILE, REPORT
from lmalgebra.sources.model_files import MARKER, SAVING
from lmalgebra.storage.atomic import refuse_unwritable
from lmalgebra.storage.completion import STAMP
from lmalgebra.storage.lockfile import lock_file_refusal, refuse_nested, refuse_other_kind
from lmalgebra.storage.output_paths import (
    KIND_MARKERS,
    MODEL_CONFIG,
    check_directory,
    directory_kind,
    lock_holder,
    output_at,
    refuse_unusable_cache_parts,
)
from lmalgebra.train.checkpoint import (
    checkpoint_dirs,
    checkpointed_step,
    refuse_other_inputs,
    refuse_uncleared,
)
from lmalgebra.train.config import KD_SETTINGS, TrainingSpec, kd_free
from lmalgebra.train.loop import (
    TRAIN_LOG,
    changed_training,
    check_precision,
    refuse_fewer_steps,
    refuse_held_output,
    refuse_other_training,
    refuse_training_parts,
)
from lmalgebra.train.run_fingerprint import differences, training_part
from lmalgebra.train.validation import refuse_unrestorable_best

RUN_STAGES: tuple[Stage, ...] = STAGES[:-1]  # what run_stages runs (evaluate: evaluate_students)
STORE_STAGES: tuple[Stage, ...] = ("prepare", "teach", "vocab")  # everything before training


# the Objective that runs each recipe type of ``distill.recipe.RECIPES`` (a test checks both
# tables name the same objectives)
OBJECTIVES: dict[type[MergeRecipe], type[Objective]] = {
    MaskedRecipe: MaskedObjective,
    CausalRecipe: CausalObjective,
}


def verify(run_dir: Path) -> list[str]:
    """Every missing, corrupt or incomplete file of the run in ``run_dir``, named
    (``merge verify``), by the store parts of the objective its recipe has, each part of the
    store built from another recipe or other teachers, as training refuses it, and, once all
    of that passes, each saved student trained from teachers or a store as they were before
    they changed, as ``merge evaluate`` refuses it. A run another command is writing is
    refused, naming it: what it has not finished would read as missing."""
    layout = RunLayout(run_dir)
    holder = lock_holder(layout.root) if layout.root.is_dir() else None
    if holder is not None:
        raise UserInputError(
            f"{layout.root} is in use by another lmalgebra run ({holder}): verify it once that "
            "ends (what it is writing would read as missing)"
        )
    objective = objective_of(run_recipe(run_dir))
    problems = verify_run(run_dir, objective.store_parts, "vocab" in objective.stages)
    if (lock := lock_file_refusal(layout.root)) is not None:  # every stage refuses it
        problems.append(lock)
    problems += record_problems(
        layout,
        objective.kind,
        objective.row_kinds(),
        lambda r: objective.evaluation_texts(r["tables"], list(r["students"]), r["settings"]),
    )
    problems += _student_problems(objective.recipe, list(layout.saved_students()))
    problems += objective.blocked_outputs(list(layout.saved_students()), others=True)
    stale = objective.stale_store()  # what training's ``check_store`` would refuse
    if problems or stale:
        return problems + stale
    return objective.stale_students()  # what ``merge evaluate`` refuses of a student


def _student_problems(recipe: MergeRecipe, names: list[str]) -> list[str]:
    """What training and evaluation refuse of each saved student's directories
    (``check_students``: its model or checkpoints a link, say), as ``merge verify`` names it."""
    problems = []
    for name in names:
        try:
            check_students(recipe, [name])
        except UserInputError as err:
            problems.append(str(err))
    return problems


def objective_of(recipe: MergeRecipe) -> Objective:
    """The objective that runs ``recipe``'s stages, refused where its run directory holds the
    other objective's store (``refuse_other_objective``)."""
    objective = OBJECTIVES[type(recipe)](recipe)
    refuse_other_objective(objective)
    return objective


def refuse_other_objective(objective: Objective) -> None:
    """Refuse a run directory holding the store of another objective than ``objective``'s (a
    masked run's ``masked/`` and ``topk/`` under a causal recipe: its output_dir given to a
    recipe of the other objective, or the run's ``recipe.yaml`` replaced by one): no stage of
    this objective reads them, its stages had called the run unprepared, and its own store had
    been written beside them."""
    layout = objective.layout
    for other in (o for o in OBJECTIVES.values() if o.kind != objective.kind):
        found = [p for p in other.store_parts if layout.pairs(p)]
        if found:
            raise UserInputError(
                f"{layout.root} holds a {other.kind} run ({', '.join(f'{p}/' for p in found)}), "
                f"and this recipe's objective is {objective.kind}: a run directory holds the "
                "stages of one objective; give this recipe another output_dir (or, where it is "
                f"the run's {RECIPE} replaced, put the run's own back)"
            )


def training_of(recipe: MergeRecipe, overrides: Mapping[str, Any], source: str) -> TrainingSpec:
    """The recipe's training settings with ``overrides`` (keys of ``training``) laid over them,
    validated as the recipe's own training section; ``source`` names the overrides in messages."""
    spec, kind = type(recipe.training), OBJECTIVES[type(recipe)].kind
    owned = ((k, key_owner(f"training.{k}", kind)) for k in overrides)
    if (other := next(((k, o) for k, o in owned if o is not None), None)) is not None:
        # the recipe's reader words it so; "unknown key" alone had misled, and a flag is named
        named = f"{source}: unknown key {other[0]!r}" if isinstance(source, Call) else None
        raise UserInputError(
            f"{named or f'--training.{other[0]}'}: a setting of {other[1]} recipes' training, "
            f"and this recipe's objective is {kind}"
        )
    base = recipe.training.model_dump()
    if kd_free(dict(overrides)):
        # a baseline beside the recipe's distilled students: their distillation settings are
        # not this run's (and would be refused as ignored)
        dropped = {*KD_SETTINGS, *(["objective_mix"] if overrides.get("gold_only") else [])}
        if isinstance(recipe, CausalRecipe):  # its student reads the text, whichever copy
            dropped |= set(TEACHER_CHOICE) - set(overrides)
        base = {k: v for k, v in base.items() if k not in dropped}
    if not overrides:  # the recipe's own: refused by the recipe's reader, in its keys
        return validate(spec, base, source)
    if not isinstance(source, Call):
        return _within_recipe(recipe, validate(spec, {**base, **overrides}, source), source)
    with keys_alone(spec):  # a Python caller's keys of the training, as it gave them
        return _within_recipe(recipe, validate(spec, {**base, **overrides}, source), source)


def _within_recipe(recipe: MergeRecipe, spec: TrainingSpec, source: str) -> TrainingSpec:
    """``spec``, refused as the recipe's rules on its training refuse it (``check_training``,
    which training applies again), naming the settings as ``source`` gave them: the flags to
    the command line, the keys of the call's mapping after the call (``merge_plan() training:
    multi_teacher 'best' would be ignored under gold_only=True``), where a rule run later had
    named a recipe's keys in YAML's spelling (``training.gold_only: true``)."""
    with spelled_as_flags(not isinstance(source, Call)):
        try:
            recipe.check_training(spec)
        except UserInputError as err:
            if not isinstance(source, Call) or str(err).startswith(source):
                raise
            raise type(err)(f"{source}: {err}") from None
    return spec


def run_stages(
    recipe: MergeRecipe,
    stages: Sequence[Stage] = STORE_STAGES,
    students: Mapping[str, TrainingSpec] | None = None,
    progress: bool = True,
    *,
    keep_saved: bool = True,
    restart: bool = False,
) -> dict[str, Path]:
    """Run ``stages`` of ``recipe`` in pipeline order; the model directory of each student.

    A stage the recipe's objective does not have (a causal recipe's ``vocab``) is skipped in a
    sequence and refused, in one line, when asked for alone. ``students``: for the ``train`` stage,
    run subdirectory name -> training settings. ``keep_saved``: a student whose model is already
    saved is not trained again; ``False`` resumes it from its last checkpoint (to more steps, say).
    ``restart``: train from step 0, dropping the students' checkpoints.
    """
    unknown = [s for s in stages if s not in RUN_STAGES]
    if unknown:
        raise ValueError(f"unknown MergeDistill stage {unknown[0]!r}; stages are {RUN_STAGES}")
    if "train" in stages and not students:
        raise UserValueError("students is empty: the train stage needs at least one student")
    if "train" in stages:  # the init inside the student's directory: the more telling line
        refuse_own_init(recipe, list(students or {}))
    check_students(recipe, list(students or {}))  # refused before any stage writes
    refuse_linked_parts(recipe)
    objective = objective_of(recipe)
    stages = objective.runnable(stages)
    # teacher inference's device and dtype, refused before anything is written
    setup = inference_setup(recipe) if "teach" in stages else None
    if "prepare" in stages:
        objective.prepare(progress)
    if "teach" in stages:
        objective.teach(progress, setup)
    if "vocab" in stages:
        objective.vocab()
    models: dict[str, Path] = {}
    chosen = (students or {}) if "train" in stages else {}
    kept = [
        n for n in chosen if not restart and keep_saved and is_complete(objective.layout.model(n))
    ]
    if kept:  # kept only if trained from these teachers and this store: checked once, first
        objective.check_students(kept)
    for name in kept:  # and as asked (its run length aside)
        _refuse_kept_otherwise(name, objective.layout.model(name), chosen[name], recipe)
    for name, training in chosen.items():
        model = objective.layout.model(name)
        if name not in kept:
            if not restart:
                _refuse_stale_unresumable(objective, name, training)
            model = objective.train(name, training, progress, restart)
        models[name] = model
    return models


def _refuse_stale_unresumable(objective: Objective, name: str, training: TrainingSpec) -> None:
    """Refuse to train saved student ``name`` from step 0 over itself when it was trained from
    other teachers, another store or another ``student`` spec (its sizes, its tokenizer) and
    kept no checkpoint (``keep_checkpoints 0``): a checkpoint of them is refused
    (``--restart``), and without one it had been replaced."""
    runs = objective.training_runs(name, training)
    model = objective.layout.model(name)
    if not is_complete(model) or any(checkpointed_step(r / CHECKPOINTS) for r in runs):
        return
    teachers = objective.check_store()
    problem = objective.stale_student(name, teachers, objective.store_digest(teachers))
    changed = _student_changes(model, objective.recipe)
    if problem is None and changed:
        problem = (
            f"student {name!r} was made with other settings ({'; '.join(changed[:3])}): "
            f"train it again with {merge_stage('train', name, restart=True)}"
        )
    if problem is not None:
        raise UserInputError(f"{problem} (it kept no checkpoint: training would replace it)")


def _student_changes(model: Path, recipe: MergeRecipe) -> list[str]:
    """``student.KEY OLD -> NEW`` for each setting of the recipe's ``student`` other than the
    saved student ``model`` records (a setting an older record lacks: not compared)."""
    made = saved_training(model, "recipe")
    if not (isinstance(made, dict) and isinstance(made.get("student"), dict)):
        return []
    now = _spelt_alike(recipe.student.model_dump(mode="json"), recipe.teachers)
    was = _spelt_alike({k: v for k, v in made["student"].items() if k in now}, recipe.teachers)
    return [f"student.{c}" for c in differences(was, {k: now[k] for k in was})]


def _spelt_alike(student: dict[str, Any], teachers: Mapping[str, Any]) -> dict[str, Any]:
    """``student`` with a causal student's tokenizer ``teacher:NAME`` written ``NAME``, as its
    checkpoints record it (either spelling is the same tokenizer)."""
    given = student.get("tokenizer")
    if isinstance(given, str) and given.removeprefix("teacher:") in teachers:
        return {**student, "tokenizer": given.removeprefix("teacher:")}
    return student


def _refuse_kept_otherwise(
    name: str, model: Path, training: TrainingSpec, recipe: MergeRecipe
) -> None:
    """Refuse to keep a saved student trained with other settings than ``training`` (those that
    shape every step) or of another ``student`` spec than the recipe's: ``keep_saved`` had
    returned it as the student asked for."""
    changed = [f"training.{c}" for c in changed_training(saved_training(model), training)]
    changed += _student_changes(model, recipe)
    if changed:
        raise UserInputError(
            f"student {name!r} is saved, trained with other settings ({'; '.join(changed[:3])}): "
            f"keep_saved keeps a student trained as asked (its run length aside); {RESTART} "
            "trains it again, or name another student"
        )


def evaluate_students(
    recipe: MergeRecipe,
    students: Sequence[str],
    languages: Sequence[str] | None = None,
    pooling: str | None = None,
    overwrite: bool = False,
) -> Evaluation:
    """Score ``students`` of the recipe's run and its teachers on the held-out examples, as the
    recipe's objective does; written to the run's ``evaluation/``, beside the rows of other
    students and languages already there (``run.evaluation_record``), or in their place with
    ``overwrite``. Refused when the store or a student was made from other teachers than the
    recipe's as they are now, and when the rows it would keep no longer hold."""
    check_students(recipe, list(students))
    refuse_linked_parts(recipe)
    return objective_of(recipe).evaluate(students, languages, pooling, overwrite)


def refuse_linked_parts(recipe: MergeRecipe) -> None:
    """Refuse a symbolic link in place of a directory of the run (its store's sets, vocabulary,
    evaluation...) whose target is, or goes inside, another lmalgebra output, and a shard set's
    directory (``teacher_text``, ``examples``...) that itself holds one: the stages would write
    their files among that output's own (an evaluation written into a decomposition run's
    directory). A link to a directory of no output (a larger disk) is followed."""
    root = recipe.output_dir
    home = root.resolve() if root.exists() else None
    for part in RESERVED:
        path = root / part
        if part in SHARD_SETS and path.is_dir() and not path.is_symlink():
            _refuse_output_in_part(path, part)
        if not path.is_symlink() or not path.is_dir():
            continue  # a file is written beside a link and renamed over it: the link goes
        target = path.resolve()
        for holder in (target, *target.parents):
            if holder == home:
                break  # a link within the run itself
            found = output_at(holder) or _foreign_model(holder)
            if found is not None:
                where = "which" if holder == target else f"which goes inside {holder}, which"
                raise UserInputError(
                    f"{path} is a symbolic link to {target}, {where} holds {found[0]} "
                    f"({found[1]}): the run would write its {part} among that output's files; "
                    "remove the link"
                )


def _refuse_output_in_part(path: Path, part: str) -> None:
    """Refuse the directory of the run's shard sets ``part`` when it holds another output (a
    decomposition run a user kept under that name): the sets would be written among its files."""
    found = output_at(path) or _foreign_model(path)
    if found is not None:
        raise UserInputError(
            f"{path} holds {found[0]} ({found[1]}): the run would write its {part} among that "
            "output's files; move it out of the run"
        )


def _foreign_model(directory: Path) -> tuple[str, str] | None:
    """A model directory lmalgebra did not write (``directory_kind``'s), or None."""
    found = directory_kind(directory)
    return found if found is not None and found[0] not in KIND_MARKERS else None


def check_students(recipe: MergeRecipe, names: Sequence[str]) -> None:
    """Refuse a student name that is no plain directory name of the run or names a part of it
    (``check_student_name``), and one that is the name of a teacher of the recipe: the
    evaluation's rows of the two would be one model's; and one whose directory in the run, or
    its model's, checkpoints' or best weights', is something else (a file, a FIFO, a link to
    nothing), which training would fail to create after its steps, or (below the student's own
    directory) a link, through which training would replace the directory it names; a link
    or a FIFO among its model's files, which saving the model (after every step) and its card
    refuse; and a student's directory holding another output (``refuse_held_output``)."""
    for name in names:
        check_student_name(name)
        student = RunLayout(recipe.output_dir).student(name)
        # the directories training writes: the student's, its model, checkpoints, best weights
        for folder in (student, *(student / part for part in (MODEL, CHECKPOINTS, BEST))):
            if folder.is_symlink() and not folder.exists():
                raise UserInputError(f"student directory {folder} {absent(folder)}")
            if folder.exists() and not folder.is_dir():
                raise UserInputError(f"student directory {folder} {not_a_directory(folder)}")
            if folder != student and folder.is_symlink():  # training would write through it
                raise UserInputError(
                    f"student directory {folder} is a symbolic link to {folder.readlink()}: "
                    "training writes the student's files there itself and would replace what "
                    "the link names; remove the link"
                )
        linked = [c for c in checkpoint_dirs(student / CHECKPOINTS) if c.is_symlink()]
        if linked:  # pruning kept it without a word, and --restart refused it after its plan
            raise UserInputError(
                f"checkpoint {linked[0]} is a symbolic link to {linked[0].readlink()}: training "
                "resumes from, prunes and removes the student's checkpoints itself, and would "
                "not remove the link; remove the link"
            )
        _refuse_other_model(recipe, student / MODEL)
        refuse_special_entries(student / MODEL)  # as saving it refuses them, after the steps
        refuse_held_output(student)  # a teacher selection written there
        if name in recipe.teachers:
            raise UserInputError(
                f"student name {name!r} is the name of a teacher of the recipe (teachers: "
                f"{', '.join(recipe.teachers)}): their scores would be one model's; name the "
                "student otherwise"
            )


# the kind a student of each objective records in its ``lmalgebra.json``
STUDENT_KINDS = {"masked": "mergedistill-student", "causal": "causal-student"}


def _refuse_other_model(recipe: MergeRecipe, model: Path) -> None:
    """Refuse a student's ``model`` directory that holds a model lmalgebra wrote of another kind
    (a teacher ``pretrain`` made, the other objective's student, copied there): kept
    (``keep_saved``) or scored it had been taken for the student, and trained it had been
    written over, its own files left among the student's; and one that holds a model lmalgebra
    did not write (a Hugging Face model copied there, where no training of the student ran),
    which training had written over, unsaid."""
    from lmalgebra.distill.pretrain.teacher_directory import other_kind

    objective = "causal" if isinstance(recipe, CausalRecipe) else "masked"
    kind = STUDENT_KINDS[objective]
    student = model.parent
    logged = (student / TRAIN_LOG).exists() or any(student.glob(f"*/{TRAIN_LOG}"))
    ours = logged or (model / MARKER).exists() or (model / SAVING).exists()
    if (model / MODEL_CONFIG).is_file() and not ours:
        raise UserInputError(  # no save of the student's was cut short there
            f"student directory {model} holds a model lmalgebra did not write ({MODEL_CONFIG}, "
            f"no {MARKER}), which training would write over: move it out of the run, or name "
            "the student otherwise"
        )
    if (shown := other_kind(model, kind)) is not None:
        raise UserInputError(
            f"student directory {model} holds {shown}, not a {objective} run's student: move it "
            "out of the run, or name the student otherwise"
        )


def refuse_own_init(recipe: MergeRecipe, names: Sequence[str]) -> None:
    """Refuse a causal recipe's ``student.init`` inside the directory of a student it would
    start (``refuse_init_inside``)."""
    if isinstance(recipe, CausalRecipe):
        for name in names:
            refuse_init_inside(recipe.student, RunLayout(recipe.output_dir).student(name))


def plan(
    recipe: MergeRecipe,
    training: TrainingSpec | None = None,
    stages: Sequence[Stage] = STAGES,
    student: str | None = None,
    restart: bool = False,
) -> list[dict[str, Any]]:
    """The run planned before anything runs (``--dry-run``); ``training``: the student's
    settings (default the recipe's). ``stages``: those the run would run, refused as
    ``run_stages`` refuses them; the seconds of a stage the objective lacks are left out. An
    output directory the run would refuse (a file, another kind of output) is refused alike,
    and so is a ``student`` name or directory training refuses (None: not checked) and, unless
    ``restart``, training it to fewer steps than it has trained or from a checkpoint of other
    data (the recipe's, the store's: ``Objective.recorded_inputs``) or other training settings
    (each run of ``lambda_candidates`` too), and a later stage alone whose
    inputs an earlier stage has not written
    (``Objective.missing_input``: a run never prepared, a store not taught, no vocabulary),
    inputs edited since ``prepare`` wrote from them (``Objective.refuse_edited_inputs``), and a
    device or precision this machine lacks: the recipe's ``device`` and ``dtype`` where teachers
    would run, ``training.mixed_precision`` where a student would train. The run's own
    ``.hashes/`` (every stage remembers its teachers' hashes there) that is a file or a link to
    nothing is refused as the stages refuse it."""
    objective = objective_of(recipe)
    refuse_unusable_cache_parts(Path(recipe.output_dir), [HASHES])
    runnable = objective.runnable(stages)
    spec = training or recipe.training
    if student is not None and "train" in runnable:
        refuse_own_init(recipe, [student])
        check_students(recipe, [student])
        layout = RunLayout(recipe.output_dir)
        done = layout.student(student) / CHECKPOINTS
        reached = max(saved_steps(layout.model(student)), checkpointed_step(done))
        for out in objective.training_runs(student, spec):  # as training refuses them
            refuse_training_parts(out, itself=out != layout.student(student))
        if not restart:
            refuse_fewer_steps(reached, spec.steps, layout.student(student), ANOTHER_STUDENT)
            saved, runs = layout.model(student), objective.training_runs(student, spec)
            # no checkpoint
            refuse_other_training(saved_training(saved), spec, runs, saved, ANOTHER_STUDENT)
            if "teach" not in runnable and "prepare" not in runnable:  # the store as it stays
                _refuse_stale_unresumable(objective, student, spec)
            parts = objective.recorded_inputs()
            for out, run_spec in objective.training_runs(student, spec).items():
                # as each run refuses it: more steps than asked (a lambda candidate's own)
                refuse_fewer_steps(
                    checkpointed_step(out / CHECKPOINTS), run_spec.steps, out, ANOTHER_STUDENT
                )
                # as resuming refuses it: other data, or other settings of the student's own
                refuse_other_inputs(
                    out / CHECKPOINTS, {"training": training_part(run_spec), **parts}
                )
                refuse_unrestorable_best(out)  # as resuming refuses them, before any step
        else:  # as --restart refuses to drop a checkpoint holding a user's file
            left = {*objective.training_runs(student, spec), *layout.student_runs(student)}
            for out in sorted(left):  # those it trains in no more too (a dropped candidate's)
                refuse_uncleared(out / CHECKPOINTS)
    if runnable:  # the run's own checks of its directory, which write nothing
        check_directory(recipe.output_dir, "output directory")
        if (lock := lock_file_refusal(recipe.output_dir)) is not None:  # as taking it does
            raise UserInputError(lock)
        refuse_linked_parts(recipe)
        refuse_nested(recipe.output_dir, f"merge {runnable[0]}")
        if recipe.output_dir.is_dir():
            refuse_other_kind(recipe.output_dir, f"merge {runnable[0]}")
        if {"prepare", "teach"} & set(runnable):  # the stages that write the run's recipe.yaml
            refuse_unwritable(RunLayout(recipe.output_dir).recipe)
            objective.recipe_kept()  # a user's recipe.yaml there, which the run's would replace
        refuse_parts_in_the_way(objective, runnable)
    writes = any(recipe.written_text(lang) is not None for lang in recipe.languages)
    if "teach" in runnable or ("prepare" in runnable and writes):  # as the run, before any work
        inference_setup(recipe)  # a device or dtype this machine lacks
    lacking = [f"{stage}_s" for stage in STAGES if stage not in objective.stages]
    rows = objective.plan(spec)  # what the settings make the stage refuse, first
    if runnable[:1] == ["train"] and isinstance(recipe, CausalRecipe):  # training alone: a
        refuse_tokenless(recipe)  # student without a tokenizer (a whole run's plan: '-')
    if "prepare" in runnable:  # then inputs edited since prepare wrote from them
        objective.refuse_edited_inputs()
    if runnable[:1] == ["evaluate"] and student is not None:  # evaluate alone scores a saved one
        objective.refuse_untrained([student])
    if runnable and runnable[0] != "prepare":  # a later stage alone reads what those before wrote
        missing = objective.missing_input(runnable[0])  # refused as the stage refuses it
        if missing is not None:
            raise UserInputError(missing)
    if "train" in runnable and spec.steps:  # as training, once its inputs are there (steps 0
        check_precision(spec)  # trains nothing, in no precision)
    return [{k: v for k, v in row.items() if k not in lacking} for row in rows]


def _written_parts(objective: Objective, stages: Sequence[Stage]) -> list[Path]:
    """The directories of the run that ``stages`` write (their shard sets, the vocabulary)."""
    layout, recipe, (copies, outputs) = objective.layout, objective.recipe, objective.store_parts
    parts = []
    if "prepare" in stages:
        written = [lang for lang in recipe.languages if recipe.written_text(lang) is not None]
        parts += [layout.teacher_text(lang) for lang in written]
        parts += [layout.examples(lang) for lang in recipe.languages]
        parts += [layout.store(copies, lang, t) for lang, t in objective.pairs()]
    if "teach" in stages:
        parts += [layout.store(outputs, lang, t) for lang, t in objective.pairs()]
    if "vocab" in stages:
        parts.append(layout.vocab)
    return parts


def refuse_parts_in_the_way(objective: Objective, stages: Sequence[Stage]) -> None:
    """Refuse, in one line naming it, a file (a FIFO, a link to nothing) where ``stages`` write
    a directory of the run, or where a folder above one is: the stage cannot write there (a dry
    run, which writes nothing, had planned it); and in such a directory, what the stage's write
    refuses where it writes a file again (a FIFO, a directory, a link to nothing in place of a
    manifest, a shard, a vocabulary's file: no stage reads one, so each is written again)."""
    root = objective.layout.root
    for part in _written_parts(objective, stages):
        for place in [part, *part.parents]:
            if place == root or root not in place.parents:
                break
            if (place.exists() or place.is_symlink()) and not place.is_dir():
                raise UserInputError(
                    f"cannot write {part}: {place} {not_a_directory(place)}; remove it, then "
                    "run again"
                )
        if part.is_dir():
            for entry in sorted(part.iterdir()):
                if _rewritten(entry.name) and _unreadable(entry):
                    refuse_unwritable(entry)


_VOCABULARY_FILES = (MAPS_FILE, META_FILE, REPORT, STAMP, "tokenizer.json")


def _rewritten(name: str) -> bool:
    """Whether a stage writes the file ``name`` of its directory again when it cannot read it:
    a shard set's manifest (and its parts) and shards, the vocabulary's checksummed files."""
    return name.startswith(("manifest.", "shard-")) or name in _VOCABULARY_FILES


def _unreadable(entry: Path) -> bool:
    """A directory, a FIFO, a socket, a device or a link to nothing at ``entry``."""
    if entry.is_symlink() and not entry.exists():
        return True
    return entry.exists() and not entry.is_file()


def inspect_run(run_dir: Path) -> RunInspection:
    """What the run in ``run_dir`` holds, as its recipe's objective reports it."""
    return objective_of(run_recipe(run_dir)).inspect()


def prepare(recipe: MergeRecipe, progress: bool = True) -> None:
    """The ``prepare`` stage alone."""
    objective_of(recipe).prepare(progress)


def teach(recipe: MergeRecipe, progress: bool = True) -> None:
    """The ``teach`` stage alone."""
    objective_of(recipe).teach(progress)


def vocab(recipe: MergeRecipe) -> None:
    """The ``vocab`` stage alone (refused for a causal recipe)."""
    objective_of(recipe).vocab()


def check_store(recipe: MergeRecipe) -> dict[str, Any]:
    """The recipe's teachers, after refusing a store built from another recipe or teachers."""
    return objective_of(recipe).check_store()


def train_student(
    recipe: MergeRecipe,
    name: str = "student",
    training: TrainingSpec | None = None,
    progress: bool = True,
    restart: bool = False,
) -> Path:
    """Train (or resume) student ``name`` of the run (``training``: default the recipe's); its
    model directory."""
    return objective_of(recipe).train(name, training or recipe.training, progress, restart)
