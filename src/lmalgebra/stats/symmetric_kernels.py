"""The dense kernels of the solver on symmetric matrices: an SPD inverse, and quadratic forms.

Every kernel is NumPy's or SciPy's (one BLAS, OpenBLAS in their wheels): the statistics engine
never hands work to torch's thread pool between two of NumPy's calls, where each pool's idle
threads spin against the other's (measured on two cores: a 384-order ``cholesky_inverse`` by
torch right after a NumPy product took 20 to 200 ms instead of 1.5 ms).

``spd_inverse`` factors and inverts ``C + Lam`` in the buffer it is given (LAPACK ``potrf`` then
``potri``, no second ``D x D`` array). ``row_quadratics`` computes ``op_i C op_i^T`` for every row
``i`` of an operator from the upper panels of the symmetric ``C`` only, reading ``C`` in place
over any set of its column ranges: about half the flops of ``(op @ C) * op`` and no gathered copy
of a sub-matrix. ``mirror_upper`` makes a matrix whole from its upper triangle. Every kernel
works in the matrix's own dtype (float64, or float32 for the float32 precision).

Work made of panels is shared out by ``in_parallel``: the panels go one at a time to threads
that each run one BLAS thread, rather than every product being split over the BLAS threads. On
a shared host this keeps a core slowed by another process from holding every call back.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, cast

import numpy as np
from scipy.linalg import lapack

from lmalgebra.stats.blas_threads import cpu_threads, one_blas_thread

# Width of the column panels of row_quadratics: wide enough for full BLAS speed, narrow enough
# that the diagonal panels (computed in full) are a small share of the work.
PANEL = 512
# Above this order a float64 factorisation runs on one BLAS thread (see ``_sound_threads``).
THREADED_FLOAT64_ORDER = 8192

T = TypeVar("T")


def spd_inverse(system: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """``(system^-1, diag(L))`` of an SPD ``(D, D)`` float64 or float32 C-contiguous
    ``system = L L^T`` (the inverse in the same dtype).

    ``system`` is overwritten: it becomes the inverse (returned as a view of it). The inverse is
    ``None`` when ``system`` is not positive definite; ``diag(L)`` then holds what the
    factorisation reached (its condition is of no use).
    """
    # a C-ordered symmetric matrix is its own transpose, an F-ordered array LAPACK works in
    fortran = system.T
    potrf, potri = lapack.get_lapack_funcs(("potrf", "potri"), (fortran,))
    with _sound_threads(system):
        factor, info = potrf(fortran, lower=1, overwrite_a=1, clean=0)
        diag = np.diagonal(factor).astype(np.float64)
        if info != 0:
            return None, diag
        inverse, info = potri(factor, lower=1, overwrite_c=1)
    if info != 0:  # a zero pivot potrf did not see: singular to working precision
        return None, diag
    result = inverse.T  # C-ordered again; potri filled the upper triangle of this view
    mirror_upper(result)
    return np.ascontiguousarray(result), diag


def cholesky(matrix: np.ndarray) -> tuple[np.ndarray, bool]:
    """``(L, ok)``: the lower Cholesky factor of a symmetric ``matrix`` (its upper triangle
    zeroed), by LAPACK ``potrf`` in the matrix's dtype; ``ok`` is false where it is not positive
    definite (``L`` then holds what the factorisation reached)."""
    (potrf,) = lapack.get_lapack_funcs(("potrf",), (matrix,))
    factor, info = potrf(matrix, lower=1, clean=1)
    return factor, info == 0


def cholesky_solve(factor: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``(L L^T)^-1 rhs`` from the lower factor ``L`` of :func:`cholesky` (LAPACK ``potrs``)."""
    (potrs,) = lapack.get_lapack_funcs(("potrs",), (factor, rhs))
    solved, info = potrs(factor, rhs, lower=1)
    if info != 0:
        raise ValueError(f"potrs: illegal argument {-info}")
    return solved


def _sound_threads(system: np.ndarray) -> contextlib.AbstractContextManager[object]:
    """One BLAS thread for a float64 factorisation above ``THREADED_FLOAT64_ORDER``, else no
    limit. OpenBLAS 0.3.30 and 0.3.31 (SciPy's and NumPy's wheels) crash with a segmentation
    fault in their threaded ``dsyrk``, which ``dpotrf`` and ``dpotri`` call, from an order of
    about 15,000 on an AVX-512 CPU (measured: 14,000 sound, 16,000 and above crash, on two
    threads; single-threaded sound); ``ssyrk`` is sound at 24,576."""
    if system.dtype != np.float64 or system.shape[0] <= THREADED_FLOAT64_ORDER:
        return contextlib.nullcontext()
    from threadpoolctl import threadpool_limits

    return threadpool_limits(limits=1, user_api="blas")


