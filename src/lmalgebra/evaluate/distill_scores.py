"""``lmalgebra merge evaluate``: students against their teachers on each language's held-out text.

On every held-out example, in each teacher's own tokenisation and masking (mapped to student ids),
the student and the teacher are scored on the same masked tokens: accuracy of the top prediction,
mean negative log-likelihood (and perplexity) of the gold token, and agreement with the teacher
(top-1 match, overlap of the top-k sets). Teachers are scored from the store (their top-k ids and
log-probabilities are exact). RDT (MergeDistill, eq. 3) is the mean relative deviation of the
student from the language's teachers, in percent, positive when the student is better, as in the
paper's tables: ``100 / n * sum_i (P_S - P_Ti) / P_Ti``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import read_yaml
from lmalgebra.distill.masking import MaskedCopy
from lmalgebra.distill.model_card import add_evaluation
from lmalgebra.distill.store_view import TeacherCopies, load_copies
from lmalgebra.distill.student_inputs import check_student_name
from lmalgebra.distill.vocab_union import UnionVocab
from lmalgebra.figures import canvas
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.csv_tables import Table, csv_text, format_cell, write_table
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.masked_head import masked_logits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    """Scores of one model on one (language, teacher tokenisation) held-out set."""

    language: str
    teacher: str
    model: str
    examples: int
    masked_tokens: int
    accuracy: float
    loss: float
    perplexity: float
    top1_agreement: float
    topk_overlap: float


SCORES = Table("scores.csv", Score, nan="nan")  # one row per (language, tokenisation, model)
RDT = "rdt.csv"  # a row per student: RDT in percent per language, then "average"
RDT_FIRST_COLUMN = "student"
RDT_DECIMALS = 3
EVALUATION_DIR = "evaluation"  # in the run directory
EVALUATION_MD = "evaluation.md"
ACCURACY_PLOT = "accuracy.png"


def _heldout_rows(copies: TeacherCopies) -> np.ndarray:
    return np.flatnonzero(copies.heldout)


def teacher_score(lang: str, teacher: str, raw: TeacherCopies) -> Score:
    rows = _heldout_rows(raw)
    masks = [np.arange(raw.mask_offsets[r], raw.mask_offsets[r + 1]) for r in rows]
    picked = np.concatenate(masks) if masks else np.zeros(0, dtype=np.int64)
    counts = np.array([len(m) for m in masks])
    accuracy = float(np.mean(raw.topk_ids[picked, 0] == raw.labels[picked])) if picked.size else 0.0
    losses = raw.loss[rows]
    valid = counts > 0
    loss = float(np.sum(losses[valid] * counts[valid]) / max(counts.sum(), 1))
    return Score(
        lang,
        teacher,
        teacher,
        len(rows),
        int(picked.size),
        accuracy,
        loss,
        float(np.exp(loss)),
        1.0,
        1.0,
    )


@torch.inference_mode()
def student_score(
    lang: str, teacher: str, name: str, model: Any, mapped: TeacherCopies, batch_size: int = 32
) -> Score:
    rows = _heldout_rows(mapped)
    correct = agree = 0
    overlap = nll = 0.0
    total = 0
    k = mapped.topk_ids.shape[1]
    for start in range(0, len(rows), batch_size):
        copies, picked = [], []
        for r in rows[start : start + batch_size]:
            t0, t1 = mapped.token_offsets[r], mapped.token_offsets[r + 1]
            m0, m1 = mapped.mask_offsets[r], mapped.mask_offsets[r + 1]
            copies.append(
                MaskedCopy(mapped.input_ids[t0:t1], mapped.positions[m0:m1], mapped.labels[m0:m1])
            )
            picked.append(np.arange(m0, m1))
        index = np.concatenate(picked)
        if not index.size:
            continue
        batch = _pad(copies)
        logits = masked_logits(model, batch).float()
        logprobs = torch.log_softmax(logits, dim=-1)
        labels = torch.from_numpy(mapped.labels[index])
        teacher_top = torch.from_numpy(mapped.topk_ids[index])
        student_top = logits.topk(k, dim=-1).indices
        correct += int((student_top[:, 0] == labels).sum())
        agree += int((student_top[:, 0] == teacher_top[:, 0]).sum())
        overlap += float((student_top.unsqueeze(2) == teacher_top.unsqueeze(1)).any(2).sum()) / k
        nll -= float(logprobs.gather(1, labels.unsqueeze(1)).sum())
        total += index.size
    loss = nll / max(total, 1)
    return Score(
        lang,
        teacher,
        name,
        len(rows),
        total,
        correct / max(total, 1),
        loss,
        float(np.exp(loss)),
        agree / max(total, 1),
        overlap / max(total, 1),
    )


def _pad(copies: list[MaskedCopy]) -> dict[str, torch.Tensor]:
    from lmalgebra.distill.masking import pad_batch

    return pad_batch(copies, pad_id=0)


def rdt(scores: list[Score], student: str, metric: str = "accuracy") -> dict[str, float]:
    """Per language and averaged: ``100/n sum_i (P_S - P_Ti) / P_Ti`` over its teachers.

    A teacher scoring 0 leaves its term undefined: it is left out of the sum (see
    ``undefined_rdt``); a language with no defined term is NaN, and the average is over the
    languages that have a value (NaN when none has)."""
    out: dict[str, float] = {}
    for lang in sorted({s.language for s in scores}):
        deviations = []
        for s in scores:
            if s.language == lang and s.model == student:
                teacher = next(t for t in scores if t.language == lang and t.model == s.teacher)
                base = getattr(teacher, metric)
                if base:
                    deviations.append((getattr(s, metric) - base) / base)
        out[lang] = 100 * float(np.mean(deviations)) if deviations else float("nan")
    defined = [v for v in out.values() if not np.isnan(v)]
    out["average"] = float(np.mean(defined)) if defined else float("nan")
    return out


def undefined_rdt(scores: list[Score], metric: str = "accuracy") -> list[str]:
    """One note per teacher whose ``metric`` is 0 on a language: RDT against it is undefined."""
    return [
        f"teacher {s.model} scores 0 {metric} on {s.language}: RDT against it is undefined and "
        "left out (a teacher that predicts no masked token right cannot be a reference)"
        for s in scores
        if s.model == s.teacher and not getattr(s, metric)
    ]


def _load_student(run_dir: Path, name: str) -> Any:
    check_student_name(name)
    from transformers import AutoModelForMaskedLM

    directory = run_dir / name / "model"
    if not (directory / "config.json").is_file():
        raise UserInputError(
            f"{directory} has no trained student: run "
            f"`lmalgebra merge train RECIPE --name {name}` first"
        )
    return AutoModelForMaskedLM.from_pretrained(directory).eval()


@holding_lock("merge evaluate", lambda run_dir, **_: run_dir)
def evaluate_run(
    run_dir: Path, students: list[str], languages: list[str] | None = None, batch_size: int = 32
) -> tuple[list[Score], dict[str, dict[str, float]]]:
    """Scores of every teacher and student per (language, teacher), and each student's RDT."""
    recipe_path = run_dir / "recipe.yaml"
    if not recipe_path.is_file():
        raise UserInputError(
            f"{run_dir} is not a merge run directory (no recipe.yaml): "
            "run `lmalgebra merge prepare RECIPE` first"
        )
    recipe = read_yaml(recipe_path)
    teachers_of = {lang: spec["teachers"] for lang, spec in recipe["languages"].items()}
    for lang in languages or []:
        if lang not in teachers_of:
            raise UserInputError(
                f"language {lang!r} is not in the run {run_dir} "
                f"(languages: {', '.join(teachers_of)})"
            )
    if not (run_dir / "vocab" / "vocab_union.json").is_file():
        raise UserInputError(
            f"{run_dir / 'vocab'} is missing: run `lmalgebra merge vocab RECIPE` first"
        )
    vocab = UnionVocab.load(run_dir / "vocab")
    models = {name: _load_student(run_dir, name) for name in students}
    scores: list[Score] = []
    for lang in languages or list(teachers_of):
        for teacher in teachers_of[lang]:
            scores.append(teacher_score(lang, teacher, load_copies(run_dir, lang, teacher, None)))
            mapped = load_copies(run_dir, lang, teacher, vocab)
            for name, model in models.items():
                scores.append(student_score(lang, teacher, name, model, mapped, batch_size))
    deviations = {name: rdt(scores, name) for name in students}
    for name in students:
        mine = [s for s in scores if s.model in (name, s.teacher)]
        add_evaluation(run_dir / name / "model", markdown(mine, {name: deviations[name]}))
    return scores, deviations


