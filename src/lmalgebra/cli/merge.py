"""Commands of MergeDistill (``lmalgebra merge ...``) and teacher pre-training."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, cast

import typer

from lmalgebra.cli.app import app, console
from lmalgebra.cli.causal import causal_summary, causal_table, causal_tokenizer_kind
from lmalgebra.cli.config_options import FlagStyle, config_flags, with_config_flags
from lmalgebra.core.errors import UserInputError
from lmalgebra.train.config import TrainingSpec

merge_app = typer.Typer(
    no_args_is_help=True, help="MergeDistill: teacher masked LMs -> one student."
)
app.add_typer(merge_app, name="merge")
RecipeArg = Annotated[Path, typer.Argument(help="MergeDistill YAML recipe.")]
RunDirArg = Annotated[Path, typer.Argument(help="A merge run directory.")]
ProgressOpt = Annotated[bool, typer.Option(help="Progress bars.")]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Print what the run would do (examples, masked tokens, teacher-store bytes, time "
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


def _stage_done(what: str, run: Any, next_command: str) -> None:
    """One summary line of the ``MergeRun`` so far (examples, masked tokens, vocabulary), and
    what next."""
    try:
        report = run.inspect()
    except UserInputError:  # a store assembled by hand, without recipe.yaml: nothing to count
        console.print(f"{what}\nnext: {next_command}")
        return
    if report["causal"]:
        console.print(f"{what}: {causal_summary(report)}\nnext: {next_command}")
        return
    pairs = report["pairs"]
    examples = sum(int(p["examples"]) for p in pairs)
    masked = sum(int(p["masked_tokens"]) for p in pairs)
    line = f"{what}: {len(pairs)} (language, teacher) pairs, {examples} masked copies, "
    line += f"{masked} masked tokens"
    if report["vocab"]:
        line += f", student vocabulary {report['vocab']['union_size']} tokens"
    console.print(line)
    console.print(f"next: {next_command}")


@merge_app.command("init")
def merge_init(
    path: Annotated[Path, typer.Argument(help="Where to write the recipe.")] = Path("merge.yaml"),
    force: Annotated[bool, typer.Option(help="Replace an existing file.")] = False,
) -> None:
    """Write a commented starter recipe (every key with its default and meaning).

    Example: lmalgebra merge init merge.yaml && lmalgebra merge run merge.yaml
    """
    from lmalgebra.distill.run.starter_recipe import write_starter

    written = write_starter(path, force)
    console.print(
        f"wrote {written}; make its teachers (commands in its header), then "
        f"[bold]lmalgebra merge run {written}[/bold]"
    )


def _run_stages(recipe: Path, stages: list[str], progress: bool, dry_run: bool) -> Any:
    """``lmalgebra.merge`` on the recipe file: the ``MergeRun``; with ``dry_run``, its plan
    printed instead (``None``)."""
    from lmalgebra.api.merge import merge
    from lmalgebra.distill.recipe import load_recipe

    config = load_recipe(recipe)
    if dry_run:
        _print_plan(config, stages)
        return None
    return merge(config, stages, progress=progress)


@merge_app.command("prepare")
def merge_prepare(
    recipe: RecipeArg, progress: ProgressOpt = True, dry_run: DryRunOpt = False
) -> None:
    """Examples per language; each teacher's tokenised, masked copy of each example."""
    run = _run_stages(recipe, ["prepare"], progress, dry_run)
    if run is not None:
        _stage_done("prepared", run, f"lmalgebra merge teach {recipe}")


@merge_app.command("teach")
def merge_teach(
    recipe: RecipeArg, progress: ProgressOpt = True, dry_run: DryRunOpt = False
) -> None:
    """Offline teacher inference: top-k log-probabilities at masked positions, per-example loss."""
    run = _run_stages(recipe, ["teach"], progress, dry_run)
    if run is not None:
        after = f"lmalgebra merge vocab {recipe}"
        if run.recipe.objective == "causal":  # no union vocabulary
            after = f"lmalgebra merge inspect {run.run_dir}"
        _stage_done("teacher store complete", run, after)


@merge_app.command("vocab")
def merge_vocab(recipe: RecipeArg, dry_run: DryRunOpt = False) -> None:
    """Union student vocabulary, teacher->student id maps and the student tokenizer."""
    run = _run_stages(recipe, ["vocab"], False, dry_run)
    if run is not None:
        _stage_done("vocabulary complete", run, f"lmalgebra merge train {recipe}")