def mirror_upper(matrix: np.ndarray) -> None:
    """Copy the upper triangle of a square array onto its lower one, in place, panel by panel
    (spread over threads: each panel writes below the diagonal and reads above it only)."""

    def mirror(a: int, b: int) -> None:
        block = matrix[a:b, a:b]
        lower = np.tril_indices(b - a, -1)
        block[lower] = block.T[lower]
        matrix[b:, a:b] = matrix[a:b, b:].T

    in_parallel(mirror, row_panels(matrix.shape[0]))


def column_runs(cols: np.ndarray) -> list[tuple[int, int, int]]:
    """Runs of consecutive column indices: ``(position, length, first column)`` each."""
    cols = np.asarray(cols)
    if cols.size == 0:
        return []
    breaks = np.flatnonzero(np.diff(cols) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), int(cols.size)]
    return [(a, b - a, int(cols[a])) for a, b in zip(starts, ends, strict=True)]


def row_quadratics(op: np.ndarray, cov: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """``(r,) float64``: ``op_i C[cols, cols] op_i^T`` for each row ``i`` of ``op``.

    ``op``: ``(r, len(cols))`` float64 or float32, its columns in the order of ``cols``;
    ``cov``: ``(D, D)`` symmetric, read in place (panels converted to ``op``'s dtype where they
    differ). With ``C`` cut into panels ``q`` (runs of consecutive columns, at most ``PANEL``
    wide), ``op C op^T = sum_q (op_q C_qq + 2 sum_{p < q} op_p C_pq) op_q^T``; the panels before
    ``q`` in one run take one product. The panels are shared out by :func:`in_parallel`, their
    sums added in one fixed order (the same bits on any number of threads).
    """
    a, c = np.asarray(op), np.asarray(cov)
    runs = column_runs(cols)
    panels = [  # the last panels first: each adds the products of every panel before it
        (k, offset) for k, (_, length, _) in enumerate(runs) for offset in range(0, length, PANEL)
    ][::-1]

    def panel(k: int, offset: int) -> np.ndarray:
        position, length, column = runs[k]
        width = min(PANEL, length - offset)
        pos_q, col_q = position + offset, column + offset
        op_q = a[:, pos_q : pos_q + width]
        target = slice(col_q, col_q + width)
        into = op_q @ c[target, target].astype(a.dtype, copy=False)
        earlier = [*runs[:k], (position, offset, column)]  # whole runs, then this run's head
        for pos_p, len_p, col_p in earlier:
            if len_p:
                block = c[col_p : col_p + len_p, target].astype(a.dtype, copy=False)
                product = a[:, pos_p : pos_p + len_p] @ block
                product *= 2.0
                into += product
        return np.einsum("ij,ij->i", into, op_q, dtype=np.float64)

    out = np.zeros(a.shape[0])
    for part in in_parallel(panel, panels):
        out += part
    return out


def in_parallel(work: Callable[..., T], tasks: Sequence[tuple[int, ...]]) -> list[T]:
    """``[work(*task) for task in tasks]``, the tasks taken one at a time, in this order, by
    ``cpu_threads()`` threads, each on one BLAS thread (give the longest first: the shortest then
    fill in at the end).

    A BLAS call split over threads waits for its slowest thread: with another process on one of
    two cores, every call runs at the speed of the thread that shares that core. Tasks taken one
    at a time go to whichever thread is free, so a thread slowed by another process takes fewer.
    Each task must write only its own part and release the GIL (NumPy's products do).
    """
    if len(tasks) <= 1:  # one panel (a small matrix): no threads to share it out
        return [work(*task) for task in tasks]
    threads = min(cpu_threads(), len(tasks))
    if threads <= 1:
        with one_blas_thread():  # the same kernels as on several threads: the same bits
            return [work(*task) for task in tasks]
    results: list[T | None] = [None] * len(tasks)

    def run(index: int) -> None:
        results[index] = work(*tasks[index])

    with one_blas_thread(), ThreadPoolExecutor(threads) as pool:
        for done in [pool.submit(run, i) for i in range(len(tasks))]:
            done.result()  # an error in a thread is raised here
    return cast(list[T], results)


def row_panels(dim: int) -> list[tuple[int, int]]:
    """The panels ``[a, b)`` of ``PANEL`` rows (the last shorter) of a ``(dim, dim)`` matrix, in
    order: the longest first along its upper triangle."""
    return [(a, min(a + PANEL, dim)) for a in range(0, dim, PANEL)]


def block_sums(values: np.ndarray, edges: Sequence[int]) -> list[float]:
    """Sums of ``values`` over consecutive ranges ``edges[k] .. edges[k + 1]``."""
    return [float(values[a:b].sum()) for a, b in itertools.pairwise(edges)]
