"""Every figure of a decomposition run, each drawn from the typed rows of its table.

Every figure function takes rows as read through the schema (:mod:`lmalgebra.lmd.rundir.schema`) and
the PNG path, writes the PNG atomically and returns the path. ``write_plots`` draws every figure
whose table exists in a run directory; the heatmaps are in :mod:`lmalgebra.lmd.figures.heatmaps`.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.splits import SPLITS
from lmalgebra.figures import canvas
from lmalgebra.lmd.figures.heatmaps import (
    TITLE_CHARS_PER_INCH,
    clustered_pairwise_heatmap,
    layer_map,
    similarity,
)
from lmalgebra.lmd.rundir.files import chosen_alpha, group_fits, preferred_split, unique
from lmalgebra.lmd.rundir.schema import (
    ALPHA_CURVE,
    ATTRIBUTION,
    CLUSTERED_HEATMAP,
    FIGURE_TABLES,
    GROUP_FIGURE,
    LANGUAGE_SWEEP,
    LAYER_MAP,
    LAYER_SWEEP,
    LENGTH_SWEEP,
    NULLS,
    PLOTS_DIR,
    SIMILARITY,
    TRAIN_SIZE_SWEEP,
    AlphaCurveRow,
    AttributionShareRow,
    FitRow,
    NullRow,
    SweepRow,
    figure_name,
    read_pairwise,
)
from lmalgebra.stats.clustering import cluster_order
from lmalgebra.storage.csv_tables import Table, read_table

log = logging.getLogger(__name__)

NULL_KINDS = ("random_group", "shuffled_group", "random_pairwise")
CRITERIA = {  # criterion -> (axis label, whether lower is better)
    "gcv": ("GCV score (lower is better)", True),
    "kfold": ("k-fold held-out R²", False),
    "validation": ("validation R²", False),
}
KIND_ORDER = {"group": 0, "single": 1, "pairwise": 2}
MAX_SERIES = 8  # a sweep with more series than this shows the group fits alone
METHODS = {"greedy": "greedy selection", "drop_one": "drop one", "shapley": "Shapley value"}


def _whiskers(ax: Any, x: np.ndarray, y: np.ndarray, low: np.ndarray, high: np.ndarray) -> bool:
    """Error bars from ``low`` to ``high`` ``(n,)`` at ``x``, drawn only where an interval
    exists (finite and wider than nothing) beside a value ``y``; whether any was drawn. A
    bootstrap percentile interval need not hold its estimate (few spans, a skewed R^2): it is
    drawn as it is (matplotlib had refused the negative length from ``y`` to it)."""
    shown = np.isfinite(low) & np.isfinite(high) & np.isfinite(y) & (high > low)
    if shown.any():
        middle, half = (low[shown] + high[shown]) / 2, (high[shown] - low[shown]) / 2
        ax.errorbar(x[shown], middle, yerr=half, fmt="none", ecolor="black", capsize=3)
    return bool(shown.any())


def group_r2_bars(fits: list[FitRow], nulls: list[NullRow], path: Path) -> Path:
    """Group R^2 per target (``fits.csv`` rows of kind group) with bootstrap intervals, and the
    mean of each null baseline of ``nulls.csv`` beside it (whiskers: min to max over draws).

    Only intervals that exist are drawn: a run without a bootstrap, or a null of one draw, shows
    bars alone, and the legend says which whiskers are intervals."""
    split = preferred_split(fits)
    group = {r.target: r for r in fits if r.kind == "group" and r.split == split}
    targets = list(group)
    draws: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in nulls:
        if r.split == split and r.target in group:
            draws[r.kind, r.target].append(r.r2)
    present = {kind for kind, _ in draws}
    kinds = [k for k in NULL_KINDS if k in present] + sorted(present - set(NULL_KINDS))
    width = 0.8 / (1 + len(kinds))
    width_in = max(5.0, 0.3 * len(targets) * (1 + len(kinds)) + 2.5)
    height = 3.8 + canvas.label_inches(targets) + 0.2 * (1 + len(kinds))  # legend below
    fig, axes = canvas.figure(1, 1, width_in, height)
    ax = axes[0, 0]
    x = np.arange(len(targets), dtype=np.float64)
    r2 = np.array([group[t].r2 for t in targets])
    low = np.array([group[t].ci_low for t in targets])
    high = np.array([group[t].ci_high for t in targets])
    drawn = _whiskers(ax, x, r2, low, high)
    label = "group R²" + (" (whiskers: bootstrap interval)" if drawn else "")
    ax.bar(x, r2, width, color=canvas.colour(0), label=label)
    for k, kind in enumerate(kinds, start=1):
        values = [draws.get((kind, t), []) for t in targets]
        mean = np.array([np.mean(v) if v else math.nan for v in values])
        lowest = np.array([min(v) if v else math.nan for v in values])
        highest = np.array([max(v) if v else math.nan for v in values])
        drawn = _whiskers(ax, x + k * width, mean, lowest, highest)
        label = f"null: {kind}" + (" (whiskers: min to max over draws)" if drawn else "")
        shade = str(0.35 + 0.5 * k / (len(kinds) + 1))
        ax.bar(x + k * width, mean, width, color=shade, label=label)
    ax.axhline(0.0, color="black", linewidth=0.6)
    canvas.slanted_ticks(ax, x + width * len(kinds) / 2, targets)
    ax.set_ylabel(f"R² ({split})")
    ax.set_title("Group R²: each model from all the others, with null baselines")
    # below the panel: inside, it would hide the last targets' bars
    fig.legend(*ax.get_legend_handles_labels(), loc="outside lower center", fontsize=7)
    return canvas.save(fig, path)


def _series(row: SweepRow) -> str:
    return row.target if row.kind == "group" else f"{row.target} from {row.basis}"


def _focus(rows: list[SweepRow]) -> tuple[list[SweepRow], str]:
    """The rows a sweep figure shows: all of them when they make few series, otherwise only the
    group fits (one series per target); the other rows stay in the CSV."""
    if len({_series(r) for r in rows}) <= MAX_SERIES or not any(r.kind == "group" for r in rows):
        return rows, ""
    return [r for r in rows if r.kind == "group"], " (group fits)"


def _sweep(
    rows: list[SweepRow],
    path: Path,
    xlabel: str,
    title: str,
    *,
    log_x: bool = False,
    by: str = "split",
) -> Path:
    """R^2 against ``setting``: one panel per split (``by="split"``, a line per series) or per
    series (``by="series"``, a line per split). Non-numeric settings are drawn as grouped bars.
    Repeated rows of one point are averaged; group series come first."""
    rows, shown = _focus(rows)
    rows = sorted(rows, key=lambda r: KIND_ORDER.get(r.kind, len(KIND_ORDER)))
    points: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    for r in rows:
        points[_series(r), r.split, r.setting].append(r.r2)
    settings = unique(r.setting for r in rows)
    is_numeric = canvas.numeric(settings)
    if is_numeric:
        settings.sort(key=float)
    series = unique(_series(r) for r in rows)
    rank = {split: k for k, split in enumerate(SPLITS)}
    splits = sorted(unique(r.split for r in rows), key=lambda s: (rank.get(s, len(SPLITS)), s))
    panels, lines = (splits, series) if by == "split" else (series, splits)
    cols = min(3, len(panels))
    fig, axes = canvas.figure(math.ceil(len(panels) / cols), cols, 4.2, 3.2)
    for ax, panel in zip(axes.flat, panels, strict=False):
        for i, line in enumerate(lines):
            serie, split = (line, panel) if by == "split" else (panel, line)
            found = [(s, points[serie, split, s]) for s in settings if (serie, split, s) in points]
            if not found:
                continue
            y = [float(np.mean(v)) for _, v in found]
            style = {"color": canvas.colour(i), "label": line}
            if is_numeric:
                x = [float(s) for s, _ in found]
                ax.plot(x, y, marker="o", linestyle=canvas.LINESTYLES.get(split, "-"), **style)
            else:
                x = [
                    settings.index(s) + (i - (len(lines) - 1) / 2) * 0.8 / len(lines)
                    for s, _ in found
                ]
                ax.bar(x, y, 0.8 / len(lines), **style)
        if log_x:
            ax.set_xscale("log")
        if not is_numeric:
            ax.set_xticks(range(len(settings)), [canvas.literal(s) for s in settings])
        elif len(settings) <= 12:  # label the settings themselves, not decades
            ax.set_xticks([float(s) for s in settings], settings)
            ax.minorticks_off()
        ax.axhline(0.0, color="black", linewidth=0.5)
        ax.set_title(canvas.wrap(panel, int(4.2 * TITLE_CHARS_PER_INCH)), fontsize=9)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("R²")
    canvas.hide_unused(axes, len(panels))
    canvas.legend(fig, axes)
    fig.suptitle(title + shown)
    return canvas.save(fig, path)


def length_sweep(rows: list[SweepRow], path: Path) -> Path:
    """``sweeps/length.csv``: R^2 against the span length T, one panel per split."""
    return _sweep(rows, path, "span length T (tokens)", "R² against span length T")


def layer_sweep(rows: list[SweepRow], path: Path) -> Path:
    """``sweeps/layer.csv``: R^2 against the target layer, one panel per split."""
    return _sweep(rows, path, "target layer", "R² against layer")


def train_size_curve(rows: list[SweepRow], path: Path) -> Path:
    """``sweeps/train_size.csv``: learning curve, train and held-out R^2 against training spans,
    one panel per target."""
    return _sweep(rows, path, "training spans", "Train and held-out R²", log_x=True, by="series")


def language_sweep(rows: list[SweepRow], path: Path) -> Path:
    """``sweeps/language.csv``: R^2 per language code, one panel per split."""
    return _sweep(rows, path, "language", "R² per language")


def alpha_curve(rows: list[AlphaCurveRow], path: Path, chosen: float | None = None) -> Path:
    """``alpha_curve.csv``: each criterion against alpha (log axis), one line per target, the best
    alpha of each line starred and the run's ``chosen`` alpha as a dashed line."""
    present = unique(r.criterion for r in rows)
    criteria = [c for c in CRITERIA if c in present] + [c for c in present if c not in CRITERIA]
    targets = unique(r.target for r in rows)
    fig, axes = canvas.figure(1, len(criteria), 4.2, 3.4)
    for ax, criterion in zip(axes.flat, criteria, strict=False):
        label, lower_better = CRITERIA.get(criterion, (criterion, False))
        for i, target in enumerate(targets):
            curve = sorted(
                (r.alpha, r.value) for r in rows if r.criterion == criterion and r.target == target
            )
            curve = [(a, v) for a, v in curve if a > 0 and math.isfinite(v)]
            if not curve:
                continue
            x, y = np.array(curve).T
            best = int(np.argmin(y) if lower_better else np.argmax(y))
            ax.plot(x, y, marker=".", color=canvas.colour(i), label=target)
            ax.plot(x[best], y[best], marker="*", markersize=11, color=canvas.colour(i))
        if chosen is not None and chosen > 0:
            ax.axvline(
                chosen,
                color="black",
                linestyle="--",
                linewidth=1,
                label=f"\N{GREEK SMALL LETTER ALPHA} = {chosen:.3g}",
            )
        ax.set_xscale("log")
        ax.set_xlabel(r"$\alpha$")
        ax.set_ylabel(label)
        ax.set_title(criterion, fontsize=9)
    canvas.legend(fig, axes)
    fig.suptitle(
        r"Ridge strength: criterion against $\alpha$ (star: best per target; dashed: chosen)"
    )
    return canvas.save(fig, path)


