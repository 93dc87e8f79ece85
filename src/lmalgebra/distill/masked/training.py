"""``lmalgebra merge train`` on a masked recipe: the student trained from the teacher store and the
union vocabulary with the one loop, saved with the union tokenizer, its id maps and a card."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lmalgebra.core import plugins
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.distill.layout import (
    ANOTHER_STUDENT,
    TOPK,
    RunLayout,
    saved_steps,
    saved_training,
    write_model_directory,
)
from lmalgebra.distill.masked.student_data import StoreBatches
from lmalgebra.distill.masked.student_model import build_masked_lm, masked_config
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.run.model_card import student_card
from lmalgebra.distill.student import student_inputs
from lmalgebra.distill.teachers import Teacher
from lmalgebra.distill.vocab.union import MAPS_FILE, META_FILE, UnionVocab
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import (
    refuse_fewer_steps,
    refuse_other_training,
    release_checkpoints,
    train,
)
from lmalgebra.train.run_fingerprint import config_part

log = logging.getLogger(__name__)


def masked_inputs(recipe: MaskedRecipe) -> dict[str, Any]:
    """What a masked student's checkpoints record of its inputs, none read from weights: the
    recipe's data settings and the store's keys, the vocabulary's record (once built) and the
    embedding initialisation."""
    meta = RunLayout(recipe.output_dir).vocab / META_FILE
    vocabulary = {"vocabulary": sha256_file(meta)} if meta.is_file() else {}
    inputs = student_inputs(recipe, TOPK)
    return {**inputs, **vocabulary, "init_embeddings": recipe.student.init_embeddings}


def planned_model(recipe: MaskedRecipe) -> dict[str, Any]:
    """The ``model`` part of a masked student's checkpoints, from the recipe and the union
    vocabulary without weights (what a dry run compares); none before the vocabulary is built,
    or where it does not load (the stages name it)."""
    try:
        vocab = len(UnionVocab.load(RunLayout(recipe.output_dir).vocab).tokens)
    except UserInputError:
        return {}
    return {"model": config_part(masked_config(recipe.student, recipe.student.vocab_size or vocab))}


def train_masked_student(
    recipe: MaskedRecipe,
    name: str,
    spec: TrainingSpec,
    teachers: dict[str, Teacher],
    progress: bool,
    restart: bool,
    *,
    store: str,
) -> Path:
    """Train (or resume) student ``name`` of the run on its store (checked: ``teachers``; its
    identity ``store``, recorded with the student); the final model goes to ``<name>/model``.

    A checkpoint of other inputs (recipe, store, vocabulary, student, training) is refused;
    ``restart`` starts afresh instead."""
    layout = RunLayout(recipe.output_dir)
    saved = layout.model(name)
    if not restart:  # a saved student of more steps, or other settings, is not replaced
        refuse_fewer_steps(saved_steps(saved), spec.steps, saved, ANOTHER_STUDENT)
        refuse_other_training(
            saved_training(saved), spec, [layout.student(name)], saved, ANOTHER_STUDENT
        )
    vocab = UnionVocab.load(layout.vocab)
    recipe.student.fits(len(vocab.tokens), recipe.example_length)
    init = recipe.student.embedding_init()  # refused before any work
    source = StoreBatches(
        recipe.output_dir,
        recipe.teachers_of(spec.teachers),
        vocab,
        spec.batch_size,
        spec.sampling_exponent,
        spec.multi_teacher,
        spec.seed,
    )
    log.info("language sampling probabilities: %s", source.probabilities)
    size = recipe.student.vocab_size or len(vocab.tokens)
    plugins.announce(plugins.EMBEDDING_INITS, [recipe.student.init_embeddings])
    model = build_masked_lm(recipe.student, size, pad_id=0, seed=spec.seed)
    inputs = masked_inputs(recipe)
    seeding: dict[str, Any] | None = None
    if init is not None:  # an entry point (core.plugins)
        seeding = init(model, recipe, vocab)
    final = train(
        model, source, spec, layout.student(name), progress, inputs, restart, beside=ANOTHER_STUDENT
    )
    target = layout.model(name)
    metadata: dict[str, Any] = {
        "kind": "mergedistill-student",
        "recipe": recipe.model_dump(mode="json"),
        "training": spec.model_dump(),
        "teacher_hashes": {n: t.hashes for n, t in teachers.items()},
        "store_sha256": store,
        "language_probabilities": source.probabilities,
        "vocabulary": MAPS_FILE,
        "final": final,
        "init_embeddings": seeding,
    }
    card = student_card(
        name, metadata["recipe"], metadata["training"], source.probabilities, len(vocab.tokens)
    )
    files = [(f, (layout.vocab / f).read_bytes()) for f in (MAPS_FILE, META_FILE)]
    tokenizer = vocab.student_tokenizer(recipe.student.max_position_embeddings)
    saved = write_model_directory(target, model, tokenizer, metadata, card, files)
    release_checkpoints(layout.student(name), spec)
    return saved
