"""Command line: parse, validate, call one library function per command."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from lmalgebra.errors import TrainingDivergedError, UserInputError

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    help="Measure how much of one language model is contained in others (LMD).",
)
console = Console()


def _split_list(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [item for value in values for item in value.split(",") if item]


@app.command()
def decompose(
    recipe: Annotated[Path | None, typer.Argument(help="YAML recipe (flags override it).")] = None,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="[NAME=][random:]PATH_OR_HUB_ID[@REVISION], [NAME=]onnx:FILE[#TOKENIZER] or "
            "[NAME=]precomputed:FILE; repeat for each model."
        ),
    ] = None,
    corpus: Annotated[
        list[str] | None, typer.Option(help="Corpus file or saved dataset; repeatable.")
    ] = None,
    text_column: Annotated[
        str | None, typer.Option(help="Text field of .jsonl/.json/.csv/.parquet.")
    ] = None,
    seq_len: Annotated[
        int | None, typer.Option("--seq-len", "-T", help="Span length T in tokens.")
    ] = None,
    spans: Annotated[
        str | None, typer.Option(help="Spans per split: TRAIN,VALIDATION,TEST.")
    ] = None,
    fractions: Annotated[
        str | None, typer.Option(help="Document fractions: TRAIN,VALIDATION,TEST.")
    ] = None,
    per_doc: Annotated[
        int | None, typer.Option(help="At most this many spans per document.")
    ] = None,
    layer: Annotated[int | None, typer.Option(help="Hidden layer (default -1, the last).")] = None,
    pooling: Annotated[str | None, typer.Option(help="mean | first | last.")] = None,
    exclude_special: Annotated[
        bool | None, typer.Option(help="Exclude special tokens from pooling.")
    ] = None,
    dtype: Annotated[str | None, typer.Option(help="float32 | bfloat16.")] = None,
    batch_size: Annotated[int | None, typer.Option(help="Spans per forward pass.")] = None,
    alpha: Annotated[
        float | None, typer.Option(help="Ridge strength (default 1e-2, relative).")
    ] = None,
    alpha_mode: Annotated[str | None, typer.Option(help="relative | absolute.")] = None,
    target: Annotated[str | None, typer.Option(help="Fit this model on --basis.")] = None,
    basis: Annotated[
        list[str] | None, typer.Option(help="Basis model(s): repeat or comma-separate.")
    ] = None,
    save_weights: Annotated[
        bool | None, typer.Option(help="Write fitted weights (safetensors).")
    ] = None,
    lengths: Annotated[
        str | None, typer.Option(help="Study: sweep span length T over these, e.g. 16,32,64.")
    ] = None,
    layers: Annotated[
        bool | None, typer.Option("--layers", help="Study: every layer of each target.")
    ] = None,
    layer_map: Annotated[
        str | None, typer.Option(help="Study: layer-by-layer map between two models: A,B.")
    ] = None,
    train_sizes: Annotated[
        str | None, typer.Option(help="Study: learning curve over these training sizes.")
    ] = None,
    by_language: Annotated[
        bool | None, typer.Option("--by-language", help="Study: results per language.")
    ] = None,
    language_column: Annotated[
        str | None, typer.Option(help="Field holding each record's language.")
    ] = None,
    bootstrap: Annotated[
        int | None, typer.Option(help="Bootstrap replicates for R^2 intervals (0 = none).")
    ] = None,
    blocks: Annotated[
        int | None, typer.Option(help="Blocks of spans per split for resampling.")
    ] = None,
    alpha_select: Annotated[
        str | None, typer.Option(help="fixed | gcv | kfold | validation.")
    ] = None,
    alpha_grid: Annotated[
        str | None, typer.Option(help="Candidate alphas, comma-separated.")
    ] = None,
    folds: Annotated[int | None, typer.Option(help="Folds for --alpha-select kfold.")] = None,
    nulls: Annotated[
        bool | None, typer.Option("--nulls", help="Add random-initialised null copies.")
    ] = None,
    attribution: Annotated[
        bool | None, typer.Option("--attribution", help="Greedy, drop-one and Shapley.")
    ] = None,
    out: Annotated[Path | None, typer.Option(help="Output directory.")] = None,
    cache_dir: Annotated[Path | None, typer.Option(help="Embedding cache root.")] = None,
    trust_remote_code: Annotated[bool, typer.Option(help="Allow models' own code to run.")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """Decompose every model on the others: pairwise and group R^2 on train, validation, test."""
    from lmalgebra.lmd.report import table
    from lmalgebra.lmd.run import decompose as run
    from lmalgebra.lmd.run import load_config, mark_incomplete
    from lmalgebra.sources.models import ModelRef

    overrides: dict[str, Any] = {}
    if model:
        refs = [
            ModelRef.parse(m).model_copy(update={"trust_remote_code": trust_remote_code})
            for m in model
        ]
        overrides["models"] = [r.model_dump() for r in refs]
    corpus_flags = {"paths": corpus, "text_column": text_column, "language_column": language_column}
    corpus_over = {k: v for k, v in corpus_flags.items() if v is not None}
    if corpus_over:
        overrides["corpus"] = corpus_over
    span_over = {
        "length": seq_len,
        "per_doc": per_doc,
        "counts": _numbers(spans, int, "--spans"),
        "fractions": _numbers(fractions, float, "--fractions"),
    }
    if any(v is not None for v in span_over.values()):
        overrides["spans"] = {k: v for k, v in span_over.items() if v is not None}
    flat = {
        "layer": layer,
        "pooling": pooling,
        "exclude_special": exclude_special,
        "dtype": dtype,
        "batch_size": batch_size,
        "alpha": alpha,
        "alpha_mode": alpha_mode,
        "target": target,
        "basis": _split_list(basis),
        "save_weights": save_weights,
        "out": out,
        "cache_dir": cache_dir,
    }
    overrides.update({k: v for k, v in flat.items() if v is not None})
    study_over = {
        "lengths": _numbers(lengths, int, "--lengths"),
        "layers": layers,
        "layer_map": _split_list([layer_map]) if layer_map else None,
        "train_sizes": _numbers(train_sizes, int, "--train-sizes"),
        "languages": by_language,
        "bootstrap": bootstrap,
        "blocks": blocks,
        "alpha_select": alpha_select,
        "alpha_grid": _numbers(alpha_grid, float, "--alpha-grid"),
        "folds": folds,
        "nulls": nulls,
        "attribution": attribution,
    }
    if any(v is not None for v in study_over.values()):
        overrides["study"] = {k: v for k, v in study_over.items() if v is not None}
    overrides["progress"] = progress
    try:
        config = load_config(recipe, overrides)
    except UserInputError:
        mark_incomplete(recipe, out)  # a rejected run must not leave an older one looking complete
        raise
    result = run(config)
    from lmalgebra.distributed import is_main

    if is_main():  # one table, not one per process
        console.print(table(result))
        console.print(f"outputs in [bold]{config.out}[/bold]")


def _numbers(text: str | None, kind: type, flag: str) -> list[Any] | None:
    if text is None:
        return None
    try:
        return [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserInputError(f"{flag}: expected comma-separated numbers, got {text!r}") from None


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("demo-output"),
    quick: Annotated[bool, typer.Option(help="A smaller run (a few minutes).")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """The whole toolkit offline: pre-train teachers, merge, evaluate, decompose, report."""
    from lmalgebra.demo.html_report import render
    from lmalgebra.demo.workflow import run_demo

    result = run_demo(out, quick=quick, progress=progress)
    report = render(result, out)
    for name, finding in result["findings"].items():
        console.print(f"{name}: {finding}", highlight=False)
    console.print(f"report: [bold]{report}[/bold]; everything else under [bold]{out}[/bold]")


@app.command("demo-lmd")
def demo_lmd(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("demo-output/packaged-lmd"),
    quick: Annotated[bool, typer.Option(help="A smaller run (about a minute).")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """Decompose the packaged real encoders on packaged Wikipedia text (no model hub needed)."""
    from lmalgebra.demo.packaged_lmd import demo_config
    from lmalgebra.lmd.report import table
    from lmalgebra.lmd.run import decompose as run

    config = demo_config(out, quick=quick, progress=progress)
    result = run(config)
    console.print(table(result))
    console.print(f"outputs in [bold]{config.out}[/bold]")


merge_app = typer.Typer(
    no_args_is_help=True, help="MergeDistill: teacher masked LMs -> one student."
)
app.add_typer(merge_app, name="merge")
RecipeArg = Annotated[Path, typer.Argument(help="MergeDistill YAML recipe.")]
RunDirArg = Annotated[Path, typer.Argument(help="A merge run directory.")]
ProgressOpt = Annotated[bool, typer.Option(help="Progress bars.")]


@merge_app.command("prepare")
def merge_prepare(recipe: RecipeArg, progress: ProgressOpt = True) -> None:
    """Examples per language; each teacher's tokenised, masked copy of each example."""
    from lmalgebra.merge import stages
    from lmalgebra.merge.recipe import load_recipe

    stages.prepare(load_recipe(recipe), progress)
    console.print("prepared")


