"""One writer per output directory: an exclusive lock on ``OUT/.lmalgebra.lock``.

Every command that writes a run directory holds the lock while it runs, so a second run aimed at
the same directory stops with a message naming the holder (pid, host, command) instead of
interleaving its files with the first one's. The lock is a ``fcntl.flock`` on the file, which the
kernel releases when the holder exits or is killed, so a lock left by a dead run never blocks;
the file itself (holder details, JSON) is removed on release and overwritten by the next holder.

In a run of several processes (``lmalgebra.distributed``) the main rank alone takes the lock and
tells the other ranks whether it got it. Holding the lock alone in one process also makes it safe
to resume what writers that died left (their temporaries, ``.NAME.tmp-PID``, are removed as
each file is written again: ``stale_temporaries``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import inspect
import json
import logging
import os
import socket
import stat
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, ParamSpec, TypeVar

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import launch_count
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.output_paths import (
    LOCK_NAME,
    Snapshot,
    check_directory,
    default_cache_dir,
    directory_kind,
    make_directory,
    read_lock_record,
    refuse_inside_other_output,
    refuse_output_inside_cache,
)
from lmalgebra.storage.stale_temporaries import TEMPORARY, alive

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")

# Locks this process holds: directory -> (open lock file descriptor, nesting depth). flock locks
# belong to an open file, so a second acquisition in the same process must reuse the first.
_held: dict[Path, tuple[int | None, int]] = {}


class DirectoryInUseError(UserInputError):
    """Another run holds the lock of the output directory."""


def _holder(path: Path) -> str:
    info = read_lock_record(path.parent) or {}
    try:
        return f"pid {info['pid']} on {info['host']} ({info['command']}, since {info['since']})"
    except (KeyError, TypeError):
        return "another process (details not yet written)"


def _refuse_lock_file(path: Path, kind: str) -> NoReturn:
    raise UserInputError(_lock_file_text(path, kind))


def _lock_file_text(path: Path, kind: str, why: str = "not a regular file") -> str:
    return (
        f"lock file {path} is {kind}, {why}: lmalgebra writes its lock there; "
        "remove it, then run again"
    )


def _linked(path: Path, links: int) -> str:
    """A lock file with other names: the lock would be written over a file kept elsewhere."""
    return _lock_file_text(
        path, f"a hard link ({links} names)", "a file named elsewhere too, which it would replace"
    )


def lock_file_refusal(directory: Path) -> str | None:
    """How every writer of ``directory`` refuses its lock file, found without opening it (a
    link, a directory, a FIFO, a socket or a device there), or None (``merge verify``, which
    writes nothing, names what the next stage would refuse)."""
    return lock_refusal(directory / LOCK_NAME)


def lock_refusal(path: Path) -> str | None:
    """:func:`lock_file_refusal` of the lock file ``path``, wherever it lies."""
    if path.is_symlink():
        return _lock_file_text(path, f"a symbolic link to {path.readlink()}")
    if path.is_dir():
        return _lock_file_text(path, "a directory")
    if path.exists() and not path.is_file():
        return _lock_file_text(path, "a FIFO, socket or device")
    if path.is_file() and path.stat().st_nlink > 1:
        return _linked(path, path.stat().st_nlink)
    return None


def open_lock_file(path: Path, written: bool = True) -> int:
    """Open (or create) the lock file ``path`` (a run directory's, or the cache's beside an
    entry it builds), never through a link (the file it names would be written over, or made
    where the link points) nor into a FIFO (opening it waits for a writer): anything but a
    regular file there is refused, naming it. ``written``: the holder writes its record into
    the file, so a hard link (another name of a file kept elsewhere) is refused too."""
    if path.is_symlink() or path.is_dir():
        raise UserInputError(str(lock_refusal(path)))
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
            _refuse_lock_file(path, "a symbolic link or special file")
        raise
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode):
        os.close(fd)
        _refuse_lock_file(path, "a FIFO, socket or device")
    if written and found.st_nlink > 1:
        os.close(fd)
        raise UserInputError(_linked(path, found.st_nlink))
    return fd


def _try_lock(directory: Path, command: str) -> int | None:
    """The descriptor of the locked file; raises ``DirectoryInUseError`` when it is taken."""
    path = directory / LOCK_NAME
    while True:
        fd = open_lock_file(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryInUseError(
                f"{directory} is in use by another lmalgebra run: {_holder(path)}; wait for it "
                "to finish or write to another directory"
            ) from None
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                log.warning("cannot lock %s (%s); concurrent runs are not detected", path, err)
                return None
            raise
        # the file may have been removed by its previous holder between our open and flock
        try:
            same = path.stat().st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "command": command,
        "argv": sys.argv,
        "since": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    try:
        with naming_file(path):  # a full disk: the one file this command could not write
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
    except BaseException:
        _release(directory, fd)  # no lock file left behind, held by no one
        raise
    return fd


def _release(directory: Path, fd: int | None) -> None:
    if fd is None:
        return
    with contextlib.suppress(FileNotFoundError):
        (directory / LOCK_NAME).unlink()  # while still holding it: the next holder re-checks
    os.close(fd)


def remove_stale_temporaries(directory: Path, settled: float = 0.0) -> list[Path]:
    """Delete ``.NAME.tmp-PID`` files under ``directory`` whose process is gone; the paths removed.

    For a directory that holds the toolkit's files alone (the cache: no user keeps a file of
    theirs in it); an output directory's are removed where they were made, as each file is
    written again (``stale_temporaries``), a user's own file named so kept. ``settled``: seconds
    a temporary must have gone unwritten (the cache, which a process of another machine may be
    writing, whose pid is not seen here).
    """
    removed = []
    for root, _, files in os.walk(directory):
        for name in files:
            match = TEMPORARY.match(name)
            pid = int(match.group(2)) if match else None
            if pid is not None and pid != os.getpid() and not alive(pid):
                path = Path(root) / name
                with contextlib.suppress(OSError):  # gone, or not this user's to remove
                    if time.time() - path.lstat().st_mtime < settled:
                        continue
                    path.unlink()
                    removed.append(path)
    if removed:
        log.info("removed %d temporary file(s) left by an interrupted run", len(removed))
    return removed


def _ranks() -> tuple[int, int]:
    if launch_count("WORLD_SIZE", 1) <= 1:
        return 0, 1  # not launched as several processes: no need to import torch.distributed
    from lmalgebra.distributed import world

    return world()


def _shared_outcome(size: int, failed: bool) -> bool:
    """Whether the main rank failed to take the lock, as every rank learns it."""
    if size == 1:
        return failed  # no process group: torch.distributed stays unimported
    from lmalgebra.distributed import any_rank

    return any_rank(failed)


# What a command writes: a merge run or a model directory is not written into another kind (a
# decomposition's own claim, ``output_paths.claim_run_directory``, judges its directory, naming
# every foreign entry); a command is looked up whole, then by its first word
WRITES = {
    "merge": "a merge run",
    "experimental select": "a teacher selection",
    "evaluate-pos": "a tagging evaluation",
    "pretrain": "a model directory written by lmalgebra",
    "demo": "a demo's output",
}


# the kinds of output each kind may go inside: a demo's directory holds its own runs, teachers,
# evaluations and smaller demos; a teacher selection goes into its merge run by default
INSIDE = {
    "a merge run": ("a demo's output",),
    "a teacher selection": ("a merge run", "a demo's output"),
    "a tagging evaluation": ("a demo's output",),
    "a model directory written by lmalgebra": ("a demo's output",),
    "a demo's output": ("a demo's output",),
}


def refuse_nested(directory: Path, command: str) -> None:
    """Refuse ``command`` writing its output inside another lmalgebra output, at any depth
    (``output_paths.refuse_inside_other_output``), but where its kind may go (``INSIDE``): a
    merge run or a teacher made inside a decomposition run or a merge run's store had mixed its
    files with that output's own. Any command's output inside the cache's own directories
    (``output_paths.refuse_output_inside_cache``, of the cache the command reads) is refused."""
    refuse_output_inside_cache(directory, default_cache_dir())
    kind = WRITES.get(command, WRITES.get(command.split()[0]))
    if kind is not None:  # a decomposition judges its directory itself
        refuse_inside_other_output(directory, "output directory", allowed=INSIDE[kind])


def refuse_other_kind(directory: Path, command: str) -> None:
    """Refuse ``command`` writing into a directory that holds another kind of output
    (``output_paths.directory_kind``: another kind of run, a model lmalgebra did not write),
    naming it and the file that tells."""
    kind = WRITES.get(command, WRITES.get(command.split()[0]))
    if kind is None:  # a decomposition judges its directory itself
        return
    found = directory_kind(directory)
    if found is not None and found[0] != kind:
        raise UserInputError(
            f"{directory} holds {found[0]} ({found[1]}), not {kind}, which {command} writes: "
            "write to another directory"
        )


@contextlib.contextmanager
def run_directory_lock(
    directory: Path, command: str, scratch: Sequence[str] = ()
) -> Iterator[None]:
    """Hold ``directory``'s lock for the duration of the block (re-entrant within a process).

    Raises ``DirectoryInUseError`` (a ``UserInputError``) naming the directory and the holder.
    When the block fails, the directories it created and left without output are removed
    (``scratch``: files that do not count as output, see ``output_paths.tidy_on_failure``).
    Collective in a multi-process run: every rank must enter it.
    """
    # the path as given, before a link is resolved: a link to nothing is refused, not followed
    # (the directory would be made at its target); on every rank, so that all refuse alike
    check_directory(Path(directory), "output directory")
    refuse_nested(Path(directory), command)
    directory = Path(directory).resolve()
    if directory in _held:
        held, depth = _held[directory]
        _held[directory] = (held, depth + 1)
        try:
            yield
        finally:
            _held[directory] = (held, depth)
        return
    rank, size = _ranks()
    before = Snapshot(directory) if rank == 0 else None  # what a failure leaves as it was
    fd: int | None = None
    refusal: DirectoryInUseError | None = None
    if rank == 0:
        make_directory(directory)
        try:
            fd = _try_lock(directory, command)
        except DirectoryInUseError as err:
            refusal = err  # what is new in the directory is the holder's: nothing is tidied
        except BaseException:
            if before is not None:  # the lock could not be written (a full disk, say)
                before.remove_created()
            raise
    if _shared_outcome(size, refusal is not None):
        raise refusal or DirectoryInUseError(
            f"{directory} is in use by another lmalgebra run (see the main rank's message)"
        )
    _held[directory] = (fd, 1)
    if before is not None:
        before.scan()  # under the lock: what appears from now on is this run's
    failed = True
    try:
        refuse_other_kind(directory, command)
        yield
        failed = False
    finally:
        del _held[directory]
        try:  # what the failed run left, taken back under its lock: a run that takes the lock
            if failed and before is not None:  # next finds none of it gone from under it
                before.tidy(scratch, created=False)
        finally:
            _release(directory, fd)
        if failed and before is not None:  # the directory itself, empty without the lock file
            before.remove_created()


@contextlib.contextmanager
def held_by_parent(directory: Path, recorded: bool = True) -> Iterator[None]:
    """In a process started by the holder of ``directory``'s lock to do part of its work (the
    demo's students of one run, trained side by side): locked entry points on ``directory`` run
    under the holder's lock, as nested calls in the holder would, and neither take the lock nor
    tidy the directory, which stay the holder's. Refused unless the lock file names this
    process's parent; ``recorded=False``: the parent's file system has no locks (the parent ran
    unlocked, warned), and there must be no lock file at all. Such a process must end before its
    parent releases the lock (``side_by_side``'s do)."""
    directory = Path(directory).resolve()
    holder = holder_record(directory)
    if recorded:
        allowed = holder is not None and holder.get("pid") == os.getppid()
    else:
        allowed = holder is None
    if directory in _held or not allowed:
        raise RuntimeError(f"the lock of {directory} is not held by this process's parent")
    _held[directory] = (None, 1)
    try:
        yield
    finally:
        del _held[directory]


def holding_lock(
    command: str, directory: Callable[..., Path], scratch: Sequence[str] = ()
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a library entry point to run under ``run_directory_lock``.

    ``directory`` receives the entry point's arguments by name, defaults filled in (so
    ``lambda recipe, **_: recipe.output_dir``), and returns the directory the entry point writes;
    ``scratch`` as for ``run_directory_lock``.
    """

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            with run_directory_lock(directory(**bound.arguments), command, scratch):
                return fn(*args, **kwargs)

        return wrapper

    return decorate


def holder_record(directory: Path) -> dict[str, Any] | None:
    """The holder details in ``directory``'s lock file, if one is there (for inspection)."""
    return read_lock_record(Path(directory))


@contextlib.contextmanager
def directory_held(directory: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``directory`` itself (no file is made there), waiting for
    it: commands writing several files into a directory no run owns (``spans --out``: a span
    list and its digest) write each set whole, never interleaved with another's. Where the
    filesystem has no locks, the block runs unguarded."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with contextlib.suppress(OSError):  # no locks there (ENOLCK, EOPNOTSUPP): unguarded
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock
