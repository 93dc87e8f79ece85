"""The passes over a measurement's embeddings that make its statistics, exact or reduced.

``exact``: one pass; every split's rows go into second moments over all ``D`` columns (per block
of spans). ``reduced`` and ``sketch``: a first pass over the training rows finds each model's
principal coordinates (:mod:`lmalgebra.stats.principal`), from the model's own covariance
(``reduced``: ``d x d`` per model) or from a streamed sketch of it (``sketch``: ``d x s``); a
second pass projects every split's rows onto them, with the tail probes, into second moments over
the reduced columns, and keeps each model's per-column moments per split (its total variance).
The fits then read the reduced statistics like any others.

Under several processes each rank reads the shards it owns; every statistic is summed over ranks
(exact algebra) before it is used, so every rank holds the same.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from lmalgebra.core.splits import SPLITS
from lmalgebra.distributed import owned
from lmalgebra.lmd.settings.scale import ScaleSpec
from lmalgebra.stats.moments import ModelColumns, Products, SecondMoments, layout, refuse_constant
from lmalgebra.stats.reduce import reduce_blocked, reduce_columns, reduce_moments, reduce_sketch
from lmalgebra.stats.sketch import ColumnMoments, CovarianceSketch
from lmalgebra.stats.solver import SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from lmalgebra.storage.atomic import make_directories

if TYPE_CHECKING:  # the principal coordinates import torch: only a reduced run needs them
    from lmalgebra.stats.principal import Reduction

# Rows of consecutive shards streamed into the statistics at once: at most GROUP_ROWS, and at most
# GROUP_BYTES of float32 (4 shards of 2048 rows of a 5,000-wide concatenation are 160 MB)
GROUP_ROWS = 8192
GROUP_BYTES = 256 * 2**20


class Source(Protocol):
    """A model's rows of one split, shard by shard (an embedding cache, a precomputed file)."""

    @property
    def dim(self) -> int: ...

    @property
    def ranges(self) -> list[tuple[int, int]]: ...

    def chunks(self, indices: Sequence[int] | None = None) -> Iterator[np.ndarray]: ...


@dataclass(frozen=True)
class Column:
    """One block of the concatenation: its name, the source it comes from, its columns there."""

    name: str
    source: int
    start: int
    stop: int


@dataclass
class Reductions:
    """What a reduced measurement kept of each model, and its total variance per split.

    Attributes:
        models: block name -> its :class:`Reduction` (from the training rows).
        totals: split -> block name -> :class:`ColumnMoments` of all the block's ``d`` columns.
        method: ``reduced`` or ``sketch``.
    """

    models: dict[str, Reduction]
    totals: dict[str, dict[str, ColumnMoments]] = field(default_factory=dict)
    method: str = "reduced"

    def scales(self, blocks: Sequence[ModelColumns]) -> list[float]:
        """Each block's mean per-dimension training variance over all its ``d`` dimensions."""
        return [self.models[b.name].total / self.models[b.name].width for b in blocks]


@dataclass
class Accumulated:
    """A measurement's statistics: per split and block of spans, the learning curve's, what a
    reduction kept, and the splits' covariances where they were spilled to disk."""

    stats: dict[str, SpanBlockMoments]
    curve: SpanBlockMoments | None = None
    reductions: Reductions | None = None
    spilled: dict[str, SplitMoments] = field(default_factory=dict)


