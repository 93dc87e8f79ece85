"""``lmalgebra report``: one self-contained HTML page of a decomposition run.

Figures are embedded as base64 PNG data URIs and the style sheet is inline: the page makes no
request and runs no script. A section appears only when the run has the file it is drawn from.
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import read_text
from lmalgebra.lmd.figures import write_plots
from lmalgebra.lmd.run_files import (
    group_fits,
    num,
    preferred_split,
    read_json,
    read_pairwise,
    read_summary,
    read_table,
    unique,
)
from lmalgebra.stats.clustering import cluster_order
from lmalgebra.storage.atomic import write_text_atomic

STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1100px; margin: 2em auto; color: #222;
       padding: 0 1em; }
nav a { margin-right: 1em; }
table { border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child, td.text { text-align: left; }
img { max-width: 100%; display: block; margin: 0.5em 0; }
pre { background: #f5f5f5; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.note { color: #555; font-size: 0.9em; }
"""
Section = tuple[str, str, str]
SWEEP_TITLES = {
    "length": "Span length T",
    "layer": "Layer",
    "train_size": "Training spans",
    "language": "Language",
}


def fmt(value: Any) -> str:
    """A table cell: floats to 3 decimals (blank for NaN), anything else as escaped text."""
    if isinstance(value, float | np.floating):
        return "" if math.isnan(value) else f"{value:.3f}"
    return html.escape(str(value))


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(value: Any) -> str:
    numeric = isinstance(value, float | np.floating) or str(value).lstrip("-").isdigit()
    return f"<td>{fmt(value)}</td>" if numeric else f'<td class="text">{fmt(value)}</td>'


def image(path: Path | None, alt: str) -> str:
    if path is None:
        return ""
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def section(anchor: str, title: str, *parts: str) -> Section:
    """A page section: its anchor, its heading and its HTML body."""
    return anchor, title, "".join(parts)


def _alpha_text(summary: dict[str, Any], config: dict[str, Any]) -> str:
    alpha = summary.get("alpha")
    if isinstance(alpha, dict) and isinstance(alpha.get("value"), int | float):
        extra = ", ".join(
            f"{k.replace('_', ' ')} {alpha[k]}" for k in ("mode", "selected_by") if k in alpha
        )
        return f"{alpha['value']:.3g}" + (f" ({extra})" if extra else "")
    if isinstance(config.get("alpha"), int | float):
        return f"{config['alpha']:.3g} ({config.get('alpha_mode', 'relative')}, from config.yaml)"
    return "not recorded"


def _per_split(values: Any) -> str:
    if not isinstance(values, dict):
        return ""
    return ", ".join(
        f"{s} {v:.3f}" if isinstance(v, int | float) else f"{s} {v}" for s, v in values.items()
    )


def _run_section(run_dir: Path, summary: dict[str, Any], config: dict[str, Any]) -> Section:
    provenance = run_dir / "provenance.json"
    versions = read_json(provenance).get("versions", {}) if provenance.is_file() else {}
    spans = summary.get("spans", {})
    seconds = summary.get("seconds", {})
    rows = [
        ("run directory", str(run_dir)),
        ("status", summary.get("status", "")),
        ("models", ", ".join(map(str, summary.get("models", [])))),
        ("spans", ", ".join(f"{s} {n}" for s, n in spans.items())),
        ("ridge strength alpha", _alpha_text(summary, config)),
        ("group dependency (mean group R²)", _per_split(summary.get("group_dependency"))),
        ("mean pairwise R²", _per_split(summary.get("mean_pairwise_r2"))),
        ("seconds", ", ".join(f"{k} {v}" for k, v in seconds.items())),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
    ]
    body = "".join(
        f'<tr><th>{html.escape(k)}</th><td class="text">{html.escape(str(v))}</td></tr>'
        for k, v in rows
    )
    return section("run", "Run", f"<table>{body}</table>")


def _pairwise_section(run_dir: Path, figure: Path | None) -> Section | None:
    pairwise = read_pairwise(run_dir, "test")
    if pairwise is None:
        return None
    names, r2 = pairwise
    order = cluster_order(r2)
    labels = [names[i] for i in order]
    rows = [[labels[a], *(r2[i, j] for j in order)] for a, i in enumerate(order)]
    note = (
        '<p class="note">Test R² of each target (row) from each single basis model (column); '
        "rows and columns ordered by average-linkage clustering on 1 &minus; symmetrised R².</p>"
    )
    return section(
        "pairwise",
        "Pairwise R² (clustered)",
        note,
        image(figure, "pairwise R² heatmap"),
        table(["target \\ basis", *labels], rows),
    )


