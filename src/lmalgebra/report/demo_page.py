"""The demo's HTML page: its findings, every table, and every figure embedded as PNG."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from lmalgebra.report.page import Section, fmt, image, section, table, write_page

SCORE_COLUMNS = {  # column heading -> field of a score row (evaluate.distill_scores.Score)
    "language": "language",
    "tokenisation": "teacher",
    "model": "model",
    "masked tokens": "masked_tokens",
    "accuracy": "accuracy",
    "perplexity": "perplexity",
    "top-1 agreement": "top1_agreement",
    "top-k overlap": "topk_overlap",
}
STORE_COLUMNS = {
    "language": "language",
    "teacher": "teacher",
    "examples": "examples",
    "masked tokens": "masked_tokens",
    "store bytes / masked": "store_bytes_per_masked_token",
}


def _cell(value: Any) -> str:
    """Small numbers to 4 decimals, large ones (perplexities, seconds) to 1."""
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return fmt(value)


def _verdict(holds: bool | None) -> str:
    if holds is None:
        return "<span>not measured</span>"
    return (
        '<span class="yes">reproduced</span>' if holds else '<span class="no">not reproduced</span>'
    )


def _findings(result: dict[str, Any]) -> Section:
    parts = []
    for name, finding in result["findings"].items():
        details = {k: v for k, v in finding.items() if k != "holds"}
        parts.append(
            f"<p><b>{html.escape(name)}</b>: {_verdict(finding.get('holds'))}<br>"
            f"<code>{html.escape(str(details))}</code></p>"
        )
    return section("findings", "Findings of MergeDistill, at this scale", *parts)


def _scores(result: dict[str, Any], out: Path) -> Section:
    scores = table(
        list(SCORE_COLUMNS),
        [[s[field] for field in SCORE_COLUMNS.values()] for s in result["scores"]],
        _cell,
    )
    rdt = result["rdt"]
    columns = sorted({k for v in rdt.values() for k in v})
    deviations = table(
        ["student", *columns],
        [[n, *(v.get(c, "") for c in columns)] for n, v in rdt.items()],
        _cell,
    )
    return section(
        "scores",
        "Held-out masked-token scores",
        scores,
        "<h3>RDT on accuracy (%)</h3>",
        deviations,
        image(out / "merge" / "evaluation" / "accuracy.png", "accuracy"),
    )


def _lmd(lmd: dict[str, Any]) -> Section:
    group = table(
        ["model", "group R^2 (test)"], [[k, v] for k, v in lmd["group_r2_test"].items()], _cell
    )
    rows = [
        [lang, student, v["teacher_from_student"], v["student_from_teacher"]]
        for lang, cov in lmd["coverage"].items()
        for student, v in cov.items()
        if isinstance(v, dict)
    ]
    coverage = table(
        ["language", "student", "teacher from student", "student from teacher"], rows, _cell
    )
    return section(
        "lmd",
        "Language Model Decomposition on unseen English text",
        group,
        image(Path(lmd["heatmap"]), "pairwise R^2"),
        "<h3>How much of each teacher the students carry (held-out R^2)</h3>",
        coverage,
    )


def render(result: dict[str, Any], out: Path) -> Path:
    """Write ``out/report.html`` from the demo's result dictionary."""
    pairs = result["inspect"]["pairs"]
    store = table(
        list(STORE_COLUMNS), [[r[f] for f in STORE_COLUMNS.values()] for r in pairs], _cell
    )
    sections = [
        _findings(result),
        _scores(result, out),
        section("store", "Teacher store", store),
    ]
    pos = result.get("pos") or []
    if pos:
        keys = list(pos[0])
        probe = table(keys, [[row[k] for k in keys] for row in pos], _cell)
        sections.append(section("pos", "Downstream: UPOS probe", probe))
    sections.append(_lmd(result["lmd"]))
    seconds = table(["step", "seconds"], list(result["seconds"].items()), _cell)
    sections.append(section("time", "Time", seconds))
    intro = f"<p>Plan: <code>{html.escape(str(result['plan']))}</code></p>"
    return write_page(out / "report.html", "lmalgebra demo", sections, intro)
