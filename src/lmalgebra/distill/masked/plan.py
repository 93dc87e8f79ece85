"""A masked recipe's run, planned before anything runs (``lmalgebra merge ... --dry-run``).

Per (language, teacher): the examples, input and masked tokens, and the bytes of the teacher
store's shards, exactly as the stages make them: the corpus is read and every example tokenised
and masked in memory as ``prepare`` does, and each ``topk/`` shard is laid out with the record
layout ``teach`` writes (top-k ids and float16 log-probabilities per masked token, a float32 loss
per example) and measured in memory. Nothing is written and no teacher weights are read: teachers
are their tokenizers and ``config.json``. Time per stage: ``prepare`` and ``vocab`` are the time
their work took here in memory (file writes not counted); ``teach``, ``train`` and ``evaluate``
(the student and the teacher on every held-out copy) are estimates from ``time_estimate``'s
stated model (``distill.run.dry_run``).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from lmalgebra.distill.examples import Example, language_examples
from lmalgebra.distill.masked.masking import TeacherMasker
from lmalgebra.distill.masked.store import topk_table
from lmalgebra.distill.masked.teachers import teacher_tokenizer
from lmalgebra.distill.masked.topk import TeacherOutput
from lmalgebra.distill.masked.vocabulary import REPORT_TEXTS
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.run.dry_run import (
    PairPlan,
    evaluate_seconds,
    student_shape,
    teach_seconds,
    teacher_shape,
    train_seconds,
)
from lmalgebra.distill.run.time_estimate import ModelShape
from lmalgebra.storage.arrow_columns import id_dtype
from lmalgebra.storage.shard_formats import ARROW_TABLES
from lmalgebra.train.config import TrainingSpec


def plan_masked(recipe: MaskedRecipe, spec: TrainingSpec) -> list[dict[str, Any]]:
    """The rows of ``distill.run.dry_run`` for a masked recipe whose student trains with
    ``spec``; ``store_bytes``: the ``topk/`` shard files. A ``training.teachers`` or a setting
    that training refuses is refused here first."""
    recipe.check_training(spec)
    tokenizers, shapes = {}, {}
    for name, teacher in recipe.teachers.items():
        ref = teacher.ref(name)
        directory = ref.source.resolve(weights=False)
        tokenizers[name] = teacher_tokenizer(ref, directory, recipe.example_length)
        shapes[name] = teacher_shape(directory, len(tokenizers[name]))
    pairs, texts = [], {}
    for lang, language in recipe.languages.items():
        clock = time.perf_counter()
        examples = language_examples(recipe, lang)
        reading = (time.perf_counter() - clock) / len(language.teachers)
        texts[lang] = [e.text for e in examples[:REPORT_TEXTS]]
        for name in language.teachers:
            pair = _mask(recipe, lang, name, (tokenizers[name], shapes[name]), examples)
            pair.seconds["prepare"] += reading
            pairs.append(pair)
    cpu = teach_seconds(pairs, shapes, recipe.shard_rows, recipe.batch_size)
    student = _vocab(recipe, tokenizers, texts, pairs)
    train_seconds(list(recipe.languages), spec, pairs, student, cpu)
    evaluate_seconds(pairs, student, cpu, shapes)
    return [pair.row() for pair in pairs]


def _mask(
    recipe: MaskedRecipe,
    lang: str,
    name: str,
    teacher: tuple[Any, ModelShape],
    examples: list[Example],
) -> PairPlan:
    """The pair's copies made as ``prepare`` makes them, shard by shard (one shard's copies in
    memory at a time); their sizes and the store's bytes."""
    tokenizer, sizes_of = teacher
    masker = TeacherMasker(name, tokenizer, recipe.masking, recipe.example_length)
    k = min(recipe.top_k, sizes_of.vocab)  # ``masked_topk`` keeps at most the vocabulary
    dtype = id_dtype(len(tokenizer))
    sizes: list[tuple[int, int]] = []  # (tokens, masked tokens) per copy
    seconds, store = 0.0, 0
    for start in range(0, len(examples), recipe.shard_rows):
        clock = time.perf_counter()
        shard = examples[start : start + recipe.shard_rows]
        copies = masker.mask_many([e.id for e in shard], [e.text for e in shard])
        seconds += time.perf_counter() - clock
        sizes += [(c.input_ids.size, c.positions.size) for c in copies]
        shape = [(c.positions.size, k) for c in copies]
        zeros = [TeacherOutput(np.zeros(s, np.int64), np.zeros(s), 0.0) for s in shape]
        store += ARROW_TABLES.size(topk_table(zeros, dtype))
    heldout = np.array([e.heldout for e in examples], dtype=bool)
    counts = np.array(sizes, dtype=np.int64).reshape(-1, 2)
    lengths, masked = counts[:, 0], counts[:, 1]
    pair = PairPlan(lang, name, lengths, masked, heldout, store, lengths, masked)
    pair.seconds["prepare"] = seconds
    return pair


def _vocab(
    recipe: MaskedRecipe,
    tokenizers: dict[str, Any],
    texts: dict[str, list[str]],
    pairs: list[PairPlan],
) -> ModelShape:
    """The vocab stage's work, done in memory and timed (split evenly over the pairs); the
    student's shape over the union vocabulary."""
    from lmalgebra.distill.vocab.union import build_union, tokens_per_language

    clock = time.perf_counter()
    union = build_union(tokenizers)
    union.report(tokenizers)
    tokens_per_language(texts, union.student_tokenizer())
    seconds = time.perf_counter() - clock
    for pair in pairs:
        pair.seconds["vocab"] = seconds / len(pairs)
    s = recipe.student
    trimmed = s.embedding_size in (None, s.hidden_size)  # BERT; factorised: ALBERT
    return student_shape(s, s.vocab_size or len(union.tokens), s.embedding_size, trimmed)
