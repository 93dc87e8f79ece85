"""Second moments kept per block of consecutive spans, so resampling and subsetting need no data.

A split's rows (spans, in corpus order) are cut into ``parts`` contiguous row ranges of near-equal
size. Each range keeps its own :class:`SecondMoments`; their sum is the split's statistics. Sums of
chosen parts give the statistics of any union of blocks: a bootstrap replicate (blocks drawn with
replacement, each counted as often as it is drawn), a cross-validation fold, or a prefix of the
training set. Spans of one document are adjacent, so a block keeps them together.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import read_record
from lmalgebra.stats.moments import (
    ModelColumns,
    Precision,
    Products,
    SecondMoments,
    block_entry,
    layout,
)
from lmalgebra.storage.atomic import make_directories, write_text_atomic


def block_edges(rows: int, parts: int) -> list[int]:
    """Row boundaries of ``parts`` contiguous blocks over ``rows`` rows (fewer if rows < parts)."""
    parts = max(1, min(parts, rows))
    return [int(e) for e in np.linspace(0, rows, parts + 1).round().astype(int)]


@dataclass
class SpanBlockMoments:
    """Statistics of one split, per contiguous block of rows.

    Attributes:
        blocks: the model layout (column blocks) shared by every part.
        edges: ``parts + 1`` row boundaries; part ``p`` holds rows ``[edges[p], edges[p+1])``.
        parts: one :class:`SecondMoments` per block of rows.
    """

    blocks: list[ModelColumns]
    edges: list[int]
    parts: list[SecondMoments]

    @classmethod
    def empty(
        cls,
        blocks: Sequence[ModelColumns],
        rows: int,
        parts: int,
        products: Products = "float64",
        precision: Precision = "float64",
    ) -> SpanBlockMoments:
        """``parts`` near-equal blocks over ``rows`` rows; ``products``, ``precision``: see
        ``SecondMoments``."""
        return cls.with_edges(blocks, block_edges(rows, parts), products, precision)

    @classmethod
    def with_edges(
        cls,
        blocks: Sequence[ModelColumns],
        edges: Sequence[int],
        products: Products = "float64",
        precision: Precision = "float64",
    ) -> SpanBlockMoments:
        """Blocks with the given increasing row boundaries (``edges[0] == 0``)."""
        edges = [int(e) for e in edges]
        if edges[0] != 0 or any(b <= a for a, b in itertools.pairwise(edges)):
            raise ValueError(f"block edges must start at 0 and increase: {edges}")
        parts = [
            SecondMoments(list(blocks), products=products, precision=precision) for _ in edges[1:]
        ]
        return cls(list(blocks), edges, parts)

    @property
    def rows(self) -> int:
        return self.edges[-1]

    def add_rows(self, chunk: np.ndarray, first_row: int) -> None:
        """Add rows ``first_row .. first_row + len(chunk)`` of the split. ``chunk``: ``(r, D)``."""
        last = first_row + chunk.shape[0]
        if first_row < 0 or last > self.rows:
            raise ValueError(f"rows {first_row}..{last} outside the split's {self.rows} rows")
        for p, (a, b) in enumerate(zip(self.edges[:-1], self.edges[1:], strict=True)):
            lo, hi = max(a, first_row), min(b, last)
            if lo < hi:
                self.parts[p].update(chunk[lo - first_row : hi - first_row])

    def total(self) -> SecondMoments:
        """Statistics of every row of the split (the part itself when there is one block)."""
        if len(self.parts) == 1:
            return self.parts[0]
        return self.combine(np.ones(len(self.parts)))

    def combine(self, counts: Sequence[float] | np.ndarray) -> SecondMoments:
        """Statistics of a union of blocks, block ``p`` counted ``counts[p]`` times (0: left out).

        Counts may be any non-negative integers (a bootstrap replicate draws blocks with
        replacement). All parts are moved to one common shift before adding, exactly.
        """
        counts = np.asarray(counts, dtype=float)
        if counts.shape != (len(self.parts),) or (counts < 0).any():
            raise ValueError(f"need {len(self.parts)} non-negative counts, got {counts.shape}")
        used = [(c, m) for c, m in zip(counts, self.parts, strict=True) if c > 0 and m.n > 0]
        if not used:
            return SecondMoments(list(self.blocks))
        shift = used[0][1].shift
        n, sums = 0, np.zeros_like(shift)
        gram = np.zeros((shift.size, shift.size))
        for c, m in used:
            moved = m.shifted_to(shift)
            n += round(c * m.n)
            sums += c * moved.sums
            gram += c * moved.gram
        return SecondMoments(list(self.blocks), n, shift.copy(), sums, gram)

    def prefix(self, parts: int) -> SecondMoments:
        """Statistics of the first ``parts`` blocks (a training set of ``edges[parts]`` rows)."""
        counts = np.zeros(len(self.parts))
        counts[:parts] = 1
        return self.combine(counts)

    def subset(self, names: Sequence[str]) -> SpanBlockMoments:
        """The same blocks of rows over only the models ``names`` (in that order)."""
        by_name = {b.name: b for b in self.blocks}
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise UserInputError(f"model {unknown[0]!r} is not among the block statistics")
        cols = np.concatenate([np.arange(by_name[n].start, by_name[n].stop) for n in names])
        blocks = layout(
            list(names), [by_name[n].dim for n in names], [by_name[n].tail for n in names]
        )
        parts = [
            SecondMoments(blocks, m.n, m.shift[cols], m.sums[cols], m.gram[np.ix_(cols, cols)])
            if m.n > 0
            else SecondMoments(blocks)
            for m in self.parts
        ]
        return SpanBlockMoments(blocks, list(self.edges), parts)

    def save(self, directory: Path) -> None:
        """One safetensors file per part plus ``blocks.json`` (layout and edges), written last."""
        make_directories(directory)
        for p, part in enumerate(self.parts):
            part.save(directory / f"part-{p:04d}.safetensors")
        meta = {"edges": self.edges, "blocks": [block_entry(b) for b in self.blocks]}
        text = json.dumps(meta, indent=1)
        write_text_atomic(directory / "blocks.json", text)

    @classmethod
    def load(cls, directory: Path) -> SpanBlockMoments:
        index = directory / "blocks.json"
        try:
            meta = json.loads(read_record(index))
        except (OSError, json.JSONDecodeError) as err:
            raise UserInputError(f"block statistics index {index} is unreadable: {err}") from err
        blocks = [ModelColumns(*entry) for entry in meta["blocks"]]
        parts = [
            SecondMoments.load(directory / f"part-{p:04d}.safetensors")
            for p in range(len(meta["edges"]) - 1)
        ]
        return cls(blocks, list(meta["edges"]), parts)