@merge_app.command("teach")
def merge_teach(recipe: RecipeArg, progress: ProgressOpt = True) -> None:
    """Offline teacher inference: top-k log-probabilities at masked positions, per-example loss."""
    from lmalgebra.merge import stages
    from lmalgebra.merge.recipe import load_recipe

    stages.teach(load_recipe(recipe), progress)
    console.print("teacher store complete")


@merge_app.command("vocab")
def merge_vocab(recipe: RecipeArg) -> None:
    """Union student vocabulary, teacher->student id maps and the student tokenizer."""
    from lmalgebra.merge import stages
    from lmalgebra.merge.recipe import load_recipe

    stages.vocab(load_recipe(recipe))
    console.print("vocabulary complete")


@merge_app.command("run")
def merge_run(recipe: RecipeArg, progress: ProgressOpt = True) -> None:
    """prepare, teach and vocab in turn (each resumes where it stopped)."""
    from lmalgebra.merge import stages
    from lmalgebra.merge.recipe import load_recipe
    from lmalgebra.merge.run_inspect import inspect_run

    config = load_recipe(recipe)
    stages.prepare(config, progress)
    stages.teach(config, progress)
    stages.vocab(config)
    console.print(_inspect_table(inspect_run(config.output_dir)))


@merge_app.command("train")
def merge_train(
    recipe: RecipeArg,
    name: Annotated[str, typer.Option(help="Run subdirectory for this student.")] = "student",
    gold_only: Annotated[bool, typer.Option(help="Gold labels only (no distillation).")] = False,
    steps: Annotated[int | None, typer.Option(help="Override training.steps.")] = None,
    progress: ProgressOpt = True,
) -> None:
    """Train the student from the teacher store (resumes from its last checkpoint)."""
    from lmalgebra.merge.recipe import load_recipe
    from lmalgebra.merge.train_student import train_student
    from lmalgebra.recipe_io import validate
    from lmalgebra.train.config import TrainingSpec

    config = load_recipe(recipe)
    update: dict[str, Any] = {"gold_only": gold_only or config.training.gold_only}
    if steps is not None:
        update["steps"] = steps
    training = validate(TrainingSpec, {**config.training.model_dump(), **update}, "command line")
    target = train_student(config, name, training, progress)
    console.print(f"student saved to [bold]{target}[/bold]")


