"""Commands of Language Model Decomposition: decompose, spans, report, and the demos."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from lmalgebra.cli.app import app, console, parse_numbers, split_list


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
    overwrite: Annotated[
        bool,
        typer.Option(help="Remove the files of a run already in --out first (another config)."),
    ] = False,
) -> None:
    """Decompose every model on the others: pairwise and group R^2 on train, validation, test."""
    from lmalgebra.lmd.config import load_config
    from lmalgebra.lmd.outputs import table
    from lmalgebra.lmd.run import decompose as run
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
        "counts": parse_numbers(spans, int, "--spans"),
        "fractions": parse_numbers(fractions, float, "--fractions"),
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
        "basis": split_list(basis),
        "save_weights": save_weights,
        "out": out,
        "cache_dir": cache_dir,
    }
    overrides.update({k: v for k, v in flat.items() if v is not None})
    study_over = {
        "lengths": parse_numbers(lengths, int, "--lengths"),
        "layers": layers,
        "layer_map": split_list([layer_map]) if layer_map else None,
        "train_sizes": parse_numbers(train_sizes, int, "--train-sizes"),
        "languages": by_language,
        "bootstrap": bootstrap,
        "blocks": blocks,
        "alpha_select": alpha_select,
        "alpha_grid": parse_numbers(alpha_grid, float, "--alpha-grid"),
        "folds": folds,
        "nulls": nulls,
        "attribution": attribution,
    }
    if any(v is not None for v in study_over.values()):
        overrides["study"] = {k: v for k, v in study_over.items() if v is not None}
    overrides["progress"] = progress
    config = load_config(recipe, overrides)
    result = run(config, overwrite=overwrite)
    from lmalgebra.distributed import is_main

    if is_main():  # one table, not one per process
        console.print(table(result))
        console.print(f"outputs in [bold]{config.out}[/bold]")


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="Output directory.")] = Path("demo-output"),
    quick: Annotated[bool, typer.Option(help="A smaller run (a few minutes).")] = False,
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """The whole toolkit offline: pre-train teachers, merge, evaluate, decompose, report."""
    from lmalgebra.demo.workflow import run_demo
    from lmalgebra.report.demo_page import render

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
    from lmalgebra.lmd.outputs import table
    from lmalgebra.lmd.run import decompose as run

    config = demo_config(out, quick=quick, progress=progress)
    result = run(config)
    console.print(table(result))
    console.print(f"outputs in [bold]{config.out}[/bold]")


@app.command("report")
def report(
    run_dir: Annotated[Path, typer.Argument(help="A complete decomposition run directory.")],
    out: Annotated[
        Path | None, typer.Option(help="HTML file to write (default RUN_DIR/report.html).")
    ] = None,
) -> None:
    """One self-contained HTML page of a decomposition run: figures, tables, configuration."""
    from lmalgebra.report.lmd_page import write_report

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
        "counts": parse_numbers(spans, int, "--spans"),
        "fractions": parse_numbers(fractions, float, "--fractions"),
    }
    if any(v is not None for v in span_over.values()):
        overrides["spans"] = {k: v for k, v in span_over.items() if v is not None}
    plan = draw_run_spans(load_span_config(recipe, overrides))
    digest = export(plan, out)
    counts = ", ".join(f"{s} {n}" for s, n in plan.counts.items())
    console.print(f"{out}: {counts} spans; order digest {plan.order_digest} in {digest}")
