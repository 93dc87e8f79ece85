"""Independent demo steps side by side, in processes of fewer threads each.

The demo's models are small: their operations are too short for two threads to share well. One
training step of a demo teacher took 120 ms on one thread and 99 ms on two (1.2x), while two
one-thread processes side by side took 124 ms a step each (1.6x the throughput of one process on
both threads; 2 cores, 2026-12-03). So the demo's teachers, which are independent, train in
separate processes, the threads torch was given shared out among them, and so do the students of
one merge run, under the run's lock held by the demo. Jobs of unequal size gain little or lose:
once the short ones end, the long one runs on its share of the threads alone (the demo's two
merge runs, twice apart, ran slower side by side than in turn).

Each job is a module-level function and its arguments (a spawned interpreter imports it anew);
what a job returns, or raises, comes back to the caller. A job process ends with its parent, so
an interrupted demo leaves no training behind it; every step resumes from what it saved.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import signal
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # prctl(2): the signal a process gets when its parent ends
Job = tuple[Callable[..., Any], tuple[Any, ...]]


def side_by_side(jobs: Mapping[str, Job], threads: int | None = None) -> dict[str, Any]:
    """Run ``jobs`` (name -> (function, arguments)) and return name -> result, in ``jobs``'s
    order. ``threads`` (default: torch's thread count, which ``OMP_NUM_THREADS`` sets) is shared
    out among ``min(len(jobs), threads)`` processes, jobs handed out in the order given (put the
    longest first); with one thread, or one job, they run here one after another."""
    budget = threads or torch_threads()
    workers = processes(len(jobs), budget)
    if workers < 2:
        return {name: function(*args) for name, (function, args) in jobs.items()}
    each = budget // workers
    log.info("%s: %d processes of %d thread(s) each", ", ".join(jobs), workers, each)
    pool = ProcessPoolExecutor(
        workers,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_start_worker,
        initargs=(each,),
    )
    try:
        futures: dict[str, Future[Any]] = {
            name: pool.submit(function, *args) for name, (function, args) in jobs.items()
        }
        results = {name: future.result() for name, future in futures.items()}
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        _stop_workers(pool)
        raise
    pool.shutdown()
    return results


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def processes(jobs: int, threads: int | None = None) -> int:
    """How many processes :func:`side_by_side` runs ``jobs`` jobs in (1: here, one after
    another): a caller shows progress bars only then."""
    return max(1, min(jobs, threads or torch_threads()))


def _start_worker(threads: int) -> None:
    """In each job process: ``threads`` torch threads, and an end with the parent (Linux)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    import torch

    torch.set_num_threads(threads)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """End the job processes still running (a job failed, or the demo was interrupted)."""
    processes = getattr(pool, "_processes", None) or {}
    for process in list(processes.values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.terminate()
    for process in list(processes.values()):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.join(timeout=10)