def accumulate(
    caches: Sequence[Source],
    names: list[str],
    widths: list[list[int]],
    rows: dict[str, int],
    parts: dict[str, int],
    train_edges: list[int] | None = None,
    products: Products = "float32",
    scale: ScaleSpec | None = None,
    spill: Path | None = None,
) -> Accumulated:
    """Stream every source's shards split by split into block statistics.

    ``caches`` holds, source by source, one cache per split in ``SPLITS`` order; ``names`` are the
    blocks' names and ``widths[i]`` the widths of source ``i``'s blocks (several layers of one
    model are several blocks); ``rows`` is each split's row count, ``parts`` its number of row
    blocks (default 1); ``train_edges``: prefixes of the training rows kept for a learning curve;
    ``products``: precision of the Gram products; ``scale``: the method (default exact);
    ``spill``: a directory where each split's covariance goes once its pass is over, so that one
    split's ``D x D`` statistics are in memory at a time (one block of spans per split only).
    """
    scale = scale or ScaleSpec()
    columns, start = [], 0
    for source, group in enumerate(widths):
        offset = 0
        for width in group:
            columns.append(Column(names[start], source, offset, offset + width))
            offset, start = offset + width, start + 1
    by_split = {split: list(caches[k :: len(SPLITS)]) for k, split in enumerate(SPLITS)}
    reductions = None
    if scale.reduced:
        reductions = _first_pass(by_split["train"], columns, scale)
        dims = [r.k + r.tail for r in reductions.models.values()]
        tails = [r.tail for r in reductions.models.values()]
        blocks = layout(names, dims, tails)
        products = "float32"
    else:
        blocks = layout(names, [c.stop - c.start for c in columns])
    stats: dict[str, SpanBlockMoments] = {}
    curve: SpanBlockMoments | None = None
    spilled: dict[str, SplitMoments] = {}
    if spill is not None and (train_edges or any(p > 1 for p in parts.values())):
        raise ValueError("statistics kept per block of spans cannot be spilled")
    for split in SPLITS:
        blocked = SpanBlockMoments.empty(
            blocks, rows[split], parts.get(split, 1), products, scale.precision
        )
        if split == "train" and train_edges:
            curve = SpanBlockMoments.with_edges(
                blocks, [0, *train_edges], products, scale.precision
            )
        totals = {c.name: ColumnMoments(c.stop - c.start) for c in columns} if reductions else {}
        for row, chunk in _rows_of(by_split[split], columns, reductions, totals):
            blocked.add_rows(chunk, row)
            if curve is not None and split == "train" and row < curve.rows:
                curve.add_rows(chunk[: curve.rows - row], row)
        stats[split] = reduce_blocked(blocked)
        if reductions is not None:
            reductions.totals[split] = {n: reduce_columns(t) for n, t in totals.items()}
        if spill is not None:
            spilled[split] = spill_covariance(stats[split].total(), spill / f"{split}.npy")
    return Accumulated(stats, None if curve is None else reduce_blocked(curve), reductions, spilled)


def spill_covariance(moments: SecondMoments, path: Path) -> SplitMoments:
    """The split's mean and covariance, the covariance made in place, written to ``path`` and
    mapped back into memory (copy on write, never written back); ``moments`` are spent.

    The file is unlinked at once: the mapping keeps its pages readable until it is dropped,
    and nothing is left behind by an interrupted run."""
    split = SplitMoments.of(moments, in_place=True)
    make_directories(path.parent)
    np.save(path, split.cov)
    mean, n = split.mean, split.n
    del split  # the in-memory covariance goes before the mapping comes
    cov = np.load(path, mmap_mode="c")
    with contextlib.suppress(OSError):  # a system that cannot unlink a mapped file keeps it
        path.unlink()
    return SplitMoments(n, mean, cov)


def _rows_of(
    caches: list[Source],
    columns: list[Column],
    reductions: Reductions | None,
    totals: dict[str, ColumnMoments],
) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, chunk)``: the split's rows, full (exact) or projected (reduced)."""
    indices = owned(len(caches[0].ranges))
    if reductions is None:
        yield from _row_groups(caches, indices)
        return
    from lmalgebra.stats.principal import project

    projectors = {c.name: reductions.models[c.name].projector() for c in columns}
    for row, pieces in _shard_pieces(caches, indices):
        projected = []
        for c in columns:
            rows = pieces[c.source][:, c.start : c.stop]
            totals[c.name].update(rows)
            projected.append(project(rows, projectors[c.name]))
        yield row, np.hstack(projected)


