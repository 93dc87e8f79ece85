"""Statistics of every rank's rows at once: moments summed around one common shift (exact)."""

from __future__ import annotations

import numpy as np

from lmalgebra.distributed import all_reduce_sum, sum_in_place, world
from lmalgebra.stats.moments import SecondMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments


def reduce_moments(moments: SecondMoments) -> SecondMoments:
    """Statistics of the union of every rank's rows (ranks hold disjoint rows).

    Every rank's statistics are first expressed around one common shift, the shift of the lowest
    rank holding any row (rank 0 holds the first shard, so this is the shift a single process
    would have used), with ``SecondMoments.shifted_to`` (exact algebra); then ``n``, sums and Gram
    matrices are summed in float64. Ranks with ``n == 0`` contribute nothing. Collective: every
    rank must call it, in the same order, with statistics over the same blocks. Returns the
    input unchanged in a single process.
    """
    rank, size = world()
    if size == 1:
        return moments
    counts = np.zeros(size)
    counts[rank] = moments.n
    counts = all_reduce_sum(counts)
    holders = np.flatnonzero(counts)
    if holders.size == 0:
        return SecondMoments(moments.blocks)
    source = int(holders[0])
    shift = all_reduce_sum(moments.shift if rank == source else np.zeros(moments.dim))
    moved = moments.shifted_to(shift) if moments.n else SecondMoments(moments.blocks)
    sums = np.ascontiguousarray(moved.sums, dtype=np.float64)
    gram = np.ascontiguousarray(moved.gram, dtype=np.float64)
    sum_in_place(sums)
    sum_in_place(gram)
    return SecondMoments(moments.blocks, int(counts.sum()), shift, sums, gram)


def reduce_blocked(blocked: SpanBlockMoments) -> SpanBlockMoments:
    """``reduce_moments`` applied to every row block of ``blocked`` (collective)."""
    parts = [reduce_moments(part) for part in blocked.parts]
    return SpanBlockMoments(blocked.blocks, blocked.edges, parts)
