"""The demo's HTML page: the plan and the findings in sentences, every table with rounded
numbers, every figure embedded as PNG.

Nothing of the demo's result dictionary reaches the page as Python text: every number goes
through :func:`number` (three decimals below 10, one above), every mapping becomes a table or a
sentence.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lmalgebra.distill.masked.scores import (
    Score,
    incomparable_languages,
    not_comparable,
    undefined_rdt,
)
from lmalgebra.report.lmd_page import negative_r2_note
from lmalgebra.report.page import Section, image, note, section, table, write_page

SCORE_COLUMNS = {  # column heading -> field of a score row (distill.masked.scores.Score)
    "language": "language",
    "tokenisation": "teacher",
    "model": "model",
    "masked tokens": "masked_tokens",
    "accuracy": "accuracy",
    "perplexity": "perplexity",
    "top-1 agreement": "top1_agreement",
    "top-k overlap": "topk_overlap",
    "comparable": "comparable",
}
STORE_COLUMNS = {
    "language": "language",
    "teacher": "teacher",
    "examples": "examples",
    "masked tokens": "masked_tokens",
    "store bytes / masked token": "store_bytes_per_masked_token",
}
POS_COLUMNS = {
    "model": "model",
    "accuracy": "accuracy",
    "macro-F1": "macro_f1",
    "majority-tag accuracy": "majority_accuracy",
    "training sentences": "train_sentences",
    "test words": "test_words",
}


def number(value: Any) -> str:
    """A value as the page shows it: floats to 3 decimals below 10 and 1 from 10 (perplexities,
    bytes, seconds), integers with thousands separators, booleans as yes/no, NaN and None blank;
    anything else as escaped text."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 10 else f"{value:,.1f}"
    return html.escape(str(value))


def _percent(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:+.1f}%"


def _rdt_cell(value: Any) -> str:
    return _percent(value) if isinstance(value, float) else html.escape(str(value))


def _seconds(value: Any) -> str:
    return f"{value:,.1f}" if isinstance(value, float | int) else html.escape(str(value))


# field of a finding -> its words; a field not listed is worded from its name
EVIDENCE: dict[str, Any] = {
    "rdt_percent": lambda v: (
        "RDT of SM3 " + ", ".join(f"{lang} {_percent(x)}" for lang, x in v.items())
    ),
    "sm3_accuracy": lambda v: f"mean held-out accuracy of SM3 {number(v)}",
    "sm2_accuracy": lambda v: f"of SM2 {number(v)}",
    "sm1_masked_accuracy_comparable": lambda v: (
        f"SM1's held-out accuracy where comparable (English) {number(v)}"
    ),
    "sm2_pos_accuracy": lambda v: f"UPOS probe accuracy of SM2 {number(v)}",
    "sm1_pos_accuracy": lambda v: f"of SM1 {number(v)}",
    "note": lambda v: str(v),
}


def _evidence(field: str, value: Any) -> str:
    if field in EVIDENCE:
        return str(EVIDENCE[field](value))
    if isinstance(value, Mapping):
        value = ", ".join(f"{k} {number(v)}" for k, v in value.items())
    return f"{field.replace('_', ' ')} {number(value)}"


def finding_lines(findings: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, str, str]]:
    """Each finding (key -> its ``claim``, ``holds`` and the numbers behind it) as (title,
    verdict, evidence sentence): the title numbered (``"1. Student within ..."``), the verdict
    "reproduced", "not reproduced" or "not measured", the numbers rounded, in one sentence."""
    lines = []
    for number_, finding in enumerate(findings.values(), start=1):
        title = f"{number_}. {finding['claim']}"
        holds = finding.get("holds")
        verdict = "not measured" if holds is None else "reproduced" if holds else "not reproduced"
        parts = [_evidence(k, v) for k, v in finding.items() if k not in ("holds", "claim")]
        evidence = "; ".join(parts)
        lines.append((title, verdict, evidence[:1].upper() + evidence[1:] + "." if parts else ""))
    return lines


def _findings(result: dict[str, Any]) -> Section:
    classes = {"reproduced": "yes", "not reproduced": "no", "not measured": ""}
    parts = [
        f'<p><b>{html.escape(title)}</b>: <span class="{classes[verdict]}">{verdict}</span>. '
        f"{html.escape(evidence)}</p>"
        for title, verdict, evidence in finding_lines(result["findings"])
    ]
    return section("findings", "Findings of MergeDistill, at this scale", *parts)


def _rdt_table(rdt: dict[str, dict[str, float]], scores: list[Score]) -> str:
    languages = sorted({k for v in rdt.values() for k in v} - {"average"})
    rows = []
    for student, values in rdt.items():
        apart = incomparable_languages(scores, student)
        cells = [
            "not comparable" if lang in apart else float(values.get(lang, math.nan))
            for lang in [*languages, "average"]
        ]
        rows.append([student, *cells])
    return table(["student", *languages, "average (comparable languages)"], rows, _rdt_cell)


