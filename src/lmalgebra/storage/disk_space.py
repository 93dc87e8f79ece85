"""A full disk (or quota), as every writer reports it, turned into one message naming the file.

Python and pyarrow raise ``OSError`` with ``errno`` ENOSPC or EDQUOT, usually without a file
name; safetensors raises its own ``SafetensorError`` whose message ends in ``(os error 28)``.
Writers wrap their writes in ``naming_file(path)`` so the user learns which file could not be
written; the caller's cleanup (temporary files removed, nothing marked complete) then runs as for
any other failure, and running the same command again, with space freed, resumes.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import absent

NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})
_NOT_PERMITTED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
_LINK_LOOP = re.compile(r"^Symlink loop from '(.+)'$")  # pathlib's, before Python 3.13


class OutOfSpaceError(UserInputError):
    """The disk (or the user's quota) filled up while a file was written."""


def _os_errors(err: BaseException) -> list[int]:
    """The operating system's error codes ``err`` and the errors it was raised from report: an
    ``OSError``'s ``errno``, or the ``(os error N)`` of a library's own error (safetensors)."""
    seen: set[int] = set()
    codes: list[int] = []
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno is not None:
            codes.append(current.errno)
        codes += [int(code) for code in _RUST_OS_ERROR.findall(str(current))]
        current = current.__cause__ or current.__context__
    return codes


def is_out_of_space(err: BaseException) -> bool:
    """Whether ``err`` (or an error it was raised from) reports a full disk or an exceeded quota."""
    return any(code in NO_SPACE for code in _os_errors(err))


def message(path: Path | str | None) -> str:
    """The one line a user sees: which file, and what to do."""
    where = f" while writing {path}" if path else ""
    return (
        f"no space left on device (or disk quota exceeded){where}; free some space and run the "
        "same command again: finished parts are kept and the rest is redone"
    )


@contextlib.contextmanager
def naming_file(path: Path) -> Iterator[None]:
    """Re-raise a full-disk error from the block as ``OutOfSpaceError`` naming ``path``, and a
    refused permission (a cache directory made read-only, a read-only file system) as one
    ``UserInputError`` line naming it, whether Python or a library reports it."""
    try:
        yield
    except OutOfSpaceError:
        raise
    except Exception as err:
        if is_out_of_space(err):
            raise OutOfSpaceError(message(path)) from err
        refused = [code for code in _os_errors(err) if code in _NOT_PERMITTED]
        if refused:  # from Python, or a library's own error (safetensors writing a cache entry)
            raise UserInputError(f"cannot write {path}: {os.strerror(refused[0])}") from err
        raise


SHOWN = 80  # characters of an over-long path a message shows, at each end


def too_long_a_path(err: BaseException) -> str | None:
    """The one line a user sees for a path the file system cannot hold (ENAMETOOLONG: a name in
    it longer than the file system's 255 bytes, or the whole longer than 4096), met wherever a
    command first looks at it, input or output, before anything is written there; None for any
    other error."""
    if errno.ENAMETOOLONG not in _os_errors(err):
        return None
    where = _paths_of(err) or ""
    longest = max((len(part.encode()) for part in Path(where).parts), default=0)
    shown = where if len(where) <= 2 * SHOWN else f"{where[:SHOWN]}...{where[-SHOWN:]}"
    return (
        f"path too long for the file system ({len(where.encode())} bytes, its longest name "
        f"{longest}): {shown}; a name may hold at most 255 bytes and a path 4096: give a "
        "shorter one"
    )


def _paths_of(err: BaseException) -> str | None:
    """The file (``A -> B`` for a rename) the first ``OSError`` of ``err``'s chain names."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.filename is not None:
            second = current.filename2
            return str(current.filename) + (f" -> {second}" if second is not None else "")
        current = current.__cause__ or current.__context__
    return None


def refused_permission(err: BaseException) -> str | None:
    """The one line a user sees for a permission the system refused (a directory below the
    cache or a run made read-only, a read-only file system) that no writer named itself; None
    for any other error."""
    refused = [code for code in _os_errors(err) if code in _NOT_PERMITTED]
    if not refused:
        return None
    where = _paths_of(err)
    return (
        f"{os.strerror(refused[0])}{f': {where}' if where else ''}; give this user the right "
        "to write there (or choose another directory) and run the same command again: finished "
        "parts are kept"
    )


def system_refusal(err: BaseException) -> str | None:
    """The one line a user sees for what the system refused a command, wherever it was met: a
    full disk, a refused permission, a path too long for the file system, memory it could not
    give; None for any other error. The command line prints it; the Python API raises it as a
    ``UserInputError``."""
    from lmalgebra.core.out_of_memory import refused_memory

    if is_out_of_space(err):
        return message(getattr(err, "filename", None))
    return refused_permission(err) or too_long_a_path(err) or refused_memory(err) or link_loop(err)


def link_loop(err: BaseException) -> str | None:
    """The one line a user sees for a loop of symbolic links that no check named first (a
    cache directory linked to itself, met where a path is resolved); None for any other error."""
    found = _LINK_LOOP.match(str(err)) if isinstance(err, RuntimeError) else None
    where = found.group(1) if found else None
    if where is None and errno.ELOOP in _os_errors(err):
        where = _paths_of(err) or "a path"
    if where is None:
        return None
    path = Path(where)
    link = next((p for p in (path, *path.parents) if p.is_symlink()), path)
    return f"{link} {absent(link)}; remove the link, or name another path"