@merge_app.command("run")
def merge_run(recipe: RecipeArg, progress: ProgressOpt = True, dry_run: DryRunOpt = False) -> None:
    """prepare, teach and vocab in turn (each resumes where it stopped)."""
    from lmalgebra.distill.recipe import load_recipe

    causal = load_recipe(recipe).objective == "causal"  # no union vocabulary
    stages = ["prepare", "teach"] if causal else ["prepare", "teach", "vocab"]
    run = _run_stages(recipe, stages, progress, dry_run)
    if run is None:
        return
    report = run.inspect()
    console.print(causal_table(report) if causal else _inspect_table(report))
    console.print(f"next: lmalgebra merge train {recipe}")


def _print_plan(config: Any, stages: list[str], training: Any = None) -> None:
    """The dry run: ``lmalgebra.api.merge.merge_plan`` as two tables, counts and times."""
    from rich.table import Table

    from lmalgebra.api.merge import merge_plan

    plan = merge_plan(config, training=training)
    counts = Table(title=f"Dry run of {config.output_dir}: nothing written")
    for column in ("language", "teacher", "examples", "held out", "tokens", "masked", "store"):
        counts.add_column(column, justify="left" if column in ("language", "teacher") else "right")
    totals = plan.sum(numeric_only=True)
    for row in [*plan.to_dict("records"), {"language": "[bold]total", "teacher": "", **totals}]:
        numbers = [f"{int(row[k]):,}" for k in ("examples", "heldout", "tokens", "masked_tokens")]
        counts.add_row(row["language"], row["teacher"], *numbers, _bytes(row["store_bytes"]))
    counts.caption = "store: the teacher store's shard files (top-k ids and log-probabilities)"
    console.print(counts)
    times = Table(title="Time per stage (an estimate)")
    for column in ("stage", "seconds", "this command", "from"):
        times.add_column(column, justify="right" if column == "seconds" else "left")
    for stage in ("prepare", "teach", "vocab", "train", "evaluate"):
        how = "its work, timed here in memory" if stage in ("prepare", "vocab") else "FLOPs model"
        runs = "runs" if stage in stages else ""
        times.add_row(stage, f"{totals[f'{stage}_s']:,.2f}", runs, how)
    times.caption = (
        "FLOPs model: FLOPs over a matmul rate probed on this machine, plus per-layer overhead "
        "and model loading (README: dry runs). File writes and process start-up not counted."
    )
    console.print(times)


