"""``lmalgebra packaged``: the models, corpora and recipes that install with the package."""

from __future__ import annotations

from rich.table import Table

from lmalgebra.cli.app import app, console
from lmalgebra.core.recipe_files import RECIPE_PREFIX, shipped_recipes
from lmalgebra.sources.packaged import catalogue


def _size(value: object) -> str:
    if not isinstance(value, int):
        return "not installed"
    return f"{value / 2**20:.1f} MiB"


@app.command("packaged")
def packaged() -> None:
    """List packaged models and corpora (name them as package:NAME) and shipped recipes
    (recipe:NAME), with sizes, what they are and their licences.

    Example: lmalgebra decompose recipe:decompose-minilm-wiki --out runs/minilm
    """
    rows = catalogue()
    for kind, title in (("model", "Packaged models"), ("corpus", "Packaged corpora")):
        table = Table(title=title, title_justify="left")
        for column in ("name", "size", "what", "installs with", "licence"):
            table.add_column(column)
        for row in rows:
            if row["kind"] == kind:
                text = [str(row[key]) for key in ("description", "requirement", "licence")]
                table.add_row(str(row["name"]), _size(row["bytes"]), *text)
        console.print(table)
    table = Table(title="Shipped recipes", title_justify="left")
    table.add_column("name")
    for name in shipped_recipes():
        table.add_row(RECIPE_PREFIX + name)
    console.print(table)
