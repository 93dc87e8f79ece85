"""How many threads NumPy's and SciPy's BLAS run on for work made of many small problems.

OpenBLAS splits every product and every step of an eigensolver between its threads, and its
idle threads wait for the next call by spinning. For one matrix of a few hundred rows the split
saves little, and on a shared host it costs much: when another process holds a core, each call
waits for a descheduled thread. Measured on two shared cores beside one busy process, the 13
eigendecompositions of order 384 of a similarity table took 4.7 s on two threads and 0.46 s on
one (``bench/bench_similarity.py``). Work of this kind runs on one thread; large products and
factorisations (the statistics pass, the D x D inverse) keep every thread.
"""

from __future__ import annotations

import contextlib


def one_blas_thread() -> contextlib.AbstractContextManager[object]:
    """NumPy's and SciPy's BLAS (OpenBLAS, or MKL where they use it) on one thread for the
    duration, then back to what it was."""
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")
