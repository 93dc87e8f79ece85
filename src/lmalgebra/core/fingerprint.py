"""Content hashes: of files, directories, JSON-able specs and text streams.

Every cache key and manifest in the toolkit is built from these, so a change in any input that
alters the numbers changes the key.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import open_regular

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read in 1 MiB chunks; a FIFO, socket or device there is
    refused (``text_files.open_regular``), never waited on."""
    digest = hashlib.sha256()
    with open_regular(path) as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_files(paths: Iterable[Path], root: Path) -> str:
    """One hash over several files: their paths relative to ``root`` and their bytes."""
    digest = hashlib.sha256()
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(sha256_file(path).encode())
    return digest.hexdigest()


def sha256_json(value: Any) -> str:
    """Hash of a JSON-able value in canonical form (sorted keys, no whitespace)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def plain(value: Any) -> Any:
    """``value`` as a JSON file holds it once read back: tuples as lists, objects JSON has no
    form for as their text, and NaN and the infinities as null (the only form strict JSON
    readers take; a figure that could not be computed reads back as None)."""
    return json.loads(json.dumps(value, default=str), parse_constant=lambda _: None)


def sealed(record: Mapping[str, Any], key: str) -> dict[str, Any]:
    """``record`` (:func:`plain`) with a checksum of itself under ``key``, which :func:`unseal`
    checks."""
    record = plain(dict(record))
    return {**record, key: sha256_json(record)}


def unseal(record: dict[str, Any], key: str) -> bool | None:
    """Take ``key`` out of ``record`` (as :func:`sealed` wrote it) and say whether the rest
    matches it: True, False (edited since), None (no checksum: an older release's record)."""
    recorded = record.pop(key, None)
    return None if recorded is None else recorded == sha256_json(record)


def sha256_texts(texts: Iterable[str]) -> str:
    """Hash of an ordered sequence of strings (length-prefixed so boundaries count)."""
    digest = hashlib.sha256()
    for text in texts:
        data = text.encode()
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.hexdigest()


def unit_hash(text: str, salt: str) -> float:
    """A deterministic number in [0, 1) from ``text`` and ``salt`` (for hash-based splits)."""
    digest = hashlib.blake2b(f"{salt}\0{text}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def span_sha256(text: str) -> str:
    """Hex sha256 of a span's UTF-8 text: the span's id in exports and Parquet files."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def order_digest(texts: Mapping[str, Sequence[str]]) -> str:
    """Hex sha256 over ``f"{split}\\t{span_sha256(text)}\\n"`` for every span, splits in order."""
    digest = hashlib.sha256()
    for split in SPLITS:
        for text in texts.get(split, ()):
            digest.update(f"{split}\t{span_sha256(text)}\n".encode())
    return digest.hexdigest()