def attribution(rows: list[AttributionShareRow], path: Path) -> Path:
    """``attribution.csv``: per target (a row of panels), the greedy selection curve and the
    drop-one and Shapley bars, each on its most held-out split present."""
    targets = unique(r.target for r in rows)
    present = unique(r.method for r in rows)
    methods = [m for m in METHODS if m in present] + [m for m in present if m not in METHODS]
    room = canvas.label_inches([r.model for r in rows])  # model names label x and y ticks
    fig, axes = canvas.figure(len(targets), len(methods), 3.8 + room, 2.8 + room)
    for i, target in enumerate(targets):
        for j, method in enumerate(methods):
            ax = axes[i, j]
            chosen = [r for r in rows if r.target == target and r.method == method]
            split = preferred_split(chosen)
            chosen = [r for r in chosen if r.split == split]
            title = f"{target}: {METHODS.get(method, method)} ({split})"
            ax.set_title(canvas.wrap(title, int(3.8 * TITLE_CHARS_PER_INCH)), fontsize=9)
            if not chosen:
                ax.set_axis_off()
            elif method == "greedy":
                chosen.sort(key=lambda r: _step(r.step))
                steps = [_step(r.step) for r in chosen]
                ax.plot(steps, [r.value for r in chosen], marker="o", color="C0")
                canvas.slanted_ticks(ax, steps, [f"+{r.model}" for r in chosen])
                ax.set_ylabel("R²")
            else:
                values = [r.value for r in chosen]
                ax.barh(
                    canvas.tick_labels([r.model for r in chosen]), values, color=canvas.colour(j)
                )
                ax.invert_yaxis()
                ax.axvline(0.0, color="black", linewidth=0.6)
                ax.set_xlabel("ΔR²" if method == "drop_one" else "share of R²")
    return canvas.save(fig, path)


