"""Output paths, checked before any work: writable, of the right kind, never mixed with other runs.

Every command that writes learns about a bad output path in its first milliseconds, with one line
naming the path, instead of a traceback after minutes of embedding or training. A run directory
that holds a run of another configuration is refused (its files would mix with the new run's);
``overwrite`` empties it first. ``LOCK_NAME`` files are ignored: the lock is taken before the
claim.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError

LOCK_NAME = ".lmalgebra.lock"


def default_cache_dir() -> Path:
    """The user's lmalgebra cache: ``$LMALGEBRA_CACHE``, else ``~/.cache/lmalgebra``."""
    env = os.environ.get("LMALGEBRA_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "lmalgebra"


def _nearest_existing(path: Path) -> Path:
    probe = path.absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return probe


def _check_creatable(path: Path, what: str) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory."""
    ancestor = _nearest_existing(path.parent)
    if not ancestor.is_dir():
        raise UserInputError(f"cannot create {what} {path}: {ancestor} is a file, not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserInputError(f"cannot create {what} {path}: {ancestor} is not writable")


def check_directory(path: Path, what: str = "output directory") -> None:
    """Raise ``UserInputError`` unless ``path`` is, or can be created as, a writable directory."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            raise UserInputError(f"{what} {path} is a file, not a directory")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserInputError(f"{what} {path} is not writable")
        return
    _check_creatable(path, what)


def check_file(path: Path, what: str = "output file") -> None:
    """Raise ``UserInputError`` unless ``path`` can be written as a file (created or replaced)."""
    path = Path(path)
    if path.is_dir():
        raise UserInputError(f"{what} {path} is a directory, not a file")
    if path.exists():
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise UserInputError(f"{what} {path}: its directory {path.parent} is not writable")
        return
    _check_creatable(path, what)


def make_directory(path: Path, what: str = "output directory") -> None:
    """``mkdir -p`` with one-line errors (a file in the way, no permission, no space)."""
    check_directory(path, what)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"cannot create {what} {path}: {err.strerror or err}") from err


def _entries(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.name != LOCK_NAME)


def _differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def claim_run_directory(
    directory: Path,
    identity: Mapping[str, Any],
    recorded: Mapping[str, Any] | None,
    *,
    finished: bool,
    overwrite: bool,
    what: str,
) -> None:
    """Make ``directory`` this run's own before anything is written to it.

    Args:
        directory: the run directory (may be missing or empty).
        identity: what makes this run this run (its configuration less paths and display options).
        recorded: the identity recorded by the run already in ``directory`` (``None``: none there).
        finished: whether the run already there is marked complete.
        overwrite: empty ``directory`` first, whatever it holds.
        what: the kind of run, for messages ("decomposition").

    An empty directory is claimed; the same configuration resumes (or, when finished, is computed
    again into the same files); anything else is refused with one line saying how to proceed.
    """
    entries = _entries(directory)
    if not entries:
        return
    if overwrite:
        for entry in entries:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        return
    hint = "write to another directory, or pass --overwrite to remove its files first"
    if recorded is None:
        raise UserInputError(f"{directory} is not empty and holds no {what}; {hint}")
    changed = _differences(recorded, identity)
    if changed:
        state = "finished" if finished else "unfinished"
        raise UserInputError(
            f"{directory} holds a {state} {what} of another configuration "
            f"({', '.join(changed)} differ); {hint}"
        )
