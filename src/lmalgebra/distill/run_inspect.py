"""What a MergeDistill run directory holds: counts, bytes per masked token, vocabulary overlap;
and a verification of every shard against its manifest."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.run_verify import checkpoint_problems, vocabulary_problems
from lmalgebra.storage.shard_set import MANIFEST, ShardSet


def _pairs(run_dir: Path) -> list[tuple[str, str]]:
    return sorted(
        (p.parent.parent.name, p.parent.name) for p in (run_dir / "masked").glob(f"*/*/{MANIFEST}")
    )


def inspect_run(run_dir: Path) -> dict[str, Any]:
    """Per (language, teacher): examples, held-out, masked tokens, store bytes per masked token."""
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
    return {"run_dir": str(run_dir), "pairs": rows, "vocab": vocab}


def verify_run(run_dir: Path) -> list[str]:
    """Every missing, corrupt or incomplete shard set of the run, a damaged vocabulary and
    damaged checkpoints, naming the file."""
    if not (run_dir / "recipe.yaml").is_file():
        raise UserInputError(f"{run_dir} is not a merge run directory (no recipe.yaml)")
    problems = []
    for stage in ("examples", "masked", "topk"):
        for manifest in sorted((run_dir / stage).rglob(MANIFEST)):
            problems += ShardSet.existing(manifest.parent).problems()
    return problems + vocabulary_problems(run_dir) + checkpoint_problems(run_dir)
