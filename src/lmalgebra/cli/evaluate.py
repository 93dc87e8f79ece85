"""``lmalgebra evaluate-pos``: downstream UPOS tagging of any encoder on a CoNLL-U treebank, with a
flag for every key of ``evaluate.pos_options.PosSpec``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.text import Text

from lmalgebra.cli.app import app, bold, console
from lmalgebra.cli.config_options import MODEL_FLAG, config_flags, with_config_flags
from lmalgebra.evaluate.pos_options import PosSpec

POS_FLAGS = config_flags(PosSpec, {"models": MODEL_FLAG})


@app.command("evaluate-pos")
@with_config_flags(POS_FLAGS)
def evaluate_pos(
    treebank: Annotated[
        Path,
        typer.Argument(help="Treebank directory: *-ud-{train,dev,test}.conllu or train/dev/test."),
    ],
    trust_remote_code: Annotated[
        bool, typer.Option(help="Allow the code shipped with the --models models to run.")
    ] = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """UPOS tagging on a CoNLL-U treebank: test accuracy and macro-F1 of each model."""
    from lmalgebra.core.recipe_files import load_settings
    from lmalgebra.evaluate.pos_tagging import evaluate_treebank

    if trust_remote_code:  # on the --models that run code of their own; refused if none
        from lmalgebra.sources.models import allow_remote_code

        allow_remote_code(overrides.get("models", []), "--trust-remote-code")
    spec = load_settings(PosSpec, None, overrides)
    results = evaluate_treebank(
        spec.models, treebank, spec.mode, spec.options(), spec.out, spec.overwrite
    )
    for r in results:
        console.print(
            f"{r.model}: accuracy {r.accuracy:.4f}, macro-F1 {r.macro_f1:.4f} "
            f"(majority {r.majority_accuracy:.4f})",
            highlight=False,
        )
    files = ": pos_results.csv, pos_results.md, pos_config.json"
    console.print("outputs in", Text.assemble(bold(spec.out), files))
