"""What a causal run directory holds: per (language, teacher) its examples and tokens, top-k and
draws, and bytes per teacher token of each part of the store (``merge inspect``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lmalgebra.distill.examples import is_written
from lmalgebra.distill.layout import LOGPROBS, TOKENS, RunLayout
from lmalgebra.distill.run.inspection import RunInspection, inspected_set, inspected_tables
from lmalgebra.storage.shard_set import ShardSet

# the parts of a causal store, by the columns that hold them
CAUSAL_PARTS = {
    "token_ids": ("token_ids",),
    "offsets": ("offsets",),
    "next_logprob": ("next_logprob",),
    "topk": ("topk_ids", "topk_logprobs"),
    "samples": ("sample_ids", "sample_logprobs"),
}
CAUSAL_COLUMNS = {
    "language": "language",
    "teacher": "teacher",
    "examples": "examples",
    "written": "written",
    "tokens": "tokens",
    "k": "top_k",
    "K": "samples",
    **{f"{part} B": f"{part}_bytes_per_token" for part in CAUSAL_PARTS},
    "total B": "store_bytes_per_token",
}

# every key of a row, with its type (a run without rows yet has a DataFrame of these columns)
CAUSAL_ROW = {
    **{"language": "str", "teacher": "str", "examples": "int64", "written": "int64"},
    **{"tokens": "int64", "top_k": "int64", "samples": "int64", "teach_complete": "bool"},
    **{f"{part}_bytes_per_token": "float64" for part in CAUSAL_PARTS},
    "store_bytes_per_token": "float64",
}


def _value_bytes(sets: list[tuple[ShardSet, str]]) -> dict[str, int]:
    """Bytes of the values of each column (list offsets left out) over the sets' shards (each
    beside the ``merge`` command that writes it)."""
    found: dict[str, int] = {}
    for shards, stage in sets:
        for table in inspected_tables(shards, stage):
            for name in table.column_names:
                column = table.column(name)
                if pa.types.is_list(column.type):
                    column = pc.list_flatten(column)
                found[name] = found.get(name, 0) + int(column.nbytes)
    return found


def _causal_row(layout: RunLayout, lang: str, teacher: str) -> dict[str, Any]:
    """One causal (language, teacher): counts, and bytes per token of each part of the store."""
    tokens = inspected_set(layout.store(TOKENS, lang, teacher), "prepare")
    logprobs = inspected_set(layout.store(LOGPROBS, lang, teacher), "teach")
    count = int(tokens.manifest.get("tokens", 0))
    complete = logprobs.complete and count > 0
    parts = [(tokens, "prepare"), (logprobs, "teach")]
    columns = _value_bytes(parts if complete else parts[:1])
    per_token = {
        f"{part}_bytes_per_token": sum(columns.get(c, 0) for c in names) / count if count else None
        for part, names in CAUSAL_PARTS.items()
    }
    return {
        "language": lang,
        "teacher": teacher,
        "examples": tokens.rows,
        "written": _written(layout, lang),
        "tokens": count,
        "top_k": logprobs.manifest.get("top_k"),
        "samples": logprobs.manifest.get("samples"),
        "teach_complete": logprobs.complete,
        **per_token,
        "store_bytes_per_token": (tokens.nbytes + logprobs.nbytes) / count if complete else None,
    }


def _written(layout: RunLayout, lang: str) -> int:
    """How many of the language's examples a teacher wrote (``teacher_text``): 0 without, or
    while its examples are not all there."""
    examples = inspected_set(layout.examples(lang), "prepare")
    if not examples.complete:
        return 0
    tables = inspected_tables(examples, "prepare")
    ids = [i for t in tables for i in t.column("id").to_pylist()]
    return sum(is_written(i, lang) for i in ids)


def causal_report(run_dir: Path) -> RunInspection:
    """A causal run: per (language, teacher) its examples (of which a teacher wrote:
    ``written``) and tokens, top-k and draws, and
    bytes per teacher token of each part of the store and of its files."""
    layout = RunLayout(run_dir)
    rows = [_causal_row(layout, lang, t) for lang, t in layout.pairs(TOKENS)]
    examples = sum(int(r["examples"]) for r in rows)
    tokens = sum(int(r["tokens"]) for r in rows)
    summary = f"{len(rows)} (language, causal teacher) pairs, {examples} examples, {tokens} tokens"
    caption = "k: top-k; K: draws; B: bytes per teacher token (values; total: shard files)"
    return RunInspection(run_dir, rows, CAUSAL_COLUMNS, summary, caption, None, CAUSAL_ROW)
