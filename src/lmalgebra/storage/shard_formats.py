"""What a shard file holds, and how it is written, read and described in its manifest record.

Two payloads: Arrow tables (IPC file format, memory-mapped on read), the teacher store's shards;
and row blocks of named arrays in safetensors, the embedding cache's shards.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from safetensors.numpy import load_file, save_file


class ShardFormat(Protocol):
    """One kind of shard file, as ``lmalgebra.storage.shard_set.ShardSet`` writes and reads it."""

    suffix: str  # the file name's ending, e.g. ".arrow"

    def save(self, path: Path, payload: Any) -> None:
        """Write ``payload`` to ``path`` (a temporary file, renamed into place afterwards)."""
        ...

    def load(self, path: Path, record: dict[str, Any]) -> Any:
        """The payload of the verified shard ``path``, recorded in the manifest as ``record``."""
        ...

    def describe(self, path: Path, payload: Any) -> dict[str, Any]:
        """The record fields that come before the shard's sha256 in its manifest entry."""
        ...


class ArrowTables:
    """``pa.Table`` shards; records hold the file name, row count and byte size."""

    suffix = ".arrow"

    def save(self, path: Path, payload: pa.Table) -> None:
        with pa.OSFile(str(path), "wb") as sink:
            self._write(sink, payload)

    def size(self, payload: pa.Table) -> int:
        """The bytes ``save`` writes for ``payload`` (written to memory, not to a file)."""
        sink = pa.BufferOutputStream()
        self._write(sink, payload)
        return int(sink.getvalue().size)

    @staticmethod
    def _write(sink: Any, payload: pa.Table) -> None:
        with pa.ipc.new_file(sink, payload.schema) as writer:
            writer.write_table(payload)

    def load(self, path: Path, record: dict[str, Any]) -> pa.Table:
        return pa.ipc.open_file(pa.memory_map(str(path))).read_all()

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

    def save(self, path: Path, payload: RowBlock) -> None:
        save_file(payload.arrays, str(path))

    def load(self, path: Path, record: dict[str, Any]) -> RowBlock:
        return RowBlock(int(record["rows"][0]), load_file(str(path)))

    def describe(self, path: Path, payload: RowBlock) -> dict[str, Any]:
        return {"rows": [payload.first, payload.stop]}


ARROW_TABLES = ArrowTables()
SAFETENSORS_ROWS = SafetensorsRows()
