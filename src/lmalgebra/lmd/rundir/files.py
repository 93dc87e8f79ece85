"""Reading a decomposition run directory beyond its tables: summary and JSON files, group fits
of runs with or without ``fits.csv``, and the small helpers the figures and the report share.

Tables are read through the schema, :mod:`lmalgebra.lmd.rundir.schema`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Protocol

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import unseal
from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import absent, not_a_directory, read_json_object
from lmalgebra.lmd.rundir.schema import (
    FILES,
    FITS,
    GROUP,
    SUMMARY,
    SUMMARY_CHECK,
    FitRow,
    recordable,
)
from lmalgebra.sources.model_source import GROUP_MEAN
from lmalgebra.storage.csv_tables import read_table
from lmalgebra.storage.file_record import check_files
from lmalgebra.storage.output_paths import lock_holder, not_a


class HasSplit(Protocol):
    @property
    def split(self) -> str: ...


def group_fits(run_dir: Path) -> list[FitRow] | None:
    """Group fits as ``fits.csv`` rows: from ``fits.csv`` when present, otherwise from
    ``group_r2.csv`` (no intervals). None if neither exists."""
    fits = read_table(run_dir, FITS)
    if fits is not None:
        return [r for r in fits if r.kind == "group"]
    group = read_table(run_dir, GROUP)
    if group is None:
        return None
    return [
        FitRow("group", row.target, "", split, getattr(row, split))
        for row in group
        if row.target != GROUP_MEAN
        for split in SPLITS
    ]


def read_json(path: Path) -> dict[str, Any]:
    """A run file's JSON object (``core.text_files.read_json_object``)."""
    return read_json_object(path, "run file")


def read_summary(run_dir: Path) -> dict[str, Any]:
    """``summary.json`` of a complete run, its checksum of itself and its record of the run's
    files checked and left out; UserInputError naming the directory when it is not a complete
    run, the summary when it was edited since, or the first file that was cut short or changed
    since (runs written before the record, or before the checksum, are read unchecked)."""
    if run_dir.exists() and not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} {not_a_directory(run_dir)}")
    if not run_dir.is_dir():
        raise UserInputError(f"run directory {run_dir} {absent(run_dir)}")
    path = run_dir / SUMMARY
    if path.exists() or path.is_symlink():
        read_json(path)  # a directory, link or special file in its place: named as such
    if not path.is_file() and (holder := lock_holder(run_dir)) is not None:
        raise UserInputError(
            f"{run_dir} is in use by another lmalgebra run ({holder}): read it once that ends "
            f"(it writes {SUMMARY} last)"
        )
    if not path.is_file():
        raise UserInputError(
            f"{run_dir} is not a complete decomposition run: it has no {SUMMARY}"
            f"{not_a(run_dir, 'a decomposition run')}"
        )
    summary = read_json(path)
    if unseal(summary, SUMMARY_CHECK) is False:
        raise UserInputError(
            f"{path} is damaged: edited since the run wrote it (its {SUMMARY_CHECK} is "
            "another); restore it, or compute the run again"
        )
    record = summary.pop(FILES, None)
    if record is not None and not isinstance(record, dict):  # damaged: no check to switch off
        raise UserInputError(
            f"{path} is damaged: its record of the run's files ({FILES!r}) is not a mapping; "
            "compute the run again"
        )
    if isinstance(record, dict):
        check_files(run_dir, record, SUMMARY)
        extra = [name for name in recordable(run_dir) if name not in record]
        if extra:  # an earlier run's table, or a user's, that would be read as this run's
            raise UserInputError(
                f"{run_dir / extra[0]} is no file of this run ({SUMMARY} records no such file: "
                f"an earlier run's, or your own); move it out of {run_dir}"
            )
    return summary


def chosen_alpha(run_dir: Path) -> float | None:
    """The run's ridge strength from ``summary.json`` (``alpha.value``), when recorded."""
    path = run_dir / SUMMARY
    if not path.is_file():
        return None
    alpha = read_json(path).get("alpha")
    value = alpha.get("value") if isinstance(alpha, dict) else alpha
    return float(value) if isinstance(value, int | float) else None


def preferred_split(rows: Iterable[HasSplit]) -> str:
    """The most held-out split present in ``rows``: test, else validation, else train."""
    present = {r.split for r in rows}
    for split in reversed(SPLITS):
        if split in present:
            return split
    return sorted(present)[0] if present else "test"


def unique(values: Iterable[str]) -> list[str]:
    """Distinct values in order of first appearance."""
    return list(dict.fromkeys(values))
