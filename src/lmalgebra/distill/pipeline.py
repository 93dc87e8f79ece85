"""The MergeDistill stage sequence, written once: prepare -> teach -> vocab -> train.

``lmalgebra.merge`` (and through it every ``lmalgebra merge`` stage command) runs its stages
through ``run_stages``; the demo runs them and then trains its students. Each stage skips the
work an earlier run finished (complete shard sets, a vocabulary built from the same tokenizers,
a student already saved), so a sequence cut short continues where it stopped when run again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from lmalgebra.distill.masked.training import train_student
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.stages import prepare, teach, vocab
from lmalgebra.distill.teacher_precision import inference_setup
from lmalgebra.train.config import TrainingSpec

Stage = Literal["prepare", "teach", "vocab", "train"]
STAGES: tuple[Stage, ...] = ("prepare", "teach", "vocab", "train")
STORE_STAGES: tuple[Stage, ...] = ("prepare", "teach", "vocab")  # everything before training
# a causal recipe has no union vocabulary: its vocab stage is skipped in a sequence of stages, and
# refused (one clear line) when asked for alone


def run_stages(
    recipe: MergeRecipe,
    stages: Sequence[Stage] = STORE_STAGES,
    students: Mapping[str, TrainingSpec] | None = None,
    progress: bool = True,
    *,
    keep_saved: bool = True,
    restart: bool = False,
) -> dict[str, Path]:
    """Run ``stages`` of ``recipe`` in pipeline order; the model directory of each student.

    ``students``: for the ``train`` stage, run subdirectory name -> training settings.
    ``keep_saved``: a student whose model is already saved (``<name>/model/lmalgebra.json``) is
    not trained again; ``False`` resumes it from its last checkpoint (to more steps, say).
    ``restart``: train from step 0, dropping the students' checkpoints.
    """
    unknown = [s for s in stages if s not in STAGES]
    if unknown:
        raise ValueError(f"unknown MergeDistill stage {unknown[0]!r}; stages are {STAGES}")
    if "train" in stages and not students:
        raise ValueError("the train stage needs at least one student")
    # teacher inference's device and dtype, refused before anything is written
    setup = inference_setup(recipe) if "teach" in stages else None
    if "prepare" in stages:
        prepare(recipe, progress)
    if "teach" in stages:
        teach(recipe, progress, setup)
    if "vocab" in stages and (recipe.objective == "masked" or list(stages) == ["vocab"]):
        vocab(recipe)
    models: dict[str, Path] = {}
    if "train" in stages:
        for name, training in (students or {}).items():
            model = recipe.output_dir / name / "model"
            if restart or not (keep_saved and (model / "lmalgebra.json").is_file()):
                model = train_student(recipe, name, training, progress, restart)
            models[name] = model
    return models
