"""Statistics of every rank's rows at once: moments summed around one common shift (exact)."""

from __future__ import annotations

import numpy as np

from lmalgebra.distributed import all_reduce_sum, sum_in_place, world
from lmalgebra.stats.moments import SecondMoments
from lmalgebra.stats.sketch import ColumnMoments, CovarianceSketch
from lmalgebra.stats.span_blocks import SpanBlockMoments


def _common_shift(n: int, shift: np.ndarray) -> tuple[int, np.ndarray | None]:
    """Total rows over ranks, and the shift of the lowest rank holding any row (rank 0 holds the
    first shard, so this is the shift a single process would have used); None without rows."""
    rank, size = world()
    counts = np.zeros(size)
    counts[rank] = n
    counts = all_reduce_sum(counts)
    holders = np.flatnonzero(counts)
    if holders.size == 0:
        return 0, None
    source = int(holders[0])
    return int(counts.sum()), all_reduce_sum(shift if rank == source else np.zeros(shift.size))


def _summed(*arrays: np.ndarray) -> list[np.ndarray]:
    out = []
    for array in arrays:
        values = np.ascontiguousarray(array, dtype=np.float64)
        sum_in_place(values)
        out.append(values)
    return out


def reduce_moments(moments: SecondMoments) -> SecondMoments:
    """Statistics of the union of every rank's rows (ranks hold disjoint rows).

    Every rank's statistics are first expressed around one common shift (``_common_shift``)
    with ``SecondMoments.shifted_to`` (exact algebra); then ``n``, sums and Gram matrices are
    summed in float64. Ranks with ``n == 0`` contribute nothing. Collective: every rank must
    call it, in the same order, with statistics over the same blocks. Returns the input
    unchanged in a single process.
    """
    if world()[1] == 1:
        return moments
    n, shift = _common_shift(moments.n, moments.shift)
    if shift is None:
        return SecondMoments(moments.blocks, precision=moments.precision)
    moved = moments.shifted_to(shift) if moments.n else SecondMoments(moments.blocks)
    sums, gram = _summed(moved.sums, moved.gram)
    gram = gram.astype(moments.gram.dtype, copy=False)
    return SecondMoments(moments.blocks, n, shift, sums, gram, moments.products, moments.precision)


def reduce_blocked(blocked: SpanBlockMoments) -> SpanBlockMoments:
    """``reduce_moments`` applied to every row block of ``blocked`` (collective)."""
    parts = [reduce_moments(part) for part in blocked.parts]
    return SpanBlockMoments(blocked.blocks, blocked.edges, parts)


def reduce_columns(columns: ColumnMoments) -> ColumnMoments:
    """``reduce_moments`` for per-column moments (collective)."""
    if world()[1] == 1:
        return columns
    n, shift = _common_shift(columns.n, columns.shift)
    if shift is None:
        return ColumnMoments(columns.dim)
    moved = columns.shifted_to(shift) if columns.n else ColumnMoments(columns.dim)
    sums, squares = _summed(moved.sums, moved.squares)
    return ColumnMoments(columns.dim, n, shift, sums, squares)


def reduce_sketch(sketch: CovarianceSketch) -> CovarianceSketch:
    """``reduce_moments`` for a covariance sketch (collective; every rank draws the same test
    matrix from the same seed)."""
    if world()[1] == 1:
        return sketch
    columns = sketch.columns
    n, shift = _common_shift(columns.n, columns.shift)
    if shift is None:
        return CovarianceSketch(ColumnMoments(columns.dim), sketch.test)
    empty = CovarianceSketch(ColumnMoments(columns.dim, shift=shift.copy()), sketch.test)
    moved = sketch.shifted_to(shift) if sketch.n else empty
    sums, squares, product = _summed(moved.columns.sums, moved.columns.squares, moved.product)
    return CovarianceSketch(
        ColumnMoments(columns.dim, n, shift, sums, squares), sketch.test, product
    )
