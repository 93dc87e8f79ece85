"""``lmalgebra merge evaluate`` on a causal run: bits per byte of every teacher and student on each
language's held-out examples (``evaluate.bits_per_byte``), RDT on bits per byte, how much of each
teacher each student carries by LMD (``evaluate.lmd_coverage``), and a few greedy continuations
of each student per language.

RDT of a student on a language, over the language's teachers ``T_i`` (lower bits per byte is
better, so the sign is turned: positive = the student needs fewer bits than the teachers)::

    RDT = 100/n * sum_i (B_Ti - B_S) / B_Ti

The average is over the languages that have a value.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import merge_stage
from lmalgebra.distill.causal.bits_per_byte import BITS, BitsRow, evaluate_bits
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.examples import heldout_texts
from lmalgebra.distill.layout import EVALUATION_MD, RDT_FILE, RunLayout, trusted_model
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.run.model_card import add_evaluation
from lmalgebra.distill.run.rdt import rdt, rdt_text
from lmalgebra.distill.teachers import load_lm
from lmalgebra.evaluate.lmd_coverage import (
    COVERAGE,
    CoverageRow,
    CoverageSpec,
    lmd_coverage,
    refuse_unusable_cache,
)
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.csv_tables import table_text

PROMPT_CHARS = 40  # prompts: the first words of held-out examples, up to this many characters
CONTINUATIONS = 2  # per language
NEW_TOKENS = 16


def bits_rdt(
    rows: list[BitsRow], student: str, teachers_of: dict[str, list[str]]
) -> dict[str, float]:
    """Per language and averaged: RDT of ``student`` on bits per byte (lower is better)."""
    bits = {(r.language, r.model): r.bits_per_byte for r in rows}
    terms = [
        (lang, bits[(lang, t)], bits[(lang, student)])
        for lang, teachers in teachers_of.items()
        for t in teachers
        if (lang, t) in bits and (lang, student) in bits
    ]
    return rdt(terms, sorted({r.language for r in rows}), higher_is_better=False)


def prompt_of(text: str) -> str:
    """The first words of ``text``, at most :data:`PROMPT_CHARS` characters (one word at least)."""
    words = text.split()
    prompt = words[0] if words else ""
    for word in words[1:]:
        if len(prompt) + 1 + len(word) > PROMPT_CHARS:
            break
        prompt += " " + word
    return prompt


def continuations(
    ref: ModelRef, directory: Path, texts: dict[str, list[str]]
) -> dict[str, list[tuple[str, str]]]:
    """Greedy continuations of the first held-out examples' prompts: language -> (prompt, text)."""
    import torch

    model = load_lm(ref, directory, "causal", role="student")
    tokenizer = source_of(ref, directory).load_tokenizer()
    start = start_token_id(tokenizer)
    out: dict[str, list[tuple[str, str]]] = {}
    for lang, docs in texts.items():
        out[lang] = []
        for doc in docs[:CONTINUATIONS]:
            prompt = prompt_of(doc)
            ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
            inputs = torch.tensor([[start, *ids]])
            with torch.no_grad():
                made = model.generate(
                    inputs,
                    attention_mask=torch.ones_like(inputs),
                    max_new_tokens=NEW_TOKENS,
                    do_sample=False,
                    pad_token_id=tokenizer.pad_token_id or start,
                )
            out[lang].append((prompt, tokenizer.decode(made[0, inputs.shape[1] :])))
    return out


@dataclass(frozen=True)
class Continuation:
    """A student's greedy continuation of a held-out example's first words on one language."""

    student: str
    language: str
    prompt: str
    text: str


@dataclass(frozen=True)
class Skipped:
    """A language without LMD coverage, and why."""

    language: str
    reason: str