def _scores(result: dict[str, Any], out: Path) -> Section:
    scores = [Score(**s) for s in result["scores"]]
    # a teacher scored in two runs on the same held-out text gives the same row twice: show it once
    shown = list(dict.fromkeys(scores))
    rows = [[getattr(s, field) for field in SCORE_COLUMNS.values()] for s in shown]
    notes = [*undefined_rdt(scores), *not_comparable(scores)]
    return section(
        "scores",
        "Held-out masked-token scores",
        note(
            "Each model scored on each language's held-out text in a teacher's tokenisation. "
            "A row is not comparable when that teacher was not trained on the language: it is "
            "shown, and left out of RDT and of every average."
        ),
        table(list(SCORE_COLUMNS), rows, number),
        "<h3>RDT on accuracy (%)</h3>",
        note("Relative deviation from the teachers; positive: the student is better."),
        _rdt_table(result["rdt"], scores),
        *(note(html.escape(f"Note: {text}.")) for text in notes),
        image(out / "merge" / "evaluation" / "accuracy.png", "accuracy"),
    )


def _lmd(lmd: dict[str, Any]) -> Section:
    group_r2 = lmd["group_r2_test"]
    group = table(["model", "group R² (test)"], [[k, v] for k, v in group_r2.items()], number)
    rows = [
        [lang, student, v["teacher_from_student"], v["student_from_teacher"]]
        for lang, cov in lmd["coverage"].items()
        for student, v in cov.items()
        if isinstance(v, dict)
    ]
    header = ["language", "student", "teacher from student", "student from teacher"]
    cells = [(f"{t} from all the others", v) for t, v in group_r2.items()]
    cells += [
        (f"{t} from {b}", v) for t, row in lmd["pairwise_r2_test"].items() for b, v in row.items()
    ]
    return section(
        "lmd",
        "Language Model Decomposition on unseen English text",
        negative_r2_note(cells),
        group,
        image(Path(lmd["heatmap"]), "pairwise R²"),
        "<h3>How much of each teacher the students carry (held-out R²)</h3>",
        negative_r2_note(
            cell
            for lang, student, teacher_r2, student_r2 in rows
            for cell in (
                (f"teacher-{lang} from {student}", teacher_r2),
                (f"{student} from teacher-{lang}", student_r2),
            )
        ),
        table(header, rows, number),
    )


def _plan(plan: dict[str, Any], quick: bool) -> str:
    """The demo's sizes (``DemoPlan.as_dict()``) in one sentence."""
    train, validation, test = plan["lmd_spans"]
    size = "The quick run (<code>lmalgebra demo --quick</code>)" if quick else "The full run"
    text = (
        f"{plan['docs_per_language']:,} documents per language; one teacher per language "
        f"with its own WordPiece vocabulary of {plan['teacher_vocab']:,} pieces, trained "
        f"{plan['teacher_steps']:,} steps; students trained {plan['student_steps']:,} steps; "
        f"every model of hidden size {plan['hidden_size']} and {plan['layers']} layers, batches "
        f"of {plan['batch_size']} examples of {plan['example_length']} tokens; the UPOS probe "
        f"on {plan['pos_train_sentences']:,} training sentences; LMD on {train:,} / "
        f"{validation:,} / {test:,} spans (train / validation / test)."
    )
    return f"<p>{size}: {html.escape(text)}</p>"


def render(result: dict[str, Any], out: Path) -> Path:
    """Write ``out/report.html`` from the demo's result dictionary."""
    pairs = result["inspect"]["pairs"]
    store = table(
        list(STORE_COLUMNS), [[r[f] for f in STORE_COLUMNS.values()] for r in pairs], number
    )
    sections = [_findings(result), _scores(result, out), section("store", "Teacher store", store)]
    pos = result.get("pos") or []
    if pos:
        probe = table(
            list(POS_COLUMNS), [[r[f] for f in POS_COLUMNS.values()] for r in pos], number
        )
        sections.append(section("pos", "Downstream: UPOS probe", probe))
    sections.append(_lmd(result["lmd"]))
    seconds = [*result["seconds"].items(), ("total", sum(result["seconds"].values()))]
    resumed = (  # a resumed demo's steps had shown as the demo's cost
        "Wall time of each step of the run that wrote this page: a step whose work an earlier "
        "run finished (the demo resumes what it finds) shows only the time that was left of it."
    )
    times = table(["step", "seconds"], seconds, _seconds)
    sections.append(section("time", "Time", times, note(resumed)))
    intro = _plan(result["plan"], bool(result.get("quick")))
    return write_page(out / "report.html", "lmalgebra demo", sections, intro)