@app.command()
def pretrain(
    corpus: Annotated[list[str], typer.Option(help="Corpus file(s) of the language; repeatable.")],
    lang: Annotated[str, typer.Option(help="Language code (for held-out ids).")],
    vocab_size: Annotated[int, typer.Option(help="WordPiece vocabulary size.")],
    out: Annotated[Path, typer.Option(help="Model directory to write.")],
    text_column: Annotated[str, typer.Option(help="Text field of structured corpora.")] = "text",
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 1000,
    batch_size: Annotated[int, typer.Option(help="Examples per batch.")] = 32,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 1e-3,
    hidden_size: Annotated[int, typer.Option(help="Hidden width.")] = 128,
    num_layers: Annotated[int, typer.Option(help="Layers.")] = 2,
    num_heads: Annotated[int, typer.Option(help="Attention heads.")] = 2,
    example_length: Annotated[int, typer.Option(help="Tokens per example.")] = 128,
    heldout_fraction: Annotated[
        float, typer.Option(help="Held-out share (as in the recipe).")
    ] = 0.05,
    lowercase: Annotated[bool, typer.Option(help="Lower-case the tokenizer.")] = False,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    progress: ProgressOpt = True,
) -> None:
    """Pre-train a small monolingual BERT teacher (WordPiece tokenizer + masked LM) from scratch."""
    from lmalgebra.merge.student import StudentSpec
    from lmalgebra.pretrain import pretrain as run
    from lmalgebra.recipe_io import validate
    from lmalgebra.sources.corpus import CorpusSpec
    from lmalgebra.train.config import TrainingSpec

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
    )
    console.print(f"teacher saved to [bold]{target}[/bold]")


