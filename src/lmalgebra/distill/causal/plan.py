"""What a causal recipe's dry run makes of its own (``distill.plan`` makes the rest): the
``logprobs/`` shards ``teach`` writes (next-token log-probability, top-k and drawn tokens at every
position), laid out with their record layout, and the student's tokenizer, made as ``train``
makes it and every example read with it, timed as part of ``train``'s seconds. ``teach`` (the
head at every position), ``train`` and ``evaluate`` (bits per byte of the student and of each
teacher on the held-out examples) are estimates (``distill.run.dry_run``). Not counted: the
cross-tokenizer alignments a training batch computes on the CPU, and the LMD coverage and
continuations of ``evaluate``. A recipe whose student names no tokenizer has no ``train``
estimate and no student in ``evaluate`` (NaN and teachers only): ``merge train`` would refuse it.
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np
import pyarrow as pa

from lmalgebra.distill.causal.logprobs import CausalOutput
from lmalgebra.distill.causal.store import logprobs_table
from lmalgebra.distill.causal.student_data import refuse_longer, validation_count
from lmalgebra.distill.causal.student_init import open_init
from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
from lmalgebra.distill.examples import Example
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.run.dry_run import PairPlan, student_shape, teacher_shape
from lmalgebra.distill.run.time_estimate import ModelShape
from lmalgebra.distill.teachers import Teacher
from lmalgebra.distill.vocab.byte_alignment import encode_with_offsets
from lmalgebra.storage.arrow_columns import id_dtype


def zero_logprobs(recipe: CausalRecipe, teacher: Teacher, k: int, tokens: np.ndarray) -> pa.Table:
    """A ``logprobs/`` shard of examples of ``tokens`` tokens each (values zero)."""
    samples = recipe.causal.samples
    zeros = [_zeros(int(n), k, samples) for n in tokens]
    return logprobs_table(zeros, id_dtype(len(teacher.tokenizer)), samples)


def _zeros(n: int, k: int, samples: int) -> CausalOutput:
    """An example's outputs of ``n`` tokens, laid out as ``teach`` stores them (values zero)."""
    drawn = (np.zeros((n, samples), np.int64), np.zeros((n, samples), np.float32))
    return CausalOutput(
        np.zeros(n, np.float32),
        np.zeros((n, k), np.int64),
        np.zeros((n, k), np.float32),
        *(drawn if samples else (None, None)),
    )


def plan_student(
    recipe: CausalRecipe,
    teachers: dict[str, Teacher],
    examples: dict[str, list[Example]],
    pairs: list[PairPlan],
    validation: float = 0.0,
) -> ModelShape | None:
    """The student's tokenizer made as ``train`` makes it and every example read with it, timed
    (split evenly over the pairs, as ``train`` seconds); the student's tokens per example set on
    each pair, and the student's shape (``student.init``: its model's, the kept layers alone).
    None when the recipe names no student tokenizer and no model to start from. A share of
    ``validation`` (``training.validation_fraction``) that leaves a language no training
    example is refused as training refuses it."""
    if validation > 0:
        for lang, found in examples.items():
            validation_count(sum(not e.heldout for e in found), validation, lang)
    if recipe.student.tokenizer is None and recipe.student.init is None:
        return None

    def training() -> dict[str, list[str]]:
        return {lang: [e.text for e in found if not e.heldout] for lang, found in examples.items()}

    init = open_init(recipe.student, weights=False)  # refused as train refuses it, first
    clock = time.perf_counter()
    tokenizer, _ = student_tokenizer(recipe, training, weights=False)  # nothing into the cache
    encoded = {
        lang: [encode_with_offsets(tokenizer, e.text, "student").ids for e in found]
        for lang, found in examples.items()
    }
    read = {lang: np.array([len(i) for i in ids], dtype=np.int64) for lang, ids in encoded.items()}
    if init is not None:  # refused as training refuses it
        init.refuse_foreign_ids(
            max((int(max(i)) for v in encoded.values() for i in v if len(i)), default=-1)
        )
    seconds = time.perf_counter() - clock
    positions = recipe.student.max_position_embeddings if init is None else init.positions
    for lang, found in examples.items():  # refused as training refuses it
        for example, length in zip(found, read[lang], strict=True):
            refuse_longer(example.id, lang, int(length), positions)
    for pair in pairs:
        pair.student_lengths = pair.student_predicted = read[pair.language]
        pair.seconds["train"] = seconds / len(pairs)
    if init is None:
        return student_shape(recipe.student, len(tokenizer))
    shape = teacher_shape(init.directory, len(tokenizer))  # its config.json and weight files
    return shape if init.layers is None else replace(shape, layers=len(init.layers))
