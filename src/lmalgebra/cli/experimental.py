"""``lmalgebra experimental``: the commands of ``lmalgebra.experimental`` (features whose recorded
evidence misses its targets; each warns when it runs). ``experimental select`` ranks a recipe's
teacher sets by LMD complementarity and quality."""

from __future__ import annotations

import warnings
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from lmalgebra.cli.app import CommandGroup, app, console
from lmalgebra.cli.config_options import FlagStyle, config_flags, with_config_flags
from lmalgebra.cli.merge import RecipeArg

experimental_app = typer.Typer(
    cls=CommandGroup,
    no_args_is_help=True,
    help="Features whose recorded evidence misses their targets (lmalgebra.experimental): "
    "they work and are tested; each warns when it runs.",
)
app.add_typer(experimental_app, name="experimental")

with warnings.catch_warnings():  # the settings alone, to build the flags: warned when it runs
    warnings.simplefilter("ignore")
    from lmalgebra.experimental.selection.selection_spec import SelectionSpec

SELECT_FLAGS = config_flags(
    SelectionSpec, {"spans.counts": FlagStyle(metavar="TRAIN,VALIDATION,TEST")}
)


@experimental_app.command("select")
@with_config_flags(SELECT_FLAGS)
def experimental_select(
    recipe: RecipeArg,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default OUTPUT_DIR/selection).")
    ] = None,
    overwrite: Annotated[
        bool,
        typer.Option(
            "--overwrite",
            help="Replace a selection of another recipe, settings, text or teachers in the "
            "output directory (its files only).",
        ),
    ] = False,
    *,
    overrides: dict[str, Any],
) -> None:
    """(experimental: its score's Spearman with student accuracy was 0.24, interval [-0.30,
    0.66]; docs/merge/index.md, "Does the score predict anything?") Rank each language's sets
    of teachers: how much of each member the others do not explain (LMD on held-out text) times
    held-out masked-token accuracy. Writes sets.csv, teachers.csv, recommended.yaml (the recipe
    with the best sets) and selection.png.

    Example: lmalgebra experimental select merge.yaml --size 2 && lmalgebra merge run
    runs/merge/selection/recommended.yaml
    """
    from lmalgebra import experimental
    from lmalgebra.api.merge import recipe_of
    from lmalgebra.core.recipe_files import validate
    from lmalgebra.distill.layout import RunLayout
    from lmalgebra.experimental.select import TeacherSelection
    from lmalgebra.experimental.selection.outputs import check_selection_directory, claim_selection
    from lmalgebra.experimental.selection.teacher_sets import select_teachers
    from lmalgebra.storage.lockfile import run_directory_lock

    experimental.warn()
    config = recipe_of(recipe)
    spec = validate(SelectionSpec, overrides, "experimental select")
    target = out if out is not None else RunLayout(config.output_dir).selection
    check_selection_directory(target, spec.cache_dir)
    with run_directory_lock(target, "experimental select"):  # refused before any teacher is scored
        claim = partial(claim_selection, target, overwrite=overwrite, run=config.output_dir)
        selection = select_teachers(config, spec, claim)
        found = TeacherSelection(selection, config)
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
    console.print(f"next: lmalgebra merge run {target / 'recommended.yaml'}{_over(config, found)}")


def _over(config: Any, found: Any) -> str:
    """What the "next:" line adds where the recommended recipe, which keeps the recipe's
    ``output_dir``, would run other teachers in a run that holds trained students."""
    from lmalgebra.distill.layout import RunLayout

    chosen = found.recommended.items()
    if all(sorted(t) == sorted(config.languages[lang].teachers) for lang, t in chosen):
        return ""
    trained = sorted(RunLayout(config.output_dir).saved_students())
    if not trained:
        return ""
    return (
        f" (it writes into {config.output_dir}, which holds students trained with other "
        f"teachers, {', '.join(trained)}: give it another output_dir to keep them as they are)"
    )


def _interval(value: float, low: float, high: float) -> str:
    if low == low and high == high:
        return f"{value:.3f} [{low:.3f}, {high:.3f}]"
    return f"{value:.3f}"