@merge_app.command("evaluate")
def merge_evaluate(
    run_dir: RunDirArg,
    student: Annotated[list[str] | None, typer.Option(help="Student name(s) in the run.")] = None,
    language: Annotated[list[str] | None, typer.Option(help="Only these languages.")] = None,
) -> None:
    """Held-out masked-token accuracy, perplexity, teacher agreement and RDT of students."""
    from lmalgebra.merge.evaluate import evaluate_run, markdown, write_evaluation

    scores, deviations = evaluate_run(run_dir, student or ["student"], language)
    write_evaluation(run_dir / "evaluation", scores, deviations)
    console.print(markdown(scores, deviations), highlight=False)
    console.print(f"written to [bold]{run_dir / 'evaluation'}[/bold]")


@merge_app.command("inspect")
def merge_inspect(
    run_dir: RunDirArg, as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False
) -> None:
    """Counts, bytes per masked token and vocabulary overlap of a run."""
    import json

    from lmalgebra.merge.run_inspect import inspect_run

    report = inspect_run(run_dir)
    if as_json:
        console.print_json(json.dumps(report))
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
    from lmalgebra.merge.run_inspect import verify_run

    problems = verify_run(run_dir)
    if problems:
        raise UserInputError("; ".join(problems))
    console.print(f"{run_dir}: every shard matches its manifest")


@app.command("evaluate-pos")
def evaluate_pos(
    treebank: Annotated[
        Path,
        typer.Argument(help="Treebank directory: *-ud-{train,dev,test}.conllu or train/dev/test."),
    ],
    model: Annotated[
        list[str], typer.Option(help="[NAME=][random:]PATH_OR_HUB_ID[@REVISION]; repeatable.")
    ],
    mode: Annotated[
        str, typer.Option(help="probe (frozen states) or finetune (whole encoder).")
    ] = "probe",
    layer: Annotated[int, typer.Option(help="Hidden layer (0 embeddings, -1 the last).")] = -1,
    epochs: Annotated[int | None, typer.Option(help="Most epochs (probe 30, finetune 3).")] = None,
    lr: Annotated[
        float | None, typer.Option(help="Learning rate (probe 1e-2, finetune 5e-5).")
    ] = None,
    batch_size: Annotated[int, typer.Option(help="Sentences per forward pass.")] = 32,
    max_train_sentences: Annotated[int | None, typer.Option(help="Seeded sample of train.")] = None,
    max_eval_sentences: Annotated[int | None, typer.Option(help="First N of dev and test.")] = None,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("pos-output"),
    trust_remote_code: Annotated[bool, typer.Option(help="Allow models' own code to run.")] = False,
    progress: ProgressOpt = True,
) -> None:
    """UPOS tagging on a CoNLL-U treebank: test accuracy and macro-F1 of each model."""
    from lmalgebra.evaluate.conllu import find_splits
    from lmalgebra.evaluate.pos_tagging import PosOptions, evaluate_many
    from lmalgebra.sources.models import ModelRef

    if mode not in ("probe", "finetune"):
        raise UserInputError(f"--mode must be probe or finetune, got {mode!r}")
    refs = [
        ModelRef.parse(m).model_copy(update={"trust_remote_code": trust_remote_code}) for m in model
    ]
    splits = find_splits(treebank)
    options = PosOptions(
        layer=layer,
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        max_train_sentences=max_train_sentences,
        max_eval_sentences=max_eval_sentences,
        seed=seed,
        progress=progress,
    )
    results = evaluate_many(
        refs,
        splits.train,
        splits.dev,
        splits.test,
        mode,  # type: ignore[arg-type]
        options,
        out,
    )
    for r in results:
        console.print(
            f"{r.model}: accuracy {r.accuracy:.4f}, macro-F1 {r.macro_f1:.4f} "
            f"(majority {r.majority_accuracy:.4f})",
            highlight=False,
        )
    console.print(
        f"outputs in [bold]{out}[/bold]: pos_results.csv, pos_results.md, pos_config.json"
    )


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="A complete decomposition run directory.")],
    out: Annotated[
        Path | None, typer.Option(help="HTML file to write (default RUN_DIR/report.html).")
    ] = None,
) -> None:
    """One self-contained HTML page of a decomposition run: figures, tables, configuration."""
    from lmalgebra.report.html import write_report

    typer.echo(str(write_report(run_dir, out)))


