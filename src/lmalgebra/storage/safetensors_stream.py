"""A safetensors file written tensor by tensor, panel by panel: no copy of a large array in memory.

``safetensors.numpy.save_file`` first turns every tensor into one ``bytes`` object, a second copy
of a ``D x D`` statistics matrix. This writer lays out the same format (an 8-byte little-endian
header length, a JSON header padded with spaces to a multiple of 8, then the raw little-endian
data of each tensor in header order) and streams each array in panels of rows, optionally
multiplied by a scale on the way (the panel is scaled, never the array). The file is written
atomically and reads back with ``safetensors``' own loaders.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import BinaryIO

import numpy as np

from lmalgebra.storage.atomic import write_atomic

_DTYPES = {"float64": "F64", "float32": "F32", "float16": "F16", "int64": "I64", "int32": "I32"}
PANEL_BYTES = 64 * 2**20  # rows written at a time, at most this many bytes


def write_safetensors(
    path: Path,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    scales: Mapping[str, float] | None = None,
) -> None:
    """Write ``tensors`` (name -> array, C order) to ``path`` as safetensors, atomically.

    ``scales``: name -> factor each of that tensor's values is multiplied by as it is written
    (in the tensor's own dtype).
    """
    scales = scales or {}
    header: dict[str, object] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, array in tensors.items():
        kind = _DTYPES.get(array.dtype.name)
        if kind is None:
            raise ValueError(f"tensor {name!r}: dtype {array.dtype} is not written")
        size = int(array.nbytes)
        header[name] = {
            "dtype": kind,
            "shape": list(array.shape),
            "data_offsets": [offset, size + offset],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)

    def write(tmp: Path) -> None:
        with tmp.open("wb") as handle:
            handle.write(struct.pack("<Q", len(text)))
            handle.write(text)
            for name, array in tensors.items():
                _write_array(handle, array, scales.get(name))

    write_atomic(path, write)


def _write_array(handle: BinaryIO, array: np.ndarray, scale: float | None) -> None:
    flat = array.reshape(array.shape[0], -1) if array.ndim > 1 else array.reshape(1, -1)
    row_bytes = max(1, flat.shape[1] * flat.itemsize)
    step = max(1, PANEL_BYTES // row_bytes)
    little = flat.dtype.newbyteorder("<")
    for start in range(0, flat.shape[0], step):
        panel = np.ascontiguousarray(flat[start : start + step], dtype=little)
        if scale is not None:
            panel = panel * panel.dtype.type(scale)
        handle.write(panel.data)
