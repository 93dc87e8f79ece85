"""On-disk cache of one model's embeddings of one split, in checksummed safetensors shards.

The cache directory is named by a hash of everything that changes the numbers (model weights,
tokenizer and config hashes, the exact span texts, layer, pooling, dtype, length limit). Shards
cover fixed row ranges in corpus order; each is written atomically and recorded with its sha256 in
``manifest.json`` before the next starts, so an interrupted run resumes at the first missing shard.
A shard whose checksum does not match is never used: it is reported and recomputed.

Under several processes (``lmalgebra.distributed``) rank ``r`` computes the shards ``i`` with
``i % size == r`` and records them in its own manifest part; after a barrier the main rank merges
the parts into ``manifest.json``. Parts left by an interrupted run are read back on resumption,
whatever the number of processes then.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save_file

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file, sha256_json
from lmalgebra.distributed import all_reduce_sum, barrier, owned, world
from lmalgebra.lmd.embed import TokenReport
from lmalgebra.storage.atomic import write_atomic, write_json_atomic
from lmalgebra.storage.manifest_parts import part_path, read_parts, remove_parts

log = logging.getLogger(__name__)

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

    def _manifest(self) -> dict[str, Any]:
        fresh = {"key": self.key, "rows": len(self.texts), "shards": {}, "complete": False}
        if not self.manifest_path.is_file():
            return fresh
        try:
            manifest = json.loads(self.manifest_path.read_text())
        except json.JSONDecodeError:
            log.warning("cache manifest %s is corrupt; recomputing this entry", self.manifest_path)
            return fresh
        if manifest.get("key") != self.key or manifest.get("rows") != len(self.texts):
            log.warning("cache entry %s does not match its key; recomputing it", self.dir)
            return fresh
        return dict(manifest)

    def _valid(self, manifest: dict[str, Any], name: str, rows: tuple[int, int]) -> bool:
        entry = manifest["shards"].get(name)
        if entry is None or tuple(entry["rows"]) != rows:
            return False
        path = self.dir / name
        if path.is_file() and sha256_file(path) == entry["sha256"]:
            return True
        log.warning("cache shard %s is missing or fails its checksum; recomputing it", path)
        return False

    def _names(self) -> list[tuple[str, tuple[int, int]]]:
        return [(f"shard-{i:05d}.safetensors", r) for i, r in enumerate(self.ranges)]

    def _compute(self, compute: Compute, a: int, b: int, name: str) -> dict[str, Any]:
        """Embed rows ``[a, b)``, write them as shard ``name``; the shard's manifest record."""
        vectors, report = compute(self.texts[a:b])
        if not np.isfinite(vectors).all():
            raise UserInputError(
                f"non-finite (NaN/inf) embeddings in rows {a}..{b} "
                f"of {self.key.get('model', 'a model')}"
            )
        path = self.dir / name
        _save_shard(path, vectors)
        return {
            "rows": [a, b],
            "sha256": sha256_file(path),
            "dim": int(vectors.shape[1]),
            "tokens": report.mean_tokens * report.spans,
            "truncated": report.truncated,
        }

    def _parts(self) -> list[dict[str, Any]]:
        """Manifest parts left by ranks of an interrupted multi-process run of this entry."""
        return read_parts(self.manifest_path, {"key": self.key, "rows": len(self.texts)})

    def ensure(
        self, compute: Compute, progress: Callable[[int], None] | None = None
    ) -> TokenReport:
        """Compute every missing or damaged shard; return the token report over all rows.

        Under several processes each rank computes the shards it owns (``i % size == rank``) and
        records them in its own manifest part; the main rank then writes the manifest.
        Collective: every rank must call it for the same entries in the same order.
        """
        rank, size = world()
        if size > 1:
            return self._ensure_shared(compute, progress, rank, size)
        manifest = self._manifest()
        parts = self._parts()
        if parts:  # left by an interrupted multi-process run: their records are the newest
            shards = manifest["shards"]
            for part in parts:
                shards.update(part["shards"])
            write_json_atomic(self.manifest_path, manifest)
            remove_parts(self.manifest_path)
        names = self._names()
        if manifest["complete"] and all(self._valid(manifest, n, r) for n, r in names):
            if progress is not None:
                progress(len(self.texts))
            return _report(manifest)
        manifest["complete"] = False
        self.dir.mkdir(parents=True, exist_ok=True)
        for name, (a, b) in names:
            if not self._valid(manifest, name, (a, b)):
                manifest["shards"][name] = self._compute(compute, a, b, name)
                write_json_atomic(self.manifest_path, manifest)
            if progress is not None:
                progress(b - a)
        manifest["complete"] = True
        recorded = manifest["shards"]  # in row order, also after resuming from parts
        manifest["shards"] = {name: recorded[name] for name, _ in names}
        write_json_atomic(self.manifest_path, manifest)
        return _report(manifest)

    def _ensure_shared(
        self, compute: Compute, progress: Callable[[int], None] | None, rank: int, size: int
    ) -> TokenReport:
        manifest = self._manifest()
        parts = self._parts()
        for part in parts:
            manifest["shards"].update(part["shards"])
        names = self._names()
        mine = [names[i] for i in owned(len(names))]
        kept = {n: manifest["shards"][n] for n, r in mine if self._valid(manifest, n, r)}
        missing, found = all_reduce_sum(np.array([len(mine) - len(kept), len(parts)]))
        advance = progress or (lambda rows: None)
        if manifest["complete"] and missing == 0 and found == 0:
            advance(len(self.texts))
            return _report(manifest)
        self.dir.mkdir(parents=True, exist_ok=True)
        barrier()  # every rank has read the old parts before any part is rewritten
        part = {"key": self.key, "rows": len(self.texts), "shards": kept}
        own_part = part_path(self.manifest_path, rank)
        write_json_atomic(own_part, part)
        advance(len(self.texts) - sum(b - a for n, (a, b) in mine if n not in kept))
        for name, (a, b) in mine:
            if name not in kept:
                part["shards"][name] = self._compute(compute, a, b, name)
                write_json_atomic(own_part, part)
                advance(b - a)
        barrier()
        if rank == 0:
            self._merge_parts(names, size)
        barrier()
        return _report(self._manifest())

    def _merge_parts(self, names: list[tuple[str, tuple[int, int]]], size: int) -> None:
        """Main rank: the manifest from the parts of ranks ``0..size-1``, then no parts."""
        parts = [json.loads(part_path(self.manifest_path, r).read_text()) for r in range(size)]
        shards = {name: parts[i % size]["shards"][name] for i, (name, _) in enumerate(names)}
        manifest = {"key": self.key, "rows": len(self.texts), "shards": shards, "complete": True}
        write_json_atomic(self.manifest_path, manifest)
        remove_parts(self.manifest_path)

    @property
    def dim(self) -> int:
        """Embedding width, from the manifest of a complete entry."""
        shards = self._manifest()["shards"]
        if not shards:
            raise RuntimeError(f"cache entry {self.dir} holds no shard")
        return int(next(iter(shards.values()))["dim"])

    def chunks(self, indices: Iterable[int] | None = None) -> Iterator[np.ndarray]:
        """Shard arrays ``(rows, dim) float32`` in row order, each verified before use.

        ``indices``: only these shards (in the order given), e.g. ``distributed.owned(...)``.
        """
        manifest = self._manifest()
        if not manifest["complete"]:
            raise RuntimeError(f"cache entry {self.dir} is incomplete")
        ranges = self.ranges
        for index in range(len(ranges)) if indices is None else indices:
            name = f"shard-{index:05d}.safetensors"
            if not self._valid(manifest, name, ranges[index]):
                raise UserInputError(
                    f"cache shard {self.dir / name} is corrupt; run again to repair it"
                )
            yield load_file(str(self.dir / name))["embeddings"]


def _save_shard(path: Path, vectors: np.ndarray) -> None:
    def write(tmp: Path) -> None:
        save_file({"embeddings": vectors}, str(tmp))

    write_atomic(path, write)


def _report(manifest: dict[str, Any]) -> TokenReport:
    shards = manifest["shards"].values()
    rows = manifest["rows"]
    tokens = sum(s["tokens"] for s in shards)
    return TokenReport(tokens / rows if rows else 0.0, sum(s["truncated"] for s in shards), rows)