def _first_pass(caches: list[Source], columns: list[Column], scale: ScaleSpec) -> Reductions:
    """Each block's principal coordinates from the training rows (see the module): every block's
    own second moments (``reduced``) or covariance sketch (``sketch``), streamed side by side."""
    from lmalgebra.stats.principal import OVERSAMPLE, reduce_covariance
    from lmalgebra.stats.principal import reduce_sketch as sketch_reduction

    components, retained = scale.choice()
    seeds = {c.name: scale.seed + 1000 * k for k, c in enumerate(columns)}
    streams: dict[str, SecondMoments | CovarianceSketch] = {}
    for c in columns:
        width = c.stop - c.start
        if scale.method == "reduced":
            streams[c.name] = SecondMoments(layout([c.name], [width]), products="float32")
        else:
            size = (components or 0) + OVERSAMPLE
            streams[c.name] = CovarianceSketch.empty(width, size, seeds[c.name])
    for _, pieces in _shard_pieces(caches, owned(len(caches[0].ranges))):
        for c in columns:
            streams[c.name].update(pieces[c.source][:, c.start : c.stop])
    models = {}
    for c in columns:  # one block's statistics at a time are made into its reduction
        stream = streams.pop(c.name)
        choice = (components, retained, scale.probes, seeds[c.name])
        if isinstance(stream, SecondMoments):
            total = reduce_moments(stream)
            mean, covariance = total.mean(), total.covariance(in_place=True)
            refuse_constant(c.name, float(np.trace(covariance)))
            models[c.name] = reduce_covariance(c.name, mean, covariance, *choice)
        else:
            sketch = reduce_sketch(stream)
            columns_of = sketch.columns
            mean, total_variance = columns_of.mean(), columns_of.total_variance()
            refuse_constant(c.name, total_variance)
            models[c.name] = sketch_reduction(
                c.name, mean, sketch.sketch(), sketch.test, total_variance, *choice
            )
    return Reductions(models, method=scale.method)


def _shard_pieces(
    caches: list[Source], indices: Sequence[int]
) -> Iterator[tuple[int, tuple[np.ndarray, ...]]]:
    """``(first row, one piece per source)`` for each shard ``indices`` (read side by side)."""
    ranges = caches[0].ranges
    pieces_of = zip(*(c.chunks(indices) for c in caches), strict=True)
    for index, pieces in zip(indices, pieces_of, strict=True):
        yield ranges[index][0], pieces


def _row_groups(caches: list[Source], indices: Sequence[int]) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, (rows, D) chunk)``: the shards ``indices`` of every source side by side,
    consecutive shards joined up to ``GROUP_ROWS`` rows and ``GROUP_BYTES`` (each update then
    mirrors its Gram once).

    Every chunk is a view of one buffer, overwritten by the next: it must not be kept (the
    statistics copy what they need), and a large buffer is not faulted in again per chunk.
    """
    width = sum(c.dim for c in caches)
    limit = max(1, min(GROUP_ROWS, GROUP_BYTES // (4 * max(width, 1))))
    ranges = caches[0].ranges
    group: list[tuple[int, tuple[np.ndarray, ...]]] = []
    buffer = np.empty((0, 0), np.float32)
    pieces_of = zip(*(c.chunks(indices) for c in caches), strict=True)
    for index, pieces in zip(indices, pieces_of, strict=True):
        if group and (index != group[-1][0] + 1 or _rows(group) >= limit):
            buffer = _joined(group, buffer)
            yield ranges[group[0][0]][0], buffer[: _rows(group)]
            group = []
        group.append((index, pieces))
    if group:
        buffer = _joined(group, buffer)
        yield ranges[group[0][0]][0], buffer[: _rows(group)]


def _rows(group: list[tuple[int, tuple[np.ndarray, ...]]]) -> int:
    return sum(len(pieces[0]) for _, pieces in group)


def _joined(group: list[tuple[int, tuple[np.ndarray, ...]]], buffer: np.ndarray) -> np.ndarray:
    """The group's rows (shards stacked) and columns (sources side by side) at the top of
    ``buffer``, or of a new buffer where it is too small or of another dtype."""
    first = group[0][1]
    widths = np.cumsum([0, *(p.shape[1] for p in first)])
    shape, dtype = (_rows(group), int(widths[-1])), np.result_type(*first)
    if buffer.shape[0] < shape[0] or buffer.shape[1] != shape[1] or buffer.dtype != dtype:
        buffer = np.empty(shape, dtype)
    row = 0
    for _, pieces in group:
        for piece, a, b in zip(pieces, widths[:-1], widths[1:], strict=True):
            buffer[row : row + len(piece), a:b] = piece
        row += len(pieces[0])
    return buffer
