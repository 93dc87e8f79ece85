"""What a student's training depends on besides its own settings: the recipe's data settings, the
teacher store and the student vocabulary. Recorded in every checkpoint (``train.run_fingerprint``),
so a student is never resumed on a store or vocabulary rebuilt since, nor labelled with a recipe
it was not trained on."""

from __future__ import annotations

import re
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file, sha256_json
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.storage.shard_set import ShardSet

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,99}")


def student_inputs(recipe: MergeRecipe) -> dict[str, Any]:
    """``{"recipe": data settings, "store": {lang/teacher: key hash}, "vocabulary": sha256}``
    (causal recipes: no vocabulary)."""
    # dtype and device of teacher inference are left out: the store's key records the dtype
    # it was computed in, and recipes written before these settings keep their fingerprint
    data = recipe.model_dump(
        mode="json",
        exclude={"output_dir", "batch_size", "dtype", "device", "student", "training"},
    )
    outputs = "logprobs" if recipe.objective == "causal" else "topk"
    store = {
        f"{lang}/{teacher}": sha256_json(
            ShardSet.existing(recipe.output_dir / outputs / lang / teacher).key
        )
        for lang, spec in recipe.languages.items()
        for teacher in spec.teachers
    }
    if recipe.objective == "causal":  # no union vocabulary: the student's tokenizer is its own
        return {"recipe": data, "store": store}
    vocabulary = sha256_file(recipe.output_dir / "vocab" / "vocab_union.json")
    return {"recipe": data, "store": store, "vocabulary": vocabulary}


def check_student_name(name: str) -> str:
    """``name`` if it is one plain directory name inside the run (no ``/``, ``..`` or hidden
    name); UserInputError naming it otherwise, so a student is never written outside the run."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise UserInputError(
            f"student name {name!r} must be one plain directory name inside the run "
            "(letters, digits, '.', '_', '-'; not starting with '.')"
        )
    return name
