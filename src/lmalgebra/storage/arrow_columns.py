"""Ragged numpy arrays <-> Arrow list columns, with the narrowest id type that fits."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa


def id_dtype(vocab_size: int) -> np.dtype:
    """uint16 for vocabularies up to 65,536 entries, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def list_column(arrays: Sequence[np.ndarray], dtype: np.dtype | type) -> pa.ListArray:
    """One Arrow list per array, values cast to ``dtype`` (no Python-level loop over values)."""
    lengths = np.fromiter((a.size for a in arrays), dtype=np.int32, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.concatenate([a.ravel() for a in arrays]) if arrays else np.zeros(0)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat.astype(dtype)))


def ragged(column: pa.ChunkedArray | pa.ListArray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, offsets)`` of a list column: row i is ``values[offsets[i]:offsets[i + 1]]``."""
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = array.offsets.to_numpy()
    values = array.values.to_numpy(zero_copy_only=False)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]
