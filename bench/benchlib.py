"""Helpers shared by the benchmark scripts: machine description, memory probes, RESULTS.md."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import hashlib
import os
import platform
import re
import resource
import subprocess
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

HEADER = """# Benchmarks

Figures below are produced by the scripts in `bench/` and are overwritten when they run again.
`make bench` regenerates every section (it runs `bench/bench_solver.py`, `bench_embedding.py`,
`bench_teacher_inference.py`, `bench_training.py`, `bench_scaling.py`, `bench_integrity.py`,
`bench_alpha_sweep.py` and `bench_bootstrap.py` in turn). Each script
rewrites only its own section, between its `<!-- name -->` ... `<!-- /name -->` markers, so any
one can be run on its own:

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_solver.py [--sizes 8000,32000] [--models 12]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_embedding.py [--spans 1500]

Memory is resident set size (RSS) as the kernel reports it (`VmHWM` / `ru_maxrss`); 1 MiB = 2^20
bytes. The scripts wait for an idle machine before each measurement and measure again when other
processes took a noticeable share of the CPUs meanwhile; a warning in a section means they could
not get a quiet run.
"""


def utc_date() -> str:
    """The current time in the format of ``date -u``."""
    return datetime.now(timezone.utc).strftime("%a %b %d %H:%M:%S UTC %Y")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_gib() -> float:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("nan")


def machine() -> str:
    """One line: usable cores, CPU model, RAM, Python and library versions."""
    import numpy as np
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (
        f"{cores} cores (nproc), {_cpu_model()}, {_ram_gib():.1f} GiB RAM; "
        f"Python {platform.python_version()}, numpy {np.__version__}, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads)"
    )


ROOT = Path(__file__).resolve().parent.parent
# The code the benchmarks exercise; other changes under src/ do not affect the figures.
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/sources")


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip()


def code_version(measured: tuple[str, ...] = MEASURED) -> str:
    """The git commit of the checkout, noting uncommitted changes in the measured code."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", *measured)
    return f"{commit}{' + uncommitted changes in ' + ', '.join(measured) if dirty else ''}"


def source_digest(measured: tuple[str, ...] = MEASURED) -> dict[str, str]:
    """A hash per file of the measured code as it is on disk now (to notice edits during a run)."""
    digests = {}
    for folder in measured:
        for path in sorted((ROOT / folder).glob("*.py")):
            digests[f"{folder}/{path.name}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def release_memory() -> None:
    """Return freed heap memory to the OS so the next run's RSS starts from a clean floor."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def changed_sources(before: dict[str, str]) -> list[str]:
    """Files of the measured code that changed (or appeared, or went) since ``before``."""
    now = source_digest()
    return sorted(name for name in before.keys() | now.keys() if before.get(name) != now.get(name))


def _busy_seconds() -> float:
    """CPU time, all cores and processes together, spent not idle since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    busy = sum(fields[:8]) - idle  # user nice system idle iowait irq softirq steal
    return busy / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class CpuWatch:
    """How much CPU other processes took while this one ran (a contamination check)."""

    def __init__(self) -> None:
        self.start_wall = time.perf_counter()
        self.start_busy = _busy_seconds()
        self.start_own = _own_cpu_seconds()

    def stop(self) -> dict[str, float]:
        wall = time.perf_counter() - self.start_wall
        busy = _busy_seconds() - self.start_busy
        own = _own_cpu_seconds() - self.start_own
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        return {
            "own_cpu_s": own,
            "others_cpu_s": max(0.0, busy - own),
            "others_share": max(0.0, busy - own) / (wall * (os.cpu_count() or cores)),
        }


def wait_for_idle(threshold: float = 0.1, window: float = 3.0, timeout: float = 300.0) -> float:
    """Wait (up to ``timeout`` s) until the machine is idle: less than ``threshold`` of all CPUs
    busy over ``window`` seconds. Returns the last busy share seen."""
    deadline = time.perf_counter() + timeout
    cores = os.cpu_count() or 1
    while True:
        before = _busy_seconds()
        time.sleep(window)
        share = (_busy_seconds() - before) / (window * cores)
        if share < threshold or time.perf_counter() > deadline:
            return share


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise KeyError(field)


def rss_mib() -> float:
    """Current resident set size of this process."""
    return _status_kib("VmRSS") / 1024


def peak_rss_mib() -> float:
    """Peak resident set size of this process so far (since start or the last reset)."""
    try:
        return _status_kib("VmHWM") / 1024
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (``VmHWM``) to the current RSS; False if not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def write_section(name: str, body: str, path: Path = RESULTS) -> None:
    """Replace (or append) the section between ``<!-- name -->`` and ``<!-- /name -->``."""
    start, end = f"<!-- {name} -->", f"<!-- /{name} -->"
    text = path.read_text(encoding="utf-8") if path.is_file() else HEADER
    first = re.search(r"^<!-- [\w.-]+ -->$", text, flags=re.MULTILINE)
    if text.startswith("# Benchmarks") and first:
        text = HEADER + "\n" + text[first.start() :]  # refresh the header
    elif not text.startswith("# Benchmarks"):
        text = HEADER + "\n" + text
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def fastest_attempt(
    run: Callable[[], Any],
    retries: int,
    report: Callable[[dict[str, Any]], None],
    contaminated: float = 0.05,
    idle_timeout: float = 300.0,
) -> dict[str, Any]:
    """Time ``run()`` on an idle machine, again (up to ``retries`` times) while other processes
    took more than ``contaminated`` of the CPUs meanwhile; the fastest attempt.

    Each attempt is a dict: ``output``, ``seconds``, ``start_rss``, ``peak_rss`` (MiB),
    ``exact_peak`` (whether the kernel's peak counter could be reset), ``cpu``
    (:class:`CpuWatch`), ``attempts``; ``report`` is called with every attempt.
    """
    best: dict[str, Any] | None = None
    for attempt in range(1 + retries):
        wait_for_idle(timeout=idle_timeout)
        release_memory()
        start_rss = rss_mib()
        exact = reset_peak_rss()
        watch = CpuWatch()
        clock = time.perf_counter()
        output = run()
        seconds = time.perf_counter() - clock
        cpu = watch.stop()
        result = {
            "output": output,
            "seconds": seconds,
            "start_rss": start_rss,
            "peak_rss": peak_rss_mib(),
            "exact_peak": exact,
            "cpu": cpu,
            "attempts": attempt + 1,
        }
        report(result)
        if best is None or seconds < best["seconds"]:
            best = result
        if cpu["others_share"] <= contaminated or cpu["others_cpu_s"] < 1:
            break
    assert best is not None
    return best
