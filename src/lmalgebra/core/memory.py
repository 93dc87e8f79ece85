"""How much memory this process may still take: the figure a run's plan is held to."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

GIB = 2**30
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")  # cgroup v2: memory.max and memory.current of this container


def available_bytes() -> float:
    """Memory available to new allocations now: the kernel's ``MemAvailable`` (free memory plus
    what it can reclaim, other processes' use deducted), capped by this container's cgroup limit
    where one is set; elsewhere the free physical pages."""
    found: list[float] = []
    with contextlib.suppress(OSError, ValueError):
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024.0)
    with contextlib.suppress(OSError, ValueError):
        limit = (CGROUP / "memory.max").read_text().strip()
        if limit != "max":
            used = int((CGROUP / "memory.current").read_text().strip())
            found.append(float(int(limit) - used))
    if not found:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            found.append(float(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")))
    return min(found) if found else float("inf")
