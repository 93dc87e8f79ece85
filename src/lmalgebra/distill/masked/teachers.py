"""Masked-LM teachers: a masked LM with a trained head and a tokenizer with a mask token, checked
before anything is written (their weights are read by ``merge teach`` alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.teachers import (
    TEACHER_HINT,
    Teacher,
    check_top_k,
    max_positions,
    refuse_damaged,
    refuse_other_head,
)
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.model_source import named_as
from lmalgebra.sources.models import ModelRef


def open_masked_teacher(
    ref: ModelRef, memo_dir: Path | None = None, example_length: int | None = None
) -> Teacher:
    """Resolve and fingerprint a teacher and load its tokenizer (which must have a mask token);
    with ``example_length``, refuse a teacher whose positions cannot hold that many tokens."""
    directory = ref.source.resolve()
    tokenizer = teacher_tokenizer(ref, directory, example_length)
    refuse_damaged(f"teacher {ref.name!r}", directory)  # before any work, not at teach
    return Teacher(ref.name, directory, source_of(ref, directory).fingerprint(memo_dir), tokenizer)


def teacher_tokenizer(ref: ModelRef, directory: Path, example_length: int | None = None) -> Any:
    """The teacher's tokenizer, refused for a model that is no masked LM (its configuration
    names another head, or an architecture transformers has no masked LM of), without a mask
    token or (given ``example_length``) when the model's positions cannot hold that many
    tokens; nothing of the weights is read (a dry run checks as much as the run)."""
    owner = f"teacher {ref.name!r}"
    refuse_other_head(owner, directory, "masked", TEACHER_HINT["masked"], ref.shown(directory))
    source_of(ref, directory).check_architecture("AutoModelForMaskedLM", owner)
    with named_as(ref.name, f"teacher {ref.name!r}"):
        tokenizer = source_of(ref, directory).load_tokenizer()
    if tokenizer.mask_token_id is None:
        raise UserInputError(f"teacher {ref.name!r}: tokenizer in {directory} has no mask token")
    limit = max_positions(directory)
    if example_length is not None and limit is not None and example_length > limit:
        raise UserInputError(
            f"example_length {example_length} exceeds the {limit} positions teacher "
            f"{ref.name!r} can read ({directory / 'config.json'}); use example_length <= {limit}"
        )
    return tokenizer


def open_teachers(recipe: MaskedRecipe) -> dict[str, Teacher]:
    """Every teacher of the recipe, checked before anything is done."""
    memo = RunLayout(recipe.output_dir).hashes
    teachers = {}
    for name, spec in recipe.teachers.items():
        teachers[name] = open_masked_teacher(spec.ref(name), memo, recipe.example_length)
        check_top_k(name, recipe.top_k, teachers[name].tokenizer)
    return teachers
