"""Commands of MergeDistill (``lmalgebra merge ...``): each calls the Python API
(``lmalgebra.api.merge``), whose stages run as the recipe's objective runs them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lmalgebra.cli.app import CommandGroup, app, bold, console
from lmalgebra.cli.config_options import config_flags, with_config_flags
from lmalgebra.cli.merge_tables import plan_tables, run_table
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import plain
from lmalgebra.train.config import CausalTrainingSpec

merge_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="MergeDistill: several teacher LMs (masked, or causal with any tokenizers) -> one "
    "student.",
)
app.add_typer(merge_app, name="merge")
RecipeArg = Annotated[Path, typer.Argument(help="MergeDistill YAML recipe.")]
RunDirArg = Annotated[Path, typer.Argument(help="A merge run directory.")]
ProgressOpt = Annotated[bool, typer.Option(help="Progress bars (in a log: a line a minute).")]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print what the run would do (examples, predicted tokens, teacher-store bytes, time "
        "per stage) and stop: nothing is written, no teacher weights are read.",
    ),
]
RestartOpt = Annotated[
    bool,
    typer.Option(
        "--restart",
        help="Start afresh from step 0, dropping checkpoints (needed when they were written "
        "for other inputs or settings).",
    ),
]
# every training setting of either objective (a causal student's own settings included): one
# the recipe's objective does not read is refused by ``merge``, naming it
TRAINING_FLAGS = config_flags(CausalTrainingSpec, prefix="training.")


def _stage_done(what: str, run: Any, next_command: str) -> None:
    """One summary line of the ``MergeRun`` so far, and what next."""
    try:
        summary = run.inspect().summary
    except UserInputError:  # a store assembled by hand, without recipe.yaml: nothing to count
        console.print(f"{what}\nnext: {next_command}")
        return
    console.print(f"{what}: {summary}\nnext: {next_command}")


@merge_app.command("init")
def merge_init(
    path: Annotated[Path, typer.Argument(help="Where to write the recipe.")] = Path("merge.yaml"),
    force: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Write a commented starter recipe (every section, its main keys with their defaults).

    Example: lmalgebra merge init merge.yaml; make the teachers its header names (lmalgebra
    pretrain masked ...); then lmalgebra merge run merge.yaml
    """
    from lmalgebra.distill.run.starter_recipe import write_starter

    written = write_starter(path, force)
    console.print(
        f"wrote {written}; make its teachers (commands in its header), then",
        bold(f"lmalgebra merge run {written}"),
    )


def _run_stages(recipe: Path, stages: list[str], progress: bool, dry_run: bool) -> Any:
    """``lmalgebra.merge`` on the recipe file: the ``MergeRun``; with ``dry_run``, its plan
    printed instead (``None``)."""
    from lmalgebra.api.merge import merge, recipe_of

    config = recipe_of(recipe)
    if dry_run:
        _print_plan(config, stages)
        return None
    return merge(config, stages, progress=progress)


@merge_app.command("prepare")
def merge_prepare(
    recipe: RecipeArg, progress: ProgressOpt = True, dry_run: DryRunOpt = False
) -> None:
    """Examples per language; each teacher's copy of each example (masked, or tokenised)."""
    run = _run_stages(recipe, ["prepare"], progress, dry_run)
    if run is not None:
        _stage_done("prepared", run, f"lmalgebra merge teach {recipe}")


@merge_app.command("teach")
def merge_teach(
    recipe: RecipeArg, progress: ProgressOpt = True, dry_run: DryRunOpt = False
) -> None:
    """Offline teacher inference: the teachers' top-k log-probabilities (and more) per token."""
    run = _run_stages(recipe, ["teach"], progress, dry_run)
    if run is not None:
        after = run.stages[run.stages.index("teach") + 1]  # vocab, or train when there is none
        _stage_done("teacher store complete", run, f"lmalgebra merge {after} {recipe}")


@merge_app.command("vocab")
def merge_vocab(recipe: RecipeArg, dry_run: DryRunOpt = False) -> None:
    """Masked recipes: the union student vocabulary, teacher->student id maps, the student
    tokenizer."""
    run = _run_stages(recipe, ["vocab"], False, dry_run)
    if run is not None:
        _stage_done("vocabulary complete", run, f"lmalgebra merge train {recipe}")


@merge_app.command("run")
def merge_run(recipe: RecipeArg, progress: ProgressOpt = True, dry_run: DryRunOpt = False) -> None:
    """Every stage before training in turn (each resumes where it stopped)."""
    run = _run_stages(recipe, ["prepare", "teach", "vocab"], progress, dry_run)
    if run is None:
        return
    console.print(run_table(run.inspect()))
    console.print(f"next: lmalgebra merge train {recipe}")


def _print_plan(
    config: Any,
    stages: list[str],
    training: dict[str, Any] | None = None,
    student: str = "student",
    restart: bool = False,
) -> None:
    """The dry run: ``lmalgebra.api.merge.merge_plan`` as two tables, counts and times."""
    from lmalgebra.api.merge import merge_plan

    found = merge_plan(config, training=training, stages=stages, student=student, restart=restart)
    for table in plan_tables(found, config.output_dir, stages):
        console.print(table)


@merge_app.command("train")
@with_config_flags(TRAINING_FLAGS)
def merge_train(
    recipe: RecipeArg,
    name: Annotated[str, typer.Option(help="Run subdirectory for this student.")] = "student",
    progress: ProgressOpt = True,
    restart: RestartOpt = False,
    dry_run: DryRunOpt = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """Train the student from the teacher store (resumes from its last checkpoint).

    A training flag overrides the recipe's training setting; one not given keeps the recipe's
    (the defaults shown apply when the recipe does not set them either).
    """
    from lmalgebra.api.merge import merge, recipe_of
    from lmalgebra.distill.pipeline import training_of

    config = recipe_of(recipe)
    training = overrides.get("training", {})
    training_of(config, training, "command line")  # a rule across flags: named as flags, first
    if dry_run:
        _print_plan(config, ["train"], training, name, restart)
        return
    students = {name: training}
    run = merge(config, ["train"], students=students, restart=restart, progress=progress)
    console.print("student saved to", bold(run.students[name]))
    from lmalgebra.distill.layout import RunLayout

    trained = " ".join(f"--students {s}" for s in RunLayout(config.output_dir).saved_students())
    console.print(f"next: lmalgebra merge evaluate {config.output_dir} {trained}")


@merge_app.command("evaluate")
def merge_evaluate(
    run_dir: RunDirArg,
    students: Annotated[
        list[str] | None,
        typer.Option(
            help="Students of the run to score (default: those saved in it, else student)."
        ),
    ] = None,
    languages: Annotated[list[str] | None, typer.Option(help="Only these languages.")] = None,
    pooling: Annotated[
        str | None,
        typer.Option(
            help="Causal runs: how LMD coverage pools a span's token states: mean (default) or "
            "last (the last token)."
        ),
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            help="Replace the run's evaluation with this one's rows alone (by default the rows "
            "of other students and languages already there are kept, if they still hold)."
        ),
    ] = False,
) -> None:
    """Score students against their teachers on held-out text: masked runs, masked-token
    accuracy, perplexity, teacher agreement and RDT; causal runs, bits per byte of teachers and
    students, RDT on bits per byte, LMD coverage of each teacher by each student, greedy
    continuations. Scoring some students or languages keeps the evaluation's other rows and
    writes every table again from them all."""
    from lmalgebra.api.merge import MergeRun
    from lmalgebra.distill.layout import RunLayout

    run = MergeRun.load(run_dir).evaluate(students, languages, pooling, overwrite)
    console.print(run.evaluation, highlight=False)
    console.print("written to", bold(RunLayout(run.run_dir).evaluation))


@merge_app.command("inspect")
def merge_inspect(
    run_dir: RunDirArg, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
) -> None:
    """Counts and bytes per stored token of a run's teacher store, and its vocabulary."""
    import json

    from lmalgebra.api.merge import MergeRun

    report = MergeRun.load(run_dir).inspect()
    if as_json:
        console.print_json(json.dumps(plain(report.as_dict())))
    else:
        console.print(run_table(report))


@merge_app.command("verify")
def merge_verify(run_dir: RunDirArg) -> None:
    """Check every shard of a run against its manifest; exit 2 naming each bad shard."""
    from lmalgebra.api.merge import MergeRun

    problems = MergeRun.load(run_dir).verify()
    if problems:
        raise UserInputError("; ".join(problems))
    console.print(f"{run_dir}: every shard matches its manifest")
