"""The hostile-input sweep (``tests/robustness/sweep/``, marker ``sweep``): how each case runs and
the rules its outcome is checked by.

A case is one ``lmalgebra`` command line, run in a child forked from a process that imported the
toolkit once (``cli_fork_server.py``), with a deadline (a command still running then is killed:
no hang is allowed) and a limit on its address space (a command that asks for the machine's
memory gets a MemoryError). Its outcome is checked by ``broken_rules``:

* no Python traceback in what it printed;
* an exit status of 0 or 2 (1 only where the case allows it: a training run that diverged);
* a refusal (2) is one ``error:`` line, the last it printed, naming the culprit;
* after a refusal, no output newly marked complete (``complete.json``, a shard set's manifest
  marked complete, a model directory's ``lmalgebra.json``, a decomposition's ``summary.json``).

The case lists are generated from the code (``sweep_cases.py``), so a new command, flag or key
is swept without editing the sweep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from fault_helpers import ForkServer, exited

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
ERROR_LINE = re.compile(r"^error: .*$", flags=re.MULTILINE)
MEMORY = 6 * 2**30  # bytes of address space a case may hold (torch alone maps about 2 GiB)
# what marks an output complete, by file name (a manifest only when it says so)
COMPLETE_MARKS = ("complete.json", "lmalgebra.json", "summary.json", "manifest.json")


@dataclass(frozen=True)
class Outcome:
    """What one command did: its exit status (None: still running at the deadline, killed),
    what it printed (colours taken out) and how long it ran."""

    args: tuple[str, ...]
    code: int | None
    output: str
    seconds: float

    @property
    def error_lines(self) -> list[str]:
        return ERROR_LINE.findall(self.output)

    def shown(self) -> str:
        tail = "\n    ".join(self.output.rstrip().splitlines()[-6:])
        return f"lmalgebra {' '.join(self.args)} -> {self.code}\n    {tail}"


class SweepServer:
    """Commands in forked children of one process, each with a deadline and a memory limit."""

    def __init__(self, cwd: Path, logs: Path):
        self.server = ForkServer(cwd)
        self.logs = logs
        self.count = 0

    def run(
        self,
        args: Sequence[str],
        timeout: float = 60.0,
        env: dict[str, str] | None = None,
        bound: bool = False,
    ) -> Outcome:
        """``lmalgebra ARGS``, killed when still running after ``timeout`` seconds."""
        self.count += 1
        log = self.logs / f"case-{self.count}.log"
        start = time.monotonic()
        pid = self.server.start(list(args), log, env, bound, memory=MEMORY)
        while not exited(pid) and time.monotonic() - start < timeout:
            time.sleep(0.01)
        killed = not exited(pid)
        if killed:
            os.kill(pid, signal.SIGKILL)
        code = self.server.wait(pid)
        seconds = time.monotonic() - start
        output = ANSI.sub("", log.read_text(encoding="utf-8", errors="replace"))
        log.unlink()
        return Outcome(tuple(args), None if killed else code, output, seconds)

    def close(self) -> None:
        self.server.close()


def complete_marks(root: Path) -> dict[str, int]:
    """Every mark of a complete output under ``root``: path -> modification time (ns)."""
    found: dict[str, int] = {}
    if not root.is_dir():
        return found
    for dirpath, _, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if name in COMPLETE_MARKS and _marks_complete(path):
                found[str(path)] = path.lstat().st_mtime_ns
    return found


def _marks_complete(path: Path) -> bool:
    """Whether ``path`` marks an output complete (a FIFO in its place is never opened: that
    would wait for a writer forever)."""
    if path.is_symlink() or not path.is_file():
        return False
    if path.name != "manifest.json":
        return True
    try:
        return json.loads(path.read_text(encoding="utf-8")).get("complete") is True
    except (OSError, ValueError, AttributeError):
        return False


@dataclass
class Rules:
    """What a case's outcome may be: its exit statuses, the texts of which its refusal line
    names one (none: any line), and the marks of complete outputs before it ran."""

    statuses: tuple[int, ...] = (0, 2)
    culprits: Sequence[str] = ()
    marks_before: dict[str, int] = field(default_factory=dict)
    watched: Path | None = None  # where outputs are marked complete


def broken_rules(outcome: Outcome, rules: Rules) -> list[str]:
    """Which rules ``outcome`` breaks (empty: none), each in a few words."""
    if outcome.code is None:
        return [f"still running after {outcome.seconds:.0f} s"]
    broken = []
    if "Traceback (most recent call last)" in outcome.output:
        broken.append("a traceback")
    if outcome.code not in rules.statuses:
        broken.append(f"exit status {outcome.code}")
    if outcome.code == 2:
        broken += _refusal_faults(outcome, rules.culprits)
        if rules.watched is not None:
            marked = _newly_marked(rules.marks_before, complete_marks(rules.watched))
            if marked:
                broken.append(f"marked complete after a refusal: {marked[0]}")
    return broken


def _refusal_faults(outcome: Outcome, culprits: Sequence[str]) -> list[str]:
    lines = outcome.error_lines
    if len(lines) != 1:
        return [f"{len(lines)} error lines"]
    if not outcome.output.rstrip().endswith(lines[0]):
        return ["the error line is not the last"]
    if culprits and not any(c in lines[0] for c in culprits):
        return [f"the line names none of {list(culprits)}"]
    return []


def _newly_marked(before: dict[str, int], after: dict[str, int]) -> list[str]:
    return sorted(p for p, stamp in after.items() if before.get(p) != stamp)


def report(faults: Iterable[tuple[str, Outcome, list[str]]]) -> str:
    """The faults of a family, one paragraph each: the case, what it broke, its output's end."""
    return "\n".join(
        f"{case}: {'; '.join(broken)}\n  {out.shown()}" for case, out, broken in faults
    )