def evaluate_students(
    run_dir: Path, students: list[str], languages: list[str] | None = None
) -> tuple[list[Score], dict[str, dict[str, float]]]:
    """``evaluate_run``, then its tables written to ``run_dir/evaluation`` (``merge evaluate``)."""
    scores, deviations = evaluate_run(run_dir, students, languages)
    write_evaluation(run_dir / EVALUATION_DIR, scores, deviations)
    return scores, deviations


@holding_lock("merge evaluate", lambda out, **_: out)
def write_evaluation(
    out: Path, scores: list[Score], deviations: dict[str, dict[str, float]]
) -> None:
    """``scores.csv``, ``rdt.csv``, ``evaluation.md`` and ``accuracy.png`` under ``out``."""
    write_table(out, SCORES, scores)
    write_text_atomic(out / RDT, rdt_text(deviations))
    write_text_atomic(out / EVALUATION_MD, markdown(scores, deviations))
    _bar_plot(scores, out / ACCURACY_PLOT)


def rdt_text(deviations: dict[str, dict[str, float]]) -> str:
    """``rdt.csv``: a header ``student,LANG,...,average`` and one row per student."""
    columns = list(next(iter(deviations.values())))
    rows: list[list[str]] = [[RDT_FIRST_COLUMN, *columns]]
    rows += [
        [name, *(format_cell(v[k], RDT_DECIMALS) for k in columns)]
        for name, v in deviations.items()
    ]
    return csv_text(rows)


