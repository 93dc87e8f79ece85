"""Sharded Arrow IPC tables with a manifest of checksums: atomic writes, resumption, verification.

A shard set is a directory of ``shard-NNNNN.arrow`` files (Arrow IPC file format, memory-mapped on
read) and a ``manifest.json`` holding the key that produced them, each shard's row count, byte size
and sha256, and whether the set is complete. Each shard is written to a temporary file, fsynced and
renamed, and only then recorded in the manifest, so a run killed at any point resumes after the last
recorded shard and a finished set is byte-for-byte what an uninterrupted run writes.

Under several processes (``lmalgebra.distributed``) ``plan`` gives each rank the missing shards it
owns (``index % size == rank``); a rank records what it writes in its own manifest part, and
``finish`` has the main rank assemble the manifest from the parts after a barrier, so no two
processes ever write one file. Parts left by an interrupted run are read back on resumption.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.distributed import all_reduce_sum, barrier, owned, world
from lmalgebra.storage.atomic import write_atomic, write_json_atomic
from lmalgebra.storage.manifest_parts import part_path, read_parts, remove_parts

MANIFEST = "manifest.json"


class ShardSet:
    """Shards of one table under ``directory``, produced by ``key`` (a JSON-able description)."""

    def __init__(self, directory: Path, key: dict[str, Any] | None):
        self.directory = directory
        self.key = key
        self.manifest = self._load()
        self._part: dict[str, Any] | None = None  # this rank's records, in a multi-process run
        self._planned = 0  # shards in the set, as ``plan`` was told

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
        """Write shard ``index`` atomically, then record it.

        In one process shards come in order and go straight into the manifest; after ``plan``
        in a multi-process run, any shard this rank owns, recorded in its manifest part.
        """
        listed = self.manifest["shards"]
        if self._part is None and index > len(listed):
            raise RuntimeError(f"shard {index} written out of order")
        path = self._path(index)

        def write_ipc(tmp: Path) -> None:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)

        write_atomic(path, write_ipc)
        entry = {
            "file": path.name,
            "rows": table.num_rows,
            "bytes": path.stat().st_size,
            "sha256": sha256_file(path),
            **extra,
        }
        if self._part is not None:
            self._part["shards"][str(index)] = entry
            write_json_atomic(part_path(self._manifest_path, world()[0]), self._part)
            return
        if index < len(listed):
            listed[index] = entry  # a damaged shard, redone in place
        else:
            listed.append(entry)
        write_json_atomic(self._manifest_path, self.manifest)

    def finish(self, **summary: Any) -> None:
        """Mark the set complete, with ``summary`` in its manifest (collective after ``plan``)."""
        if self._part is not None:
            self._finish_shared(summary)
            return
        self.manifest.update(summary, complete=True)
        write_json_atomic(self._manifest_path, self.manifest)
        remove_parts(self._manifest_path)

    @property
    def _manifest_path(self) -> Path:
        return self.directory / MANIFEST

    def _intact(self, index: int, entry: dict[str, Any]) -> bool:
        path = self._path(index)
        return path.is_file() and sha256_file(path) == entry["sha256"]

    def _part_records(self) -> dict[int, dict[str, Any]]:
        """Records in the manifest parts of an interrupted multi-process run (any rank count)."""
        records: dict[int, dict[str, Any]] = {}
        for part in read_parts(self._manifest_path, {"key": self.key}):
            records.update({int(i): e for i, e in part["shards"].items()})
        return records

    def plan(self, count: int) -> list[int]:
        """Indices of the shards of ``range(count)`` this process must (re)compute, in order.

        Empty, with ``complete`` True, when the set is complete and intact. In one process this
        is every missing or damaged shard (after folding in parts an interrupted multi-process
        run left); intact ones are kept. Under several processes it is collective: each rank
        verifies and lists only the shards it owns, and later ``write``s go to its manifest part.
        """
        rank, size = world()
        found = self._part_records()
        if size == 1:
            if found:  # fold them in: the manifest alone must describe the set from here on
                listed = self.manifest["shards"]
                for index, entry in sorted(found.items()):
                    if index < len(listed):
                        listed[index] = entry
                    elif index == len(listed):
                        listed.append(entry)
                write_json_atomic(self._manifest_path, self.manifest)
                remove_parts(self._manifest_path)
            return self._damaged_and_missing(count)
        records = {**dict(enumerate(self.manifest["shards"])), **found}
        mine = owned(count)
        kept = {i: records[i] for i in mine if i in records and self._intact(i, records[i])}
        missing, parts = all_reduce_sum(np.array([len(mine) - len(kept), len(found)]))
        if self.complete and missing == 0 and parts == 0:
            return []
        self.manifest["complete"] = False
        self.directory.mkdir(parents=True, exist_ok=True)
        barrier()  # every rank has read the old parts before any part is rewritten
        self._part = {"key": self.key, "shards": {str(i): e for i, e in kept.items()}}
        self._planned = count
        write_json_atomic(part_path(self._manifest_path, rank), self._part)
        return [i for i in mine if i not in kept]

    def _damaged_and_missing(self, count: int) -> list[int]:
        """One process: recorded shards that are missing or fail their checksum, then the rest.

        A damaged set is marked incomplete on disk at once, so it never looks complete again
        until every damaged shard is redone; intact shards are kept as they are.
        """
        listed = self.manifest["shards"]
        damaged = [i for i, entry in enumerate(listed) if not self._intact(i, entry)]
        todo = damaged + list(range(len(listed), count))
        if todo and self.complete:
            self.manifest["complete"] = False
            write_json_atomic(self._manifest_path, self.manifest)
        return [] if self.complete else todo

    def _finish_shared(self, summary: dict[str, Any]) -> None:
        rank, size = world()
        barrier()  # every rank has recorded its shards
        if rank == 0:
            parts = [
                json.loads(part_path(self._manifest_path, r).read_text())["shards"]
                for r in range(size)
            ]
            self.manifest["shards"] = [parts[i % size][str(i)] for i in range(self._planned)]
            self.manifest.update(summary, complete=True)
            write_json_atomic(self._manifest_path, self.manifest)
            remove_parts(self._manifest_path)
        barrier()  # the manifest is written
        self._part = None
        self.manifest = self._load()

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
