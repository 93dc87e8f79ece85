"""Helpers shared by the benchmark scripts: machine description, memory probes, RESULTS.md."""

from __future__ import annotations

import os
import platform
import resource
from datetime import datetime, timezone
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"

HEADER = """# Benchmarks

Figures below are produced by the scripts in `bench/` and are overwritten when they run again.
Regenerate everything with `make bench` (runs `bench/bench_solver.py`, then
`bench/bench_embedding.py`); each script rewrites only its own section, between its
`<!-- name -->` ... `<!-- /name -->` markers, so the two can be run independently:

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_solver.py [--sizes 8000,32000] [--models 12]
    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_embedding.py [--spans 1500]

Memory is resident set size (RSS) as the kernel reports it (`VmHWM` / `ru_maxrss`); 1 MiB = 2^20
bytes.
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
    if not text.startswith("# Benchmarks"):
        text = HEADER + "\n" + text
    block = f"{start}\n{body.strip()}\n{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
