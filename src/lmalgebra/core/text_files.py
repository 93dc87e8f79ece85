"""Reading the text files a user hands over (recipes, corpora, a run's CSV and JSON files).

Every reader goes through :func:`read_text`, so each way a file can be unusable (absent, a
directory, unreadable, not UTF-8) is reported the same way: one line naming the file, and for
bad bytes the offset of the first one.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from lmalgebra.core.errors import UserInputError


def absent(path: Path) -> str:
    """Why ``path``, which is no regular file or directory, is not there, as a message ends:
    ``does not exist``, for a link to nothing ``is a symbolic link to TARGET, which does not
    exist`` (not "a file", nor a name to look up elsewhere), and to itself, through however many
    links, that they loop; and for a FIFO, socket or device,
    which is there, that it is no regular file (not "does not exist")."""
    if path.exists() and not path.is_file() and not path.is_dir():
        return "is not a regular file (a FIFO, socket or device)"
    if path.is_symlink():
        try:
            target = str(path.readlink())
        except OSError:
            target = "a path"
        if _loops(path):
            return f"is a symbolic link to {target}, which leads back to it (a loop of links)"
        if (path.parent / target).is_symlink():  # a chain: the link it names is there
            end = os.path.realpath(path)
            return (
                f"is a symbolic link to {target}, itself a link leading to {end}, which does "
                "not exist"
            )
        return f"is a symbolic link to {target}, which does not exist"
    return "does not exist"


def _loops(path: Path) -> bool:
    """Whether following the links from ``path`` comes back round (ELOOP)."""
    try:
        path.resolve(strict=True)
    except RuntimeError:  # Python before 3.13: "Symlink loop from ..."
        return True
    except OSError as err:
        return err.errno == errno.ELOOP
    return False


def not_a_directory(path: Path) -> str:
    """Why ``path``, which exists and is no directory, is not one, as a message ends: ``is a
    file, not a directory``, or for a FIFO, socket or device ``is a FIFO, socket or device, not a
    directory`` (not called a file)."""
    kind = "a file" if path.is_file() else "a FIFO, socket or device"
    return f"is {kind}, not a directory"


def not_a_file(path: Path) -> str:
    """Why ``path``, which is no regular file, is not one, as a message ends: ``is a
    directory, not a file``, or as :func:`absent` says (a FIFO, a link to nothing, nothing)."""
    return "is a directory, not a file" if path.is_dir() else absent(path)


def local_namesake(text: str) -> str:
    """For a ``recipe:NAME`` or ``package:NAME`` refused as no such name, how to reach a local
    path spelled the same (the prefix wins), as a message ends; empty when there is none."""
    return f"; the local {text} here is reached as ./{text}" if os.path.lexists(text) else ""


class NotARegularFileError(OSError):
    """What :func:`open_regular` raises for a path that is no regular file: an ``OSError``, as
    a missing file's, so that a reader that takes an unreadable record for none does the same."""

    def __str__(self) -> str:
        return str(self.strerror)  # the path and what stands there, without "[Errno 22]"


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened to read its bytes, never waiting on what stands there: a FIFO is opened
    without waiting for a writer and, as a directory, socket or device, refused with
    :class:`NotARegularFileError` naming it (:func:`not_a_file`); a link is followed. Raises
    ``OSError`` as ``open`` does."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    handle = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        handle.close()
        raise NotARegularFileError(errno.EINVAL, f"{path} {not_a_file(Path(path))}")
    return handle


def read_record(path: Path) -> str:
    """The UTF-8 text of a record a run reads back (a ``summary.json``, a checkpoint's
    ``state.json``, a manifest), read through :func:`open_regular`: a FIFO there had made the
    command wait forever. ``UnicodeDecodeError`` for bytes that are not UTF-8."""
    with open_regular(path) as handle:
        return handle.read().decode("utf-8")


def require_file(path: Path, what: str) -> Path:
    """``path`` if it is an existing regular file (or a link to one); else UserInputError."""
    if path.is_file():
        return path
    raise UserInputError(f"{what} {path} {not_a_file(path)}")


def decode_utf8(data: bytes, path: Path, what: str) -> str:
    """``data`` decoded as UTF-8 (a leading byte-order mark dropped); UserInputError naming the
    file and the offset of the first byte that is not UTF-8."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UserInputError(
            f"{what} {path} is not UTF-8 text: byte 0x{data[err.start]:02x} at offset {err.start}"
        ) from None


def unencodable(text: str) -> int | None:
    """The position of the first character of ``text`` no UTF-8 file can hold (a lone
    surrogate: Python's stand-in for a byte that decoded to no character), or None."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        return err.start
    return None


def read_text(path: Path, what: str, newline: str | None = None) -> str:
    """The text of the file at ``path`` (``what`` names it in messages: "recipe", "corpus"...).

    With ``newline=None`` line ends are translated to ``\\n`` as Python's text mode does; with
    ``newline=""`` they are kept (for the ``csv`` module).
    """
    path = Path(path)
    require_file(path, what)
    try:
        data = path.read_bytes()
    except PermissionError as err:
        raise UserInputError(f"{what} {path} is not readable ({err.strerror})") from None
    except OSError as err:
        raise UserInputError(f"{what} {path} cannot be read ({err.strerror})") from None
    text = decode_utf8(data, path, what)
    if newline is None and "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    return text


def read_lines(path: Path, what: str) -> list[str]:
    """The lines of the text file at ``path`` (``what`` as for :func:`read_text`), parted at its
    line ends alone: ``str.splitlines`` also parts a line at a form feed, U+0085, U+2028 and the
    other separators that text copied from the web holds."""
    text = read_text(path, what)
    return text.removesuffix("\n").split("\n") if text else []


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in the file at ``path`` (``what`` names it in messages); UserInputError
    naming the file when it cannot be read, is no JSON, or holds no object."""
    try:
        data = json.loads(read_text(path, what))
    except ValueError as err:
        raise UserInputError(f"{path} is not readable JSON: {err}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"{path}: expected a JSON object")
    return data
