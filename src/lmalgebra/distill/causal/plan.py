"""A causal recipe's run, planned before anything runs (``lmalgebra merge ... --dry-run``).

Per (language, teacher): the examples and the teacher's tokens, exactly as ``prepare`` makes
them (every example cut by text and tokenised with byte offsets in memory), and the bytes of the
``logprobs/`` shards ``teach`` writes (next-token log-probability, top-k and drawn tokens at every
position), laid out with its record layout and measured in memory. Nothing is written and no
teacher weights are read: teachers are their tokenizers and ``config.json``.

Time per stage: ``prepare`` is the time its work took here in memory (file writes not counted);
``teach`` (the head at every position), ``train`` and ``evaluate`` (bits per byte of the student
and of each teacher on the held-out examples) are estimates from ``time_estimate``'s stated model
(``distill.run.dry_run``), ``train`` with the time the student's tokenizer takes to make and read
every example, measured here. Not counted: the cross-tokenizer alignments a training batch
computes on the CPU, and the LMD coverage and continuations of ``evaluate``. A recipe whose
student names no tokenizer has no ``train`` estimate and no student in ``evaluate`` (NaN and
teachers only): ``merge train`` would refuse it.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
import pyarrow as pa

from lmalgebra.distill.causal.logprobs import CausalOutput
from lmalgebra.distill.causal.store import logprobs_table, tokens_table
from lmalgebra.distill.causal.student_init import open_init
from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
from lmalgebra.distill.causal.teachers import teacher_tokenizer
from lmalgebra.distill.examples import Example, language_examples
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.run.dry_run import (
    PairPlan,
    evaluate_seconds,
    student_shape,
    teach_seconds,
    teacher_shape,
    train_seconds,
)
from lmalgebra.distill.run.time_estimate import ModelShape
from lmalgebra.distill.teachers import Teacher
from lmalgebra.distill.vocab.byte_alignment import encode_with_offsets
from lmalgebra.storage.arrow_columns import id_dtype, ragged
from lmalgebra.storage.shard_formats import ARROW_TABLES
from lmalgebra.train.config import CausalTrainingSpec


def plan_causal(recipe: CausalRecipe, spec: CausalTrainingSpec) -> list[dict[str, Any]]:
    """The rows of ``distill.run.dry_run`` for a causal recipe whose student trains with
    ``spec``; ``predicted_tokens`` are every token, ``store_bytes`` the ``logprobs/`` files.
    What training refuses of ``spec`` (a teacher the recipe lacks, a setting the recipe makes
    it ignore, a loss the store cannot feed) is refused here first, as ``merge train`` would."""
    from lmalgebra.distill.causal.training import DEFAULT_MIX, check_mix

    recipe.check_training(spec)
    check_mix(recipe, spec.objective_mix or DEFAULT_MIX)
    teachers, shapes = {}, {}
    for name, teacher_spec in recipe.teachers.items():
        ref = teacher_spec.ref(name)
        directory = ref.source.resolve(weights=False)
        tokenizer = teacher_tokenizer(ref, directory, recipe.top_k)
        teachers[name] = Teacher(name, directory, {}, tokenizer)
        shapes[name] = teacher_shape(directory, len(tokenizer))
    pairs, examples_of = [], {}
    for lang, language in recipe.languages.items():
        clock = time.perf_counter()
        examples_of[lang] = language_examples(recipe, lang)
        reading = (time.perf_counter() - clock) / len(language.teachers)
        for name in language.teachers:
            pair = _tokenize(recipe, lang, teachers[name], examples_of[lang])
            pair.seconds["prepare"] += reading
            pairs.append(pair)
    cpu = teach_seconds(pairs, shapes, recipe.shard_rows, recipe.batch_size)
    student = _student(recipe, examples_of, pairs)
    if student is None:
        for pair in pairs:
            pair.seconds["train"] = math.nan
        evaluate_seconds(pairs, None, cpu, shapes)
    else:
        made = pairs[0].seconds["train"]  # the tokenizer's time, already split over the pairs
        train_seconds(list(recipe.languages), spec, pairs, student, cpu)
        for pair in pairs:
            pair.seconds["train"] += made
        evaluate_seconds(pairs, student, cpu, shapes)
    return [pair.row() for pair in pairs]


def _tokenize(
    recipe: CausalRecipe, lang: str, teacher: Teacher, examples: list[Example]
) -> PairPlan:
    """The pair's ``tokens/`` shards made as ``prepare`` makes them (one shard in memory at a
    time); the token counts and the ``logprobs/`` bytes."""
    k, samples = recipe.top_k, recipe.causal.samples
    dtype = id_dtype(len(teacher.tokenizer))
    lengths: list[int] = []
    seconds, store = 0.0, 0
    for start in range(0, len(examples), recipe.shard_rows):
        part = examples[start : start + recipe.shard_rows]
        table = pa.table(
            {
                "id": [e.id for e in part],
                "text": [e.text for e in part],
                "heldout": [e.heldout for e in part],
            }
        )
        clock = time.perf_counter()
        tokens = tokens_table(recipe, lang, teacher, table)
        seconds += time.perf_counter() - clock
        counts = np.diff(ragged(tokens.column("token_ids"))[1])
        lengths += counts.tolist()
        zeros = [_zeros(int(n), k, samples) for n in counts]
        store += ARROW_TABLES.size(logprobs_table(zeros, dtype, samples))
    heldout = np.array([e.heldout for e in examples], dtype=bool)
    counted = np.array(lengths, dtype=np.int64)
    pair = PairPlan(lang, teacher.name, counted, counted, heldout, store, counted, counted)
    pair.seconds["prepare"] = seconds
    return pair


def _zeros(n: int, k: int, samples: int) -> CausalOutput:
    """An example's outputs of ``n`` tokens, laid out as ``teach`` stores them (values zero)."""
    drawn = (np.zeros((n, samples), np.int64), np.zeros((n, samples), np.float32))
    return CausalOutput(
        np.zeros(n, np.float32),
        np.zeros((n, k), np.int64),
        np.zeros((n, k), np.float32),
        *(drawn if samples else (None, None)),
    )


def _student(
    recipe: CausalRecipe, examples: dict[str, list[Example]], pairs: list[PairPlan]
) -> ModelShape | None:
    """The student's tokenizer made as ``train`` makes it and every example read with it, timed
    (split evenly over the pairs, as ``train`` seconds); the student's tokens per example set on
    each pair, and the student's shape (``student.init``: its model's, the kept layers alone).
    None when the recipe names no student tokenizer and no model to start from."""
    if recipe.student.tokenizer is None and recipe.student.init is None:
        return None

    def training() -> dict[str, list[str]]:
        return {lang: [e.text for e in found if not e.heldout] for lang, found in examples.items()}

    clock = time.perf_counter()
    tokenizer, _ = student_tokenizer(recipe, training)
    read = {
        lang: np.array(
            [len(encode_with_offsets(tokenizer, e.text, "student").ids) for e in found],
            dtype=np.int64,
        )
        for lang, found in examples.items()
    }
    seconds = time.perf_counter() - clock
    for pair in pairs:
        pair.student_lengths = pair.student_predicted = read[pair.language]
        pair.seconds["train"] = seconds / len(pairs)
    init = open_init(recipe.student, weights=False)
    if init is None:
        return student_shape(recipe.student, len(tokenizer))
    shape = teacher_shape(init.directory, len(tokenizer))  # its config.json and weight files
    return shape if init.layers is None else replace(shape, layers=len(init.layers))
