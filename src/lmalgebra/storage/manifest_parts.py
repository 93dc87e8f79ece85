"""Per-rank manifest parts: where each rank of a multi-process run records the shards it wrote.

Ranks never write the same file: rank ``r`` records its shards of the set whose manifest is
``manifest.json`` in ``manifest.rank-000r.json``, and the main rank alone merges the parts into
the manifest after a barrier. Parts left by an interrupted run are read back on resumption,
whatever the number of processes then.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from lmalgebra.core.text_files import read_record

MANIFEST = "manifest.json"  # a shard set's manifest (``shard_set``), beside its parts

log = logging.getLogger(__name__)


def part_path(manifest: Path, rank: int) -> Path:
    """Where rank ``rank`` records its shards of the set whose manifest is ``manifest``."""
    return manifest.with_name(f"{manifest.stem}.rank-{rank:04d}{manifest.suffix}")


def _part_paths(manifest: Path) -> list[Path]:
    return sorted(manifest.parent.glob(f"{manifest.stem}.rank-*{manifest.suffix}"))


def read_parts(manifest: Path, identity: dict[str, Any]) -> list[dict[str, Any]]:
    """Every readable manifest part next to ``manifest`` whose fields match ``identity``.

    A part is a JSON object ``{**identity, "shards": ...}`` (``identity`` holds the set's key and
    any other field that must agree, such as a row count); parts of any rank count are read.
    Unreadable or foreign parts are skipped: their shards are then recomputed.
    """
    found = []
    for path in _part_paths(manifest):
        try:
            part = json.loads(read_record(path))
        except (OSError, json.JSONDecodeError):
            log.warning("manifest part %s is unreadable; its shards will be recomputed", path)
            continue
        if isinstance(part, dict) and all(part.get(f) == v for f, v in identity.items()):
            found.append(part)
    return found


def remove_parts(manifest: Path) -> None:
    """Delete the manifest parts next to ``manifest`` (once the manifest holds their records)."""
    for path in _part_paths(manifest):
        path.unlink(missing_ok=True)
