"""Atomic file writes: a reader sees the old file or the whole new one, never a partial one."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import plain
from lmalgebra.core.text_files import absent, not_a_directory
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.stale_temporaries import remove_stale_of


def make_directories(path: Path) -> None:
    """``mkdir -p path``, with one line for what stands in the way (a file, a symbolic link to
    nothing, no permission, no space) instead of an ``OSError`` from deep inside a write."""
    for probe in (path, *path.parents):
        if probe.is_symlink() and not probe.exists():
            raise UserInputError(f"cannot create {path}: {probe} {absent(probe)}")
        if probe.exists():
            if not probe.is_dir():
                raise UserInputError(f"cannot create {path}: {probe} {not_a_directory(probe)}")
            break
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UserInputError(f"cannot create {path}: {err.strerror or err}") from err


def refuse_special(path: Path, what: str = "output file") -> None:
    """Refuse an output ``path`` that is a symbolic link (dangling or not) or exists as anything
    but a regular file or directory (a FIFO, a socket, a device): opening a FIFO to look at it
    waits for a writer forever, and renaming a new file over a link replaces the link, not the
    file it names."""
    if path.is_symlink():
        raise UserInputError(
            f"{what} {path} is a symbolic link: lmalgebra replaces no link; name the file it "
            "points to, or another path"
        )
    if path.exists() and not path.is_file() and not path.is_dir():
        # no "remove it": a device such as /dev/null is no one's to remove
        device = path.is_char_device() or path.is_block_device()
        advice = "name another path" if device else "remove it, or name another path"
        raise UserInputError(
            f"{what} {path} is not a regular file (a FIFO, socket or device): lmalgebra writes "
            f"only regular files; {advice}"
        )


def refuse_unwritable(path: Path) -> None:
    """Refuse what :func:`write_atomic` refuses at ``path`` before anything is written: a link
    or a special file (:func:`refuse_special`), a directory (lmalgebra removes none it did not
    write). A stage that writes ``path`` last calls it first, and so does its dry run."""
    refuse_special(path)
    if path.is_dir():
        raise UserInputError(f"{path} is a directory, not a file: remove it, then run again")


def remove_file(path: Path) -> None:
    """Remove the file ``path`` if there is one (a record or mark taken away before what it
    describes is written again), refusing what :func:`write_atomic` refuses there, before
    anything is removed (:func:`refuse_unwritable`)."""
    refuse_unwritable(path)
    path.unlink(missing_ok=True)


def created_mode() -> int:
    """The mode ``open()`` gives a file it creates in this process: ``0o666`` less the umask
    (read from ``/proc`` where there is one: setting the umask to read it would race with the
    process's other threads)."""
    try:
        status = Path("/proc/self/status").read_text(encoding="ascii")
        mask = next(int(line.split()[1], 8) for line in status.splitlines() if line[:6] == "Umask:")
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0o022)
        os.umask(mask)
    return 0o666 & ~mask


def as_created(paths: Iterable[Path]) -> None:
    """Give each file the mode ``open()`` would have (:func:`created_mode`): safetensors makes
    its files ``0600`` whatever the umask, so a model directory, a run or a cache shared by a
    team would be readable by its writer alone."""
    mode = created_mode()
    for path in paths:
        path.chmod(mode)


def write_atomic(path: Path, write: Callable[[Path], object]) -> None:
    """Call ``write(tmp)`` on a temporary sibling of ``path``, fsync it, rename it over ``path``.

    The temporary is removed on any failure; a full disk raises ``OutOfSpaceError`` naming ``path``,
    a directory in the way of ``path`` or of its folder ``UserInputError`` naming it (a cache entry
    made a directory by hand, say), as does a link or special file at ``path``
    (:func:`refuse_special`), before anything is written.
    """
    refuse_unwritable(path)
    blocker = next((p for p in path.parents if p.exists()), None)
    if blocker is not None and not blocker.is_dir():
        raise UserInputError(f"cannot write {path}: {blocker} {not_a_directory(blocker)}")
    make_directories(path.parent)
    remove_stale_of(path)  # a temporary of this file that a writer killed here left
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with naming_file(path):
            write(tmp)
            as_created([tmp])  # a safetensors writer's 0600 made what open() makes
            with tmp.open("rb+") as handle:
                os.fsync(handle.fileno())
            tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(path: Path, data: Any) -> None:
    """``write_atomic`` of ``data``: anything with the buffer protocol (bytes, an Arrow buffer)."""
    write_atomic(path, lambda tmp: tmp.write_bytes(memoryview(data)))


def write_text_atomic(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(path: Path, value: Any) -> None:
    """``value`` as strict JSON (``fingerprint.plain``: NaN and infinities as null)."""
    write_text_atomic(path, json.dumps(plain(value), indent=2, allow_nan=False) + "\n")