@app.command("spans")
def export_spans(
    recipe: Annotated[Path | None, typer.Argument(help="Decomposition recipe.")] = None,
    model: Annotated[
        list[str] | None, typer.Option(help="Model(s) as in decompose; one supplies the tokenizer.")
    ] = None,
    corpus: Annotated[list[str] | None, typer.Option(help="Corpus file(s); repeatable.")] = None,
    text_column: Annotated[str | None, typer.Option(help="Text field of structured files.")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", "-T", help="Span length T.")] = None,
    spans: Annotated[str | None, typer.Option(help="Spans per split: TRAIN,VAL,TEST.")] = None,
    fractions: Annotated[str | None, typer.Option(help="Document fractions, three.")] = None,
    per_doc: Annotated[int | None, typer.Option(help="At most this many per document.")] = None,
    out: Annotated[Path, typer.Option(help="Span list to write (JSONL).")] = Path("spans.jsonl"),
) -> None:
    """Export a decomposition's spans, to embed them elsewhere (then: precomputed:FILE).

    Writes one JSON line per span (row, split, index, sha256, text) and the order digest.
    """
    from lmalgebra.lmd.span_plan import draw_run_spans, load_span_config
    from lmalgebra.lmd.span_plan import export_spans as export
    from lmalgebra.sources.models import ModelRef

    overrides: dict[str, Any] = {}
    if model:
        overrides["models"] = [ModelRef.parse(m).model_dump() for m in model]
    corpus_over = {k: v for k, v in {"paths": corpus, "text_column": text_column}.items() if v}
    if corpus_over:
        overrides["corpus"] = corpus_over
    span_over = {
        "length": seq_len,
        "per_doc": per_doc,
        "counts": _numbers(spans, int, "--spans"),
        "fractions": _numbers(fractions, float, "--fractions"),
    }
    if any(v is not None for v in span_over.values()):
        overrides["spans"] = {k: v for k, v in span_over.items() if v is not None}
    plan = draw_run_spans(load_span_config(recipe, overrides))
    digest = export(plan, out)
    counts = ", ".join(f"{s} {n}" for s, n in plan.counts.items())
    console.print(f"{out}: {counts} spans; order digest {plan.order_digest} in {digest}")


def main() -> None:
    """Console entry point: bad input -> one line on stderr, exit status 2."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # our own bars cover loading and embedding
    hf_logging.set_verbosity_error()  # load reports: we check missing weights ourselves
    from lmalgebra.threads import pin_thread_count

    pin_thread_count()  # same bits in every process, busy machine or not (resumed runs)
    try:
        app(standalone_mode=False)
    except UserInputError as err:
        Console(stderr=True).print(
            f"[red]error:[/red] {escape(str(err))}", highlight=False, soft_wrap=True
        )
        sys.exit(2)
    except typer.Exit as err:
        sys.exit(err.exit_code)
    except TrainingDivergedError as err:
        Console(stderr=True).print(f"[red]stopped:[/red] {escape(str(err))}", highlight=False)
        sys.exit(1)
    except (typer.Abort, KeyboardInterrupt):
        Console(stderr=True).print("interrupted; run the same command again to resume")
        sys.exit(130)
    except Exception as err:  # click usage errors
        import click

        # typer vendors its own click: recognise usage errors by their interface
        if isinstance(err, click.ClickException) or (
            hasattr(err, "show") and hasattr(err, "exit_code")
        ):
            err.show()
            sys.exit(2)
        from lmalgebra.disk_space import is_out_of_space, message

        if is_out_of_space(err):  # a write not wrapped by ``disk_space.naming_file``
            text = message(getattr(err, "filename", None))
            Console(stderr=True).print(
                f"[red]error:[/red] {escape(text)}", highlight=False, soft_wrap=True
            )
            sys.exit(2)
        raise
