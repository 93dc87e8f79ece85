"""Before a student trains: the teacher store must have been built from this recipe and these
teachers. Each shard set's key, recomputed from the recipe and the teachers' current hashes, must
equal the key the set was written under; a difference is refused with one line naming what
changed and the stage to run again. Each objective names its sets (``Objective.check_store``)."""

from __future__ import annotations

from collections.abc import Sequence

from lmalgebra.core.errors import UserInputError
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.run_fingerprint import differences


def check_set(accepted: Sequence[ShardSet], stage: str) -> None:
    """Refuse a missing or incomplete shard set, or one written under none of the ``accepted``
    keys (one per dtype the recipe accepts), naming what differs from the first: a setting of the
    recipe, the dtype, or a teacher's weights or tokenizer hash; ``stage``: the ``merge``
    command that writes it."""
    expected = accepted[0]
    found = ShardSet.existing(expected.directory)
    if not found.complete or not found.records:  # a complete set of nothing feeds no student
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
