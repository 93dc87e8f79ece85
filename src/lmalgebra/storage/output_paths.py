"""Output paths, checked before any work: writable, of the right kind, never mixed with other runs,
and left as they were by a command that fails.

Every command that writes learns about a bad output path in its first milliseconds, with one line
naming the path, instead of a traceback after minutes of embedding or training. A run directory
that holds a run of another configuration is refused (its files would mix with the new run's);
``overwrite`` empties it first. ``LOCK_NAME`` files are ignored: the lock is taken before the
claim. ``tidy_on_failure`` is how every writing command takes back the directories it created
when it fails before producing anything in them.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import socket
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import OVERWRITE, UserInputError
from lmalgebra.core.settings import home_expanded
from lmalgebra.core.text_files import absent, not_a_directory
from lmalgebra.storage.atomic import refuse_special

LOCK_NAME = ".lmalgebra.lock"


# the cache root a command was given (``--cache_dir``), for the command's duration
_GIVEN_ROOT: ContextVar[Path | None] = ContextVar("cache_root", default=None)


def default_cache_dir() -> Path:
    """The user's lmalgebra cache: the root a running command was given (:func:`cache_root`),
    else ``$LMALGEBRA_CACHE``, else ``~/.cache/lmalgebra``."""
    given = _GIVEN_ROOT.get()
    if given is not None:
        return given
    env = os.environ.get("LMALGEBRA_CACHE")
    return home_expanded(Path(env)) if env else Path.home() / ".cache" / "lmalgebra"


@contextlib.contextmanager
def cache_root(root: Path) -> Iterator[None]:
    """Within the block, every cache (embeddings, spans, hashes, packaged and dequantised GGUF
    models, token maps) lives under ``root``: a command's ``cache_dir`` keeps all its cache
    writes there."""
    token = _GIVEN_ROOT.set(home_expanded(Path(root)))
    try:
        yield
    finally:
        _GIVEN_ROOT.reset(token)


def cache_directory(root: Path | None = None) -> Path:
    """The cache root, ``root`` or else :func:`default_cache_dir`, checked where the cache is
    opened (embeddings, packaged and GGUF models, token maps): one line naming it unless it is,
    or can be created as, a writable directory."""
    path = home_expanded(Path(root)) if root is not None else default_cache_dir()
    env = os.environ.get("LMALGEBRA_CACHE")
    named = env is not None and home_expanded(Path(env)) == path
    if named and not str(env).strip():  # an empty one reads as unset; blanks had made "  /"
        raise UserInputError(
            f"$LMALGEBRA_CACHE {env!r}: an empty path; name a directory, or unset it "
            "(~/.cache/lmalgebra)"
        )
    check_directory(path, "cache directory ($LMALGEBRA_CACHE)" if named else "cache directory")
    return path


# the mined token maps of causal training, below the cache root
MINED_MAPS = "mined-maps"
# the cache's own directories below its root, each holding the cache's files alone: the
# remembered hashes, span plans, embeddings, dequantised GGUF and unpacked packaged models, and
# the mined token maps
CACHE_DIRECTORIES = ("hashes", "spans", "embeddings", "gguf", "packaged", MINED_MAPS)


def refuse_cache_overlap(out: Path, cache: Path) -> None:
    """Refuse a cache directory inside the output directory ``out`` (whose files are the run's
    alone: its ``--overwrite`` had then been refused over the cache) or inside another output
    (a finished run, a model directory; a demo's, which holds its own cache, aside), and ``out``
    inside one of the cache's own directories (:func:`refuse_output_inside_cache`), before
    either is written."""
    if cache.resolve().is_relative_to(out.resolve()):
        raise UserInputError(
            f"cache directory {cache} is inside the output directory {out}, whose files are "
            "the run's alone; give a cache directory outside it"
        )
    refuse_cache_inside_output(cache)
    refuse_output_inside_cache(out, cache)


def refuse_output_inside_cache(out: Path, cache: Path) -> None:
    """Refuse the output directory ``out`` inside one of the cache's own directories
    (``CACHE_DIRECTORIES``, below the cache root ``cache``), whether or not the run writes
    there: its files would be taken for the cache's entries, or mixed with them (one inside
    ``gguf/`` or ``packaged/`` had been written among the models built there). A run in the
    cache's root, beside them, is fine."""
    real = out.resolve()
    inside = [cache / p for p in CACHE_DIRECTORIES if real.is_relative_to((cache / p).resolve())]
    if inside:
        raise UserInputError(
            f"output directory {out} is inside the cache's {inside[0]}, whose files are the "
            "cache's alone; give an output directory outside it"
        )


