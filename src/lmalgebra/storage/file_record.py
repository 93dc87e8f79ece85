"""The sizes and digests of the files of a directory written as one unit, recorded in its
completion mark and checked when it is read: a file cut short or changed after the unit was
complete is named, instead of read as if whole.

Text files (tables, configuration) are recorded by size and sha256; binary files (moments,
weights, possibly gigabytes) by size, which is what a cut-short copy or an interrupted transfer
changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.core.text_files import not_a_file

DIGESTED = (".csv", ".json", ".yaml", ".txt")  # read whole by every reader: digests are cheap


def record_files(root: Path, paths: Iterable[Path]) -> dict[str, dict[str, Any]]:
    """Per file (its path relative to ``root``, ``/``-separated): ``bytes`` and, for text
    files, ``sha256``."""
    record: dict[str, dict[str, Any]] = {}
    for path in sorted(paths):
        entry: dict[str, Any] = {"bytes": path.stat().st_size}
        if path.suffix in DIGESTED:
            entry["sha256"] = sha256_file(path)
        record[path.relative_to(root).as_posix()] = entry
    return record


def check_files(root: Path, record: Mapping[str, Any], mark: str) -> None:
    """Raise ``UserInputError`` naming the first file of ``record`` that is missing, of another
    size or of other contents under ``root``; ``mark`` is the file that holds the record."""
    for name, entry in record.items():
        path = root / name
        problem = _problem(path, entry if isinstance(entry, Mapping) else {}, mark)
        if problem:
            raise UserInputError(
                f"{path} {problem}: the run is damaged (cut short or changed after it finished); "
                "run it again, or restore the file"
            )


def _problem(path: Path, entry: Mapping[str, Any], mark: str) -> str | None:
    if not path.is_file():
        return f"{_no_file(path)} ({mark} records it)"
    size = path.stat().st_size
    if size != entry.get("bytes", size):
        return f"has {size} bytes where {mark} records {entry['bytes']}"
    digest = entry.get("sha256")
    if digest is not None and sha256_file(path) != digest:
        return f"has other contents than {mark} records (sha256)"
    return None


def _no_file(path: Path) -> str:
    """What stands where a recorded file should be, as a message goes on: a FIFO or a
    directory there is no missing file (and a FIFO is never opened)."""
    return not_a_file(path) if path.exists() or path.is_symlink() else "is missing"
