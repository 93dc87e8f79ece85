"""What the MergeDistill commands print and check for causal recipes and teachers: the causal
store's table, and the flags of ``pretrain --causal``."""

from __future__ import annotations

from typing import Any

from lmalgebra.core.errors import UserInputError


def causal_table(report: dict[str, Any]) -> Any:
    """Counts and bytes per teacher token of each part of a causal store."""
    from rich.table import Table

    parts = {"token_ids": "ids", "offsets": "offs", "next_logprob": "next", "topk": "top-k"}
    parts["samples"] = "draws"
    table = Table(
        title=f"causal teacher store {report['run_dir']}",
        caption="k: top-k; K: draws; B: bytes per teacher token (values; total: shard files)",
    )
    table.add_column("lang")
    table.add_column("teacher")
    for column in ("examples", "tokens", "k", "K", *(f"{p} B" for p in parts.values())):
        table.add_column(column, justify="right")
    table.add_column("total B", justify="right")
    for row in report["causal"]:
        sizes = row["bytes_per_token"]
        store = row["store_bytes_per_token"]
        table.add_row(
            row["language"],
            row["teacher"],
            str(row["examples"]),
            str(row["tokens"]),
            str(row["top_k"]),
            str(row["samples"]),
            *(f"{sizes[p]:.0f}" if sizes[p] is not None else "-" for p in parts),
            f"{store:.1f}" if store else "-",
        )
    return table


def causal_summary(report: dict[str, Any]) -> str:
    """``3 (language, causal teacher) pairs, 110 examples, 11816 teacher tokens``."""
    rows = report["causal"]
    examples = sum(int(r["examples"]) for r in rows)
    tokens = sum(int(r["tokens"]) for r in rows)
    return f"{len(rows)} (language, causal teacher) pairs, {examples} examples, {tokens} tokens"


def causal_tokenizer_kind(causal: bool, kind: str | None, lowercase: bool, head_only: bool) -> Any:
    """The tokenizer kind of ``pretrain --causal`` (bytelevel-bpe unless given); refuses the
    flags that do not go with it."""
    from lmalgebra.distill.vocab.tokenizer_choice import TOKENIZER_KINDS

    if not causal:
        raise UserInputError("--tokenizer-kind applies to --causal teachers only")
    if head_only:
        raise UserInputError("--head-only fits masked-LM heads: it does not go with --causal")
    kind = kind or "bytelevel-bpe"
    if kind not in TOKENIZER_KINDS:
        raise UserInputError(
            f"--tokenizer-kind must be one of {', '.join(TOKENIZER_KINDS)}, got {kind!r}"
        )
    if lowercase:
        raise UserInputError("--lowercase applies to masked-LM (WordPiece) teachers only")
    return kind
