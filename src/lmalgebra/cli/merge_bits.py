"""``lmalgebra merge bits-per-byte``: causal LMs scored on a run's held-out text, per language."""

from __future__ import annotations

from typing import Annotated

import typer

from lmalgebra.cli.app import console
from lmalgebra.cli.merge import RunDirArg, merge_app
from lmalgebra.core.errors import UserInputError


@merge_app.command("bits-per-byte")
def merge_bits_per_byte(
    run_dir: RunDirArg,
    model: Annotated[
        list[str] | None,
        typer.Option(
            help="[NAME=]PATH_OR_HUB_ID (or package:NAME, gguf:FILE) of a causal LM; "
            "repeatable (default: the run's causal teachers)."
        ),
    ] = None,
    language: Annotated[list[str] | None, typer.Option(help="Only these languages.")] = None,
    context: Annotated[
        int | None, typer.Option(help="Tokens per sliding window (default: the model's).")
    ] = None,
) -> None:
    """Bits per byte and per character of causal LMs on each language's held-out examples."""
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.evaluate.bits_per_byte import BITS, evaluate_bits
    from lmalgebra.sources.models import ModelRef

    if model:
        refs = [ModelRef.parse(m) for m in model]
    else:
        recipe = load_recipe(run_dir / "recipe.yaml")
        if recipe.objective != "causal":
            raise UserInputError(
                f"{run_dir} is a masked-LM run: name the causal LMs to score with --model"
            )
        refs = [spec.ref(name) for name, spec in recipe.teachers.items()]
    rows = evaluate_bits(run_dir, refs, language, context)
    for row in rows:
        console.print(
            f"{row.language} {row.model}: {row.bits_per_byte:.4f} bits/byte, "
            f"{row.bits_per_char:.4f} bits/char ({row.documents} documents, "
            f"{row.unknown_tokens} unknown tokens)",
            highlight=False,
        )
    console.print(f"written to [bold]{run_dir / 'evaluation' / BITS.file}[/bold]")
