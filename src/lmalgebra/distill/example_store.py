"""The examples of each language as a shard set (``examples/<lang>/``), shared by both objectives:
the masked copies and the causal teacher store are row-aligned with it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.examples import language_examples
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.storage.shard_set import ShardSet


def examples_set(recipe: MergeRecipe, lang: str) -> ShardSet:
    spec = recipe.languages[lang]
    key = {
        "stage": "examples",
        "rules": "ids-sha256/heldout-blake2b-salted",  # bump when these rules change
        "language": lang,
        "corpus": spec.corpus.model_dump(mode="json"),
        "max_examples": spec.max_examples,
        "heldout": recipe.heldout_fraction,
        "shard_rows": recipe.shard_rows,
    }
    if recipe.objective == "causal":  # a masked recipe's key is as it always was
        key["cut"] = {"utf8_bytes": recipe.causal.example_bytes, "at": "character boundary"}
    return ShardSet(recipe.output_dir / "examples" / lang, key)


def write_examples(recipe: MergeRecipe, lang: str) -> pa.Table:
    """The language's examples (``id``, ``text``, ``heldout``), written once, then read back."""
    shards = examples_set(recipe, lang)
    if shards.intact():
        return pa.concat_tables(shards.tables(verify=False))
    shards.restart()  # the examples are drawn again as a whole, so every shard is rewritten
    found = language_examples(recipe, lang)
    table = pa.table(
        {
            "id": [e.id for e in found],
            "text": [e.text for e in found],
            "heldout": [e.heldout for e in found],
        }
    )
    for index, start in enumerate(range(0, table.num_rows, recipe.shard_rows)):
        shards.write(index, table.slice(start, recipe.shard_rows))
    shards.finish(examples=table.num_rows, heldout=int(np.sum(table.column("heldout").to_numpy())))
    return table


def require(shards: ShardSet, command: str) -> None:
    """Refuse to go on when an earlier stage's shard set is missing or incomplete."""
    if not shards.complete:
        raise UserInputError(
            f"{shards.directory} is missing or incomplete: "
            f"run `lmalgebra merge {command} RECIPE` first"
        )


def heldout_texts(run_dir: Path, languages: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The held-out examples' texts of each language of the run (of ``languages`` if given)."""
    return stored_texts(run_dir, languages, heldout=True)


def stored_texts(
    run_dir: Path, languages: Sequence[str] | None = None, heldout: bool = True
) -> dict[str, list[str]]:
    """The texts of each language's held-out (``heldout``) or training examples, in stored order;
    refused when the run has no examples, or a language none of that kind."""
    found = sorted(p.parent.name for p in (run_dir / "examples").glob("*/manifest.json"))
    if not found:
        raise UserInputError(
            f"{run_dir} holds no examples: run `lmalgebra merge prepare RECIPE` first"
        )
    unknown = sorted(set(languages or []) - set(found))
    if unknown:
        raise UserInputError(
            f"language {unknown[0]!r} is not in {run_dir} (it has {', '.join(found)})"
        )
    kind = "held-out" if heldout else "training"
    texts = {}
    for lang in languages or found:
        shards = ShardSet.existing(run_dir / "examples" / lang)
        require(shards, "prepare")
        table = pa.concat_tables(shards.tables())
        chosen = table.column("heldout").to_numpy(zero_copy_only=False) == heldout
        kept = [t for t, keep in zip(table.column("text").to_pylist(), chosen, strict=True) if keep]
        if not kept:
            raise UserInputError(f"language {lang!r} of {run_dir} has no {kind} example")
        texts[lang] = kept
    return texts
