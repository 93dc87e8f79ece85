"""A run's spans, remembered: the corpus is cut by the reference tokenizer once per corpus,
tokenizer and span settings, and read back on every later run.

An entry is a safetensors file of ``(spans, 3) int64`` rows per split (document, first character,
end character), named by the sha256 of what decides the spans: the documents' hash, the hashes of
the tokenizer's files and of its model's config, the span settings, and the versions of
``transformers`` and ``tokenizers``. Its metadata holds the hashes of the span texts, so an entry
whose rows do not reproduce them (a damaged or foreign file) is drawn again and rewritten. A
tokenizer that runs remote code, whose behaviour no file hash pins down, is never remembered.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.settings.spans import Span, SpanSpec
from lmalgebra.lmd.spans.draw import RunSpans, plan_of
from lmalgebra.storage.atomic import write_atomic
from lmalgebra.storage.split_archive import clear_misplaced

log = logging.getLogger(__name__)
FORMAT = 1


def span_key(corpus: str, tokenizer: dict[str, str], spec: SpanSpec) -> dict[str, Any]:
    """What decides a run's spans. ``corpus``: ``sha256_texts`` of the documents; ``tokenizer``:
    the reference model's fingerprint (its ``tokenizer`` and ``config`` hashes are used)."""
    return {
        "format": FORMAT,
        "corpus": corpus,
        "tokenizer": tokenizer["tokenizer"],
        "config": tokenizer["config"],
        "spans": spec.model_dump(mode="json"),
        "libraries": {name: _version(name) for name in ("transformers", "tokenizers")},
    }


def remembered_plan(
    directory: Path,
    key: dict[str, Any],
    docs: list[str],
    reference: str,
    draw: Callable[[], RunSpans],
) -> RunSpans:
    """The entry of ``key`` under ``directory`` when it is sound, else ``draw()`` (then stored)."""
    path = directory / f"{sha256_json(key)}.safetensors"
    clear_misplaced(path, False, "span cache")  # a FIFO, a directory: drawn again, not refused
    if path.is_file():
        plan = _read(path, docs, reference, key)
        if plan is not None:
            return plan
        log.warning("span cache %s does not reproduce its spans: cutting the corpus again", path)
    plan = draw()
    _write(path, plan, key)
    return plan


def _write(path: Path, plan: RunSpans, key: dict[str, Any]) -> None:
    rows = {}
    for split in SPLITS:
        triples = [(s.doc, s.start, s.end) for s in plan.spans[split]]
        rows[split] = np.array(triples, dtype=np.int64).reshape(-1, 3)
    meta = {"key": json.dumps(key, sort_keys=True), "hashes": json.dumps(plan.hashes)}
    write_atomic(path, lambda tmp: save_file(rows, str(tmp), metadata=meta))


def _read(path: Path, docs: list[str], reference: str, key: dict[str, Any]) -> RunSpans | None:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="numpy") as handle:
            meta = handle.metadata() or {}
            rows = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
        if meta["key"] != json.dumps(key, sort_keys=True):  # another key's file by this name
            return None
        stored = json.loads(meta["hashes"])
    except Exception:  # a damaged entry: safetensors raises its own error types too
        return None
    spans = {}
    for split in SPLITS:
        found = _spans(rows[split], docs) if split in rows else None
        if found is None:
            return None
        spans[split] = found
    plan = plan_of(docs, spans, reference, key["corpus"])
    return plan if plan.hashes == stored else None


def _spans(rows: np.ndarray, docs: list[str]) -> list[Span] | None:
    """The spans of ``rows``, or None where a row points outside the documents."""
    if rows.ndim != 2 or rows.shape[1] != 3 or rows.dtype != np.int64:
        return None
    spans = []
    for doc, start, end in rows.tolist():
        if not (0 <= doc < len(docs) and 0 <= start < end <= len(docs[doc])):
            return None
        spans.append(Span(doc, start, end))
    return spans


def _version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "absent"
