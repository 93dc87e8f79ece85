"""Helpers of the kill-at-every-write tests: a command stopped at each point where what it has
on disk changes, then run again, must finish as an uninterrupted run does.

``watching_writes(root, act)`` sees every change a command makes to the files under ``root``: a
rename or replace (how an atomic write, a checkpoint or a staged directory lands), a file opened
to write or append, a removal (``os.unlink``, ``os.rmdir``, ``shutil.rmtree``) and a directory
made. Each is a *write point*, numbered from 1 in the order the command reaches it (a command
that writes from two threads, ``decompose``, may interleave them otherwise in another run);
between two of them the command only computes, so stopping it at each of them in turn stops it
in every state it can leave on disk (at the granularity of Python's calls: what a library
writes from compiled code, the tensors of a safetensors file, lands with the rename that
follows, or is seen as part of the file opened for it). The lock file is left out (the kernel
releases the lock of a killed process), and so are the temporaries of atomic writes
(``.NAME.tmp-PID``): nothing reads them, and the next run removes those of a writer that died.

Two ways to stop at point ``k``:

* ``interrupted_at(k)``: a ``KeyboardInterrupt`` raised instead of the write (Ctrl-C there), in
  this process; the command's own clean-up runs, and it must exit with status 130.
* ``killed_after(k)``: the process ends at once (``os._exit``) just after the write (``kill -9``
  there), in a child forked from this one; nothing of the command runs after it.

``check_resumes`` runs the command once uninterrupted (the reference, which counts its points),
then for each chosen point (``chosen_points``) restores the directories it writes as they were,
stops the command there, runs the same command again, and compares what it left with the
reference, file by file (``snapshot``: the bytes, less what no two runs write alike: timings,
the order of a safetensors header's metadata, remembered hashes named by inodes; ``steady``).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import random
import re
import shutil
import sys
import threading
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hostile_helpers import run_cli

LOCK = ".lmalgebra.lock"
ATOMIC_TEMPORARY = re.compile(r"^\..+\.tmp-\d+$")
WRITE_MODES = set("wax+")


@dataclass
class Point:
    """One write point: its number (from 1), what it does, and to which path."""

    index: int
    kind: str
    path: str

    def __str__(self) -> str:
        return f"#{self.index} {self.kind} {self.path}"


@dataclass
class _Watch:
    root: str
    act: Callable[[Point, str], None]  # (point, "before" | "after")
    points: list[Point] = field(default_factory=list)
    # per thread (decompose writes its statistics in a thread of its own): inside a watched
    # call, whose own calls (shutil.rmtree's removals) are not counted again
    inside: threading.local = field(default_factory=threading.local)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def depth(self) -> int:
        return int(getattr(self.inside, "depth", 0))

    @depth.setter
    def depth(self, value: int) -> None:
        self.inside.depth = value


def _absolute(path: Any, dir_fd: int | None = None) -> str | None:
    if isinstance(path, int) or dir_fd is not None:
        return None  # a descriptor, or a name relative to one (inside a watched call)
    try:
        return os.path.abspath(os.fsdecode(path))  # noqa: PTH100 (a link is not followed)
    except TypeError:
        return None


def _counted(watch: _Watch, path: str | None) -> bool:
    if watch.depth or path is None:
        return False
    if not (path == watch.root or path.startswith(watch.root + os.sep)):
        return False
    name = Path(path).name
    return name != LOCK and not ATOMIC_TEMPORARY.match(name)


@contextlib.contextmanager
def watching_writes(root: Path, act: Callable[[Point, str], None]) -> Iterator[list[Point]]:
    """Call ``act(point, "before")`` before and ``act(point, "after")`` after every write point
    under ``root`` while the block runs; yields the points seen, in order."""
    watch = _Watch(os.path.abspath(root), act)  # noqa: PTH100 (as _absolute)
    real = {
        "replace": os.replace,
        "rename": os.rename,
        "unlink": os.unlink,
        "remove": os.remove,
        "rmdir": os.rmdir,
        "mkdir": os.mkdir,
        "rmtree": shutil.rmtree,
        "open": builtins.open,
    }

    def watched(kind: str, call: Callable[..., Any], target: Callable[..., str | None]):
        def run(*args: Any, **kwargs: Any) -> Any:
            path = target(*args, **kwargs)
            if not _counted(watch, path):
                return call(*args, **kwargs)
            assert path is not None
            with watch.lock:
                point = Point(len(watch.points) + 1, kind, os.path.relpath(path, watch.root))
                watch.points.append(point)
            watch.act(point, "before")
            watch.depth += 1
            try:
                result = call(*args, **kwargs)
            finally:
                watch.depth -= 1
            watch.act(point, "after")
            return result

        return run

    def destination(src: Any, dst: Any, *args: Any, **kwargs: Any) -> str | None:
        return _absolute(dst, kwargs.get("dst_dir_fd"))

    def removed(path: Any, *args: Any, **kwargs: Any) -> str | None:
        found = _absolute(path, kwargs.get("dir_fd"))
        return found if found is not None and os.path.lexists(found) else None  # else no change

    def opened(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> str | None:
        return _absolute(file) if WRITE_MODES & set(mode) else None

    def made(path: Any, *args: Any, **kwargs: Any) -> str | None:
        found = _absolute(path, kwargs.get("dir_fd"))
        if found is None or Path(found).is_dir() or not Path(found).parent.is_dir():
            return None  # no change: it is there, or cannot be made yet (mkdir -p's first try)
        return found

    patched = {
        (os, "replace"): watched("replace", real["replace"], destination),
        (os, "rename"): watched("rename", real["rename"], destination),
        (os, "unlink"): watched("unlink", real["unlink"], removed),
        (os, "remove"): watched("remove", real["remove"], removed),
        (os, "rmdir"): watched("rmdir", real["rmdir"], removed),
        (os, "mkdir"): watched("mkdir", real["mkdir"], made),
        (shutil, "rmtree"): watched("rmtree", real["rmtree"], removed),
        (builtins, "open"): watched("open", real["open"], opened),
        (io, "open"): watched("open", real["open"], opened),
    }
    with pytest.MonkeyPatch.context() as patch:
        for (module, name), replacement in patched.items():
            patch.setattr(module, name, replacement)
        yield watch.points


def count_points(root: Path, run: Callable[[], Any]) -> list[Point]:
    """The write points under ``root`` of ``run()`` (which must not be stopped)."""
    with watching_writes(root, lambda point, when: None) as points:
        run()
    return list(points)


def interrupted_at(
    k: int, root: Path, run: Callable[[], tuple[int, str]]
) -> tuple[int, str, Point | None]:
    """``run()`` with a ``KeyboardInterrupt`` instead of its ``k``-th write point under ``root``:
    its (exit status, stderr) and the point (None: it finished before reaching it)."""
    reached: list[Point] = []

    def act(point: Point, when: str) -> None:
        if when == "before" and point.index == k:
            reached.append(point)
            raise KeyboardInterrupt

    with watching_writes(root, act):
        code, stderr = run()
    return code, stderr, reached[0] if reached else None


def killed_after(
    k: int, root: Path, run: Callable[[], tuple[int, str]], log: Path
) -> tuple[int, str]:
    """``run()`` in a child forked from this process that ends (``os._exit(137)``, as after
    ``kill -9``) just after its ``k``-th write point under ``root``; (its exit status, the point
    or what it printed). Status 137 means it was killed there; anything else, that it ended
    before reaching the point."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the child never returns into the test
        code = 1
        try:
            out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, 1)
            os.dup2(out, 2)

            def act(point: Point, when: str) -> None:
                if when == "after" and point.index == k:
                    os.write(out, f"killed after {point}\n".encode())
                    os._exit(137)

            with watching_writes(root, act):
                code, stderr = run()
            os.write(out, stderr.encode())
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), log.read_text(errors="replace")


