"""A run of either objective planned before anything runs (``lmalgebra merge ... --dry-run``).

Per (language, teacher): the examples and the teacher's copies of them, exactly as ``prepare``
makes them (``Objective.copy_shard``, one shard in memory at a time, timed), and the bytes of the
outputs ``teach`` writes, laid out with their record layout (values zero) and measured in memory.
Nothing is written and no teacher weights are read: teachers are their tokenizers and
``config.json``. The model-running stages are estimates from ``time_estimate``'s stated model
(``distill.run.dry_run``). What differs is the objective's (``distill.masked.plan``,
``distill.causal.plan``): its teachers' tokenizers, its outputs' layout, and its student, whose
inputs it makes here, timed, before its shape is known.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from lmalgebra.distill.examples import Example, examples_table, language_examples
from lmalgebra.distill.objective import Objective
from lmalgebra.distill.run.dry_run import (
    PairPlan,
    evaluate_seconds,
    teach_seconds,
    teacher_shape,
    train_seconds,
)
from lmalgebra.distill.run.time_estimate import ModelShape
from lmalgebra.distill.teachers import Teacher, check_top_k
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.shard_formats import ARROW_TABLES
from lmalgebra.train.config import TrainingSpec

# (teacher, k, predicted tokens of each copy) -> a shard of its outputs, laid out as teach does
ZeroOutputs = Callable[[Teacher, int, np.ndarray], pa.Table]
# (teachers, each language's examples, the pairs) -> the student's shape, None: no student; the
# student's inputs made as ``train`` makes them, timed on the pairs' ``vocab`` or ``train`` seconds
StudentPlan = Callable[
    [dict[str, Teacher], dict[str, list[Example]], list[PairPlan]], ModelShape | None
]


def plan_rows(
    objective: Objective,
    spec: TrainingSpec,
    tokenizer_of: Callable[[ModelRef, Path], Any],
    zero_outputs: ZeroOutputs,
    student_of: StudentPlan,
) -> list[dict[str, Any]]:
    """The rows of ``distill.run.dry_run`` for ``objective``'s recipe, its student trained with
    ``spec``; ``tokenizer_of`` refuses a teacher as the run would before its weights are read.
    A recipe without a student (None) has no ``train`` estimate and no student in
    ``evaluate``: ``merge train`` would refuse it."""
    recipe = objective.recipe
    teachers, shapes = {}, {}
    for name, teacher in recipe.teachers.items():
        ref = teacher.ref(name)
        directory = ref.source.resolve(weights=False)
        teachers[name] = Teacher(name, directory, {}, tokenizer_of(ref, directory))
        check_top_k(name, recipe.top_k, teachers[name].tokenizer)  # as the run's teachers are
        shapes[name] = teacher_shape(directory, len(teachers[name].tokenizer))
    pairs, examples = [], {}
    for lang, language in recipe.languages.items():
        clock = time.perf_counter()
        examples[lang] = language_examples(recipe, lang)
        reading = (time.perf_counter() - clock) / len(language.teachers)
        for name in language.teachers:
            zeros = partial(zero_outputs, teachers[name], recipe.top_k)
            pairs.append(_pair(objective, lang, teachers[name], examples[lang], zeros))
            pairs[-1].seconds["prepare"] += reading
    cpu = teach_seconds(pairs, shapes, recipe.shard_rows, recipe.batch_size)
    student = student_of(teachers, examples, pairs)
    inputs = [pair.seconds["train"] for pair in pairs]  # the student's inputs, made here
    if student is None:
        for pair in pairs:
            pair.seconds["train"] = math.nan
    else:
        train_seconds(list(recipe.languages), spec, pairs, student, cpu)
        for pair, seconds in zip(pairs, inputs, strict=True):
            pair.seconds["train"] += seconds
    evaluate_seconds(pairs, student, cpu, shapes)
    return [pair.row() for pair in pairs]


def _pair(
    objective: Objective,
    lang: str,
    teacher: Teacher,
    examples: list[Example],
    zeros: Callable[[np.ndarray], pa.Table],
) -> PairPlan:
    """The pair's copies made as ``prepare`` makes them, shard by shard, timed; the tokens of
    each copy and those its teacher predicts (``Objective.columns``), and the bytes of its
    outputs (``zeros``: a shard of them from each copy's predicted tokens)."""
    make, _ = objective.copy_shard(lang, teacher)
    rows, columns = objective.recipe.shard_rows, objective.columns
    table = examples_table(examples)
    counts: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
    seconds, store = 0.0, 0
    for start in range(0, table.num_rows, rows):
        clock = time.perf_counter()
        copies = make(table.slice(start, rows))
        seconds += time.perf_counter() - clock
        for found, column in zip(counts, columns, strict=True):
            found.append(pc.list_value_length(copies[column]).to_numpy().astype(np.int64))
        store += ARROW_TABLES.size(zeros(counts[1][-1]))
    lengths, predicted = (np.concatenate(found) for found in counts)
    heldout = np.array([e.heldout for e in examples], dtype=bool)
    pair = PairPlan(lang, teacher.name, lengths, predicted, heldout, store, lengths, predicted)
    pair.seconds["prepare"] = seconds
    return pair
