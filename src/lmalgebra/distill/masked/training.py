"""``lmalgebra merge train``: the student trained from the teacher store with the one loop."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from lmalgebra.distill.masked.seeding import seed_from_teachers
from lmalgebra.distill.masked.student_data import StoreBatches
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.run.model_card import student_card, write_card
from lmalgebra.distill.stages import RUN_SCRATCH
from lmalgebra.distill.store_check import check_store
from lmalgebra.distill.student import build_student, save_student
from lmalgebra.distill.student_inputs import check_student_name, student_inputs
from lmalgebra.distill.vocab.union import UnionVocab
from lmalgebra.distributed import is_main
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train

log = logging.getLogger(__name__)


@holding_lock("merge train", lambda recipe, **_: recipe.output_dir, RUN_SCRATCH)
def train_student(
    recipe: MergeRecipe,
    name: str = "student",
    training: TrainingSpec | None = None,
    progress: bool = True,
    restart: bool = False,
) -> Path:
    """Train (or resume) student ``run_dir/<name>``; the final model goes to ``<name>/model``.

    A checkpoint of other inputs (recipe, store, vocabulary, student, training) is refused;
    ``restart`` starts afresh instead."""
    spec = training or recipe.training
    check_student_name(name)
    if recipe.objective == "causal":
        from lmalgebra.distill.causal.training import train_causal_student

        return train_causal_student(recipe, name, spec, progress, restart)
    hashes = {n: t.hashes for n, t in check_store(recipe).items()}
    vocab = UnionVocab.load(recipe.output_dir / "vocab")
    recipe.student.fits(len(vocab.tokens), recipe.example_length)
    source = StoreBatches(
        recipe.output_dir,
        {k: v.teachers for k, v in recipe.languages.items()},
        vocab,
        spec.batch_size,
        spec.sampling_exponent,
        spec.multi_teacher,
        spec.seed,
    )
    log.info("language sampling probabilities: %s", source.probabilities)
    out = recipe.output_dir / name
    model = build_student(recipe.student, len(vocab.tokens), pad_id=0, seed=spec.seed)
    inputs = student_inputs(recipe)
    seeding: dict[str, Any] | None = None
    if recipe.student.init_embeddings == "teachers":
        seeding = seed_from_teachers(model, recipe, vocab)
        inputs["init_embeddings"] = "teachers"  # absent for random: older checkpoints stay valid
    final = train(model, source, spec, out, progress, inputs, restart)
    if not is_main():  # the main rank saves the student
        return out / "model"
    metadata: dict[str, Any] = {
        "kind": "mergedistill-student",
        "recipe": recipe.model_dump(mode="json"),
        "training": spec.model_dump(),
        "teacher_hashes": hashes,
        "language_probabilities": source.probabilities,
        "vocabulary": "vocab_maps.safetensors",
        "final": final,
        "init_embeddings": seeding,
    }
    target = out / "model"
    save_student(
        model, vocab.student_tokenizer(recipe.student.max_position_embeddings), target, metadata
    )
    for file in ("vocab_maps.safetensors", "vocab_union.json"):
        shutil.copy2(recipe.output_dir / "vocab" / file, target / file)
    card = student_card(
        name, metadata["recipe"], metadata["training"], source.probabilities, len(vocab.tokens)
    )
    write_card(target, card)
    return target
