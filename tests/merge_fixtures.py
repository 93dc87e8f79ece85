"""A two-language, two-teacher MergeDistill recipe over tiny teachers with different tokenizers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiny import build_bert_mlm, build_roberta_mlm, documents


def write_recipe(root: Path, teachers: dict[str, Path], **overrides: Any) -> Path:
    """Languages 'xx' (teacher wp) and 'yy' (teachers wp and sp), 60 and 40 documents."""
    corpora = {}
    for lang, count, seed in (("xx", 60, 11), ("yy", 40, 12)):
        path = root / f"{lang}.txt"
        path.write_text("\n".join(documents(count, seed=seed)) + "\n", encoding="utf-8")
        corpora[lang] = path
    recipe: dict[str, Any] = {
        "languages": {
            "xx": {"corpus": {"paths": [str(corpora["xx"])]}, "teachers": ["wp"]},
            "yy": {"corpus": {"paths": [str(corpora["yy"])]}, "teachers": ["wp", "sp"]},
        },
        "teachers": {name: {"path": str(path)} for name, path in teachers.items()},
        "masking": {"seed": 3},
        "example_length": 48,
        "heldout_fraction": 0.1,
        "top_k": 8,
        "batch_size": 8,
        "shard_rows": 16,
        "output_dir": str(root / "run"),
    }
    recipe.update(overrides)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def build_teachers(root: Path) -> dict[str, Path]:
    return {"wp": build_bert_mlm(root / "wp"), "sp": build_roberta_mlm(root / "sp")}


# A student and a training run small enough for tests (a few seconds on two cores).
TINY_STUDENT = {
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
TINY_TRAINING = {
    "steps": 6,
    "batch_size": 8,
    "warmup_steps": 1,
    "log_every": 1,
    "checkpoint_every": 3,
    "lr": 1e-3,
}
