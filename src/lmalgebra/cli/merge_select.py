"""``lmalgebra merge select``: rank a recipe's teacher sets by LMD complementarity and quality."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from lmalgebra.cli.app import console
from lmalgebra.cli.merge import ProgressOpt, RecipeArg, merge_app
from lmalgebra.core.errors import UserInputError


def _spans(text: str) -> tuple[int, int, int]:
    parts = text.split(",")
    try:
        counts = tuple(int(p) for p in parts)
    except ValueError:
        counts = ()
    if len(counts) != 3 or min(counts) < 1:
        raise UserInputError(
            f"--spans: expected three positive counts TRAIN,VALIDATION,TEST, got {text!r}"
        )
    return counts


@merge_app.command("select")
def merge_select(
    recipe: RecipeArg,
    size: Annotated[int, typer.Option(help="Teachers per set.")] = 2,
    language: Annotated[
        list[str] | None, typer.Option(help="Only this language (repeat for several).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default OUTPUT_DIR/selection).")
    ] = None,
    spans: Annotated[
        str, typer.Option(help="Spans TRAIN,VALIDATION,TEST cut from the held-out text.")
    ] = "2000,250,500",
    seq_len: Annotated[int, typer.Option(help="Span length in tokens.", min=2)] = 32,
    max_texts: Annotated[
        int | None, typer.Option(help="Held-out examples per language (default all).", min=1)
    ] = None,
    bootstrap: Annotated[int, typer.Option(help="Bootstrap replicates.", min=0)] = 1000,
    progress: ProgressOpt = True,
) -> None:
    """(experimental: its score's Spearman with student accuracy was 0.24, interval [-0.30,
    0.66]; README "Does the score predict anything?") Rank each language's sets of teachers:
    how much of each member the others do not explain (LMD on held-out text) times held-out
    masked-token accuracy. Writes sets.csv, teachers.csv, recommended.yaml (the recipe with the
    best sets) and selection.png.

    Example: lmalgebra merge select merge.yaml --size 2 && lmalgebra merge run
    runs/merge/selection/recommended.yaml
    """
    from lmalgebra.api.merge import recipe_of
    from lmalgebra.experimental import select_teachers
    from lmalgebra.storage.output_paths import check_directory

    config = recipe_of(recipe)
    target = out if out is not None else config.output_dir / "selection"
    check_directory(target, "selection directory")
    found = select_teachers(
        config,
        size=size,
        languages=language or None,
        spans=_spans(spans),
        seq_len=seq_len,
        max_texts=max_texts,
        bootstrap=bootstrap,
        progress=progress,
    )
    paths = found.save(target)
    table = Table("language", "rank", "teachers", "complementarity", "quality", "score")
    for row in found.sets.itertuples():
        if row.rank <= 3:
            table.add_row(
                row.language,
                str(row.rank),
                row.members.replace("+", " + "),
                "" if row.complementarity != row.complementarity else f"{row.complementarity:.3f}",
                "" if row.quality != row.quality else f"{row.quality:.3f}",
                _interval(row.score, row.score_low, row.score_high),
            )
    console.print(table)
    seconds = sum(found.seconds.values())
    console.print(f"selection took {seconds:.1f} s; wrote {len(paths)} files to {target}")
    console.print(f"next: lmalgebra merge run {target / 'recommended.yaml'}")


def _interval(value: float, low: float, high: float) -> str:
    if low == low and high == high:
        return f"{value:.3f} [{low:.3f}, {high:.3f}]"
    return f"{value:.3f}"
