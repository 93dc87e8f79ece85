"""Typed CSV tables: one writer and one reader for every table a run directory holds.

A table is declared once, as a frozen dataclass whose fields are its columns in order, and a
:class:`Table` naming its file and how its numbers are written. Field types say how a cell is read
back: ``str`` (text, stripped), ``float`` (an empty cell is NaN), ``int`` or ``int | None`` (an
empty cell is None), ``bool`` (``True`` or ``False``, as Python writes them). :func:`read_table`
returns instances of the dataclass, so ``pandas.DataFrame(rows)`` gives one typed column per
field.
"""

from __future__ import annotations

import csv
import io
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import read_text
from lmalgebra.storage.atomic import write_text_atomic

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


@dataclass(frozen=True)
class Table(Generic[R]):
    """Where a table lives and how its numbers are written.

    Attributes:
        file: its path inside the directory that holds it (``sweeps/layer.csv``).
        row: the dataclass of one row; its fields are the columns, in order.
        decimals: floats with this many decimals; None writes them at full precision (``repr``).
        nan: how a NaN float is written (read back as NaN either way).
    """

    file: str
    row: type[R]
    decimals: int | None = None
    nan: str = ""

    @property
    def stem(self) -> str:
        """The file's path without ``.csv`` (``sweeps/layer``)."""
        return self.file.removesuffix(".csv")

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.row))


def format_cell(value: Any, decimals: int | None = None, nan: str = "") -> Any:
    """One cell as written: floats as ``repr`` or to ``decimals``, NaN as ``nan``, None as blank;
    anything else as the csv module writes it."""
    if value is None:
        return ""
    if isinstance(value, float | np.floating):
        if math.isnan(value):
            return nan
        return repr(float(value)) if decimals is None else f"{value:.{decimals}f}"
    return value


def csv_text(rows: Iterable[Sequence[Any]]) -> str:
    """Rows (the header first) as CSV text with ``\\n`` line ends, cells as given."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def _values(row: Any, columns: Sequence[str], file: str) -> list[Any]:
    if is_dataclass(row):
        return [getattr(row, c) for c in columns]
    unknown = set(row) - set(columns)
    if unknown:
        raise ValueError(f"{file}: a row has column(s) {sorted(unknown)} not among {columns}")
    return [row.get(c, "") for c in columns]


def table_text(table: Table[R], rows: Iterable[R | Mapping[str, Any]]) -> str:
    """``rows`` (dataclass rows, or mappings of column -> value; a missing column is blank) as the
    CSV text of ``table``, header first."""
    columns = table.columns
    cells = (
        [format_cell(v, table.decimals, table.nan) for v in _values(row, columns, table.file)]
        for row in rows
    )
    return csv_text([columns, *cells])


def write_table(directory: Path, table: Table[R], rows: Iterable[R | Mapping[str, Any]]) -> Path:
    """Write ``rows`` to ``directory / table.file`` atomically; return the path."""
    path = directory / table.file
    write_text_atomic(path, table_text(table, rows))
    return path


def parse_number(text: str, where: str, column: str) -> float:
    """A numeric cell: empty is NaN; UserInputError naming ``where`` and ``column`` if malformed."""
    try:
        return float(text) if text else math.nan
    except ValueError:
        raise UserInputError(f"{where}: column {column!r} is not a number: {text!r}") from None


def _integer(text: str, where: str, column: str) -> int | None:
    if not text:
        return None
    value = parse_number(text, where, column)
    if not value.is_integer():
        raise UserInputError(f"{where}: column {column!r} is not an integer: {text!r}")
    return int(value)


def _required_integer(text: str, where: str, column: str) -> int:
    value = _integer(text, where, column)
    if value is None:
        raise UserInputError(f"{where}: column {column!r} is empty")
    return value


Parser = Callable[[str, str, str], Any]
BOOLEANS = {"true": True, "false": False}


def _boolean(text: str, where: str, column: str) -> bool:
    try:
        return BOOLEANS[text.lower()]
    except KeyError:
        raise UserInputError(f"{where}: column {column!r} is not True or False: {text!r}") from None


def _parser(hint: Any) -> Parser:
    if hint is str:
        return lambda text, where, column: text
    if hint is float:
        return parse_number
    if hint is int:
        return _required_integer
    if hint is bool:
        return _boolean
    if isinstance(hint, types.UnionType) and set(typing.get_args(hint)) == {int, type(None)}:
        return _integer
    raise TypeError(f"no CSV reading for a column of type {hint!r}")


def parsers(row: type[Any]) -> dict[str, Parser]:
    """Column -> how its cell is read, from the field types of the dataclass ``row``."""
    hints = typing.get_type_hints(row)
    return {f.name: _parser(hints[f.name]) for f in fields(row)}


def read_table(directory: Path, table: Table[R]) -> list[R] | None:
    """The rows of ``directory / table.file`` as ``table.row`` instances; None if it is absent.

    Columns beyond the table's are ignored. Raises UserInputError naming the file when a column is
    missing, and file, line and column when a cell is not of its column's type.
    """
    path = directory / table.file
    if not path.is_file():
        return None
    read = parsers(table.row)
    with io.StringIO(read_text(path, "run file", newline=""), newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in table.columns if c not in (reader.fieldnames or [])]
        if missing:
            raise UserInputError(f"{path}: missing column(s) {', '.join(missing)}")
        records = list(reader)
    rows = []
    for line, record in enumerate(records, start=2):
        where = f"{path}, line {line}"
        extra = record.pop(None, [])  # cells past the header (a row run on)
        given = sum(v is not None for v in record.values()) + len(extra)
        if given != len(record):  # a torn row's missing cells had been read as empty (NaN, "")
            raise UserInputError(
                f"{where}: {given} cells where the header has {len(record)}: the table is "
                "damaged (a line cut short, or edited)"
            )
        cells = {c: (record[c] or "").strip() for c in table.columns}
        rows.append(table.row(**{c: read[c](text, where, c) for c, text in cells.items()}))
    return rows
