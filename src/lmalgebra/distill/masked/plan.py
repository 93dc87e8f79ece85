"""What a masked recipe's dry run makes of its own (``distill.plan`` makes the rest): the ``topk/``
shards ``teach`` writes, laid out with their record layout (top-k ids and float16
log-probabilities per masked token, a float32 loss per example), and the ``vocab`` stage's work,
done in memory and timed (file writes not counted). ``train`` and ``evaluate`` (the student and
the teacher on every held-out copy) are estimates (``distill.run.dry_run``).
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from lmalgebra.distill.examples import Example
from lmalgebra.distill.masked.store import topk_table
from lmalgebra.distill.masked.topk import TeacherOutput
from lmalgebra.distill.masked.vocabulary import REPORT_TEXTS
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.run.dry_run import PairPlan, student_shape
from lmalgebra.distill.run.time_estimate import ModelShape
from lmalgebra.distill.teachers import Teacher
from lmalgebra.storage.arrow_columns import id_dtype


def zero_topk(teacher: Teacher, k: int, masked: np.ndarray) -> pa.Table:
    """A ``topk/`` shard of copies with ``masked`` masked tokens each (values zero)."""
    zeros = [TeacherOutput(np.zeros((n, k), np.int64), np.zeros((n, k)), 0.0) for n in masked]
    return topk_table(zeros, id_dtype(len(teacher.tokenizer)))


def plan_vocab(
    recipe: MaskedRecipe,
    teachers: dict[str, Teacher],
    examples: dict[str, list[Example]],
    pairs: list[PairPlan],
) -> ModelShape:
    """The vocab stage's work, done in memory and timed (split evenly over the pairs); the
    student's shape over the union vocabulary."""
    from lmalgebra.distill.vocab.union import build_union, tokens_per_language

    tokenizers = {name: teacher.tokenizer for name, teacher in teachers.items()}
    texts = {lang: [e.text for e in found[:REPORT_TEXTS]] for lang, found in examples.items()}
    clock = time.perf_counter()
    union = build_union(tokenizers)
    union.report(tokenizers)
    tokens_per_language(texts, union.student_tokenizer())
    seconds = time.perf_counter() - clock
    for pair in pairs:
        pair.seconds["vocab"] = seconds / len(pairs)
    s = recipe.student
    s.fits(len(union.tokens), recipe.example_length)  # refused as training refuses it
    check = getattr(s.embedding_init(), "plan", None)  # an init's own refusals, if it has any
    if check is not None:
        check(union, {name: teacher.directory for name, teacher in teachers.items()})
    trimmed = s.embedding_size in (None, s.hidden_size)  # BERT; factorised: ALBERT
    return student_shape(s, s.vocab_size or len(union.tokens), s.embedding_size, trimmed)
