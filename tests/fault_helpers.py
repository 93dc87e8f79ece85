"""Helpers of the fault-injection tests: a fork server client, kill points, directory snapshots."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

TEMPORARY = re.compile(r"^\..+\.tmp-\d+$|^\.tmp-step-\d+$")
SERVER = Path(__file__).with_name("cli_fork_server.py")


class ForkServer:
    """Client of ``cli_fork_server.py``: ``lmalgebra`` commands in forked, killable children."""

    def __init__(self, cwd: Path):
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.process = subprocess.Popen(
            [sys.executable, str(SERVER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
        )
        self._ask(None)  # the ready line

    def _ask(self, request: dict[str, object] | None) -> dict[str, int]:
        assert self.process.stdin is not None and self.process.stdout is not None
        if request is not None:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the fork server died")
        return dict(json.loads(line))

    def start(
        self,
        args: list[str],
        log: Path,
        env: dict[str, str] | None = None,
        bound: bool = False,
        memory: int | None = None,
    ) -> int:
        """Start ``lmalgebra ARGS`` (its output in ``log``), with ``env`` set in its environment,
        when ``bound``, bound by file permissions (``cli_fork_server.bind_permissions``), and
        with at most ``memory`` bytes of address space when given."""
        request: dict[str, object] = {"run": args, "log": str(log), "bound": bound}
        if memory is not None:
            request["memory"] = memory
        return self._ask({**request, "env": env or {}})["pid"]

    def wait(self, pid: int) -> int:
        """Exit code of ``pid``, or minus the signal that ended it."""
        return self._ask({"wait": pid})["status"]

    def run(
        self, args: list[str], log: Path, env: dict[str, str] | None = None, bound: bool = False
    ) -> int:
        return self.wait(self.start(args, log, env, bound))

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        self.process.wait(timeout=30)


@dataclass(frozen=True)
class KillPoint:
    """Where a trial kills: once ``progress() >= after``, at once in the next write window seen
    (``in_write``) or after ``delay`` seconds; in either case no later than the moment the next
    unit of progress is done (``progress() >= after + unit``), so the command never finishes."""

    seed: int
    after: int
    unit: int
    in_write: bool
    delay: float

    @classmethod
    def draw(cls, seed: int, last: int, unit: int, interval: float) -> KillPoint:
        """``after`` in ``[0, last]``; in a write for odd seeds, else a delay within 1.5
        ``interval``s (the typical time one unit takes)."""
        rng = random.Random(seed)
        after = rng.randint(0, last)
        return cls(seed, after, unit, seed % 2 == 1, rng.uniform(0, 1.5 * interval))


def kill_at(
    pid: int,
    point: KillPoint,
    progress: Callable[[], int],
    writing: Callable[[], bool],
    timeout: float = 120.0,
) -> str:
    """SIGKILL ``pid`` at ``point``; a description of the moment. ``progress`` counts finished
    units (shards, checkpointed steps); ``writing`` says whether a temporary is on disk now."""
    deadline = time.monotonic() + timeout
    while progress() < point.after:
        if time.monotonic() > deadline or exited(pid):
            raise RuntimeError(f"seed {point.seed}: the command stopped at {progress()}")
        time.sleep(0.002)
    how, start = f"after {progress()} done", time.monotonic()
    limit = point.after + point.unit
    if point.in_write:
        while not writing() and progress() < limit and time.monotonic() < deadline:
            pass  # spin: a write window lasts milliseconds
        how += ", during a write" if writing() else ", write window missed"
    else:
        while time.monotonic() - start < point.delay and progress() < limit:
            time.sleep(0.001)
        how += f", +{(time.monotonic() - start) * 1000:.0f} ms"
    os.kill(pid, signal.SIGKILL)
    return how


def exited(pid: int) -> bool:
    """Whether child ``pid`` has ended (a zombie waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def wait_for(condition: Callable[[], bool], timeout: float = 120.0) -> None:
    """Poll ``condition`` every 2 ms until it holds; TimeoutError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not reached")
        time.sleep(0.002)


def temporaries(root: Path) -> list[Path]:
    """Temporary files and checkpoint directories under ``root``."""
    return sorted(p for p in root.rglob("*") if TEMPORARY.match(p.name))


def names_in(directories: list[Path], pattern: str) -> list[str]:
    """Names matching ``pattern`` (a regex) in ``directories``, cheaply (for tight polling)."""
    found = []
    for directory in directories:
        with contextlib.suppress(FileNotFoundError):
            found += [e.name for e in os.scandir(directory) if re.match(pattern, e.name)]
    return found


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` by relative path; manifests by parsed content."""
    found: dict[str, bytes] = {}
    for path in sorted(root.rglob("*")):
        if path.is_file():
            data = path.read_bytes()
            if path.name == "manifest.json":
                data = json.dumps(json.loads(data), sort_keys=True).encode()
            found[str(path.relative_to(root))] = data
    return found


def recipe_copy(recipe: Path, target: Path, output_dir: Path) -> Path:
    """``recipe`` with another output directory, written to ``target``."""
    data = yaml.safe_load(recipe.read_text())
    data["output_dir"] = str(output_dir)
    target.write_text(yaml.safe_dump(data), encoding="utf-8")
    return target


def stamps(paths: list[Path]) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each file: unchanged means not rewritten."""
    return {str(p): (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


def median_gap(paths: list[Path]) -> float:
    """Median time between the modification times of ``paths`` (seconds)."""
    times = sorted(p.stat().st_mtime for p in paths)
    gaps = sorted(b - a for a, b in itertools.pairwise(times))
    return gaps[len(gaps) // 2] if gaps else 0.1