def markdown(scores: list[Score], deviations: dict[str, dict[str, float]]) -> str:
    lines = [
        "| language | tokenisation | model | masked tokens | accuracy | perplexity | "
        "top-1 agreement | top-k overlap |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        lines.append(
            f"| {s.language} | {s.teacher} | {s.model} | {s.masked_tokens} | "
            f"{s.accuracy:.4f} | {s.perplexity:.2f} | {s.top1_agreement:.3f} | "
            f"{s.topk_overlap:.3f} |"
        )
    lines += [
        "",
        "RDT on masked-token accuracy (%, positive = student better than its teachers):",
        "",
        "| student | " + " | ".join(next(iter(deviations.values()))) + " |",
        "|---|" + "---|" * len(next(iter(deviations.values()))),
    ]
    for name, values in deviations.items():
        cells = ("n/a" if np.isnan(v) else f"{v:+.2f}" for v in values.values())
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += ["", *(f"Note: {note}." for note in undefined_rdt(scores))]
    return "\n".join(lines).rstrip("\n") + "\n"


def _bar_plot(scores: list[Score], path: Path) -> None:
    groups = sorted({(s.language, s.teacher) for s in scores})
    models = list(dict.fromkeys("teacher" if s.model == s.teacher else s.model for s in scores))
    fig, axes = canvas.figure(1, 1, max(5.0, 1.4 * len(groups) * len(models) / 2), 3.6, layout=None)
    ax = axes[0, 0]
    width = 0.8 / len(models)
    for m, model in enumerate(models):
        values = [
            next(
                (
                    s.accuracy
                    for s in scores
                    if (s.language, s.teacher) == g
                    and ("teacher" if s.model == s.teacher else s.model) == model
                ),
                0.0,
            )
            for g in groups
        ]
        ax.bar(np.arange(len(groups)) + m * width, values, width, label=model)
    ax.set_xticks(
        np.arange(len(groups)) + width * (len(models) - 1) / 2,
        [f"{lang}\n({teacher})" for lang, teacher in groups],
    )
    ax.set_ylabel("held-out masked-token accuracy")
    ax.legend()
    fig.tight_layout()
    canvas.save(fig, path, dpi=120)