def _step(step: int | None) -> float:
    return math.nan if step is None else float(step)


def write_plots(
    run_dir: Path, out_dir: Path | None = None, chosen: float | None = None
) -> list[Path]:
    """Draw every figure whose table exists in ``run_dir`` into ``out_dir`` (default
    ``run_dir/plots``), named after its table (``plots/length.png``; the clustered pairwise
    heatmap is ``plots/pairwise_r2_test_clustered.png``); return the paths written.

    ``chosen`` marks the alpha on the alpha curve (default: ``alpha.value`` of summary.json).
    A table with a header but no rows gets no figure.
    """
    out = out_dir if out_dir is not None else run_dir / PLOTS_DIR
    written: list[Path] = []
    order: list[str] | None = None
    pairwise = read_pairwise(run_dir, "test")
    if pairwise is not None:
        names, r2 = pairwise
        order = [names[i] for i in cluster_order(r2)]
        written.append(clustered_pairwise_heatmap(r2, names, out / CLUSTERED_HEATMAP))
    fits = group_fits(run_dir)
    if fits:
        nulls = read_table(run_dir, NULLS) or []
        written.append(group_r2_bars(fits, nulls, out / GROUP_FIGURE))
    alpha = chosen if chosen is not None else chosen_alpha(run_dir)
    draws: dict[Table[Any], Callable[[Any, Path], Path]] = {
        SIMILARITY: lambda rows, p: similarity(rows, p, order),
        ALPHA_CURVE: lambda rows, p: alpha_curve(rows, p, alpha),
        ATTRIBUTION: attribution,
        LENGTH_SWEEP: length_sweep,
        LAYER_SWEEP: layer_sweep,
        LAYER_MAP: layer_map,
        TRAIN_SIZE_SWEEP: train_size_curve,
        LANGUAGE_SWEEP: language_sweep,
    }
    for table in FIGURE_TABLES:  # the figures a run's --overwrite knows by name
        rows = read_table(run_dir, table)
        if rows is None:
            continue
        if not rows:
            log.info("%s has no rows: no figure", run_dir / table.file)
            continue
        written.append(draws[table](rows, out / figure_name(table)))
    return written
