"""Causal teachers (recipes with ``objective: causal``): an ``AutoModelForCausalLM`` with a trained
head and a fast tokenizer of any kind, whose first token is predicted after a start token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.teachers import (
    TEACHER_HINT,
    Teacher,
    check_top_k,
    refuse_damaged,
    refuse_other_head,
)
from lmalgebra.distill.vocab.token_forms import detect_convention
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.model_source import named_as
from lmalgebra.sources.models import ModelRef


def start_token_id(tokenizer: Any) -> int | None:
    """The token a text's first token is predicted after: the beginning-of-sequence token, or,
    for tokenizers with an end-of-text token only (GPT-2 style: one token separates documents
    in training), that token; None when the tokenizer has neither."""
    for found in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if found is not None:
            return int(found)
    return None


def open_causal_teacher(ref: ModelRef, memo_dir: Path | None, top_k: int) -> Teacher:
    """Resolve and fingerprint a causal teacher and load its tokenizer; refuse a masked LM, a
    tokenizer without offsets or start token, and a ``top_k`` beyond its vocabulary."""
    directory = ref.source.resolve()
    tokenizer = teacher_tokenizer(ref, directory, top_k)
    refuse_damaged(f"teacher {ref.name!r}", directory)  # before any work, not at teach
    return Teacher(ref.name, directory, source_of(ref, directory).fingerprint(memo_dir), tokenizer)


def teacher_tokenizer(ref: ModelRef, directory: Path, top_k: int) -> Any:
    """The causal teacher's tokenizer, refused for a masked LM, without offsets or a start
    token, or with fewer tokens than ``top_k``, and for an architecture transformers has no
    causal LM of; nothing of the weights is read (a dry run checks as much as the run)."""
    owner, hint = f"teacher {ref.name!r}", TEACHER_HINT["causal"]
    refuse_other_head(owner, directory, "causal", hint, ref.shown(directory))
    source_of(ref, directory).check_architecture("AutoModelForCausalLM", f"teacher {ref.name!r}")
    with named_as(ref.name, f"teacher {ref.name!r}"):
        tokenizer = source_of(ref, directory).load_tokenizer()
    detect_convention(tokenizer, ref.name)  # refuses one whose tokens cannot be read as bytes
    if start_token_id(tokenizer) is None:
        raise UserInputError(
            f"teacher {ref.name!r}: the tokenizer in {directory} has neither a "
            "beginning-of-sequence nor an end-of-text token to predict the first token after"
        )
    check_top_k(ref.name, top_k, tokenizer)
    return tokenizer


def open_teachers(recipe: CausalRecipe) -> dict[str, Teacher]:
    """Every teacher of the recipe, checked before anything is done."""
    memo = RunLayout(recipe.output_dir).hashes
    return {
        name: open_causal_teacher(spec.ref(name), memo, recipe.top_k)
        for name, spec in recipe.teachers.items()
    }