def refuse_cache_inside_output(cache: Path) -> None:
    """Refuse a cache directory inside an lmalgebra output (a finished run, a model directory
    lmalgebra wrote, at any depth; a demo's, which holds its own cache, aside): its files are
    that output's own, which the cache's would be taken for, or mixed with."""
    refuse_inside_other_output(cache, "cache directory", allowed=("a demo's output",))


def refuse_unusable_cache_parts(root: Path, parts: Iterable[str]) -> None:
    """Refuse, for a dry run, each of the cache's own directories ``parts`` under ``root`` that
    is a file, a FIFO or a link to nothing: nothing cached can be read there, so the run writes
    there and refuses it (the dry run had passed it). One this user may not write is left to the
    run, which reads what it holds."""
    for part in parts:
        path = root / part
        if path.is_symlink() and not path.exists():
            raise UserInputError(f"cache directory {path} {absent(path)} (the run writes there)")
        if path.exists() and not path.is_dir():
            why = not_a_directory(path)
            raise UserInputError(f"cache directory {path} {why} (the run writes there)")


def _check_creatable(path: Path, what: str) -> None:
    """``path`` does not exist: its nearest existing ancestor must be a writable directory."""
    ancestor = path.parent.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:  # the nearest that exists
        if ancestor.is_symlink():  # a link to nothing: mkdir -p would make its target
            raise UserInputError(f"cannot create {what} {path}: {ancestor} {absent(ancestor)}")
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise UserInputError(f"cannot create {what} {path}: {ancestor} {not_a_directory(ancestor)}")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserInputError(f"cannot create {what} {path}: {ancestor} is not writable")


def check_directory(path: Path, what: str = "output directory") -> None:
    """Raise ``UserInputError`` unless ``path`` is, or can be created as, a writable directory."""
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise UserInputError(f"{what} {path} {absent(path)}")
    if path.exists():
        if not path.is_dir():
            raise UserInputError(f"{what} {path} {not_a_directory(path)}")
        if not os.access(path, os.W_OK | os.X_OK):
            raise UserInputError(f"{what} {path} is not writable")
        return
    _check_creatable(path, what)


def check_file(
    path: Path, what: str = "output file", ours: Callable[[bytes], bool] | None = None
) -> None:
    """Raise ``UserInputError`` unless ``path`` can be written as a file (created or replaced):
    not a directory, link or special file (``atomic.refuse_special``).

    ``ours``: whether a file's first bytes (``HEAD_BYTES``) are those of one this command
    writes; a non-empty file that is not is refused rather than replaced (a user's own file
    where the output was aimed)."""
    path = Path(path)
    if path.name == LOCK_NAME:  # taken and removed around the command: the file went with it
        raise UserInputError(
            f"{what} {path}: {LOCK_NAME} is the name of lmalgebra's lock file, removed when the "
            "command ends; name another file"
        )
    refuse_special(path, what)
    if path.is_dir():
        raise UserInputError(f"{what} {path} is a directory, not a file")
    if path.exists():
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise UserInputError(f"{what} {path}: its directory {path.parent} is not writable")
        if ours is not None and not _replaceable(path, ours):
            raise UserInputError(
                f"{what} {path} exists and is not one lmalgebra wrote: it is left as it is; "
                "name another file, or move it away"
            )
        return
    _check_creatable(path, what)


HEAD_BYTES = 512  # what ``check_file``'s ``ours`` is shown of an existing file


