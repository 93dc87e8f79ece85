"""``lmalgebra merge bits-per-byte``: causal LMs scored on a run's held-out text, per language."""

from __future__ import annotations

from typing import Annotated

import typer

from lmalgebra.cli.app import bold, console
from lmalgebra.cli.merge import RunDirArg, merge_app


@merge_app.command("bits-per-byte")
def merge_bits_per_byte(
    run_dir: RunDirArg,
    models: Annotated[
        list[str] | None,
        typer.Option(
            help="[NAME=]PATH_OR_HUB_ID (or package:NAME, gguf:FILE) of a causal LM; "
            "repeatable (default: the run's causal teachers)."
        ),
    ] = None,
    languages: Annotated[list[str] | None, typer.Option(help="Only these languages.")] = None,
    context: Annotated[
        int | None, typer.Option(help="Tokens per sliding window (default: the model's).")
    ] = None,
) -> None:
    """Bits per byte and per character of causal LMs on each language's held-out examples."""
    from lmalgebra.api.merge import MergeRun
    from lmalgebra.distill.causal.bits_per_byte import SCORED
    from lmalgebra.distill.layout import RunLayout

    run = MergeRun.load(run_dir)
    rows = run.bits_per_byte(models or None, languages, context).itertuples()
    for row in rows:
        console.print(
            f"{row.language} {row.model}: {row.bits_per_byte:.4f} bits/byte, "
            f"{row.bits_per_char:.4f} bits/char ({row.documents} documents, "
            f"{row.unknown_tokens} unknown tokens)",
            highlight=False,
        )
    written = RunLayout(run.run_dir).evaluation / SCORED.file
    console.print("written to", bold(written))
