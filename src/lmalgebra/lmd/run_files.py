"""Reading a decomposition run directory: its tidy CSV tables, pairwise matrices and JSON files.

Rows stay ``dict[str, str]`` as in the file; numeric columns are checked when read (so a bad cell
is reported with its file and line) and converted with :func:`num` where they are used.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import read_text

Rows = list[dict[str, str]]

SUMMARY = "summary.json"
PAIRWISE = "pairwise_r2_{split}.csv"
SWEEP = ("setting", "kind", "target", "basis", "split", "r2")
COLUMNS: dict[str, tuple[str, ...]] = {
    "fits.csv": ("kind", "target", "basis", "split", "r2", "ci_low", "ci_high", "adjusted_r2"),
    "nulls.csv": ("kind", "target", "basis", "split", "r2"),
    "similarity.csv": ("model_a", "model_b", "split", "lmd_r2", "cka", "mean_cca"),
    "alpha_curve.csv": ("target", "alpha", "criterion", "value"),
    "attribution.csv": ("target", "method", "model", "step", "split", "value"),
    "sweeps/length.csv": SWEEP,
    "sweeps/layer.csv": SWEEP,
    "sweeps/train_size.csv": SWEEP,
    "sweeps/language.csv": SWEEP,
    "sweeps/layer_map.csv": ("model_a", "layer_a", "model_b", "layer_b", "split", "r2"),
}
NUMERIC = frozenset(
    {"r2", "ci_low", "ci_high", "adjusted_r2", "lmd_r2", "cka", "mean_cca", "alpha", "value"}
    | {"step", "layer_a", "layer_b"}
)


def num(text: str | None) -> float:
    """A CSV cell as float; an empty or missing cell is NaN."""
    return float(text) if text else math.nan


def _check_number(text: str, where: str, column: str) -> None:
    try:
        num(text)
    except ValueError:
        raise UserInputError(f"{where}: column {column!r} is not a number: {text!r}") from None


def read_table(run_dir: Path, name: str) -> Rows | None:
    """Rows of the contract table ``name`` (e.g. ``"sweeps/layer.csv"``); None if it is absent.

    Raises UserInputError naming the file when a column is missing or a number is malformed.
    """
    path = run_dir / name
    if not path.is_file():
        return None
    required = COLUMNS[name]
    with io.StringIO(read_text(path, "run file", newline=""), newline="") as handle:
        reader = csv.DictReader(handle)
        missing = [c for c in required if c not in (reader.fieldnames or [])]
        if missing:
            raise UserInputError(f"{path}: missing column(s) {', '.join(missing)}")
        rows = [{k: (v or "").strip() for k, v in row.items() if k is not None} for row in reader]
    for line, row in enumerate(rows, start=2):
        for column in required:
            if column in NUMERIC:
                _check_number(row[column], f"{path}, line {line}", column)
    return rows


def read_pairwise(run_dir: Path, split: str = "test") -> tuple[list[str], np.ndarray] | None:
    """Model names and the ``(n, n)`` float64 pairwise R^2 matrix (row = target, column = basis).

    NaN where a cell is empty (the diagonal). None if the file is absent.
    """
    path = run_dir / PAIRWISE.format(split=split)
    if not path.is_file():
        return None
    with io.StringIO(read_text(path, "run file", newline=""), newline="") as handle:
        table = [row for row in csv.reader(handle) if row]
    if not table or len(table[0]) < 2:
        raise UserInputError(f"{path}: expected a header 'target \\ basis,MODEL,...'")
    names = table[0][1:]
    index = {n: i for i, n in enumerate(names)}
    matrix = np.full((len(names), len(names)), np.nan)
    for line, row in enumerate(table[1:], start=2):
        if row[0] not in index or len(row) != len(names) + 1:
            raise UserInputError(f"{path}, line {line}: expected a row for one of {names}")
        for j, cell in enumerate(row[1:]):
            _check_number(cell, f"{path}, line {line}", names[j])
            matrix[index[row[0]], j] = num(cell)
    return names, matrix


def group_fits(run_dir: Path) -> Rows | None:
    """Group fits in the form of ``fits.csv`` rows: from ``fits.csv`` when present, otherwise
    from ``group_r2.csv`` (no intervals). None if neither exists."""
    fits = read_table(run_dir, "fits.csv")
    if fits is not None:
        return [r for r in fits if r["kind"] == "group"]
    path = run_dir / "group_r2.csv"
    if not path.is_file():
        return None
    with io.StringIO(read_text(path, "run file", newline=""), newline="") as handle:
        reader = csv.DictReader(handle)
        if "target" not in (reader.fieldnames or []):
            raise UserInputError(f"{path}: missing column target")
        table = list(reader)
    rows: Rows = []
    for line, row in enumerate(table, start=2):
        if row["target"] == "mean":
            continue
        for split in SPLITS:
            cell = (row.get(split) or "").strip()
            _check_number(cell, f"{path}, line {line}", split)
            rows.append(
                {"kind": "group", "target": row["target"], "basis": "", "split": split, "r2": cell}
                | {"ci_low": "", "ci_high": "", "adjusted_r2": ""}
            )
    return rows


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(read_text(path, "run file"))
    except ValueError as err:
        raise UserInputError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected a JSON object")
    return data


def read_summary(run_dir: Path) -> dict[str, Any]:
    """``summary.json`` of a complete run; UserInputError naming the directory otherwise."""
    if not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} does not exist")
    path = run_dir / SUMMARY
    if not path.is_file():
        raise UserInputError(f"{run_dir} is not a complete decomposition run: it has no {SUMMARY}")
    return read_json(path)


def chosen_alpha(run_dir: Path) -> float | None:
    """The run's ridge strength from ``summary.json`` (``alpha.value``), when recorded."""
    path = run_dir / SUMMARY
    if not path.is_file():
        return None
    alpha = read_json(path).get("alpha")
    value = alpha.get("value") if isinstance(alpha, dict) else alpha
    return float(value) if isinstance(value, int | float) else None


def preferred_split(rows: Iterable[dict[str, str]]) -> str:
    """The most held-out split present in ``rows``: test, else validation, else train."""
    present = {r["split"] for r in rows}
    for split in reversed(SPLITS):
        if split in present:
            return split
    return sorted(present)[0] if present else "test"


def unique(values: Iterable[str]) -> list[str]:
    """Distinct values in order of first appearance."""
    return list(dict.fromkeys(values))
