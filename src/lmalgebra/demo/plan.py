"""Sizes of the demo, full and quick. One place, so the documentation and the report quote the
same."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

LANGUAGES = ("en", "fr", "es")


class _Sizes:
    def as_dict(self) -> dict[str, Any]:
        return asdict(self)  # type: ignore[call-overload]  # every subclass is a dataclass


@dataclass(frozen=True)
class DemoPlan(_Sizes):
    """Sizes of one demo run. ``head_*``: the second English teacher, a packaged pre-trained
    encoder (``head_encoder``) with a masked-LM head fitted for ``head_steps`` on its states at
    the first ``head_examples`` English training examples (``pretrain --head-only``)."""

    docs_per_language: int
    teacher_vocab: int
    teacher_steps: int
    head_encoder: str
    head_examples: int
    head_steps: int
    student_steps: int
    hidden_size: int
    layers: int
    example_length: int
    batch_size: int
    pos_train_sentences: int
    lmd_spans: tuple[int, int, int]


FULL = DemoPlan(
    docs_per_language=5000,
    teacher_vocab=3000,
    teacher_steps=1000,
    head_encoder="package:minilm",
    head_examples=2000,
    head_steps=300,
    student_steps=1000,
    hidden_size=128,
    layers=2,
    example_length=64,
    batch_size=32,
    pos_train_sentences=2000,
    lmd_spans=(2000, 400, 400),
)
# every step of the full demo at the smallest size that still runs each path (the test suite's
# smoke test); its numbers are toys
QUICK = replace(
    FULL,
    docs_per_language=500,
    teacher_vocab=2000,
    teacher_steps=60,
    head_examples=120,
    head_steps=20,
    student_steps=40,
    hidden_size=64,
    example_length=32,
    batch_size=16,
    pos_train_sentences=200,
    lmd_spans=(200, 50, 50),
)


@dataclass(frozen=True)
class CausalPlan(_Sizes):
    """Sizes of ``demo --causal``: one causal teacher per language (tokenizer kind and size in
    ``teachers``), students trained with each loss of ``losses`` for every seed of ``seeds``."""

    docs_per_language: int
    heldout_fraction: float
    example_bytes: int
    teachers: tuple[tuple[str, str, int], ...]  # (language, tokenizer kind, vocabulary size)
    student_tokenizer: str  # the teacher whose tokenizer the student uses
    teacher_steps: int
    student_steps: int
    hidden_size: int
    layers: int
    batch_size: int
    teacher_window: int
    top_k: int
    lambda_value: float
    seeds: tuple[int, ...]


CAUSAL_TEACHERS: tuple[tuple[str, str, int], ...] = (
    ("en", "bytelevel-bpe", 2000),
    ("fr", "unigram", 1500),
    ("es", "bpe", 2500),
)
# Every student trains with the same steps, data and lambda; only the distillation loss differs.
CAUSAL_LOSSES: dict[str, dict[str, float]] = {
    "ce": {"ce": 1.0},
    "mined": {"mined_kl": 1.0},
    "uld": {"uld": 1.0},
    "alm": {"alm": 1.0},
}
CAUSAL_FULL = CausalPlan(
    docs_per_language=600,
    heldout_fraction=0.1,
    example_bytes=384,
    teachers=CAUSAL_TEACHERS,
    student_tokenizer="teacher-en",
    teacher_steps=300,
    student_steps=80,
    hidden_size=64,
    layers=2,
    batch_size=8,
    teacher_window=64,
    top_k=8,
    lambda_value=0.5,
    seeds=(0, 1, 2),
)
CAUSAL_QUICK = replace(  # every path at the smallest size that runs it (the smoke test)
    CAUSAL_FULL,
    docs_per_language=200,
    teacher_steps=40,
    student_steps=12,
    hidden_size=48,
    seeds=(0,),
)


@dataclass(frozen=True)
class RealPlan(_Sizes):
    """Sizes of ``demo --real``: two pre-trained causal LMs with different tokenizers teach every
    language (``teachers``: name, model reference); the student is ``student_init`` with only
    ``layers`` of its decoder layers, trained as each of ``variants`` (keys of
    :data:`REAL_VARIANTS`) for every seed of ``seeds``, beside the same student untrained.
    ``validation_fraction`` of the training examples score each student every
    ``validation_every`` steps; it keeps its best weights and stops after ``patience`` scores
    without a better one. ``precision``: ``auto`` trains and runs the teachers in bfloat16
    autocast where the hardware computes it natively, else float32; ``float32`` always."""

    teachers: tuple[tuple[str, str], ...]
    student_init: str
    layers: tuple[int, ...]
    docs_per_language: int
    heldout_fraction: float
    example_bytes: int
    top_k: int
    steps: int
    batch_size: int
    lr: float
    lambda_value: float
    seeds: tuple[int, ...]
    variants: tuple[str, ...]
    validation_fraction: float
    validation_every: int
    patience: int
    precision: str = "auto"


REAL_TEACHERS = (("gemma", "package:gemma3-270m"), ("smollm2", "package:smollm2-135m"))
# variant -> the keys of ``training`` it sets beside the seed; teachers named as in REAL_TEACHERS
# (the demo's and experiments/distillation_regimes.py's)
REAL_VARIANTS: dict[str, dict[str, Any]] = {
    "ce": {"objective_mix": {"ce": 1.0}},
    # soft targets without a teacher: the regularisation a teacher's share is measured beyond
    "ce-smooth": {"objective_mix": {"ce": 1.0}, "label_smoothing": 0.1},
    # the student's own tokenizer: same-tokenizer KD, the ceiling of the cross-tokenizer losses
    "kl-smollm2": {"objective_mix": {"tail_kl": 1.0}, "teachers": ["smollm2"]},
    "prefix-gemma": {"objective_mix": {"prefix_kl": 1.0}, "teachers": ["gemma"]},
    "alm-gemma": {"objective_mix": {"alm": 1.0}, "teachers": ["gemma"]},
    "merge": {"objective_mix": {"prefix_kl": 1.0}, "multi_teacher": "all"},
    "merge-all": {"objective_mix": {"alm": 1.0}, "multi_teacher": "all"},
    "merge-best": {"objective_mix": {"alm": 1.0}, "multi_teacher": "best"},
}
# The layers the real-teacher experiment chose (experiments/results/real_teachers.md): of four
# six-layer subsets of SmolLM2's 30, the fewest bits per byte before training on unseen leads.
REAL_LAYERS = (0, 1, 2, 27, 28, 29)
# The little-data regime (experiments/results/little_data.md), where distillation pays: 32 leads
# a language repeated for up to 48 steps, each student at its best validation checkpoint; CE
# only, label smoothing and both teachers merged by prefix projection, two seeds
REAL_FULL = RealPlan(
    teachers=REAL_TEACHERS,
    student_init="package:smollm2-135m",
    layers=REAL_LAYERS,
    docs_per_language=32,
    heldout_fraction=0.25,
    example_bytes=256,
    top_k=64,
    steps=48,
    batch_size=8,
    lr=3e-4,
    lambda_value=0.5,
    seeds=(0, 1),
    variants=("ce", "ce-smooth", "merge"),
    validation_fraction=0.2,
    validation_every=6,
    patience=3,
)
REAL_QUICK = replace(  # every path at the smallest size that runs it (the smoke test)
    REAL_FULL,
    docs_per_language=12,
    steps=2,
    batch_size=2,
    seeds=(0,),
    variants=("ce", "merge"),
    validation_every=1,
    patience=1,
)