def _replaceable(path: Path, ours: Callable[[bytes], bool]) -> bool:
    """An empty file, or one whose first bytes ``ours`` recognises (unreadable: not ours)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(HEAD_BYTES)
    except OSError:
        return False
    return not head or ours(head)


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


# which demo, at which sizes, a demo's output directory holds (``demo.workflow``)
DEMO_PLAN = "demo-plan.json"
# the top-level files by which each kind of lmalgebra output directory is known
# (a teacher selection and a tagging evaluation come first: a selection also writes a
# ``summary.json``)
KIND_MARKERS = {
    "a teacher selection": ("recommended.yaml",),
    "a tagging evaluation": ("pos_results.csv",),
    "a decomposition run": ("summary.json", "provenance.json"),
    "a merge run": ("recipe.yaml",),
    "a model directory written by lmalgebra": ("lmalgebra.json",),
    "a demo's output": (DEMO_PLAN,),
}


# a model's configuration, and where ``lmalgebra pretrain`` keeps its checkpoints and log while
# (and after) it trains: a model directory without them was not written here
MODEL_CONFIG = "config.json"
PRETRAIN_WORK = "training"


def directory_kind(directory: Path) -> tuple[str, str] | None:
    """What kind of output ``directory`` holds, and the file that tells (the first of
    ``KIND_MARKERS`` found that is the output's, ``_confirmed``; a Hugging Face model directory
    that ``lmalgebra pretrain`` is not writing, by its ``config.json``), or None."""
    for kind, markers in KIND_MARKERS.items():
        for marker in markers:
            if _stands(directory / marker) and _confirmed(directory, kind, marker):
                return kind, marker
    if (directory / MODEL_CONFIG).is_file() and not (directory / PRETRAIN_WORK).is_dir():
        if not _model_config(directory / MODEL_CONFIG):  # a user's own file of that name
            return "a file of the user's", MODEL_CONFIG
        return "a model lmalgebra did not write", MODEL_CONFIG
    return None


def _model_config(path: Path) -> bool:
    """Whether the file ``path`` holds a model's configuration (a JSON object naming its
    ``model_type``, as every Hugging Face model's does); one that cannot be read is taken for
    one. A user's own ``config.json`` (of a tool, an experiment) had been called "a model
    lmalgebra did not write"."""
    try:
        data = json.loads(path.read_bytes())
    except OSError:
        return True
    except ValueError:  # no JSON, or no UTF-8 text
        return False
    return isinstance(data, dict) and "model_type" in data


def _stands(marker: Path) -> bool:
    """Whether something other than a directory stands at ``marker``: a file, or what stands in
    one's place (a FIFO, a link, to nothing too), which tells the kind as the file would; a
    selection whose ``recommended.yaml`` was a FIFO had been taken for a decomposition run by
    its ``summary.json``."""
    return marker.is_symlink() or (marker.exists() and not marker.is_dir())


# for the kinds whose marker a user's file may be named as well (a recipe.yaml, a summary.json),
# what such an output always holds beside it
CONFIRMED_BY = {
    "a teacher selection": "summary.json",
    "a tagging evaluation": "pos_config.json",
    "a decomposition run": "config.yaml",
    "a merge run": "examples",
    "a model directory written by lmalgebra": MODEL_CONFIG,
}


# markers a user's own file is often named as: they tell their kind only where ``_confirmed``
COMMON_NAMES = ("recipe.yaml", "summary.json")


def _confirmed(directory: Path, kind: str, marker: str) -> bool:
    """Whether ``marker`` (a file of ``KIND_MARKERS[kind]`` in ``directory``) tells its kind: a
    name of its own (not ``COMMON_NAMES``), or one beside what such an output always holds
    (``CONFIRMED_BY``), or something other than a file in its place (a FIFO, a link to
    nothing), as the file would. A user's ``recipe.yaml`` or ``summary.json`` had made a folder
    of theirs "a merge run" or "a decomposition run", in messages and in refusals of other
    outputs written there."""
    beside = CONFIRMED_BY.get(kind)
    if marker not in COMMON_NAMES or beside is None or (directory / beside).exists():
        return True
    return not (directory / marker).is_file()


def holds_kind(directory: Path, kind: str) -> bool:
    """Whether ``directory`` holds a ``kind`` of output (a key of ``KIND_MARKERS``): one of its
    markers stands there and is the output's (``_confirmed``)."""
    markers = KIND_MARKERS[kind]
    return any(_stands(directory / m) and _confirmed(directory, kind, m) for m in markers)


