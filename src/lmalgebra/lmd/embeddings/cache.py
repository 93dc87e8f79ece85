"""On-disk cache of one model's embeddings of one split, a shard set of safetensors row blocks.

The cache directory is named by a hash of everything that changes the numbers (model weights,
tokenizer and config hashes, the exact span texts, layer, pooling, dtype, length limit). Shards
cover fixed row ranges in corpus order; their manifest records, besides each shard's row range
and sha256, the embedding width and the token counts of its spans. Writing, checksums,
resumption and the sharing of shards between ranks (``i % size == rank``) belong to
``lmalgebra.storage.shard_set``: an interrupted run resumes at the missing shards, and a shard
whose checksum does not match is never used: it is reported and recomputed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.sources.embed_spec import TokenReport
from lmalgebra.storage.shard_formats import SAFETENSORS_ROWS, RowBlock
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.storage.split_archive import clear_misplaced

FORMAT = 1
Compute = Callable[[list[str]], tuple[np.ndarray, TokenReport]]


class EmbeddingCache:
    """Embeddings ``(rows, dim) float32`` of ``texts`` by one model, cached under ``root``.

    Args:
        root: cache root directory.
        key: JSON-able description of everything that changes the numbers.
        texts: the spans, in corpus order.
        shard_rows: rows per shard (the unit of resumption and of streaming reads).
    """

    def __init__(self, root: Path, key: dict[str, Any], texts: list[str], shard_rows: int = 2048):
        self.key = {"format": FORMAT, "shard_rows": shard_rows, **key}
        digest = sha256_json(self.key)
        self.dir = root / digest[:2] / digest
        self.texts = texts
        self.shard_rows = shard_rows
        self.manifest_path = self.dir / "manifest.json"

    @property
    def ranges(self) -> list[tuple[int, int]]:
        n = len(self.texts)
        return [(a, min(a + self.shard_rows, n)) for a in range(0, n, self.shard_rows)]

    def _shards(self) -> ShardSet:
        """The entry's shard set as it stands on disk now (another process may have finished it)."""
        return ShardSet(
            self.dir,
            self.key,
            SAFETENSORS_ROWS,
            header={"rows": len(self.texts)},
            by_name=True,
            label="cache",
        )

    def ensure(
        self, compute: Compute, progress: Callable[[int], None] | None = None
    ) -> TokenReport:
        """Compute every missing or damaged shard; return the token report over all rows.

        Under several processes each rank computes the shards it owns (``i % size == rank``) and
        records them in its own manifest part; the main rank then writes the manifest.
        Collective: every rank must call it for the same entries in the same order.
        """
        advance = progress or (lambda rows: None)
        self._clear_misplaced()
        shards = self._shards()
        ranges = self.ranges
        todo = shards.plan(len(ranges))
        advance(len(self.texts) - sum(ranges[i][1] - ranges[i][0] for i in todo))
        if shards.complete:
            return _report(shards)
        for index in todo:
            a, b = ranges[index]
            vectors, report = compute(self.texts[a:b])
            if not np.isfinite(vectors).all():
                raise UserInputError(
                    f"non-finite (NaN/inf) embeddings in rows {a}..{b} "
                    f"of {self.key.get('model', 'a model')}"
                )
            shards.write(
                index,
                RowBlock(a, {"embeddings": vectors}),
                dim=int(vectors.shape[1]),
                tokens=report.mean_tokens * report.spans,
                truncated=report.truncated,
            )
            advance(b - a)
        shards.finish()
        return _report(shards)

    def _clear_misplaced(self) -> None:
        """What no writer of the cache leaves in the entry's place (its directory or the one
        above a file, a link to nothing; a FIFO, a directory or a link in a file's place) moved
        aside, so the entry is built again: the run had refused it, which its dry run, writing
        nothing, had passed."""
        for directory in (self.dir.parent, self.dir):
            clear_misplaced(directory, True, "embedding cache entry")
        if self.dir.is_dir():
            for path in self.dir.iterdir():
                clear_misplaced(path, False, "embedding cache file")

    @property
    def dim(self) -> int:
        """Embedding width, from the manifest of a complete entry."""
        records = self._shards().records
        if not records:
            raise RuntimeError(f"cache entry {self.dir} holds no shard")
        return int(records[min(records)]["dim"])

    def chunks(self, indices: Iterable[int] | None = None) -> Iterator[np.ndarray]:
        """Shard arrays ``(rows, dim) float32`` in row order, each verified before use.

        ``indices``: only these shards (in the order given), e.g. ``distributed.owned(...)``.
        """
        shards = self._shards()
        if not shards.complete:
            for index in shards.damaged():  # damage is why: name the shard
                shards.read(index)
            raise RuntimeError(f"cache entry {self.dir} is incomplete")
        for index in range(len(self.ranges)) if indices is None else indices:
            yield shards.read(index).arrays["embeddings"]


def _report(shards: ShardSet) -> TokenReport:
    records = [shards.records[i] for i in sorted(shards.records)]
    rows = int(shards.header["rows"])
    tokens = sum(r["tokens"] for r in records)
    return TokenReport(tokens / rows if rows else 0.0, sum(r["truncated"] for r in records), rows)
