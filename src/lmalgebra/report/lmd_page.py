"""``lmalgebra report``: one self-contained HTML page of a decomposition run.

Figures are embedded as base64 PNG data URIs and the style sheet is inline: the page makes no
request and runs no script. A section appears only when the run has the file it is drawn from.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import read_text
from lmalgebra.lmd.figures.run_figures import write_plots
from lmalgebra.lmd.rundir.files import group_fits, preferred_split, read_json, read_summary, unique
from lmalgebra.lmd.rundir.schema import (
    ATTRIBUTION,
    CLUSTERED_HEATMAP,
    CONFIG,
    NULLS,
    PAIRWISE_CORNER,
    PROVENANCE,
    REPORT,
    SIMILARITY,
    AttributionShareRow,
    FitRow,
    read_pairwise,
    refuse_linked_directories,
)
from lmalgebra.report.page import (
    Section,
    facts,
    image,
    note,
    section,
    table,
    without_empty_columns,
    write_page,
)
from lmalgebra.stats.clustering import cluster_order
from lmalgebra.storage.csv_tables import read_table
from lmalgebra.storage.lockfile import run_directory_lock
from lmalgebra.storage.output_paths import check_file, refuse_inside_other_output, tidy_on_failure

NEGATIVE_R2 = (
    "An R² below 0 means the fit predicts the held-out embeddings worse than their mean: the "
    "basis models do not explain the target linearly, or the ridge fit over-learnt too few "
    "training spans. It is a result, not an error; if overfitting is the cause, use more spans "
    "or let the data choose the ridge strength (<code>--study.alpha_select gcv</code>)."
)
NEGATIVE_SHOWN = 6  # cells named in the note; the rest are counted

SWEEP_TITLES = {
    "length": "Span length T",
    "layer": "Layer",
    "train_size": "Training spans",
    "language": "Language",
}


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


def negative_r2_note(cells: Iterable[tuple[str, float]]) -> str:
    """A note naming the ``(label, R^2)`` cells below 0 and saying what that means; empty when
    none is (NaN is not below 0)."""
    negative = [(label, value) for label, value in cells if value < 0]
    if not negative:
        return ""
    named = ", ".join(
        f"{html.escape(label)} ({value:.2f})" for label, value in negative[:NEGATIVE_SHOWN]
    )
    more = len(negative) - NEGATIVE_SHOWN
    named += f" and {more} more" if more > 0 else ""
    count = "One value is" if len(negative) == 1 else f"{len(negative)} values are"
    return note(f"{count} below 0: {named}. {NEGATIVE_R2}")


def _summary_cells(summary: dict[str, Any]) -> list[tuple[str, float]]:
    """The headline numbers of summary.json as ``(label, value)``, for the note on R^2 < 0."""
    cells = []
    for key, label in (
        ("group_dependency", "group dependency"),
        ("mean_pairwise_r2", "mean pairwise R²"),
    ):
        values = summary.get(key)
        if isinstance(values, dict):
            cells += [
                (f"{label}, {s}", float(v)) for s, v in values.items() if isinstance(v, int | float)
            ]
    return cells


def _per_split(values: Any) -> str:
    if not isinstance(values, dict):
        return ""
    return ", ".join(
        f"{s} {v:.3f}" if isinstance(v, int | float) else f"{s} {'n/a' if v is None else v}"
        for s, v in values.items()
    )


def _method_text(method: Any) -> str:
    """How the statistics were made: exact (and in which precision), or reduced with its k per
    model, the variance kept and the error estimate (``summary.json``'s ``method``)."""
    if not isinstance(method, dict):
        return "exact, float64"
    if method.get("name") == "exact":
        return f"exact, {method.get('precision', 'float64')}"
    components = method.get("components", {})
    kept = method.get("retained_variance", {})
    per_model = ", ".join(
        f"{name} k {k} ({100 * kept.get(name, {}).get('train', float('nan')):.1f}% of its "
        "training variance)"
        for name, k in components.items()
    )
    return (
        f"{method.get('name')} ({method.get('precision')}): {per_model}. "
        f"{method.get('statement', '')}: {_per_split(method.get('error_estimate'))}"
    )


def _single_fit_row(single: Any) -> list[tuple[str, str]]:
    """The fit the run was asked for (``target`` from ``basis``), as its R² per split; none
    for a run without one."""
    if not isinstance(single, dict) or not isinstance(single.get("basis"), list):
        return []
    basis = " + ".join(map(str, single["basis"]))
    return [(f"{single.get('target')} from {basis} (R²)", _per_split(single.get("r2")))]


def _run_section(run_dir: Path, summary: dict[str, Any], config: dict[str, Any]) -> Section:
    provenance = run_dir / PROVENANCE
    versions = read_json(provenance).get("versions", {}) if provenance.is_file() else {}
    spans = summary.get("spans", {})
    seconds = summary.get("seconds", {})
    rows = [
        ("run directory", str(run_dir)),
        ("status", summary.get("status", "")),
        ("models", ", ".join(map(str, summary.get("models", [])))),
        ("spans", ", ".join(f"{s} {n}" for s, n in spans.items())),
        ("ridge strength alpha", _alpha_text(summary, config)),
        ("statistics", _method_text(summary.get("method"))),
        ("group dependency (mean group R²)", _per_split(summary.get("group_dependency"))),
        ("mean pairwise R²", _per_split(summary.get("mean_pairwise_r2"))),
        *_single_fit_row(summary.get("single_fit")),
        ("seconds", ", ".join(f"{k} {v}" for k, v in seconds.items())),
        ("versions", ", ".join(f"{k} {v}" for k, v in versions.items())),
    ]
    warnings = [str(w) for w in summary.get("warnings", [])]
    notes = [note("Warning: " + html.escape(w)) for w in warnings]
    return section("run", "Run", *notes, facts(rows), negative_r2_note(_summary_cells(summary)))


def _pairwise_section(run_dir: Path, figure: Path | None) -> Section | None:
    pairwise = read_pairwise(run_dir, "test")
    if pairwise is None:
        return None
    names, r2 = pairwise
    order = cluster_order(r2)
    labels = [names[i] for i in order]
    rows = [[labels[a], *(r2[i, j] for j in order)] for a, i in enumerate(order)]
    explained = note(
        "Test R² of each target (row) from each single basis model (column); "
        "rows and columns ordered by average-linkage clustering on 1 &minus; symmetrised R²."
    )
    cells = [(f"{names[i]} from {names[j]}", float(r2[i, j])) for i in order for j in order]
    return section(
        "pairwise",
        "Pairwise R² (clustered)",
        explained,
        negative_r2_note(cells),
        image(figure, "pairwise R² heatmap"),
        table([PAIRWISE_CORNER, *labels], rows),
    )


def _group_section(run_dir: Path, figure: Path | None) -> Section | None:
    fits = group_fits(run_dir)
    if not fits:
        return None
    nulls = read_table(run_dir, NULLS) or []
    split = preferred_split(fits)
    by = {(r.target, r.split): r for r in fits}
    targets = unique(r.target for r in fits)
    null_kinds = unique(r.kind for r in nulls if r.split == split)
    header = [
        "model",
        *(f"R² {s}" for s in SPLITS),
        f"interval low ({split})",
        f"interval high ({split})",
        "adjusted R² (train)",
        *(f"null {k} ({split})" for k in null_kinds),
    ]
    rows: list[list[Any]] = []
    missing = FitRow("group", "", "", "", math.nan)
    for t in targets:
        held = by.get((t, split), missing)
        row: list[Any] = [t, *(by.get((t, s), missing).r2 for s in SPLITS)]
        row += [held.ci_low, held.ci_high, by.get((t, "train"), missing).adjusted_r2]
        for kind in null_kinds:
            draws = [r.r2 for r in nulls if (r.kind, r.target, r.split) == (kind, t, split)]
            row.append(float(np.mean(draws)) if draws else math.nan)
        rows.append(row)
    mean = ["mean", *(_mean(row[i] for row in rows) for i in range(1, len(header)))]
    header, shown = without_empty_columns(header, [*rows, mean])
    shown_kinds = {h.split()[0] for h in header}  # a column left out says nothing of its kind
    explained = note(
        "Each model from all the others."
        + (" Intervals from the bootstrap." if "interval" in shown_kinds else "")
        + (" Nulls averaged over their draws." if "null" in shown_kinds else "")
    )
    cells = [(f"{row[0]}, {s}", row[1 + k]) for row in rows for k, s in enumerate(SPLITS)]
    return section(
        "group",
        "Group R²",
        explained,
        negative_r2_note(cells),
        image(figure, "group R² bars"),
        table(header, shown),
    )


def _mean(values: Iterable[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return float(np.mean(finite)) if finite else math.nan


def _similarity_section(run_dir: Path, figure: Path | None) -> Section | None:
    rows = read_table(run_dir, SIMILARITY)
    if not rows:
        return None
    split = preferred_split(rows)
    picked = [r for r in rows if r.split == split]
    cells = [[r.model_a, r.model_b, r.lmd_r2, r.cka, r.mean_cca] for r in picked]
    header = ["model a", "model b", "LMD R² (a from b)", "linear CKA", "mean CCA"]
    return section(
        "similarity",
        "Similarity: LMD, CKA and CCA",
        note(f"Split: {html.escape(split)}."),
        negative_r2_note((f"{r.model_a} from {r.model_b}", r.lmd_r2) for r in picked),
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
    rows = read_table(run_dir, ATTRIBUTION)
    if not rows:
        return None
    picked: dict[tuple[str, str, str], AttributionShareRow] = {}
    for target in unique(r.target for r in rows):
        for method in unique(r.method for r in rows):
            chosen = [r for r in rows if r.target == target and r.method == method]
            split = preferred_split(chosen)
            picked.update({(target, r.model, method): r for r in chosen if r.split == split})
    methods = {m for _, _, m in picked}
    columns = [c for c in ATTRIBUTION_COLUMNS if c[1] in methods]
    cells = []
    for pair in unique(f"{t}\0{m}" for t, m, _ in picked):
        target, model = pair.split("\0")
        row: list[Any] = [target, model]
        for _, method, field in columns:
            found = picked.get((target, model, method))
            value = getattr(found, field) if found is not None else None
            # a greedy step as text (an integer), a value as a float; blank when absent
            row.append(
                math.nan if value is None else str(value) if field == "step" else float(value)
            )
        cells.append(row)
    explained = note("Each method on the most held-out split it was computed on.")
    header = ["target", "model", *(c[0] for c in columns)]
    return section(
        "attribution", "Attribution", explained, image(figure, "attribution"), table(header, cells)
    )


TITLE = "lmalgebra report: "  # the page's title, then the run's name: a report is known by it


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    """Write the HTML report of the complete run ``run_dir`` to ``out`` (default
    ``run_dir/report.html``), drawing its figures into ``run_dir/plots`` first; return the path.

    Raises UserInputError naming the directory when it holds no ``summary.json``.
    """
    if out is None:  # the page goes into the run: a run directory that is none is named so
        read_summary(run_dir)  # (a file, a link to nothing had been a report file not created)
    target = out if out is not None else run_dir / REPORT
    refuse_inside_other_output(target, "report", run_dir)
    check_file(target, "report file", lambda head: TITLE.encode() in head)
    summary = read_summary(run_dir)
    refuse_linked_directories(run_dir)  # the figures go into its plots/
    if not os.access(run_dir, os.W_OK | os.X_OK):  # had been named as the output directory
        raise UserInputError(
            f"run directory {run_dir} is not writable, and the report draws its figures into "
            "it (plots/) wherever the page goes: copy the run where you can write, and report "
            "the copy"
        )
    # the figures go into the run: not while a run writes there (--overwrite, say)
    with run_directory_lock(run_dir, "report"), tidy_on_failure(target.parent, deep=False):
        return _write(run_dir, target, summary)


def _write(run_dir: Path, target: Path, summary: dict[str, Any]) -> Path:
    figures = {p.stem: p for p in write_plots(run_dir)}
    config_path = run_dir / CONFIG
    config_text = read_text(config_path, "run file") if config_path.is_file() else ""
    try:
        parsed = yaml.safe_load(config_text)
    except yaml.YAMLError:
        parsed = None
    config = parsed if isinstance(parsed, dict) else {}
    sections: list[Section | None] = [
        _run_section(run_dir, summary, config),
        _pairwise_section(run_dir, figures.get(CLUSTERED_HEATMAP.removesuffix(".png"))),
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
        chosen = note(f"Chosen &alpha;: {html.escape(_alpha_text(summary, config))}.")
        sections.append(
            section("alpha", "Alpha curve", chosen, image(figures["alpha_curve"], "alpha curve"))
        )
    sections.append(_attribution_section(run_dir, figures.get("attribution")))
    if config_text:
        sections.append(
            section("config", "Configuration", f"<pre>{html.escape(config_text)}</pre>")
        )
    title = f"{TITLE}{run_dir.name}"
    return write_page(target, title, [s for s in sections if s is not None])