def output_at(directory: Path) -> tuple[str, str] | None:
    """What lmalgebra output ``directory`` surely holds (a kind of ``KIND_MARKERS`` and the file
    that tells, confirmed by ``CONFIRMED_BY``), or None."""
    found = directory_kind(directory)
    if found is None or found[0] not in KIND_MARKERS:
        return None
    beside = CONFIRMED_BY.get(found[0])
    return found if beside is None or (directory / beside).exists() else None


def refuse_inside_other_output(
    path: Path, what: str, own: Path | None = None, allowed: tuple[str, ...] = ()
) -> None:
    """Refuse writing the file (or output directory) ``path`` inside a directory, at any depth,
    that holds another lmalgebra output (``output_at``: a run, an evaluation, a model lmalgebra
    wrote, a demo's output), naming it: its files are that output's own, and a file of another
    run among them would replace one of its files or be taken for a user's. ``own``: the output
    the file belongs to (a report's run), inside which it may go; ``allowed``: kinds of output
    (of ``KIND_MARKERS``) inside which it may go (a demo's, which holds its own runs). A path
    through a symbolic link is judged where it leads as well as where it is named."""
    home = own.resolve() if own is not None else None
    given = Path(os.path.abspath(path))  # noqa: PTH100 (a link is not followed)
    real = Path(os.path.realpath(path))  # where a link in the path leads: its parents count too
    parents = [*given.parents, *(real.parents if real != given else ())]
    for parent in parents:
        if home is not None and parent.resolve() == home:
            return
        found = output_at(parent)
        if found is not None and found[0] in allowed:
            return
        if found is not None:
            raise UserInputError(
                f"{what} {path} would go inside {parent}, which holds {found[0]} ({found[1]}): "
                f"its files are its own; write the {what} elsewhere"
            )
        holder = lock_holder(parent)
        if holder is not None:  # a run writing there, whose files may not be there yet
            raise UserInputError(
                f"{what} {path} would go inside {parent}, which is in use by another lmalgebra "
                f"run ({holder}); write the {what} elsewhere, or wait for it to finish"
            )