@dataclass
class CausalEvaluation:
    """What ``merge evaluate`` found on a causal run.

    Attributes:
        bits: bits per byte of every teacher and student per language (``bits_per_byte.csv``).
        rdt: student -> language (then ``average``) -> RDT on bits per byte (``rdt.csv``).
        continuations: student -> language -> (prompt, greedy continuation) pairs.
        coverage: LMD coverage rows (``lmd_coverage.csv``); skipped: language -> why it has none.
        pooling: how the coverage's span embeddings were pooled.
    """

    bits: list[BitsRow]
    rdt: dict[str, dict[str, float]]
    continuations: dict[str, dict[str, list[tuple[str, str]]]]
    coverage: list[CoverageRow]
    skipped: dict[str, str]
    pooling: str


def score_causal_run(
    recipe: CausalRecipe,
    students: list[str],
    languages: list[str] | None = None,
    coverage: CoverageSpec | None = None,
) -> dict[str, list[Any]]:
    """The rows a causal evaluation scores (``Objective.score``): bits per byte of teachers and
    students (``bits``), LMD coverage of each teacher by each student (``coverage``; ``skipped``
    the languages without), each student's greedy continuations (``continuations``)."""
    layout = RunLayout(recipe.output_dir)
    run_dir = layout.root
    coverage = coverage or CoverageSpec()
    refuse_unusable_cache(coverage.cache_dir)  # before the bits per byte, not after
    teachers = {name: spec.ref(name) for name, spec in recipe.teachers.items()}
    mine: dict[str, ModelRef] = {}
    for name in students:
        directory = trusted_model(
            layout.model(name),
            f"student {name!r} has no model in {layout.model(name)}: run "
            f"{merge_stage('train', name)} first",
        )
        mine[name] = ModelRef(name=name, path=str(directory))
    rows = evaluate_bits(run_dir, [*teachers.values(), *mine.values()], languages, table=None)
    teachers_of = {k: v.teachers for k, v in recipe.languages.items()}
    texts = heldout_texts(run_dir, languages)
    covered, skipped = lmd_coverage(
        texts,
        {lang: recipe.languages[lang].corpus for lang in texts},
        {lang: [teachers[t] for t in teachers_of[lang]] for lang in texts},
        list(mine.values()),
        coverage,
    )
    made = [
        Continuation(name, lang, prompt, text)
        for name, ref in mine.items()
        for lang, pairs in continuations(ref, Path(ref.path), texts).items()
        for prompt, text in pairs
    ]
    return {
        "bits": rows,
        "coverage": covered,
        "skipped": [Skipped(lang, why) for lang, why in skipped.items()],
        "continuations": made,
    }


def causal_evaluation(
    recipe: CausalRecipe, tables: dict[str, list[dict[str, Any]]], students: list[str], pooling: str
) -> CausalEvaluation:
    """The evaluation of ``students`` that every row of ``tables`` (an evaluation's record)
    makes: RDT of each student on bits per byte, from the rows as they are."""
    bits = [BitsRow(**row) for row in tables["bits"]]
    teachers_of = {k: v.teachers for k, v in recipe.languages.items()}
    made: dict[str, dict[str, list[tuple[str, str]]]] = {name: {} for name in students}
    for row in tables["continuations"]:
        made[row["student"]].setdefault(row["language"], []).append((row["prompt"], row["text"]))
    return CausalEvaluation(
        bits,
        {name: bits_rdt(bits, name, teachers_of) for name in students},
        made,
        [CoverageRow(**row) for row in tables["coverage"]],
        {row["language"]: row["reason"] for row in tables["skipped"]},
        pooling,
    )


def write_causal_evaluation(layout: RunLayout, found: CausalEvaluation, scored: list[str]) -> None:
    """``evaluation/``'s ``bits_per_byte.csv``, ``rdt.csv``, ``lmd_coverage.csv`` and
    ``evaluation.md``, then the card of each student ``scored`` (the run's lock held:
    ``Objective.evaluate``)."""
    for name, text in causal_texts(found).items():
        write_text_atomic(layout.evaluation / name, text)
    for name in scored:
        add_evaluation(layout.model(name), student_evaluation(found, name))


