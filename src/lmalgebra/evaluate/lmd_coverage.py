"""How much of each teacher a student carries, by LMD: the held-out R^2 of a ridge fit of the
teacher's span embeddings on the student's (and the reverse), per language.

Spans are text (``lmd.settings.spans``): every model tokenizes the same span text with its own
tokenizer, so teachers and students whose tokenizers disagree are compared on exactly the same text.
Each language is one LMD run (``lmd.run.pipeline.run_decomposition``: the one embedding loop, its
cache and the statistics engine) over the language's held-out examples, with the language's teachers
and every student; spans are cut in the tokens of the language's first teacher. A causal model's
span embedding is its last hidden layer pooled over the span's tokens (``mean``, or ``last``: the
last token, which has read the whole span), special tokens left out.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import validate
from lmalgebra.core.settings import Settings
from lmalgebra.lmd.run.pipeline import RunInputs, run_decomposition
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.settings.spans import HeldOutSpans, TooLittleTextError
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.sources.models import ModelRef
from lmalgebra.stats.moments import ConstantModelError
from lmalgebra.stats.solver import SingularBasisError
from lmalgebra.storage.csv_tables import Table
from lmalgebra.storage.output_paths import (
    cache_directory,
    default_cache_dir,
    refuse_unusable_cache_parts,
)

log = logging.getLogger(__name__)
SOURCE = "merge evaluate (LMD coverage)"
CoveragePooling = Literal["mean", "last"]


class CoverageSpec(Settings):
    """How spans of held-out text are cut, embedded and fitted."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    pooling: CoveragePooling = Field(
        default="mean",
        description="How a span's token states are pooled: mean, or last (the last token).",
    )
    spans: HeldOutSpans = Field(default_factory=HeldOutSpans, description="Spans.")
    alpha: float = Field(default=0.01, description="Ridge strength (relative).")
    batch_size: int = Field(default=32, ge=1, description="Spans per forward pass.")
    progress: bool = Field(default=False, description="Progress bars (in a log: a line a minute).")
    cache_dir: Path = Field(
        default_factory=default_cache_dir, description="Cache root (embeddings, models)."
    )


@dataclass(frozen=True)
class CoverageRow:
    """One (language, teacher, student): test R^2 both ways on the language's held-out text."""

    language: str
    teacher: str
    student: str
    pooling: str
    teacher_from_student: float  # how much of the teacher the student carries
    student_from_teacher: float
    train_spans: int
    test_spans: int


COVERAGE = Table("lmd_coverage.csv", CoverageRow, nan="nan")


def _config(
    models: Sequence[ModelRef], corpus: CorpusSpec, reference: str, spec: CoverageSpec
) -> DecomposeConfig:
    data = {
        "models": list(models),
        "corpus": corpus,  # recorded only: the documents are given
        "reference_tokenizer": reference,
        "spans": spec.spans.model_dump(),
        "pooling": spec.pooling,
        "exclude_special": True,  # a start token's state is the same before every span
        "alpha": spec.alpha,
        "cache_dir": spec.cache_dir,
        "progress": spec.progress,
        "batch_size": spec.batch_size,
    }
    return validate(DecomposeConfig, data, SOURCE)


def refuse_unusable_cache(cache_dir: Path) -> None:
    """What an LMD run refuses of the cache's directories it writes into (a file, a link to
    nothing), for a command whose LMD run follows other work (merge evaluate's bits per byte,
    experimental select's accuracies): refused before that work, which it had thrown away."""
    refuse_unusable_cache_parts(cache_directory(cache_dir), ("hashes", "spans", "embeddings"))


def language_coverage(
    language: str,
    texts: list[str],
    corpus: CorpusSpec,
    teachers: Sequence[ModelRef],
    students: Sequence[ModelRef],
    spec: CoverageSpec,
) -> list[CoverageRow]:
    """Rows of every (teacher, student) of one language, from one LMD run on ``texts``."""
    config = _config([*teachers, *students], corpus, teachers[0].name, spec)
    result = run_decomposition(config, RunInputs(docs=texts, log_warnings=False))
    for warning in result.warnings:  # by language, without decompose's flags (-T, --study.)
        log.warning("LMD coverage, %s: %s", language, warning.split("; use ")[0])
    test = result.pairwise["test"]  # row: the target, column: the basis
    where = {name: i for i, name in enumerate(result.names)}
    return [
        CoverageRow(
            language,
            t.name,
            s.name,
            spec.pooling,
            float(test[where[t.name], where[s.name]]),
            float(test[where[s.name], where[t.name]]),
            result.spans["train"],
            result.spans["test"],
        )
        for t in teachers
        for s in students
    ]


def lmd_coverage(
    texts: dict[str, list[str]],
    corpora: dict[str, CorpusSpec],
    teachers_of: dict[str, list[ModelRef]],
    students: Sequence[ModelRef],
    spec: CoverageSpec,
) -> tuple[list[CoverageRow], dict[str, str]]:
    """Coverage rows of every language of ``texts``, and the languages left out: language ->
    why (held-out text too short for a span in some split, a model whose embeddings do not vary
    over it; the rest of the evaluation stands)."""
    rows: list[CoverageRow] = []
    skipped: dict[str, str] = {}
    for lang, docs in texts.items():
        try:
            rows += language_coverage(lang, docs, corpora[lang], teachers_of[lang], students, spec)
        except TooLittleTextError as err:
            skipped[lang] = f"too little held-out text for LMD ({err}); raise heldout_fraction"
        except ConstantModelError as err:  # a collapsed student, say: the rest still scores it
            skipped[lang] = f"LMD cannot score it: {err}"
        except SingularBasisError as err:  # its remedies are decompose's flags
            raise UserInputError(
                f"LMD coverage, {lang}: {err.what}; use a larger alpha (now {spec.alpha})"
            ) from None
        if lang in skipped:
            log.warning("LMD coverage, %s: %s", lang, skipped[lang])
    return rows, skipped
