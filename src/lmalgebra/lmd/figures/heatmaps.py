"""The heatmaps of a decomposition run: pairwise R^2 (run order and clustered), layer maps, and
LMD against CKA and CCA.

Each figure has one colour scale for all its panels: from 0, or diverging around 0 when a value is
below it (:func:`lmalgebra.figures.canvas.matrix`), its colour bar then saying what below 0 means.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.figures import canvas
from lmalgebra.lmd.rundir.files import preferred_split, unique
from lmalgebra.lmd.rundir.schema import LayerMapRow, SimilarityRow
from lmalgebra.stats.clustering import cluster_order

MEASURES = {"lmd_r2": "LMD pairwise R²", "cka": "linear CKA", "mean_cca": "mean CCA"}
TITLE_CHARS_PER_INCH = 11  # at the panel titles' 9 points: where a title wraps


def _scale_label(label: str, image: Any) -> str:
    """A colour bar's label; a scale reaching below 0 says what those colours mean."""
    return (
        f"{label}\n(below 0: worse than the held-out mean)" if canvas.below_zero(image) else label
    )


def pairwise_heatmap(matrix: np.ndarray, names: list[str], path: Path) -> Path:
    """Test pairwise R^2 ``(n, n)`` float64 (rows = target, columns = basis) in the run's model
    order, every cell annotated: the run-root ``pairwise_r2_test.png``."""
    size = max(4.0, 0.6 * len(names) + 2) + canvas.label_inches(names)
    fig, axes = canvas.figure(1, 1, size + 1, size, layout=None)
    ax = axes[0, 0]
    image = canvas.matrix(ax, matrix, names, names, annotate_up_to=None, text_size=8)
    ax.set_xlabel("basis")
    ax.set_ylabel("target")
    canvas.colorbar(fig, image, ax, _scale_label("held-out R$^2$ (test)", image))
    ax.set_title("Pairwise R$^2$: target from one basis model")
    fig.tight_layout()
    return canvas.save(fig, path, dpi=120)


def clustered_pairwise_heatmap(
    r2: np.ndarray, names: list[str], path: Path, split: str = "test"
) -> Path:
    """Pairwise R^2 ``(n, n)`` float64 (row = target, column = basis), rows and columns in the
    order of average-linkage clustering on ``1 - symmetrised R^2``."""
    order = cluster_order(r2)
    labels = [names[i] for i in order]
    side = max(4.0, 0.55 * len(names) + 2.0) + canvas.label_inches(names)
    fig, axes = canvas.figure(1, 1, side + 1.2, side)
    ax = axes[0, 0]
    image = canvas.matrix(ax, r2[np.ix_(order, order)], labels, labels)
    ax.set_xlabel("basis")
    ax.set_ylabel("target")
    ax.set_title(f"Pairwise R² ({split}), clustered")
    canvas.colorbar(fig, image, ax, _scale_label(f"held-out R² ({split})", image))
    return canvas.save(fig, path)


def layer_map(rows: list[LayerMapRow], path: Path) -> Path:
    """``sweeps/layer_map.csv``: for each (model_a, model_b), R^2 of model_a's layer (rows)
    from model_b's layer (columns), on the most held-out split present."""
    split = preferred_split(rows)
    rows = [r for r in rows if r.split == split]
    pairs = unique(f"{r.model_a}\0{r.model_b}" for r in rows)
    cols = min(3, len(pairs))
    fig, axes = canvas.figure(math.ceil(len(pairs) / cols), cols, 3.8, 3.4)
    chars = int(3.8 * TITLE_CHARS_PER_INCH)
    low = canvas.lower_bound(np.array([r.r2 for r in rows]))  # one scale: the panels share a bar
    image = None
    for ax, pair in zip(axes.flat, pairs, strict=False):
        a, b = pair.split("\0")
        cells = [r for r in rows if r.model_a == a and r.model_b == b]
        layers_a = sorted({r.layer_a for r in cells})
        layers_b = sorted({r.layer_b for r in cells})
        values = np.full((len(layers_a), len(layers_b)), np.nan)
        for r in cells:
            values[layers_a.index(r.layer_a), layers_b.index(r.layer_b)] = r.r2
        labels_a, labels_b = [str(v) for v in layers_a], [str(v) for v in layers_b]
        image = canvas.matrix(ax, values, labels_a, labels_b, vmin=low)
        ax.set_ylabel(canvas.wrap(f"{a} layer (target)", canvas.LABEL_CHARS))
        ax.set_xlabel(canvas.wrap(f"{b} layer (basis)", chars))
        ax.set_title(canvas.wrap(f"{a} from {b}", chars), fontsize=9)
    canvas.hide_unused(axes, len(pairs))
    if image is not None:
        used = list(axes.flat[: len(pairs)])
        canvas.colorbar(fig, image, used, _scale_label(f"R² ({split})", image))
    return canvas.save(fig, path)


def similarity(rows: list[SimilarityRow], path: Path, order: list[str] | None = None) -> Path:
    """``similarity.csv``: LMD pairwise R^2, linear CKA and mean CCA as heatmaps side by side
    (row = model_a, column = model_b), models in ``order`` (default: first appearance)."""
    split = preferred_split(rows)
    rows = [r for r in rows if r.split == split]
    seen = unique([r.model_a for r in rows] + [r.model_b for r in rows])
    models = [m for m in order or [] if m in seen] + [m for m in seen if m not in (order or [])]
    index = {m: i for i, m in enumerate(models)}
    side = max(3.4, 0.45 * len(models) + 1.8)
    room = canvas.label_inches(models)  # below each panel; left of the first only
    fig, axes = canvas.figure(1, len(MEASURES), side + room / len(MEASURES), side + room)
    panels = {}
    for column in MEASURES:
        values = np.full((len(models), len(models)), np.nan)
        for r in rows:
            values[index[r.model_a], index[r.model_b]] = getattr(r, column)
        panels[column] = values
    low = canvas.lower_bound(*panels.values())  # one scale: the three panels share a bar
    image = None
    for ax, (column, title) in zip(axes.flat, MEASURES.items(), strict=True):
        image = canvas.matrix(ax, panels[column], models, models, vmin=low)
        ax.set_title(title, fontsize=10)
        if ax is not axes[0, 0]:  # the rows are those of the first panel
            ax.tick_params(labelleft=False)
    axes[0, 0].set_ylabel("model a (target)")
    if image is not None:
        label = _scale_label(f"similarity ({split})", image)
        canvas.colorbar(fig, image, list(axes.flat), label, shrink=0.8)
    fig.suptitle(f"LMD against CKA and CCA ({split})")
    return canvas.save(fig, path)
