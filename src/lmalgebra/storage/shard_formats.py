"""What a shard file holds, and how it is written, read and described in its manifest record.

Two payloads: Arrow tables (IPC file format, memory-mapped on read), the teacher store's shards;
and row blocks of named arrays in safetensors, the embedding cache's shards. A payload is encoded
to its file's bytes in memory and a file is read into one buffer, so the shard set hashes the
very bytes it writes or decodes: no shard is read twice to be checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeAlias

import numpy as np
import pyarrow as pa
from safetensors.numpy import load, save

Bytes: TypeAlias = "bytes | pa.Buffer"  # what hashlib and file writes take (buffer protocol)


class ShardFormat(Protocol):
    """One kind of shard file, as ``lmalgebra.storage.shard_set.ShardSet`` writes and reads it."""

    suffix: str  # the file name's ending, e.g. ".arrow"

    def encode(self, payload: Any) -> Bytes:
        """The bytes of the file holding ``payload``."""
        ...

    def read(self, path: Path) -> Bytes:
        """The bytes of the file ``path``, read once (memory-mapped where the format allows)."""
        ...

    def decode(self, data: Bytes, record: dict[str, Any]) -> Any:
        """The payload of a verified file's bytes ``data``, recorded in the manifest as
        ``record``."""
        ...

    def describe(self, path: Path, payload: Any) -> dict[str, Any]:
        """The record fields that come before the shard's sha256 in its manifest entry."""
        ...


class ArrowTables:
    """``pa.Table`` shards; records hold the file name, row count and byte size."""

    suffix = ".arrow"

    def encode(self, payload: pa.Table) -> Bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, payload.schema) as writer:
            writer.write_table(payload)
        return sink.getvalue()

    def size(self, payload: pa.Table) -> int:
        """The bytes a shard of ``payload`` takes (encoded in memory, not written)."""
        return len(self.encode(payload))

    def read(self, path: Path) -> Bytes:
        with pa.memory_map(str(path)) as mapped:  # the buffer keeps the mapping alive
            return mapped.read_buffer()

    def decode(self, data: Bytes, record: dict[str, Any]) -> pa.Table:
        return pa.ipc.open_file(pa.BufferReader(data)).read_all()

    def describe(self, path: Path, payload: pa.Table) -> dict[str, Any]:
        return {"file": path.name, "rows": payload.num_rows, "bytes": path.stat().st_size}


@dataclass(frozen=True)
class RowBlock:
    """Rows ``[first, first + n)`` of a larger matrix: named arrays of ``n`` rows each."""

    first: int
    arrays: dict[str, np.ndarray]

    @property
    def stop(self) -> int:
        return self.first + len(next(iter(self.arrays.values())))


class SafetensorsRows:
    """``RowBlock`` shards in safetensors files; records hold the row range ``[first, stop]``."""

    suffix = ".safetensors"

    def encode(self, payload: RowBlock) -> Bytes:
        return save(payload.arrays)

    def read(self, path: Path) -> Bytes:
        return path.read_bytes()

    def decode(self, data: Bytes, record: dict[str, Any]) -> RowBlock:
        return RowBlock(int(record["rows"][0]), load(bytes(data)))

    def describe(self, path: Path, payload: RowBlock) -> dict[str, Any]:
        return {"rows": [payload.first, payload.stop]}


ARROW_TABLES = ArrowTables()
SAFETENSORS_ROWS = SafetensorsRows()
