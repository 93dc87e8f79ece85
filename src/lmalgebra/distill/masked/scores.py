"""The masked evaluation's rows and what is written of them: ``Score``, RDT on accuracy and its
notes, and ``evaluation/``'s ``scores.csv``, ``rdt.csv``, ``evaluation.md`` and ``accuracy.png``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmalgebra.distill.layout import EVALUATION_MD, RDT_FILE
from lmalgebra.distill.run.rdt import rdt, rdt_text
from lmalgebra.figures import canvas
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.csv_tables import Table, table_text

ACCURACY_PLOT = "accuracy.png"


@dataclass(frozen=True)
class Score:
    """Scores of one model on one (language, teacher tokenisation) held-out set.

    ``accuracy``, ``loss``, ``perplexity`` and the agreements score inputs whose selected tokens
    are all the mask token; ``top1_training_masking`` is the top-1 accuracy under the training
    masking (80/10/10), where a tenth of the positions show their gold token (NaN: not measured).
    """

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
    top1_training_masking: float = math.nan
    # False: the teacher was not trained on this language (see masked.comparability); the row
    # is shown but left out of RDT and of averages
    comparable: bool = True


SCORES = Table("scores.csv", Score, nan="nan")  # one row per (language, tokenisation, model)


# per metric of a score row: whether higher is better (RDT's direction)
HIGHER_IS_BETTER = {
    "accuracy": True,
    "top1_agreement": True,
    "topk_overlap": True,
    "top1_training_masking": True,
    "loss": False,
    "perplexity": False,
}


def score_rdt(scores: list[Score], student: str, metric: str = "accuracy") -> dict[str, float]:
    """Per language and averaged: RDT of ``student`` on ``metric`` against each language's
    teachers, in the metric's direction, comparable scores only (see ``not_comparable``; a
    teacher scoring 0 is left out, see ``undefined_rdt``)."""
    terms = []
    for s in scores:
        if s.model == student and s.comparable:
            teacher = next(t for t in scores if t.language == s.language and t.model == s.teacher)
            terms.append((s.language, getattr(teacher, metric), getattr(s, metric)))
    languages = sorted({s.language for s in scores})
    return rdt(terms, languages, higher_is_better=HIGHER_IS_BETTER[metric])


def undefined_rdt(scores: list[Score], metric: str = "accuracy") -> list[str]:
    """One note per teacher whose ``metric`` is 0 on a language: RDT against it is undefined."""
    return [
        f"teacher {s.model} scores 0 {metric} on {s.language}: RDT against it is undefined and "
        "left out (a teacher that predicts no masked token right cannot be a reference)"
        for s in scores
        if s.model == s.teacher and not getattr(s, metric)
    ]


def incomparable_languages(scores: list[Score], student: str) -> list[str]:
    """The languages on which ``student`` has scores and none of them is comparable: its RDT
    there is left blank, as not comparable."""
    mine = [s for s in scores if s.model == student]
    return sorted({s.language for s in mine} - {s.language for s in mine if s.comparable})


def not_comparable(scores: list[Score]) -> list[str]:
    """One note per teacher with scores that are not comparable, naming the languages."""
    languages: dict[str, set[str]] = {}
    for s in scores:
        if not s.comparable:
            languages.setdefault(s.teacher, set()).add(s.language)
    return [
        f"teacher {teacher} was not trained on {', '.join(sorted(langs))}: scores there in its "
        "tokenisation are not comparable (comparable = false) and are left out of RDT and its "
        "average"
        for teacher, langs in languages.items()
    ]


def write_evaluation(
    out: Path, scores: list[Score], deviations: dict[str, dict[str, float]]
) -> None:
    """``scores.csv``, ``rdt.csv``, ``evaluation.md`` and ``accuracy.png`` under ``out`` (the
    run's lock held: ``Objective.evaluate``)."""
    for name, text in evaluation_texts(scores, deviations).items():
        write_text_atomic(out / name, text)
    _bar_plot(scores, out / ACCURACY_PLOT)


def evaluation_texts(
    scores: list[Score], deviations: dict[str, dict[str, float]]
) -> dict[str, str]:
    """The text files of an evaluation (``scores.csv``, ``rdt.csv``, ``evaluation.md``) by name,
    as its rows make them: what ``merge verify`` compares the files with."""
    return {
        SCORES.file: table_text(SCORES, scores),
        RDT_FILE: rdt_text(deviations),
        EVALUATION_MD: markdown(scores, deviations),
    }


def _or_na(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{value:.4f}"


def markdown(scores: list[Score], deviations: dict[str, dict[str, float]]) -> str:
    lines = [
        "Every scored token replaced by the mask token; the training masking (80/10/10, a tenth "
        "of the tokens shown) beside, for reference.",
        "",
        "| language | tokenisation | model | masked tokens | accuracy | perplexity | "
        "top-1 agreement | top-k overlap | accuracy (training masking) | comparable |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        lines.append(
            f"| {s.language} | {s.teacher} | {s.model} | {s.masked_tokens} | "
            f"{s.accuracy:.4f} | {s.perplexity:.2f} | {s.top1_agreement:.3f} | "
            f"{s.topk_overlap:.3f} | {_or_na(s.top1_training_masking)} | "
            f"{'yes' if s.comparable else 'no'} |"
        )
    lines += [
        "",
        "RDT on masked-token accuracy (%, positive = student better than its teachers):",
        "",
        "| student | " + " | ".join(next(iter(deviations.values()))) + " |",
        "|---|" + "---|" * len(next(iter(deviations.values()))),
    ]
    for name, values in deviations.items():
        apart = incomparable_languages(scores, name)
        cells = (
            "not comparable" if k in apart else "n/a" if np.isnan(v) else f"{v:+.2f}"
            for k, v in values.items()
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [*undefined_rdt(scores), *not_comparable(scores)]
    lines += ["", *(f"Note: {note}." for note in notes)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _bar_plot(scores: list[Score], path: Path) -> None:
    groups = sorted({(s.language, s.teacher) for s in scores})
    comparable = {(s.language, s.teacher) for s in scores if s.comparable}
    label = {s: "teacher" if s.model == s.teacher else s.model for s in scores}
    models = list(dict.fromkeys(label.values()))
    # the first row of each (language, tokenisation, model)
    accuracy = {(s.language, s.teacher, label[s]): s.accuracy for s in reversed(scores)}
    fig, axes = canvas.figure(1, 1, max(5.0, 1.4 * len(groups) * len(models) / 2), 3.6, layout=None)
    ax = axes[0, 0]
    width = 0.8 / len(models)
    for m, model in enumerate(models):
        values = [accuracy.get((*group, model), 0.0) for group in groups]
        ax.bar(np.arange(len(groups)) + m * width, values, width, label=model)
    ax.set_xticks(
        np.arange(len(groups)) + width * (len(models) - 1) / 2,
        [
            f"{lang}\n({teacher})" + ("" if (lang, teacher) in comparable else "\nnot comparable")
            for lang, teacher in groups
        ],
    )
    ax.set_ylabel("held-out masked-token accuracy")
    ax.legend()
    fig.tight_layout()
    canvas.save(fig, path, dpi=120)