def read_lock_record(directory: Path) -> dict[str, Any] | None:
    """The holder details in ``directory``'s lock file (JSON), or None: no lock file, one that
    does not read as a record, or anything but a regular file there, which is not opened (a
    FIFO would wait for a writer) nor followed (a link)."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # a directory opens too, and fdopen refuses it
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as handle:
        try:
            record = json.loads(handle.read(1 << 16).decode("utf-8"))
        except (OSError, ValueError):
            return None
    return record if isinstance(record, dict) else None


def lock_holder(directory: Path) -> str | None:
    """Who holds ``directory``'s lock, when another live process of this machine does (its lock
    file names it: a holder removes the file when it lets go, and one killed leaves the pid of
    a process that is gone, or that another process has since taken, which holds no lock on
    the file); None otherwise. Read, not taken: a probe of the lock itself would
    make a run starting at that moment find it taken."""
    record = read_lock_record(directory)
    if record is None:
        return None
    try:
        pid, host = int(record["pid"]), str(record["host"])
    except (ValueError, KeyError, TypeError):
        return None
    if pid == os.getpid() or host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    if not _locked(directory / LOCK_NAME):  # its pid now another process's: a stale record
        return None
    return f"pid {pid}, {record.get('command', 'a command')}"


def _locked(path: Path) -> bool:
    """Whether a process holds a lock on the file ``path``, as the kernel lists the locks it
    holds (``/proc/locks``: read, not taken); true where it keeps no such list."""
    try:
        found = path.lstat()
        listing = Path("/proc/locks").read_text(encoding="ascii")
    except (OSError, ValueError):
        return True
    inode = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    return any(inode in line.split() for line in listing.splitlines())


def not_a(directory: Path, kind: str) -> str:
    """What ``directory`` holds instead of a ``kind`` (a key of ``KIND_MARKERS``), for a
    message (empty when nothing)."""
    found = directory_kind(directory)
    return f"; it holds {found[0]} ({found[1]})" if found and found[0] != kind else ""


def _names(entries: Sequence[Path], root: Path | None = None) -> str:
    """The first three of ``entries`` (relative to ``root``; a directory with a slash), and how
    many more."""

    def name(entry: Path) -> str:
        shown = str(entry.relative_to(root)) if root is not None else entry.name
        return f"{shown}/" if entry.is_dir() else shown

    shown = ", ".join(name(e) for e in entries[:3])
    return shown + (f" and {len(entries) - 3} more" if len(entries) > 3 else "")


def _owned(name: str, owned: Sequence[str]) -> bool:
    """Whether a top-level ``name`` is one a run writes: matches ``owned``, or is the hidden
    temporary file of an atomic write of such a name (``.NAME.tmp-PID``)."""
    if name.startswith(".") and ".tmp-" in name:
        name = name[1:].rsplit(".tmp-", 1)[0]
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in owned)


def _sort_out(directory: Path, owned: Sequence[str]) -> tuple[list[Path], list[Path]]:
    """``(files a run writes, entries it does not)`` under ``directory``, the lock aside.

    ``owned``: patterns (``fnmatch``) of the relative paths of the files a run writes
    (``fits.csv``, ``stats/*.safetensors``): a directory is a run's only as far as its files are,
    so a user's file inside one is found (and keeps it from being removed); a link is a file."""
    mine: list[Path] = []
    foreign: list[Path] = []
    files = [p for p in owned if "/" not in p]
    for entry in _entries(directory):
        if entry.is_dir() and not entry.is_symlink():
            head = [p.split("/", 1) for p in owned if "/" in p]
            inner = [rest for first, rest in head if fnmatch.fnmatchcase(entry.name, first)]
            if not inner:
                foreign.append(entry)
                continue
            found, other = _sort_out(entry, inner)
            mine += found
            foreign += other
        elif _owned(entry.name, files):
            mine.append(entry)
        else:
            foreign.append(entry)
    return mine, foreign


def holds_only(directory: Path, owned: Sequence[str]) -> bool:
    """Whether every file under ``directory`` (the lock aside) is one a run writes (``owned``
    patterns, or the temporary file of an atomic write of one); true when it is empty."""
    return not _sort_out(directory, owned)[1]


def remove_run_files(directory: Path, what: str, owned: Sequence[str] = ("*",)) -> None:
    """Empty ``directory`` of a run's files (paths matching ``owned``, the lock kept), and of the
    directories that leaves empty; refused, removing nothing, when it also holds anything else
    (a user's own files, in it or in a directory of the run's, another run), naming a few."""
    refuse_foreign(directory, what, owned)
    mine, _ = _sort_out(directory, owned)
    kind = directory_kind(directory)
    markers = KIND_MARKERS.get(kind[0], ()) if kind is not None else ()
    # the files that tell the kind go last: a run stopped in between is still its own kind
    # (a selection's summary.json without its recommended.yaml read as a decomposition's)
    for path in sorted(mine, key=lambda p: p.relative_to(directory).as_posix() in markers):
        path.unlink()
    # every directory left is the run's (another would have been refused): the emptied go
    folders = [p for p in directory.rglob("*") if p.is_dir() and not p.is_symlink()]
    for folder in sorted(folders, key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):  # not empty: something a run writes appeared
            folder.rmdir()


def _changed(
    recorded: Mapping[str, Any], identity: Mapping[str, Any], within: str = ""
) -> list[str]:
    """The keys whose values differ between two identities, named down to the settings that
    differ (``settings.alpha``, not ``settings``)."""
    changed = []
    for key in sorted(recorded.keys() | identity.keys()):
        old, new = recorded.get(key), identity.get(key)
        named = _named(old), _named(new)
        if named[0] is not None and named[1] is not None and list(named[0]) == list(named[1]):
            old, new = named  # two lists of the same names, in the same order
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            changed += _changed(old, new, f"{within}{key}.")
        elif old != new:
            changed.append(f"{within}{key}")
    return changed


def _named(value: Any) -> dict[str, Any] | None:
    """A list of named settings (a decomposition's ``models``) as a mapping by name, in its
    order, so that ``_changed`` names the one that differs (``models.a.path``); None for
    anything else."""
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        return None
    names = [v.get("name") for v in value]
    if not names or not all(isinstance(n, str) for n in names) or len(set(names)) < len(names):
        return None
    return dict(zip(names, value, strict=True))


def refuse_foreign(directory: Path, what: str, owned: Sequence[str] = ("*",)) -> None:
    """Refuse ``--overwrite`` of a directory that holds anything a run of ``what`` does not
    write, or a symbolic link where it writes a file, or a file of the run in a folder this
    user may not write (a read-only mount): removing the others first had left a run cut to
    its last folders, still marked complete (``remove_run_files``' check, which removes
    nothing)."""
    mine, foreign = _sort_out(directory, owned)
    if foreign:
        raise UserInputError(
            f"{directory} holds files a {what} does not write ({_names(foreign, directory)}); "
            f"{OVERWRITE} removes only a run's own files: move those away, or write to "
            "another directory"
        )
    _refuse_odd(directory, what, mine)
    stuck = [p for p in mine if not os.access(p.parent, os.W_OK | os.X_OK)]
    if stuck:
        raise UserInputError(
            f"{stuck[0].parent} is not writable: {OVERWRITE} could not remove the {what}'s "
            f"files there ({_names(stuck, directory)}) and removes none; give this user the "
            "right to write there, or write to another directory"
        )


def _refuse_odd(directory: Path, what: str, mine: Sequence[Path]) -> None:
    """Refuse symbolic links and special files among ``mine``, the paths where a run of
    ``what`` writes its files: a run writes no link (the file it names is a user's, and so is
    the link) and no FIFO; found before any work, not at the write after it."""
    odd = [p for p in mine if p.is_symlink() or not p.is_file()]
    if odd:
        raise UserInputError(
            f"{directory} holds symbolic links or special files (FIFOs, sockets, devices) "
            f"where a {what} writes files ({_names(odd, directory)}): lmalgebra replaces none, "
            f"{OVERWRITE} included; remove them, or write to another directory"
        )


def claim_run_directory(
    directory: Path,
    identity: Mapping[str, Any],
    recorded: Mapping[str, Any] | None,
    *,
    finished: bool,
    overwrite: bool,
    what: str,
    owned: Sequence[str] = ("*",),
    dry: bool = False,
) -> None:
    """Make ``directory`` this run's own before anything is written to it (``dry``: refuse what
    would be refused, removing nothing: a dry run).

    Args:
        directory: the run directory (may be missing or empty).
        identity: what makes this run this run (its configuration less paths and display options).
        recorded: the identity recorded by the run already in ``directory`` (``None``: none there).
        finished: whether the run already there is marked complete.
        overwrite: remove the run's files first (those matching ``owned``); refused, removing
            nothing, when ``directory`` holds anything else (a user's own files, another run).
        what: the kind of run, for messages ("decomposition").
        owned: patterns (``fnmatch``) of the top-level names this kind of run writes; hidden
            temporary files of interrupted atomic writes (``.NAME.tmp-PID``) are its own too.

    An empty directory is claimed; the same configuration resumes (or, when finished, is computed
    again into the same files); anything else is refused with one line saying how to proceed.
    """
    entries = _entries(directory)
    if not entries:
        return
    if overwrite:
        if dry:
            refuse_foreign(directory, what, owned)
        else:
            remove_run_files(directory, what, owned)
        return
    mine, foreign = _sort_out(directory, owned)
    hint = f"write to another directory, or pass {OVERWRITE} to remove its files first"
    if recorded is None and foreign:
        raise UserInputError(
            f"{directory} is not empty and holds no {what} ({_names(foreign, directory)}); "
            "write to another directory"
        )
    if recorded is None:
        raise UserInputError(f"{directory} is not empty and holds no {what}; {hint}")
    changed = _changed(recorded, identity)
    if changed:
        state = "a finished" if finished else "an unfinished"
        shown = ", ".join(changed[:4]) + (f" and {len(changed) - 4} more" if changed[4:] else "")
        raise UserInputError(
            f"{directory} holds {state} {what} of another configuration "
            f"({shown} {'differ' if len(changed) > 1 else 'differs'}); {hint}"
        )
    # the same run, resumed or computed again, writes there: nothing in the way of a file
    _refuse_odd(directory, what, mine)
    blocked = [
        p
        for p in foreign
        if p.is_dir()
        and any(fnmatch.fnmatchcase(p.relative_to(directory).as_posix(), o) for o in owned)
    ]
    if blocked:
        more = f" (and {_names(blocked[1:], directory)})" if len(blocked) > 1 else ""
        raise UserInputError(
            f"{blocked[0]} is a directory, where a {what} writes a file{more}: lmalgebra "
            "removes none it did not write; move it away, or write to another directory"
        )


class Snapshot:
    """What was under ``root`` before a command wrote there: the outermost of it and its parents
    that did not exist (``created``, the top of what the command may make), taken at once, and
    every path below it (relative, files and directories), taken by ``scan``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()
        self.created: Path | None = None
        for path in (self.root, *self.root.parents):
            if path.exists() or path.is_symlink():
                break
            self.created = path
        self.paths: set[Path] | None = set()  # None: not listed (``scan(deep=False)``)

    def scan(self, deep: bool = True) -> Snapshot:
        """Record what is below ``root`` now (call it while no one else writes there).

        ``deep=False`` when the command writes only files into an existing ``root`` (a report
        into the working directory): nothing is listed, and nothing below it is ever touched.
        """
        exists = self.root.is_dir()
        self.paths = set(_walk(self.root)) if exists and deep else set() if not exists else None
        return self

    def tidy(self, scratch: Sequence[str], created: bool = True) -> None:
        """Remove the new files matching ``scratch`` when they are all the command added below
        ``root``; then every new directory left empty, deepest first (``created=False``: those
        below ``root`` only, ``remove_created`` left to the caller)."""
        if not self.root.is_dir() or self.paths is None:
            return
        new = [p for p in _walk(self.root) if p not in self.paths]
        files = [p for p in new if not (self.root / p).is_dir() and p.name != LOCK_NAME]
        if files and all(any(fnmatch.fnmatchcase(p.as_posix(), s) for s in scratch) for p in files):
            for path in files:
                with contextlib.suppress(OSError):
                    (self.root / path).unlink()
        fresh = [self.root / p for p in new if (self.root / p).is_dir()]
        for directory in sorted(fresh, key=lambda d: -len(d.parts)):
            with contextlib.suppress(OSError):
                directory.rmdir()  # fails, and is skipped, unless empty
        if created:
            self.remove_created()

    def remove_created(self) -> None:
        """Remove the root and its parents up to the first that existed before, deepest first,
        each where it is empty (a failure before anything was written leaves no directory)."""
        if self.created is None:
            return
        for directory in (self.root, *self.root.parents):
            if self.created not in (directory, *directory.parents):
                break
            with contextlib.suppress(OSError):
                directory.rmdir()


def _walk(root: Path) -> Iterator[Path]:
    """Every path below ``root`` (relative), symbolic links not followed."""
    for top, dirs, files in os.walk(root):
        relative = Path(top).relative_to(root)
        for name in (*dirs, *files):
            yield relative / name


@contextlib.contextmanager
def tidy_on_failure(
    *roots: Path, scratch: Sequence[str] = (), enabled: bool = True, deep: bool = True
) -> Iterator[None]:
    """Run a block that writes under ``roots``; if it fails, take back what it left without output.

    Args:
        roots: the directories the block writes into (they may not exist yet).
        scratch: glob patterns, relative to a root, of files written before any output (a copy
            of the recipe, memoised hashes); new ones are removed when they are all the block
            added under that root, so a run that failed before producing anything leaves nothing.
        enabled: ``False`` makes it a plain block (the ranks of a run other than the main one).
        deep: ``False`` when the block writes files only, no directory, into the roots that exist
            (the directory of an output file, which may be the user's working directory): those
            are not listed, and only missing roots and parents are taken back.

    On any exception (Ctrl-C included) every directory the block created that is left empty is
    removed, the roots and their missing parents included. A file that was there before, or any
    new file not matching ``scratch`` (a finished shard, a checkpoint: work a rerun resumes),
    is never removed, and neither is the directory holding it.
    """
    before = [Snapshot(root).scan(deep) for root in roots] if enabled else []
    try:
        yield
    except BaseException:
        for state in before:
            state.tidy(scratch)
        raise
