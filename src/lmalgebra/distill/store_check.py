"""Before a student trains: the teacher store (and, for masked recipes, the union vocabulary)
must have been built from this recipe and these teachers. Each shard set's key, recomputed from
the recipe and the teachers' current hashes, must equal the key the set was written under; a
difference is refused with one line naming what changed and the stage to run again."""

from __future__ import annotations

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.store import logprobs_set, tokens_set
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.stages import open_teachers, topk_set, vocab_stamp
from lmalgebra.distill.teacher_precision import accepted_dtypes
from lmalgebra.distill.teachers import Teacher
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.run_fingerprint import differences


def _check_set(accepted: list[ShardSet], stage: str) -> None:
    """Refuse a missing or incomplete shard set, or one written under none of the ``accepted``
    keys (one per dtype the recipe accepts), naming what differs from the first: a setting of the
    recipe, the dtype, or a teacher's weights or tokenizer hash."""
    expected = accepted[0]
    found = ShardSet.existing(expected.directory)
    if not found.complete:
        raise UserInputError(
            f"{expected.directory} is missing or incomplete: run `lmalgebra merge {stage} RECIPE` "
            "first"
        )
    if found.key not in [a.key for a in accepted]:
        changed = differences(found.key, expected.key)
        shown = "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
        raise UserInputError(
            f"the store in {expected.directory} was built with a different recipe or teacher "
            f"({shown}): run `lmalgebra merge {stage} RECIPE` for this recipe"
        )


def check_store(recipe: MergeRecipe) -> dict[str, Teacher]:
    """Refuse a store (or masked recipes' vocabulary) built from another recipe or other
    teachers; the recipe's teachers, opened."""
    teachers = open_teachers(recipe)
    for lang, spec in recipe.languages.items():
        for name in spec.teachers:
            teacher = teachers[name]
            if recipe.objective == "causal":
                _check_set([tokens_set(recipe, lang, teacher)], "prepare")
                _check_set(
                    [logprobs_set(recipe, lang, teacher, d) for d in accepted_dtypes(recipe)],
                    "teach",
                )
            else:
                _check_set(
                    [topk_set(recipe, lang, teacher, d) for d in accepted_dtypes(recipe)], "teach"
                )
    if recipe.objective == "causal":  # no union vocabulary
        return teachers
    stamp = vocab_stamp(recipe, teachers)
    if stamp.recorded() is None:
        raise UserInputError(
            f"{stamp.directory} is missing: run `lmalgebra merge vocab RECIPE` first"
        )
    if not stamp.done():
        raise UserInputError(
            f"the vocabulary in {stamp.directory} was built from other teachers: "
            "run `lmalgebra merge vocab RECIPE` again"
        )
    return teachers
