"""How many threads NumPy's and SciPy's BLAS run on for work made of many small problems.

OpenBLAS splits every product and every step of an eigensolver between its threads, and its
idle threads wait for the next call by spinning. For one matrix of a few hundred rows the split
saves little, and on a shared host it costs much: when another process holds a core, each call
waits for a descheduled thread. On two shared cores, the three splits' similarity tables of 13
models of width 384 (39 eigendecompositions of order 384, 234 of order about 165) took 5 to 72 s
of wall time and up to 60 s of CPU on two threads, against 1.2 s (2.8 s beside a competing
process) and 1.2 s of CPU on one (``bench/bench_similarity.py``). Work of this kind runs on one
thread; large products and factorisations (the statistics pass, the D x D inverse) keep every
thread.
"""

from __future__ import annotations

import contextlib
import os


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """NumPy's and SciPy's BLAS (OpenBLAS, or MKL where they use it) on one thread for the
    duration, then back to what it was."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def cpu_threads() -> int:
    """The threads the statistics' own panel work is spread over: ``OMP_NUM_THREADS`` where it
    is set to a positive count (as torch and OpenBLAS read it), else the CPUs this process may
    run on."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    if given.isdigit() and int(given) > 0:
        return int(given)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1
