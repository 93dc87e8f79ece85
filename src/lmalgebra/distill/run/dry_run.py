"""What a dry run of either objective shares (``lmalgebra merge ... --dry-run``): a (language,
teacher) pair's plan, a teacher's sizes from its files, and the times of the model-running stages
from ``time_estimate``'s stated model, batched as the stages batch.

``distill.plan`` makes each pair's copies in memory as the objective's ``prepare`` does; the rows
have the same columns for both objectives: ``language``, ``teacher``, ``examples``, ``heldout``,
``tokens`` (of the teacher's copies), ``predicted_tokens`` (the tokens the teacher store holds
outputs for: masked tokens, or every token of a causal teacher), ``store_bytes`` (the shard files
of the teachers' outputs) and the seconds each stage spends on the pair (``prepare_s`` ...
``evaluate_s``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.distill.run.time_estimate import ModelShape, Speed, measure_speed
from lmalgebra.distill.sampling import language_probabilities
from lmalgebra.distill.student import ModelSpec
from lmalgebra.distill.student_memory import refuse_beyond_memory
from lmalgebra.distill.teachers import model_config
from lmalgebra.sources.model_files import weight_files
from lmalgebra.train.config import TrainingSpec

PLAN_STAGES = ("prepare", "teach", "vocab", "train", "evaluate")
EVALUATE_BATCH = 32  # the evaluations' batch size
SAMPLED_BATCHES = 256  # training batches drawn to estimate a step (padding included)


@dataclass
class PairPlan:
    """One (language, teacher) pair: per example (``(examples,)`` arrays) the tokens of the
    teacher's copy (``lengths``), its predicted tokens (``predicted``), whether it is held out,
    and what the student reads of it (``student_lengths``, ``student_predicted``: the teacher's
    copy itself for a masked student); the bytes of its store and seconds per stage."""

    language: str
    teacher: str
    lengths: np.ndarray
    predicted: np.ndarray
    heldout: np.ndarray
    store_bytes: int
    student_lengths: np.ndarray
    student_predicted: np.ndarray
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PLAN_STAGES, 0.0))

    def row(self) -> dict[str, Any]:
        counts = {
            "language": self.language,
            "teacher": self.teacher,
            "examples": int(self.lengths.size),
            "heldout": int(self.heldout.sum()),
            "tokens": int(self.lengths.sum()),
            "predicted_tokens": int(self.predicted.sum()),
            "store_bytes": self.store_bytes,
        }
        return {**counts, **{f"{stage}_s": self.seconds[stage] for stage in PLAN_STAGES}}


def teacher_shape(directory: Path, vocab: int) -> ModelShape:
    """A teacher's sizes from its ``config.json`` and the bytes of its weight files (read by
    nothing here)."""
    weights = weight_files(directory)
    return ModelShape.from_config(
        model_config(directory), vocab, sum(p.stat().st_size for p in weights)
    )


def student_shape(
    spec: ModelSpec, vocab: int, embedding: int | None = None, trimmed: bool = False
) -> ModelShape:
    """A student's sizes for the estimates: its spec's, over ``vocab`` tokens (``embedding``: a
    factorised embedding's width; ``trimmed``: the last layer runs at the predicted rows only).
    A student too large for this machine is refused, as training refuses it."""
    refuse_beyond_memory(spec, vocab)
    return ModelShape(
        layers=spec.num_layers,
        hidden=spec.hidden_size,
        intermediate=spec.intermediate_size,
        embedding=embedding or spec.hidden_size,
        vocab=vocab,
        trimmed=trimmed,
    )


def batches(
    lengths: np.ndarray, predicted: np.ndarray, rows: np.ndarray, size: int, sort: bool
) -> list[tuple[int, int, int]]:
    """``(rows, padded width, predicted)`` of each batch of ``size`` of ``rows``, in order or,
    as teacher inference does, longest first."""
    if sort:
        rows = rows[np.argsort(-lengths[rows], kind="stable")]
    return [
        (len(part), int(lengths[part].max()), int(predicted[part].sum()))
        for part in (rows[i : i + size] for i in range(0, rows.size, size))
    ]


def teach_seconds(
    pairs: list[PairPlan], shapes: dict[str, ModelShape], shard_rows: int, batch_size: int
) -> Speed:
    """Each pair's ``teach`` seconds: its teacher loaded (shared by the teacher's pairs), then
    inference over every copy, shard by shard, length-sorted batches; the CPU probed."""
    cpu = measure_speed("cpu")
    for pair in pairs:
        shape = shapes[pair.teacher]
        share = sum(p.teacher == pair.teacher for p in pairs)
        work = []
        for start in range(0, pair.lengths.size, shard_rows):
            shard = np.arange(start, min(start + shard_rows, pair.lengths.size))
            work += batches(pair.lengths, pair.predicted, shard, batch_size, sort=True)
        pair.seconds["teach"] = shape.load_seconds / share + cpu.batch_seconds(shape, work)
    return cpu


def train_seconds(
    languages: list[str], spec: TrainingSpec, pairs: list[PairPlan], student: ModelShape, cpu: Speed
) -> None:
    """Student training: batches drawn as the student's data draws them (languages by
    ``n^sampling_exponent``, then a training copy uniformly), time split by each pair's tokens;
    timed on the device Accelerate trains on."""
    import torch

    rng = np.random.default_rng(spec.seed)
    pools = {lang: [p for p in pairs if p.language == lang] for lang in languages}
    counts = {lang: int((~pools[lang][0].heldout).sum()) for lang in languages}
    probabilities = language_probabilities(counts, spec.sampling_exponent)
    micro = spec.steps * spec.grad_accum
    drawn, tokens = [], {id(p): 0 for p in pairs}
    training_rows = {id(p): np.flatnonzero(~p.heldout) for p in pairs}
    for _ in range(min(micro, SAMPLED_BATCHES)):
        picks = rng.choice(
            len(languages), size=spec.batch_size, p=[probabilities[x] for x in languages]
        )
        width = predicted = 0
        for k in picks:
            pool = pools[languages[k]]
            pair = pool[rng.integers(len(pool))]  # ``best`` keeps one copy: same odds per teacher
            row = rng.choice(training_rows[id(pair)])
            width = max(width, int(pair.student_lengths[row]))
            predicted += int(pair.student_predicted[row])
            tokens[id(pair)] += int(pair.student_lengths[row])
        drawn.append((spec.batch_size, width, predicted))
    speed = measure_speed("cuda") if torch.cuda.is_available() else cpu  # as Accelerate picks
    sampled = speed.batch_seconds(student, drawn, training=True)
    total = sampled * micro / max(len(drawn), 1) + student.load_seconds  # building the student
    seen = max(sum(tokens.values()), 1)
    for pair in pairs:
        pair.seconds["train"] = total * tokens[id(pair)] / seen


def evaluate_seconds(
    pairs: list[PairPlan], student: ModelShape | None, cpu: Speed, teachers: dict[str, ModelShape]
) -> None:
    """The student (None: none to score) and each pair's teacher scored on the pair's held-out
    copies; the student is loaded once, its load split over the pairs."""
    for pair in pairs:
        rows = np.flatnonzero(pair.heldout)
        shape = teachers[pair.teacher]
        theirs = batches(pair.lengths, pair.predicted, rows, EVALUATE_BATCH, sort=False)
        seconds = shape.load_seconds + cpu.batch_seconds(shape, theirs)
        if student is not None:
            mine = batches(
                pair.student_lengths, pair.student_predicted, rows, EVALUATE_BATCH, sort=False
            )
            seconds += student.load_seconds / len(pairs) + cpu.batch_seconds(student, mine)
        pair.seconds["evaluate"] = seconds
