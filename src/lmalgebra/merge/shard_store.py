"""Sharded Arrow IPC tables with a manifest of checksums: atomic writes, resumption, verification.

A shard set is a directory of ``shard-NNNNN.arrow`` files (Arrow IPC file format, memory-mapped on
read) and a ``manifest.json`` holding the key that produced them, each shard's row count, byte size
and sha256, and whether the set is complete. Each shard is written to a temporary file, fsynced and
renamed, and only then recorded in the manifest, so a run killed at any point resumes after the last
recorded shard and a finished set is byte-for-byte what an uninterrupted run writes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from lmalgebra.atomic import write_atomic, write_json_atomic
from lmalgebra.errors import UserInputError
from lmalgebra.fingerprint import sha256_file

MANIFEST = "manifest.json"


class ShardSet:
    """Shards of one table under ``directory``, produced by ``key`` (a JSON-able description)."""

    def __init__(self, directory: Path, key: dict[str, Any] | None):
        self.directory = directory
        self.key = key
        self.manifest = self._load()

    @classmethod
    def existing(cls, directory: Path) -> ShardSet:
        """The shard set in ``directory`` as its manifest describes it (for inspection)."""
        shards = cls(directory, None)
        shards.key = shards.manifest.get("key")
        return shards

    def _load(self) -> dict[str, Any]:
        path = self.directory / MANIFEST
        fresh: dict[str, Any] = {"key": self.key, "shards": [], "complete": False}
        if not path.is_file():
            return fresh
        try:
            manifest = json.loads(path.read_text())
        except json.JSONDecodeError:
            return fresh
        return dict(manifest) if self.key is None or manifest.get("key") == self.key else fresh

    @property
    def complete(self) -> bool:
        return bool(self.manifest["complete"])

    def _path(self, index: int) -> Path:
        return self.directory / f"shard-{index:05d}.arrow"

    def verified_count(self) -> int:
        """How many leading recorded shards exist on disk with the recorded checksum."""
        count = 0
        for index, entry in enumerate(self.manifest["shards"]):
            path = self._path(index)
            if not path.is_file() or sha256_file(path) != entry["sha256"]:
                break
            count += 1
        return count

    def resume_point(self) -> int:
        """Drop records from the first bad shard on; return the number of shards to keep."""
        keep = self.verified_count()
        if keep < len(self.manifest["shards"]):
            self.manifest["shards"] = self.manifest["shards"][:keep]
            self.manifest["complete"] = False
        return keep

    def write(self, index: int, table: pa.Table, **extra: Any) -> None:
        """Write shard ``index`` (the next one) atomically, then record it."""
        if index != len(self.manifest["shards"]):
            raise RuntimeError(f"shard {index} written out of order")
        path = self._path(index)

        def write_ipc(tmp: Path) -> None:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)

        write_atomic(path, write_ipc)
        self.manifest["shards"].append(
            {
                "file": path.name,
                "rows": table.num_rows,
                "bytes": path.stat().st_size,
                "sha256": sha256_file(path),
                **extra,
            }
        )
        write_json_atomic(self.directory / MANIFEST, self.manifest)

    def finish(self, **summary: Any) -> None:
        self.manifest.update(summary, complete=True)
        write_json_atomic(self.directory / MANIFEST, self.manifest)

    def read(self, index: int, verify: bool = True) -> pa.Table:
        """Shard ``index``, memory-mapped; raises naming the shard if it fails its checksum."""
        path = self._path(index)
        entry = self.manifest["shards"][index]
        if not path.is_file():
            raise UserInputError(f"store shard {path} is missing")
        if verify and sha256_file(path) != entry["sha256"]:
            raise UserInputError(f"store shard {path} is corrupt (checksum mismatch)")
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()

    def tables(self, verify: bool = True) -> list[pa.Table]:
        return [self.read(i, verify) for i in range(len(self.manifest["shards"]))]

    def problems(self) -> list[str]:
        """Every missing or corrupt shard, and an incomplete set, as messages naming the file."""
        issues = []
        if not (self.directory / MANIFEST).is_file():
            return [f"{self.directory}: no manifest"]
        for index, entry in enumerate(self.manifest["shards"]):
            path = self._path(index)
            if not path.is_file():
                issues.append(f"{path}: missing")
            elif sha256_file(path) != entry["sha256"]:
                issues.append(f"{path}: corrupt (checksum mismatch)")
        if not self.complete:
            issues.append(f"{self.directory}: incomplete (run the stage again to finish it)")
        return issues

    @property
    def rows(self) -> int:
        return sum(int(s["rows"]) for s in self.manifest["shards"])

    @property
    def nbytes(self) -> int:
        return sum(int(s["bytes"]) for s in self.manifest["shards"])
