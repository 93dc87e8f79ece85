"""What a MergeDistill run directory holds: counts, bytes per masked token, vocabulary overlap,
bytes per token of each part of a causal store; and a verification of every shard against its
manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.run.verify import checkpoint_problems, vocabulary_problems
from lmalgebra.storage.shard_set import MANIFEST, ShardSet

# the parts of a causal store, by the columns that hold them
CAUSAL_PARTS = {
    "token_ids": ("token_ids",),
    "offsets": ("offsets",),
    "next_logprob": ("next_logprob",),
    "topk": ("topk_ids", "topk_logprobs"),
    "samples": ("sample_ids", "sample_logprobs"),
}


def _pairs(run_dir: Path, stage: str = "masked") -> list[tuple[str, str]]:
    return sorted(
        (p.parent.parent.name, p.parent.name) for p in (run_dir / stage).glob(f"*/*/{MANIFEST}")
    )


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


def _causal_row(run_dir: Path, lang: str, teacher: str) -> dict[str, Any]:
    """One causal (language, teacher): counts, and bytes per token of each part of the store."""
    tokens = ShardSet.existing(run_dir / "tokens" / lang / teacher)
    logprobs = ShardSet.existing(run_dir / "logprobs" / lang / teacher)
    count = int(tokens.manifest.get("tokens", 0))
    complete = logprobs.complete and count > 0
    columns = _value_bytes([tokens, logprobs] if complete else [tokens])
    per_token = {
        part: sum(columns.get(c, 0) for c in names) / count if count else None
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
        "bytes_per_token": per_token,
        "store_bytes_per_token": (tokens.nbytes + logprobs.nbytes) / count if complete else None,
    }


def inspect_run(run_dir: Path) -> dict[str, Any]:
    """Per (language, teacher): examples, held-out, masked tokens, store bytes per masked token;
    for a causal store (``causal``): examples, tokens and bytes per token of each part."""
    if not (run_dir / "recipe.yaml").is_file():
        raise UserInputError(
            f"{run_dir} is not a merge run directory (no recipe.yaml); "
            "run `lmalgebra merge prepare RECIPE` first"
        )
    rows = []
    for lang, teacher in _pairs(run_dir):
        masked = ShardSet.existing(run_dir / "masked" / lang / teacher)
        topk = ShardSet.existing(run_dir / "topk" / lang / teacher)
        tokens = int(masked.manifest.get("masked_tokens", 0))
        k = topk.manifest.get("top_k")
        id_bytes = 2 if int(masked.manifest.get("vocab_size", 0)) <= 1 << 16 else 4
        rows.append(
            {
                "language": lang,
                "teacher": teacher,
                "examples": masked.rows,
                "masked_tokens": tokens,
                "top_k": k,
                "teach_complete": topk.complete,
                "topk_payload_bytes_per_masked_token": k * (id_bytes + 2) if k else None,
                "topk_file_bytes_per_masked_token": topk.nbytes / tokens
                if tokens and topk.complete
                else None,
                "store_bytes_per_masked_token": (masked.nbytes + topk.nbytes) / tokens
                if tokens and topk.complete
                else None,
            }
        )
    report_path = run_dir / "vocab" / "report.json"
    vocab = json.loads(report_path.read_text()) if report_path.is_file() else None
    causal = [_causal_row(run_dir, lang, t) for lang, t in _pairs(run_dir, "tokens")]
    return {"run_dir": str(run_dir), "pairs": rows, "causal": causal, "vocab": vocab}


def verify_run(run_dir: Path) -> list[str]:
    """Every missing, corrupt or incomplete shard set of the run, a damaged vocabulary and
    damaged checkpoints, naming the file."""
    if not (run_dir / "recipe.yaml").is_file():
        raise UserInputError(f"{run_dir} is not a merge run directory (no recipe.yaml)")
    problems = []
    for stage in ("examples", "masked", "topk", "tokens", "logprobs"):
        for manifest in sorted((run_dir / stage).rglob(MANIFEST)):
            problems += ShardSet.existing(manifest.parent).problems()
    return problems + vocabulary_problems(run_dir) + checkpoint_problems(run_dir)
