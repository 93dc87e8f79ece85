"""A MergeDistill recipe's run, planned before anything runs (``lmalgebra merge ... --dry-run``).

Per (language, teacher): the examples, input and masked tokens, and the bytes of the teacher
store's shards, exactly as the stages make them: the corpus is read and every example tokenised
and masked in memory as ``prepare`` does, and each ``topk/`` shard is laid out with the record
layout ``teach`` writes (top-k ids and float16 log-probabilities per masked token, a float32 loss
per example) and measured in memory. Nothing is written and no teacher weights are read: teachers
are their tokenizers and ``config.json``. Time per stage: ``prepare`` and ``vocab`` are the time
their work took here in memory (file writes not counted); ``teach``, ``train`` and ``evaluate``
are estimates from ``time_estimate``'s stated model.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmalgebra.distill.examples import language_examples
from lmalgebra.distill.masked.masking import TeacherMasker
from lmalgebra.distill.masked.topk import TeacherOutput
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.run.time_estimate import ModelShape, Speed, measure_speed
from lmalgebra.distill.sampling import language_probabilities
from lmalgebra.distill.stages import topk_table
from lmalgebra.distill.teachers import model_config, teacher_tokenizer
from lmalgebra.sources.models import WEIGHT_SUFFIXES, resolve_directory
from lmalgebra.storage.arrow_columns import id_dtype
from lmalgebra.storage.shard_formats import ARROW_TABLES
from lmalgebra.train.config import TrainingSpec

STAGES = ("prepare", "teach", "vocab", "train", "evaluate")
EVALUATE_BATCH = 32  # ``evaluate.distill_scores.evaluate_run``'s batch size
VOCAB_TEXTS = 2000  # texts per language the vocab stage's report tokenises
_SAMPLED_BATCHES = 256  # training batches drawn to estimate a step (padding included)


@dataclass
class PairPlan:
    """One (language, teacher) pair: counts, store bytes and seconds per stage spent on it.

    ``lengths``, ``masked`` and ``heldout`` are per example (``(examples,)`` arrays): tokens of
    the teacher's copy, its masked tokens, whether it is held out.
    """

    language: str
    teacher: str
    lengths: np.ndarray
    masked: np.ndarray
    heldout: np.ndarray
    store_bytes: int
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def row(self) -> dict[str, Any]:
        counts = {
            "language": self.language,
            "teacher": self.teacher,
            "examples": int(self.lengths.size),
            "heldout": int(self.heldout.sum()),
            "tokens": int(self.lengths.sum()),
            "masked_tokens": int(self.masked.sum()),
            "store_bytes": self.store_bytes,
        }
        return {**counts, **{f"{stage}_s": self.seconds[stage] for stage in STAGES}}


@dataclass
class _Teacher:
    tokenizer: Any
    shape: ModelShape


def plan_merge(recipe: MergeRecipe, training: TrainingSpec | None = None) -> list[dict[str, Any]]:
    """One row per (language, teacher): ``language``, ``teacher``, ``examples``, ``heldout``,
    ``tokens``, ``masked_tokens``, ``store_bytes`` (the ``topk/`` shard files), and seconds
    spent on the pair by each stage (``prepare_s`` ... ``evaluate_s``; a stage's total is the
    column's sum). ``training``: the student's settings (default the recipe's)."""
    spec = training or recipe.training
    teachers = {name: _open(recipe, name) for name in recipe.teachers}
    cpu = measure_speed("cpu")
    pairs, texts = [], {}
    for lang, language in recipe.languages.items():
        clock = time.perf_counter()
        examples = language_examples(recipe, lang)
        reading = (time.perf_counter() - clock) / len(language.teachers)
        texts[lang] = [e.text for e in examples[:VOCAB_TEXTS]]
        for name in language.teachers:
            pair = _mask(recipe, lang, name, teachers[name], examples)
            pair.seconds["prepare"] += reading
            pairs.append(pair)
    for pair in pairs:
        teacher = teachers[pair.teacher]
        share = sum(p.teacher == pair.teacher for p in pairs)
        load = teacher.shape.load_seconds / share
        pair.seconds["teach"] = load + _teach_seconds(recipe, pair, teacher.shape, cpu)
    student = _vocab(recipe, teachers, texts, pairs)
    _train(recipe, spec, pairs, student, cpu)
    for pair in pairs:
        batches = _batches(pair, np.flatnonzero(pair.heldout), EVALUATE_BATCH, sort=False)
        load = student.load_seconds / len(pairs)
        pair.seconds["evaluate"] = load + cpu.batch_seconds(student, batches)
    return [pair.row() for pair in pairs]


def _open(recipe: MergeRecipe, name: str) -> _Teacher:
    """A teacher as its tokenizer (checked as ``prepare`` checks it) and its sizes."""
    ref = recipe.teachers[name].ref(name)
    directory = resolve_directory(ref, weights=False)
    tokenizer = teacher_tokenizer(ref, directory, recipe.example_length)
    weights = [p for p in directory.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)]
    shape = ModelShape.from_config(
        model_config(directory), len(tokenizer), sum(p.stat().st_size for p in weights)
    )
    return _Teacher(tokenizer, shape)


def _mask(
    recipe: MergeRecipe, lang: str, name: str, teacher: _Teacher, examples: list[Any]
) -> PairPlan:
    """The pair's copies made as ``prepare`` makes them, shard by shard (one shard's copies in
    memory at a time); their sizes and the store's bytes."""
    masker = TeacherMasker(name, teacher.tokenizer, recipe.masking, recipe.example_length)
    k = min(recipe.top_k, teacher.shape.vocab)  # ``masked_topk`` keeps at most the vocabulary
    dtype = id_dtype(len(teacher.tokenizer))
    sizes: list[tuple[int, int]] = []  # (tokens, masked tokens) per copy
    seconds, store = 0.0, 0
    for start in range(0, len(examples), recipe.shard_rows):
        clock = time.perf_counter()
        copies = [masker(e.id, e.text) for e in examples[start : start + recipe.shard_rows]]
        seconds += time.perf_counter() - clock
        sizes += [(c.input_ids.size, c.positions.size) for c in copies]
        shape = [(c.positions.size, k) for c in copies]
        zeros = [TeacherOutput(np.zeros(s, np.int64), np.zeros(s), 0.0) for s in shape]
        store += ARROW_TABLES.size(topk_table(zeros, dtype))
    heldout = np.array([e.heldout for e in examples], dtype=bool)
    counts = np.array(sizes, dtype=np.int64).reshape(-1, 2)
    pair = PairPlan(lang, name, counts[:, 0], counts[:, 1], heldout, store)
    pair.seconds["prepare"] = seconds
    return pair


def _batches(pair: PairPlan, rows: np.ndarray, size: int, sort: bool) -> list[tuple[int, int, int]]:
    """``(rows, padded width, masked)`` of each batch of ``size`` of ``rows``, in order or, as
    teacher inference does, longest first."""
    if sort:
        rows = rows[np.argsort(-pair.lengths[rows], kind="stable")]
    return [
        (len(part), int(pair.lengths[part].max()), int(pair.masked[part].sum()))
        for part in (rows[i : i + size] for i in range(0, rows.size, size))
    ]


def _teach_seconds(recipe: MergeRecipe, pair: PairPlan, shape: ModelShape, cpu: Speed) -> float:
    """Teacher inference over every copy, shard by shard, length-sorted batches."""
    batches = []
    for start in range(0, pair.lengths.size, recipe.shard_rows):
        shard = np.arange(start, min(start + recipe.shard_rows, pair.lengths.size))
        batches += _batches(pair, shard, recipe.batch_size, sort=True)
    return cpu.batch_seconds(shape, batches)


def _vocab(
    recipe: MergeRecipe,
    teachers: dict[str, _Teacher],
    texts: dict[str, list[str]],
    pairs: list[PairPlan],
) -> ModelShape:
    """The vocab stage's work, done in memory and timed (split evenly over the pairs); the
    student's shape over the union vocabulary."""
    from lmalgebra.distill.vocab.union import build_union, tokens_per_language

    clock = time.perf_counter()
    tokenizers = {name: t.tokenizer for name, t in teachers.items()}
    union = build_union(tokenizers)
    union.report(tokenizers)
    tokens_per_language(texts, union.student_tokenizer())
    seconds = time.perf_counter() - clock
    for pair in pairs:
        pair.seconds["vocab"] = seconds / len(pairs)
    s = recipe.student
    return ModelShape(
        layers=s.num_layers,
        hidden=s.hidden_size,
        intermediate=s.intermediate_size,
        embedding=s.embedding_size or s.hidden_size,
        vocab=s.vocab_size or len(union.tokens),
        trimmed=s.embedding_size in (None, s.hidden_size),  # BERT; factorised: ALBERT
    )


def _train(
    recipe: MergeRecipe, spec: TrainingSpec, pairs: list[PairPlan], student: ModelShape, cpu: Speed
) -> None:
    """Student training: batches drawn as ``StoreBatches`` draws them (languages by
    ``n^sampling_exponent``, then a training copy uniformly), time split by each pair's tokens;
    timed on the device Accelerate trains on."""
    import torch

    rng = np.random.default_rng(spec.seed)
    langs = list(recipe.languages)
    pools = {lang: [p for p in pairs if p.language == lang] for lang in langs}
    counts = {lang: int((~pools[lang][0].heldout).sum()) for lang in langs}
    probabilities = language_probabilities(counts, spec.sampling_exponent)
    micro = spec.steps * spec.grad_accum
    drawn, tokens = [], {id(p): 0 for p in pairs}
    training_rows = {id(p): np.flatnonzero(~p.heldout) for p in pairs}
    for _ in range(min(micro, _SAMPLED_BATCHES)):
        picks = rng.choice(len(langs), size=spec.batch_size, p=[probabilities[x] for x in langs])
        width = masked = 0
        for k in picks:
            pool = pools[langs[k]]
            pair = pool[rng.integers(len(pool))]  # ``best`` keeps one copy: same odds per teacher
            row = rng.choice(training_rows[id(pair)])
            width, masked = max(width, int(pair.lengths[row])), masked + int(pair.masked[row])
            tokens[id(pair)] += int(pair.lengths[row])
        drawn.append((spec.batch_size, width, masked))
    speed = measure_speed("cuda") if torch.cuda.is_available() else cpu  # as Accelerate picks
    sampled = speed.batch_seconds(student, drawn, training=True)
    total = sampled * micro / max(len(drawn), 1) + student.load_seconds  # building the student
    seen = max(sum(tokens.values()), 1)
    for pair in pairs:
        pair.seconds["train"] = total * tokens[id(pair)] / seen
