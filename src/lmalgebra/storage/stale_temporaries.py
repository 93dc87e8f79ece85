"""Temporaries of atomic writes (``.NAME.tmp-PID``, :mod:`lmalgebra.storage.atomic`) left by a
writer that died (``kill -9``, power loss): each is removed where it was made, when a write of
the same ``NAME`` into the same directory comes again (a resumed run writing the file it was
killed writing), and nowhere else.

A sweep of every such name under an output directory, at any depth, had also removed a user's
own file named so (``notes/.draft.txt.tmp-4242``). Only a process running alone does this: in a
run of several processes, a temporary whose writer is not seen here may be a live process's of
another machine.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

from lmalgebra.core.precision import launch_count

TEMPORARY = re.compile(r"^\.(.+)\.tmp-(\d+)$")  # ``.NAME.tmp-PID``: NAME and the writer's pid

# per process and directory it wrote into: the temporaries of writers that are gone, by the
# name they were written for, found at its first write there (one listing a directory, not one
# a write: a shard set's directory holds thousands of files); a forked child lists again
_stale: dict[tuple[int, Path], dict[str, list[Path]]] = {}


def new_call() -> None:
    """A command or library call begins: each directory is listed again at its first write (a
    process that runs several, a notebook's, had kept the listing of its first call, blind to
    the temporaries a writer killed since had left)."""
    _stale.clear()


def alive(pid: int) -> bool:
    """Whether a process ``pid`` runs on this machine (one of another user's too)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stale_temporaries(directory: Path) -> dict[str, list[Path]]:
    """The temporaries in ``directory`` (not below it) whose writer is gone, by target name."""
    found: dict[str, list[Path]] = {}
    with contextlib.suppress(OSError):  # no directory yet, or none to list: nothing stale
        for entry in os.scandir(directory):
            match = TEMPORARY.match(entry.name)
            if match is None or not entry.is_file(follow_symlinks=False):
                continue
            pid = int(match.group(2))
            if pid != os.getpid() and not alive(pid):
                found.setdefault(match.group(1), []).append(Path(entry.path))
    return found


def remove_stale_of(path: Path) -> None:
    """Remove the temporaries of ``path`` (``.NAME.tmp-PID`` beside it) whose writer is gone,
    before this process writes ``path``; in a process running alone."""
    if launch_count("WORLD_SIZE", 1) > 1:
        return
    key = (os.getpid(), path.parent.absolute())
    if key not in _stale:
        _stale[key] = stale_temporaries(key[1])
    for temporary in _stale[key].pop(path.name, []):
        with contextlib.suppress(OSError):  # gone, or not this user's to remove
            temporary.unlink()