def _bytes(count: float) -> str:
    """``18.0 KiB``: a byte count in binary units."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while count >= 1024 and power < len(units) - 1:
        count, power = count / 1024, power + 1
    return f"{count:,.0f} B" if power == 0 else f"{count:,.1f} {units[power]}"


TRAINING_FLAGS = config_flags(
    TrainingSpec,
    {
        "training.steps": FlagStyle(aliases=("--steps",)),
        "training.gold_only": FlagStyle(aliases=("--gold-only",)),
    },
    prefix="training.",
    skip=("training.objective_mix",),  # a mapping: set in the recipe
)


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
    from lmalgebra.api.merge import merge
    from lmalgebra.core.recipe_files import validate
    from lmalgebra.distill.recipe import load_recipe

    config = load_recipe(recipe)
    settings = {**config.training.model_dump(), **overrides.get("training", {})}
    training = validate(TrainingSpec, settings, "command line")
    if dry_run:
        _print_plan(config, ["train"], training)
        return
    run = merge(config, ["train"], name=name, training=training, restart=restart, progress=progress)
    console.print(f"student saved to [bold]{run.students[name]}[/bold]")
    console.print(f"next: lmalgebra merge evaluate {config.output_dir} --student {name}")


SCRATCH_SIZES = {"hidden_size": 128, "num_layers": 2, "num_heads": 2}  # pretrain's defaults


@app.command()
def pretrain(
    corpus: Annotated[list[str], typer.Option(help="Corpus file(s) of the language; repeatable.")],
    lang: Annotated[str, typer.Option(help="Language code (for held-out ids).")],
    out: Annotated[Path, typer.Option(help="Model directory to write.")],
    vocab_size: Annotated[
        int | None, typer.Option(help="Tokenizer vocabulary size (from scratch).")
    ] = None,
    head_only: Annotated[
        bool,
        typer.Option(
            "--head-only",
            help="Fit only a masked-LM head on the frozen encoder --from (its own tokenizer).",
        ),
    ] = False,
    from_model: Annotated[
        str | None,
        typer.Option("--from", help="With --head-only: the encoder (directory, package:, hub id)."),
    ] = None,
    max_examples: Annotated[
        int | None, typer.Option(help="With --head-only: fit on the first N training examples.")
    ] = None,
    trust_remote_code: Annotated[
        bool, typer.Option(help="With --head-only: allow the encoder's own code to run.")
    ] = False,
    text_column: Annotated[str, typer.Option(help="Text field of structured corpora.")] = "text",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 1000,
    batch_size: Annotated[int, typer.Option(help="Examples per batch.")] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 1e-3,
    hidden_size: Annotated[int, typer.Option(help="Hidden width.")] = SCRATCH_SIZES["hidden_size"],
    num_layers: Annotated[int, typer.Option(help="Layers.")] = SCRATCH_SIZES["num_layers"],
    num_heads: Annotated[int, typer.Option(help="Attention heads.")] = SCRATCH_SIZES["num_heads"],
    example_length: Annotated[int, typer.Option(help="Tokens per example.")] = 128,
    heldout_fraction: Annotated[
        float, typer.Option(help="Held-out share (as in the recipe).")
    ] = 0.05,
    lowercase: Annotated[bool, typer.Option(help="Lower-case the tokenizer.")] = False,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    progress: ProgressOpt = True,
    restart: RestartOpt = False,
    causal: Annotated[
        bool, typer.Option("--causal", help="A GPT-2-style causal LM instead of a BERT masked LM.")
    ] = False,
    tokenizer_kind: Annotated[
        str | None,
        typer.Option(
            help="Tokenizer of a --causal teacher: bytelevel-bpe (default), unigram, bpe, "
            "wordpiece."
        ),
    ] = None,
) -> None:
    """Pre-train a small monolingual BERT teacher (WordPiece tokenizer + masked LM) from scratch,
    or (--head-only --from MODEL) fit a masked-LM head on an existing encoder, kept frozen, or
    (--causal) pre-train a GPT-2-style causal LM with a tokenizer of --tokenizer-kind."""
    from lmalgebra.core.recipe_files import validate
    from lmalgebra.distill.pretrain.masked import pretrain as run
    from lmalgebra.distill.student import StudentSpec
    from lmalgebra.sources.corpus import CorpusSpec

    scratch = {"hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads}
    head_flags = {"--from": from_model is not None, "--max-examples": max_examples is not None}
    head_flags["--trust-remote-code"] = trust_remote_code
    _check_pretrain_mode(head_only, head_flags, vocab_size, lowercase, scratch)
    sizes = {
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "intermediate_size": 4 * hidden_size,
        "max_position_embeddings": max(512, example_length),
    }
    model = validate(StudentSpec, sizes, "command line")
    schedule = {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "seed": seed,
        "warmup_steps": min(100, steps // 10),
        "gold_only": True,
        "checkpoint_every": max(1, steps // 5),
    }
    training = validate(TrainingSpec, schedule, "command line")
    spec = CorpusSpec(paths=corpus, text_column=text_column)
    if causal or tokenizer_kind is not None:
        from lmalgebra.distill.pretrain.causal import pretrain_causal

        kind = causal_tokenizer_kind(causal, tokenizer_kind, lowercase, head_only)
        assert vocab_size is not None  # checked above
        target = pretrain_causal(
            spec,
            lang,
            kind,
            vocab_size,
            out,
            model,
            training,
            example_length,
            heldout_fraction,
            progress,
            restart,
        )
        console.print(f"causal teacher saved to [bold]{target}[/bold]")
        return
    if head_only:
        from lmalgebra.distill.pretrain.head_only import pretrain_head
        from lmalgebra.sources.models import ModelRef

        assert from_model is not None  # checked above
        encoder = ModelRef.parse(from_model).model_copy(
            update={"trust_remote_code": trust_remote_code}
        )
        target = pretrain_head(
            spec,
            lang,
            encoder,
            out,
            training,
            example_length,
            heldout_fraction,
            max_examples,
            progress,
            restart,
        )
        console.print(f"teacher saved to [bold]{target}[/bold]")
        return
    assert vocab_size is not None  # checked above
    target = run(
        spec,
        lang,
        vocab_size,
        out,
        model,
        training,
        example_length,
        heldout_fraction,
        lowercase,
        progress,
        restart,
    )
    console.print(f"teacher saved to [bold]{target}[/bold]")


def _check_pretrain_mode(
    head_only: bool,
    head_flags: dict[str, bool],
    vocab_size: int | None,
    lowercase: bool,
    scratch: dict[str, int],
) -> None:
    """Refuse an option of one kind of pre-training given to the other, naming it
    (``head_flags``: whether each option of head-only teachers was given)."""
    if not head_only:
        given = [flag for flag, on in head_flags.items() if on]
        if given:
            raise UserInputError(f"{given[0]} applies to a head-only teacher: add --head-only")
        if vocab_size is None:
            raise UserInputError(
                "--vocab-size is needed to pre-train from scratch "
                "(or fit a head on an existing encoder: --head-only --from MODEL)"
            )
        return
    if not head_flags["--from"]:
        raise UserInputError(
            "--head-only needs --from MODEL: the encoder to fit a head on "
            "(a directory, package:NAME or hub id)"
        )
    given = [f"--{k.replace('_', '-')}" for k, v in scratch.items() if v != SCRATCH_SIZES[k]]
    given += ["--vocab-size"] * (vocab_size is not None) + ["--lowercase"] * lowercase
    if given:
        raise UserInputError(
            f"{', '.join(given)} does not apply with --head-only "
            "(the encoder keeps its own sizes and tokenizer)"
        )


@merge_app.command("evaluate")
def merge_evaluate(
    run_dir: RunDirArg,
    student: Annotated[list[str] | None, typer.Option(help="Student name(s) in the run.")] = None,
    language: Annotated[list[str] | None, typer.Option(help="Only these languages.")] = None,
    pooling: Annotated[
        str | None,
        typer.Option(
            help="Causal runs: how LMD coverage pools a span's token states: mean (default) or "
            "last (the last token)."
        ),
    ] = None,
) -> None:
    """Held-out masked-token accuracy, perplexity, teacher agreement and RDT of students (causal
    runs: bits per byte of teachers and students, RDT on bits per byte, LMD coverage of each
    teacher by each student, greedy continuations)."""
    from lmalgebra.api.merge import MergeRun
    from lmalgebra.evaluate.causal_evaluation import (
        causal_markdown,
        evaluate_causal_run,
        is_causal_run,
    )
    from lmalgebra.evaluate.lmd_coverage import CoveragePooling, CoverageSpec

    if is_causal_run(run_dir):
        spec = CoverageSpec(pooling=cast(CoveragePooling, pooling or "mean"))
        found = evaluate_causal_run(run_dir, student or ["student"], language, spec)
        console.print(causal_markdown(found), highlight=False)
        console.print(f"written to [bold]{run_dir / 'evaluation'}[/bold]")
        return
    if pooling is not None:
        raise UserInputError("--pooling applies to causal runs only (LMD coverage of teachers)")
    run = MergeRun.load(run_dir).evaluate(student or ["student"], language)
    console.print(run.evaluation, highlight=False)
    console.print(f"written to [bold]{run_dir / 'evaluation'}[/bold]")


@merge_app.command("inspect")
def merge_inspect(
    run_dir: RunDirArg, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
) -> None:
    """Counts, bytes per masked token and vocabulary overlap of a run."""
    import json

    from lmalgebra.api.merge import MergeRun

    report = MergeRun.load(run_dir).inspect()
    if as_json:
        console.print_json(json.dumps(report))
    elif report["causal"]:
        console.print(causal_table(report))
    else:
        console.print(_inspect_table(report))


def _inspect_table(report: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title=f"MergeDistill run {report['run_dir']}")
    for column in (
        "language",
        "teacher",
        "examples",
        "masked tokens",
        "top-k",
        "top-k B/masked tok",
        "store B/masked tok",
    ):
        table.add_column(
            column, justify="right" if column[0] != "l" and column[0] != "t" else "left"
        )
    for row in report["pairs"]:
        store = row["store_bytes_per_masked_token"]
        table.add_row(
            row["language"],
            row["teacher"],
            str(row["examples"]),
            str(row["masked_tokens"]),
            str(row["top_k"]),
            f"{row['topk_file_bytes_per_masked_token'] or 0:.1f}",
            f"{store:.1f}" if store else "-",
        )
    vocab = report.get("vocab")
    if vocab:
        table.caption = f"union vocabulary: {vocab.get('union_size')} tokens"
    return table


@merge_app.command("verify")
def merge_verify(run_dir: RunDirArg) -> None:
    """Check every shard of a run against its manifest; exit 2 naming each bad shard."""
    from lmalgebra.api.merge import MergeRun

    problems = MergeRun.load(run_dir).verify()
    if problems:
        raise UserInputError("; ".join(problems))
    console.print(f"{run_dir}: every shard matches its manifest")
