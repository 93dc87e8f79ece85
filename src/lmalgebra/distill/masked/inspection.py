"""What a masked run directory holds: per (language, teacher) its masked copies, masked tokens,
top-k and bytes per masked token; the union vocabulary's report (``merge inspect``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.distill.layout import MASKED, TOPK, RunLayout
from lmalgebra.distill.run.inspection import RunInspection, inspected_set
from lmalgebra.distill.vocab.union import read_report

MASKED_COLUMNS = {
    "language": "language",
    "teacher": "teacher",
    "examples": "examples",
    "masked tokens": "masked_tokens",
    "top-k": "top_k",
    "top-k B/masked tok": "topk_file_bytes_per_masked_token",
    "store B/masked tok": "store_bytes_per_masked_token",
}


# every key of a row, with its type (a run without rows yet has a DataFrame of these columns)
MASKED_ROW = {
    **{"language": "str", "teacher": "str", "examples": "int64", "masked_tokens": "int64"},
    **{"top_k": "int64", "teach_complete": "bool", "topk_payload_bytes_per_masked_token": "int64"},
    **{"topk_file_bytes_per_masked_token": "float64", "store_bytes_per_masked_token": "float64"},
}


def _masked_row(layout: RunLayout, lang: str, teacher: str) -> dict[str, Any]:
    masked = inspected_set(layout.store(MASKED, lang, teacher), "prepare")
    topk = inspected_set(layout.store(TOPK, lang, teacher), "teach")
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


def _overlap(vocab: dict[str, Any]) -> str:
    """The tokens each pair of teachers shares, as the table's caption shows them."""
    pairs = [f"{p['a']}/{p['b']} {p['shared']}" for p in vocab.get("overlap", [])]
    return f"; tokens shared: {', '.join(pairs)}" if pairs else ""


def masked_report(run_dir: Path) -> RunInspection:
    """A masked run: per (language, teacher) its examples, masked tokens, top-k and bytes per
    masked token of the top-k files and of the whole store; the vocabulary's report."""
    layout = RunLayout(run_dir)
    rows = [_masked_row(layout, lang, t) for lang, t in layout.pairs(MASKED)]
    vocab = read_report(layout.vocab)
    examples = sum(int(p["examples"]) for p in rows)
    masked = sum(int(p["masked_tokens"]) for p in rows)
    summary = f"{len(rows)} (language, teacher) pairs, {examples} masked copies, "
    summary += f"{masked} masked tokens"
    caption = ""
    if vocab:
        summary += f", student vocabulary {vocab['union_size']} tokens"
        caption = f"union vocabulary: {vocab.get('union_size')} tokens" + _overlap(vocab)
    return RunInspection(run_dir, rows, MASKED_COLUMNS, summary, caption, vocab, MASKED_ROW)
