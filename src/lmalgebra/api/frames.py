"""A decomposition's tables as pandas DataFrames, the same whether computed now or read back.

Rows computed in memory are read as they would be written (each cell formatted as the run
directory's CSV writes it, then parsed by the schema's reader), so a DataFrame of a run computed
now equals the DataFrame of the same run read from its directory, cell for cell and dtype for
dtype. The tidy tables write floats at full precision, which keeps every value exact. pandas is
imported when the first table is made.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.rundir.files import group_fits
from lmalgebra.lmd.rundir.schema import FITS, TABLES, read_pairwise
from lmalgebra.storage.csv_tables import Table, format_cell, parsers, read_table

if TYPE_CHECKING:
    import pandas as pd


def frame(table: Table[Any], rows: Sequence[Any]) -> pd.DataFrame:
    """``rows`` (typed rows as read, or rows as computed) as a DataFrame of ``table``'s columns."""
    import pandas as pd

    read = parsers(table.row)
    typed = []
    for row in rows:
        if isinstance(row, Mapping):
            cells = {c: row.get(c, "") for c in table.columns}
            where = f"{table.file} (in memory)"
            parsed = {
                c: read[c](str(format_cell(v, table.decimals, table.nan)).strip(), where, c)
                for c, v in cells.items()
            }
            typed.append(table.row(**parsed))
        else:
            typed.append(row)
    if not typed:  # the dtypes a row would give its columns, not object for every one
        return _empty(table)
    return pd.DataFrame([asdict(r) for r in typed], columns=list(table.columns))


# what pandas makes of a column of each field type, for a frame with no row to tell
_DTYPES = {str: "str", float: "float64", int: "int64", bool: "bool"}


def _empty(table: Table[Any]) -> pd.DataFrame:
    """A frame of ``table``'s columns and no row, each column of its field's dtype (an
    ``int | None`` field, whose rows may hold None, as ``object``)."""
    import pandas as pd

    hints = typing.get_type_hints(table.row)
    return pd.DataFrame({c: pd.Series(dtype=_DTYPES.get(hints[c], object)) for c in table.columns})


def computed_frames(tables: Mapping[str, Sequence[Any]]) -> dict[str, pd.DataFrame]:
    """Every table of a result computed now, by stem (``fits``, ``sweeps/layer``, ...)."""
    return {stem: frame(TABLES[stem], rows) for stem, rows in tables.items()}


def read_frames(run_dir: Path) -> dict[str, pd.DataFrame]:
    """Every tidy table a run directory holds, by stem, through the run schema."""
    out = {}
    for stem, table in TABLES.items():
        rows = read_table(run_dir, table)
        if rows is not None:
            out[stem] = frame(table, rows)
    if "fits" not in out:  # a run written before fits.csv: its wide tables, to six decimals
        fallback = _fits_from_wide_tables(run_dir)
        if fallback is not None:
            out["fits"] = fallback
    return out


def _fits_from_wide_tables(run_dir: Path) -> pd.DataFrame | None:
    rows: list[Any] = list(group_fits(run_dir) or [])
    for split in SPLITS:
        found = read_pairwise(run_dir, split)
        if found is None:
            continue
        names, matrix = found
        for i, target in enumerate(names):
            for j, basis in enumerate(names):
                if i != j:
                    rows.append(FITS.row("pairwise", target, basis, split, float(matrix[i, j])))
    return frame(FITS, rows) if rows else None


def pairwise_frame(
    fits: pd.DataFrame, names: list[str], split: str, diagonal: float
) -> pd.DataFrame:
    """R^2 of each target (rows) from each single basis model (columns) on ``split``."""
    import pandas as pd

    chosen = fits[(fits["kind"] == "pairwise") & (fits["split"] == split)]
    table = chosen.pivot(index="target", columns="basis", values="r2")
    table = table.reindex(index=names, columns=names).astype(float)
    values = table.to_numpy(copy=True)
    np.fill_diagonal(values, diagonal)
    out = pd.DataFrame(values, index=pd.Index(names, name="target"))
    out.columns = pd.Index(names, name="basis")
    return out


def group_frame(fits: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    """R^2 of each model from all the others: one row per target, one column per split."""
    chosen = fits[fits["kind"] == "group"]
    table = chosen.pivot(index="target", columns="split", values="r2")
    splits = [s for s in SPLITS if s in table.columns]
    out = table.reindex(index=names, columns=splits).astype(float)
    out.index.name, out.columns.name = "target", None
    return out