def chosen_points(count: int, every_up_to: int, sampled: int, seed: str) -> list[int]:
    """The points (1..count) to stop at: every one for a command of at most ``every_up_to``
    points; else the first two, the last two and ``sampled`` more drawn with ``seed`` (the
    command's name, so that each command is sampled in its own places)."""
    if count <= every_up_to:
        return list(range(1, count + 1))
    ends = {1, 2, count - 1, count}
    middle = sorted(set(range(1, count + 1)) - ends)
    return sorted(ends | set(random.Random(seed).sample(middle, min(sampled, len(middle)))))


# remembered hashes (a run's .hashes/, the cache's hashes/): named by the files' inode and times,
# which restoring a directory between trials changes; a cache of work, not an output
MEMO = re.compile(r"(^|/)\.?hashes/")
CHECKSUMS = ("sha256", "state_sha256", "config_sha256")  # of records holding timings
MEASURED = re.compile(r"tokens_per_s|_seconds$|^seconds|elapsed")  # timings: no run repeats them


def _steady(value: Any) -> Any:
    """A JSON value without the timings a rerun measures otherwise (``MEASURED`` keys)."""
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if not MEASURED.search(str(k))}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value


def steady(name: str, data: bytes) -> bytes:
    """What of a file an uninterrupted run and a resumed one must agree on: the bytes, except
    for timings in JSON (``MEASURED`` keys) and two things a writer does not repeat: a
    safetensors header's metadata map, whose order safetensors does not fix (a checkpoint
    records a tied weight's name there), and so the sha256 a checkpoint's ``state.json``
    records of its files (and a model's ``lmalgebra.json``, a decomposition's ``summary.json``
    and a tagging evaluation's ``pos_config.json`` of themselves, timings included). A file
    that does not parse is taken as it is."""
    try:
        return _steady_bytes(name, data)
    except ValueError:  # a file cut short, say: it differs from the reference's
        return data