def _group_section(run_dir: Path, figure: Path | None) -> Section | None:
    fits = group_fits(run_dir)
    if not fits:
        return None
    nulls = read_table(run_dir, "nulls.csv") or []
    split = preferred_split(fits)
    by = {(r["target"], r["split"]): r for r in fits}
    targets = unique(r["target"] for r in fits)
    null_kinds = unique(r["kind"] for r in nulls if r["split"] == split)
    header = [
        "model",
        *(f"R² {s}" for s in SPLITS),
        f"interval low ({split})",
        f"interval high ({split})",
        "adjusted R² (train)",
        *(f"null {k} ({split})" for k in null_kinds),
    ]
    rows: list[list[Any]] = []
    for t in targets:
        held = by.get((t, split), {})
        row: list[Any] = [t, *(num(by.get((t, s), {}).get("r2")) for s in SPLITS)]
        row += [num(held.get("ci_low")), num(held.get("ci_high"))]
        row.append(num(by.get((t, "train"), {}).get("adjusted_r2")))
        for kind in null_kinds:
            draws = [
                num(r["r2"])
                for r in nulls
                if (r["kind"], r["target"], r["split"]) == (kind, t, split)
            ]
            row.append(float(np.mean(draws)) if draws else math.nan)
        rows.append(row)
    mean = ["mean", *(_mean(row[i] for row in rows) for i in range(1, len(header)))]
    note = (
        '<p class="note">Each model from all the others. Intervals from the bootstrap; nulls '
        "averaged over their draws (blank: not computed).</p>"
    )
    return section(
        "group", "Group R²", note, image(figure, "group R² bars"), table(header, [*rows, mean])
    )


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _similarity_section(run_dir: Path, figure: Path | None) -> Section | None:
    rows = read_table(run_dir, "similarity.csv")
    if not rows:
        return None
    split = preferred_split(rows)
    cells = [
        [r["model_a"], r["model_b"], num(r["lmd_r2"]), num(r["cka"]), num(r["mean_cca"])]
        for r in rows
        if r["split"] == split
    ]
    header = ["model a", "model b", "LMD R² (a from b)", "linear CKA", "mean CCA"]
    note = f'<p class="note">Split: {html.escape(split)}.</p>'
    return section(
        "similarity",
        "Similarity: LMD, CKA and CCA",
        note,
        image(figure, "LMD, CKA and CCA heatmaps"),
        table(header, cells),
    )


ATTRIBUTION_COLUMNS = (  # (column, method, field of attribution.csv)
    ("greedy step", "greedy", "step"),
    ("greedy R²", "greedy", "value"),
    ("drop one (ΔR²)", "drop_one", "value"),
    ("Shapley value", "shapley", "value"),
)


def _attribution_section(run_dir: Path, figure: Path | None) -> Section | None:
    rows = read_table(run_dir, "attribution.csv")
    if not rows:
        return None
    picked: dict[tuple[str, str, str], dict[str, str]] = {}
    for target in unique(r["target"] for r in rows):
        for method in unique(r["method"] for r in rows):
            chosen = [r for r in rows if r["target"] == target and r["method"] == method]
            split = preferred_split(chosen)
            picked.update({(target, r["model"], method): r for r in chosen if r["split"] == split})
    methods = {m for _, _, m in picked}
    columns = [c for c in ATTRIBUTION_COLUMNS if c[1] in methods]
    cells = []
    for pair in unique(f"{t}\0{m}" for t, m, _ in picked):
        target, model = pair.split("\0")
        row: list[Any] = [target, model]
        for _, method, field in columns:
            value = num(picked.get((target, model, method), {}).get(field))
            row.append(str(int(value)) if field == "step" and math.isfinite(value) else value)
        cells.append(row)
    note = '<p class="note">Each method on the most held-out split it was computed on.</p>'
    header = ["target", "model", *(c[0] for c in columns)]
    return section(
        "attribution", "Attribution", note, image(figure, "attribution"), table(header, cells)
    )


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the HTML report of the complete run ``run_dir`` to ``out`` (default
    ``run_dir/report.html``), drawing its figures into ``run_dir/plots`` first; return the path.

    Raises UserInputError naming the directory when it holds no ``summary.json``.
    """
    summary = read_summary(run_dir)
    target = out if out is not None else run_dir / "report.html"
    if target.is_dir():
        raise UserInputError(f"--out {target} is a directory; give a file name")
    figures = {p.stem: p for p in write_plots(run_dir)}
    config_path = run_dir / "config.yaml"
    config_text = read_text(config_path, "run file") if config_path.is_file() else ""
    try:
        parsed = yaml.safe_load(config_text)
    except yaml.YAMLError:
        parsed = None
    config = parsed if isinstance(parsed, dict) else {}
    sections: list[Section | None] = [
        _run_section(run_dir, summary, config),
        _pairwise_section(run_dir, figures.get("pairwise_r2_test")),
        _group_section(run_dir, figures.get("group_r2")),
        _similarity_section(run_dir, figures.get("similarity")),
    ]
    sweeps = [
        f"<h3>{html.escape(title)}</h3>{image(figures[stem], title)}"
        for stem, title in SWEEP_TITLES.items()
        if stem in figures
    ]
    if sweeps:
        sections.append(section("sweeps", "Sweeps", *sweeps))
    if "layer_map" in figures:
        sections.append(section("layer-maps", "Layer maps", image(figures["layer_map"], "layers")))
    if "alpha_curve" in figures:
        chosen = f'<p class="note">Chosen &alpha;: {html.escape(_alpha_text(summary, config))}.</p>'
        sections.append(
            section("alpha", "Alpha curve", chosen, image(figures["alpha_curve"], "alpha curve"))
        )
    sections.append(_attribution_section(run_dir, figures.get("attribution")))
    if config_text:
        sections.append(
            section("config", "Configuration", f"<pre>{html.escape(config_text)}</pre>")
        )
    return _write_page(target, run_dir, [s for s in sections if s is not None])


def _write_page(target: Path, run_dir: Path, sections: list[Section]) -> Path:
    nav = " ".join(f'<a href="#{a}">{html.escape(t)}</a>' for a, t, _ in sections)
    body = "".join(
        f'<section id="{a}"><h2>{html.escape(t)}</h2>{part}</section>' for a, t, part in sections
    )
    title = html.escape(f"lmalgebra report: {run_dir.name}")
    # the empty data: icon keeps the browser from asking for /favicon.ico
    page = (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
        f'<link rel="icon" href="data:,"><style>{STYLE}</style></head><body>'
        f"<h1>{title}</h1><nav>{nav}</nav>{body}</body></html>\n"
    )
    write_text_atomic(target, page)
    return target
