"""What a MergeDistill run directory holds, read from its shard sets: per (language, teacher) the
examples and what the teacher store holds of them, and bytes per stored token; the vocabulary's
report. Each objective names its rows (``masked_report``, ``causal_report``); both return a
``RunInspection``."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from lmalgebra.distill.layout import LOGPROBS, MASKED, TOKENS, TOPK, RunLayout
from lmalgebra.storage.shard_set import ShardSet

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunInspection:
    """What a MergeDistill run directory holds (``MergeRun.inspect``, ``merge inspect``).

    Attributes:
        run_dir: the run directory.
        pairs: one row per (language, teacher): its examples, what the store holds of them, bytes
            per stored token (the keys of ``columns``' values); ``frame()`` as a DataFrame.
        columns: the command's table: heading -> key of a row.
        summary: one line (pairs, examples, tokens; the student vocabulary's size when built).
        caption: what the table's abbreviations mean ("" when none).
        vocab: the union vocabulary's report (masked runs, after ``merge vocab``), or None.
    """

    run_dir: Path
    pairs: list[dict[str, Any]]
    columns: dict[str, str]
    summary: str
    caption: str
    vocab: dict[str, Any] | None

    def frame(self) -> pd.DataFrame:
        """``pairs`` as a DataFrame indexed by (language, teacher)."""
        import pandas as pd

        # a run without examples yet: no rows, the table's columns
        frame = pd.DataFrame(
            self.pairs or None, columns=None if self.pairs else self.columns.values()
        )
        return frame.set_index(["language", "teacher"])

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``merge inspect --json``): the run directory as text."""
        return {**asdict(self), "run_dir": str(self.run_dir)}


# the parts of a causal store, by the columns that hold them
CAUSAL_PARTS = {
    "token_ids": ("token_ids",),
    "offsets": ("offsets",),
    "next_logprob": ("next_logprob",),
    "topk": ("topk_ids", "topk_logprobs"),
    "samples": ("sample_ids", "sample_logprobs"),
}
MASKED_COLUMNS = {
    "language": "language",
    "teacher": "teacher",
    "examples": "examples",
    "masked tokens": "masked_tokens",
    "top-k": "top_k",
    "top-k B/masked tok": "topk_file_bytes_per_masked_token",
    "store B/masked tok": "store_bytes_per_masked_token",
}
CAUSAL_COLUMNS = {
    "language": "language",
    "teacher": "teacher",
    "examples": "examples",
    "tokens": "tokens",
    "k": "top_k",
    "K": "samples",
    **{f"{part} B": f"{part}_bytes_per_token" for part in CAUSAL_PARTS},
    "total B": "store_bytes_per_token",
}


def _value_bytes(sets: list[ShardSet]) -> dict[str, int]:
    """Bytes of the values of each column (list offsets left out) over the sets' shards."""
    found: dict[str, int] = {}
    for shards in sets:
        for table in shards.tables(verify=False):
            for name in table.column_names:
                column = table.column(name)
                if pa.types.is_list(column.type):
                    column = pc.list_flatten(column)
                found[name] = found.get(name, 0) + int(column.nbytes)
    return found


def _vocabulary(layout: RunLayout) -> dict[str, Any] | None:
    path = layout.vocab / "report.json"
    return json.loads(path.read_text()) if path.is_file() else None


def _masked_row(layout: RunLayout, lang: str, teacher: str) -> dict[str, Any]:
    masked = ShardSet.existing(layout.store(MASKED, lang, teacher))
    topk = ShardSet.existing(layout.store(TOPK, lang, teacher))
    tokens = int(masked.manifest.get("masked_tokens", 0))
    k = topk.manifest.get("top_k")
    id_bytes = 2 if int(masked.manifest.get("vocab_size", 0)) <= 1 << 16 else 4
    done = bool(tokens and topk.complete)
    return {
        "language": lang,
        "teacher": teacher,
        "examples": masked.rows,
        "masked_tokens": tokens,
        "top_k": k,
        "teach_complete": topk.complete,
        "topk_payload_bytes_per_masked_token": k * (id_bytes + 2) if k else None,
        "topk_file_bytes_per_masked_token": topk.nbytes / tokens if done else None,
        "store_bytes_per_masked_token": (masked.nbytes + topk.nbytes) / tokens if done else None,
    }


def masked_report(run_dir: Path) -> RunInspection:
    """A masked run: per (language, teacher) its examples, masked tokens, top-k and bytes per
    masked token of the top-k files and of the whole store; the vocabulary's report."""
    layout = RunLayout(run_dir)
    rows = [_masked_row(layout, lang, t) for lang, t in layout.pairs(MASKED)]
    vocab = _vocabulary(layout)
    examples = sum(int(p["examples"]) for p in rows)
    masked = sum(int(p["masked_tokens"]) for p in rows)
    summary = f"{len(rows)} (language, teacher) pairs, {examples} masked copies, "
    summary += f"{masked} masked tokens"
    caption = ""
    if vocab:
        summary += f", student vocabulary {vocab['union_size']} tokens"
        caption = f"union vocabulary: {vocab.get('union_size')} tokens"
    return RunInspection(run_dir, rows, MASKED_COLUMNS, summary, caption, vocab)


def _causal_row(layout: RunLayout, lang: str, teacher: str) -> dict[str, Any]:
    """One causal (language, teacher): counts, and bytes per token of each part of the store."""
    tokens = ShardSet.existing(layout.store(TOKENS, lang, teacher))
    logprobs = ShardSet.existing(layout.store(LOGPROBS, lang, teacher))
    count = int(tokens.manifest.get("tokens", 0))
    complete = logprobs.complete and count > 0
    columns = _value_bytes([tokens, logprobs] if complete else [tokens])
    per_token = {
        f"{part}_bytes_per_token": sum(columns.get(c, 0) for c in names) / count if count else None
        for part, names in CAUSAL_PARTS.items()
    }
    return {
        "language": lang,
        "teacher": teacher,
        "examples": tokens.rows,
        "tokens": count,
        "top_k": logprobs.manifest.get("top_k"),
        "samples": logprobs.manifest.get("samples"),
        "teach_complete": logprobs.complete,
        **per_token,
        "store_bytes_per_token": (tokens.nbytes + logprobs.nbytes) / count if complete else None,
    }


def causal_report(run_dir: Path) -> RunInspection:
    """A causal run: per (language, teacher) its examples and tokens, top-k and draws, and
    bytes per teacher token of each part of the store and of its files."""
    layout = RunLayout(run_dir)
    rows = [_causal_row(layout, lang, t) for lang, t in layout.pairs(TOKENS)]
    examples = sum(int(r["examples"]) for r in rows)
    tokens = sum(int(r["tokens"]) for r in rows)
    summary = f"{len(rows)} (language, causal teacher) pairs, {examples} examples, {tokens} tokens"
    caption = "k: top-k; K: draws; B: bytes per teacher token (values; total: shard files)"
    return RunInspection(run_dir, rows, CAUSAL_COLUMNS, summary, caption, None)
