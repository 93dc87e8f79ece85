"""Tiny causal teachers with different tokenizer kinds, and a two-language causal recipe."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tiny import documents, sentences

# a tiny causal student with teacher bl's tokenizer; positions for a whole 300-byte example
CAUSAL_STUDENT = {
    "tokenizer": "bl",
    "hidden_size": 32,
    "num_layers": 2,
    "num_heads": 4,
    "intermediate_size": 64,
    "max_position_embeddings": 320,
    "dropout": 0.0,
}


def build_causal_teacher(
    directory: Path, kind: str, seed: int = 0, hidden: int = 32, positions: int = 256
) -> Path:
    """A randomly initialised GPT-2 causal LM with a ``kind`` tokenizer trained on tiny text."""
    from lmalgebra.distill.causal.student_model import build_causal_lm
    from lmalgebra.distill.student import ModelSpec
    from lmalgebra.distill.vocab.tokenizer_trainers import train_causal_tokenizer

    texts = sentences(400, seed=seed + 5) + ["café crème brûlée, naïve señor; 東京 ☃ 😀"] * 3
    tokenizer = train_causal_tokenizer(texts, kind, 300, positions)
    spec = ModelSpec(
        hidden_size=hidden,
        num_layers=2,
        num_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=positions,
        dropout=0.0,
    )
    build_causal_lm(spec, tokenizer, seed).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def build_causal_teachers(root: Path) -> dict[str, Path]:
    """'bl' (byte-level BPE), 'uni' (unigram) and 'wp' (WordPiece) causal teachers."""
    kinds = {"bl": "bytelevel-bpe", "uni": "unigram", "wp": "wordpiece"}
    return {
        name: build_causal_teacher(root / name, kind, seed=i)
        for i, (name, kind) in enumerate(kinds.items())
    }


def write_causal_recipe(root: Path, teachers: dict[str, Path], **overrides: Any) -> Path:
    """Languages 'xx' (teachers bl, uni) and 'yy' (teacher wp), 40 and 30 documents, some with
    characters of several bytes; examples cut at 300 bytes; top-5 and 4 draws per position."""
    corpora = {}
    for lang, count, seed in (("xx", 40, 11), ("yy", 30, 12)):
        path = root / f"{lang}.txt"
        docs = documents(count, seed=seed)
        docs = [d + " Ça coûte 5 €, señor 😀." if i % 3 == 0 else d for i, d in enumerate(docs)]
        path.write_text("\n".join(docs) + "\n", encoding="utf-8")
        corpora[lang] = path
    recipe: dict[str, Any] = {
        "objective": "causal",
        "languages": {
            "xx": {"corpus": {"paths": [str(corpora["xx"])]}, "teachers": ["bl", "uni"]},
            "yy": {"corpus": {"paths": [str(corpora["yy"])]}, "teachers": ["wp"]},
        },
        "teachers": {name: {"path": str(path)} for name, path in teachers.items()},
        "causal": {"example_bytes": 300, "samples": 4, "sample_seed": 7},
        "heldout_fraction": 0.1,
        "top_k": 5,
        "batch_size": 4,
        "shard_rows": 8,
        "output_dir": str(root / "run"),
    }
    recipe.update(overrides)
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True), encoding="utf-8")
    return path


def taught_causal_recipe(root: Path, teachers: dict[str, Path], training: dict[str, Any]) -> Path:
    """``write_causal_recipe`` with the tiny ``CAUSAL_STUDENT`` and ``training``, its store
    prepared and taught; the recipe's path."""
    from lmalgebra.distill import pipeline as stages
    from lmalgebra.distill.recipe import load_recipe

    path = write_causal_recipe(root, teachers, student=CAUSAL_STUDENT, training=training)
    recipe = load_recipe(path)
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    return path


def train_causal(recipe_path: Path, name: str, **changes: Any) -> Path:
    """Student ``name`` of the recipe's run, trained with its ``training`` changed by
    ``changes`` (as ``merge train`` lays a student's settings over the recipe's: a CE-only
    student drops the recipe's distillation settings); its model directory."""
    from lmalgebra.distill.pipeline import train_student, training_of
    from lmalgebra.distill.recipe import load_recipe

    recipe = load_recipe(recipe_path)
    return train_student(recipe, name, training_of(recipe, changes, "test"), False)


def train_log(model: Path) -> list[dict[str, Any]]:
    """The rows of a student's ``train_log.jsonl``."""
    import json

    lines = (model.parent / "train_log.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]
