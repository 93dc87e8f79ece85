"""One self-contained HTML page of the demo: every table, and every figure embedded as PNG."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from lmalgebra.storage.atomic import write_text_atomic

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 980px; margin: 2em auto; color: #222; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child { text-align: left; }
.yes { color: #176917; font-weight: bold; } .no { color: #a31515; font-weight: bold; }
img { max-width: 100%; } code { background: #f3f3f3; padding: 0 3px; }
"""


def _table(header: list[str], rows: list[list[Any]]) -> str:
    head = "".join(f"<th>{html.escape(str(h))}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
    return html.escape(str(value))


def _image(path: Path, alt: str) -> str:
    if not path.is_file():
        return f"<p>(figure {html.escape(str(path))} missing)</p>"
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _verdict(holds: bool | None) -> str:
    if holds is None:
        return "<span>not measured</span>"
    return (
        '<span class="yes">reproduced</span>' if holds else '<span class="no">not reproduced</span>'
    )


def render(result: dict[str, Any], out: Path) -> Path:
    """Write ``out/report.html`` from the demo's result dictionary."""
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>lmalgebra demo</title>"
        f"<style>{STYLE}</style></head><body><h1>lmalgebra demo</h1>",
        f"<p>Plan: <code>{html.escape(str(result['plan']))}</code></p>",
    ]
    parts.append("<h2>Findings of MergeDistill, at this scale</h2>")
    for name, finding in result["findings"].items():
        details = {k: v for k, v in finding.items() if k != "holds"}
        parts.append(
            f"<p><b>{html.escape(name)}</b>: {_verdict(finding.get('holds'))}<br>"
            f"<code>{html.escape(str(details))}</code></p>"
        )
    scores = result["scores"]
    parts.append("<h2>Held-out masked-token scores</h2>")
    parts.append(
        _table(
            [
                "language",
                "tokenisation",
                "model",
                "masked tokens",
                "accuracy",
                "perplexity",
                "top-1 agreement",
                "top-k overlap",
            ],
            [
                [
                    s["language"],
                    s["teacher"],
                    s["model"],
                    s["masked_tokens"],
                    s["accuracy"],
                    s["perplexity"],
                    s["top1_agreement"],
                    s["topk_overlap"],
                ]
                for s in scores
            ],
        )
    )
    parts.append("<h3>RDT on accuracy (%)</h3>")
    rdt = result["rdt"]
    columns = sorted({k for v in rdt.values() for k in v})
    parts.append(
        _table(
            ["student", *columns], [[n, *(v.get(c, "") for c in columns)] for n, v in rdt.items()]
        )
    )
    parts.append(_image(out / "merge" / "evaluation" / "accuracy.png", "accuracy"))
    store = result["inspect"]
    parts.append("<h2>Teacher store</h2>")
    parts.append(
        _table(
            ["language", "teacher", "examples", "masked tokens", "store bytes / masked"],
            [
                [
                    r["language"],
                    r["teacher"],
                    r["examples"],
                    r["masked_tokens"],
                    r["store_bytes_per_masked_token"],
                ]
                for r in store["pairs"]
            ],
        )
    )
    pos = result.get("pos") or []
    if pos:
        parts.append("<h2>Downstream: UPOS probe</h2>")
        keys = list(pos[0])
        parts.append(_table(keys, [[row[k] for k in keys] for row in pos]))
    lmd = result["lmd"]
    parts.append("<h2>Language Model Decomposition on unseen English text</h2>")
    parts.append(
        _table(["model", "group R^2 (test)"], [[k, v] for k, v in lmd["group_r2_test"].items()])
    )
    parts.append(_image(Path(lmd["heatmap"]), "pairwise R^2"))
    parts.append("<h3>How much of each teacher the students carry (held-out R^2)</h3>")
    rows = [
        [lang, student, v["teacher_from_student"], v["student_from_teacher"]]
        for lang, cov in lmd["coverage"].items()
        for student, v in cov.items()
        if isinstance(v, dict)
    ]
    parts.append(
        _table(["language", "student", "teacher from student", "student from teacher"], rows)
    )
    parts.append("<h2>Time</h2>" + _table(["step", "seconds"], list(result["seconds"].items())))
    parts.append("</body></html>")
    path = out / "report.html"
    write_text_atomic(path, "\n".join(parts))
    return path
