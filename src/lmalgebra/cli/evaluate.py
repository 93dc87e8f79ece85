"""``lmalgebra evaluate-pos``: downstream UPOS tagging of any encoder on a CoNLL-U treebank."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmalgebra.cli.app import app, console
from lmalgebra.core.errors import UserInputError


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
    progress: Annotated[bool, typer.Option(help="Progress bars.")] = True,
) -> None:
    """UPOS tagging on a CoNLL-U treebank: test accuracy and macro-F1 of each model."""
    from lmalgebra.evaluate.pos_tagging import PosOptions, evaluate_treebank
    from lmalgebra.sources.models import ModelRef

    if mode not in ("probe", "finetune"):
        raise UserInputError(f"--mode must be probe or finetune, got {mode!r}")
    refs = [
        ModelRef.parse(m).model_copy(update={"trust_remote_code": trust_remote_code}) for m in model
    ]
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
    results = evaluate_treebank(refs, treebank, mode, options, out)  # type: ignore[arg-type]
    for r in results:
        console.print(
            f"{r.model}: accuracy {r.accuracy:.4f}, macro-F1 {r.macro_f1:.4f} "
            f"(majority {r.majority_accuracy:.4f})",
            highlight=False,
        )
    console.print(
        f"outputs in [bold]{out}[/bold]: pos_results.csv, pos_results.md, pos_config.json"
    )