def causal_texts(found: CausalEvaluation) -> dict[str, str]:
    """The text files of an evaluation (``bits_per_byte.csv``, ``rdt.csv``, ``lmd_coverage.csv``,
    ``evaluation.md``) by name, as its rows make them: what ``merge verify`` compares the files
    with."""
    return {
        BITS.file: table_text(BITS, found.bits),
        RDT_FILE: rdt_text(found.rdt),
        COVERAGE.file: table_text(COVERAGE, found.coverage),
        EVALUATION_MD: causal_markdown(found),
    }


def student_evaluation(found: CausalEvaluation, name: str) -> str:
    """A student's card section: its bits per byte beside its teachers', and its RDT."""
    teachers = {r.model for r in found.bits} - set(found.rdt)
    lines = ["| language | model | bits/byte |", "|---|---|---|"]
    for r in found.bits:
        if r.model == name or r.model in teachers:
            lines.append(f"| {r.language} | {r.model} | {r.bits_per_byte:.4f} |")
    rdt = ", ".join(
        f"{k} {'n/a' if math.isnan(v) else f'{v:.2f}%'}" for k, v in found.rdt[name].items()
    )
    return "\n".join([*lines, "", f"RDT against its teachers: {rdt}."])


def causal_markdown(found: CausalEvaluation) -> str:
    """The evaluation report: bits per byte, RDT, LMD coverage, continuations."""
    lines = [
        "Bits per byte on each language's held-out examples (lower is better); RDT in percent, "
        "positive when the student needs fewer bits per byte than the language's teachers.",
        "",
        "| language | model | documents | bits/byte | bits/char |",
        "|---|---|---|---|---|",
    ]
    for r in found.bits:
        lines.append(
            f"| {r.language} | {r.model} | {r.documents} | {r.bits_per_byte:.4f} | "
            f"{r.bits_per_char:.4f} |"
        )
    deviations = found.rdt
    lines += ["", "| student | " + " | ".join(next(iter(deviations.values()))) + " |"]
    lines.append("|---" * (1 + len(next(iter(deviations.values())))) + "|")
    for name, values in deviations.items():
        cells = " | ".join("n/a" if math.isnan(v) else f"{v:.2f}" for v in values.values())
        lines.append(f"| {name} | {cells} |")
    lines += ["", *coverage_markdown(found.coverage, found.skipped, found.pooling)]
    for name, by_lang in found.continuations.items():
        lines += ["", f"Greedy continuations of {name}:"]
        for lang, pairs in by_lang.items():
            lines += [f"- {lang}: {_code(prompt)} → {_code(text)}" for prompt, text in pairs]
    return "\n".join(lines) + "\n"


def _code(text: str) -> str:
    """``text`` as a Markdown code span, shown as written: the held-out text's ``*``, ``_``,
    ``<tag>`` or ``[link](...)`` had been read as Markdown inside the bold prompt. The fence is
    one backtick longer than the longest run in ``text``; line breaks are shown as ``⏎``."""
    text = text.replace("\r\n", "\n").replace("\n", "⏎").replace("\r", "⏎")
    fence = "`" * (1 + max((len(run) for run in re.findall("`+", text)), default=0))
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def coverage_markdown(rows: list[CoverageRow], skipped: dict[str, str], pooling: str) -> list[str]:
    """The LMD coverage table's lines, then a line per language left out."""
    lines = [
        "How much of each teacher the student carries (LMD: test R^2 of the teacher's span "
        f"embeddings fitted on the student's, {pooling} pooling, held-out text; and the reverse).",
        "",
        "| language | teacher | student | teacher from student | student from teacher | "
        "test spans |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.language} | {r.teacher} | {r.student} | {r.teacher_from_student:.3f} | "
            f"{r.student_from_teacher:.3f} | {r.test_spans} |"
        )
    lines += [f"- {lang}: no LMD coverage: {why}" for lang, why in skipped.items()]
    return lines