def _steady_bytes(name: str, data: bytes) -> bytes:
    if name.endswith(".safetensors"):
        size = int.from_bytes(data[:8], "little")
        header = json.dumps(json.loads(data[8 : 8 + size]), sort_keys=True).encode()
        return header + data[8 + size :]
    if name.endswith(".jsonl"):
        lines = [json.dumps(_steady(json.loads(ln))) for ln in data.splitlines() if ln.strip()]
        return "\n".join(lines).encode()
    if name.endswith(".json"):
        value = _steady(json.loads(data))
        if re.search(
            r"(^|/)(step-\d+/state|lmalgebra|summary|pos_config)\.json$", name
        ):  # sums over timings too
            value = {k: v for k, v in value.items() if k not in CHECKSUMS}
        return json.dumps(value, sort_keys=True).encode()
    return data


def snapshot(
    root: Path, normalise: Callable[[str, bytes], bytes] | None = steady
) -> dict[str, bytes]:
    """Every file under ``root`` by relative path (the lock file and remembered hashes left
    out), its bytes passed through ``normalise(relative path, bytes)`` (default ``steady``)."""
    found: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.name != LOCK:
            name = str(path.relative_to(root))
            if MEMO.search(name):
                continue
            data = path.read_bytes()
            found[name] = normalise(name, data) if normalise else data
    return found


def differences(expected: dict[str, bytes], found: dict[str, bytes]) -> list[str]:
    """What differs between two snapshots, one line per file."""
    lines = [f"missing {name}" for name in sorted(expected.keys() - found.keys())]
    lines += [f"extra {name}" for name in sorted(found.keys() - expected.keys())]
    lines += [
        f"differs {n}" for n in sorted(expected.keys() & found.keys()) if expected[n] != found[n]
    ]
    return lines


def restore(pristine: Path | None, target: Path) -> None:
    """``target`` as ``pristine`` holds it (removed when ``pristine`` is None)."""
    shutil.rmtree(target, ignore_errors=True)
    if pristine is not None:
        shutil.copytree(pristine, target, symlinks=True)


def check_resumes(
    args: list[str],
    outputs: list[Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    *,
    root: Path | None = None,
    normalise: Callable[[str, bytes], bytes] | None = steady,
    every_up_to: int = 12,
    sampled: int = 4,
    modes: tuple[str, ...] = ("interrupt", "kill"),
    last: int = 0,
) -> dict[str, Any]:
    """``lmalgebra ARGS`` stopped at its write points under ``root`` (default: the common parent
    of ``outputs``) and run again: every rerun exits 0 without a traceback and leaves
    ``outputs`` as an uninterrupted run does. ``outputs`` are the directories the command writes
    (and what it starts from: their state before the command is restored before each trial).
    ``last``: stop it at its last ``last`` points alone (the writes that end a command too long
    to stop anywhere else in a short test). Returns the number of write points and the points
    tried, for the test to report."""
    watched = root or Path(os.path.commonpath([str(o) for o in outputs]))
    backup = tmp_path / "kill-points-pristine"
    pristine = {o: (backup / str(i) if o.exists() else None) for i, o in enumerate(outputs)}
    for output, saved in pristine.items():
        if saved is not None:
            shutil.copytree(output, saved, symlinks=True)

    def cli() -> tuple[int, str]:
        return run_cli(args, monkeypatch, capsys)

    def state() -> dict[str, dict[str, bytes]]:
        return {str(o): snapshot(o, normalise) for o in outputs}

    finished: list[tuple[int, str]] = []
    points = count_points(watched, lambda: finished.append(cli()))
    code, stderr = finished[0]
    assert code == 0 and "Traceback" not in stderr, f"the uninterrupted run: exit {code}\n{stderr}"
    expected = state()
    tried = chosen_points(len(points), every_up_to, sampled, " ".join(args[:2]))
    if last:
        tried = list(range(max(1, len(points) - last + 1), len(points) + 1))
    failures: list[str] = []
    for k in tried:
        for mode in modes:
            for output, saved in pristine.items():
                restore(saved, output)
            if mode == "interrupt":
                code, stderr, point = interrupted_at(k, watched, cli)
                how = f"interrupted before {point}"
                if code != 130 or point is None or "Traceback" in stderr:
                    failures.append(f"{how}: exit {code}\n{stderr[-2000:]}")
                    continue
            else:
                code, said = killed_after(k, watched, cli, tmp_path / "killed.log")
                told = [ln for ln in said.splitlines() if ln.startswith("killed after")]
                how = told[0] if told else f"killed after #{k}"
                if code != 137:
                    failures.append(f"kill after #{k}: the command ended ({code})\n{said[-2000:]}")
                    continue
            code, stderr = cli()
            if code != 0 or "Traceback" in stderr:
                failures.append(f"{how}, then run again: exit {code}\n{stderr[-3000:]}")
                continue
            found = state()
            diff = [
                f"{output}: {line}"
                for output in expected
                for line in differences(expected[output], found[output])
            ]
            if diff:
                failures.append(f"{how}, then run again: " + "; ".join(diff[:8]))
    assert not failures, "\n\n".join(failures) + "\n\npoints:\n" + "\n".join(map(str, points))
    return {"points": len(points), "tried": tried, "all": [str(p) for p in points]}


def demo_steady(name: str, data: bytes) -> bytes:
    """``steady``, less the wall times a demo shows outside its JSON files (whose
    timings ``steady`` leaves out): its page's time section, the last column of the UPOS tables
    (``seconds``), and the real demo's minutes in its table's caption."""
    if name.endswith("real-demo.md"):
        data = re.sub(rb"[0-9.]+ minutes", b"", data)
    if name.endswith(".html"):
        data = re.sub(rb'<section id="time">.*?</section>', b"", data, flags=re.S)
    if name.endswith("pos_results.csv"):
        data = b"\n".join(line.rsplit(b",", 1)[0] for line in data.splitlines())
    if name.endswith("pos_results.md"):
        data = b"\n".join(re.sub(rb"[^|]*\|$", b"", ln) for ln in data.splitlines())
    return steady(name, data)
