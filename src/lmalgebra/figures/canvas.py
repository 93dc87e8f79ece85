"""Matplotlib plumbing shared by the figures: Agg figures, annotated matrices, atomic PNG writes.

Figures are built on ``matplotlib.figure.Figure`` with an Agg canvas (no pyplot state, so nothing
global is touched and nothing needs closing).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from lmalgebra.storage.atomic import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

DPI = 100
LINESTYLES = {"train": "-", "validation": "--", "test": ":"}
ANNOTATE_UP_TO = 16  # cells per side; beyond this the numbers are unreadable


def figure(rows: int, cols: int, width: float, height: float) -> tuple[Figure, np.ndarray]:
    """A figure of ``rows x cols`` panels of ``width x height`` inches each; axes as a 2-D array."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(cols * width, rows * height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def save(fig: Figure, path: Path) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically."""
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=DPI))
    return path


def colour(index: int) -> Any:
    """The ``index``-th colour of a qualitative map (tab10, then tab20 beyond ten)."""
    from matplotlib import colormaps

    return colormaps["tab10" if index < 10 else "tab20"](index % 20)


def matrix(
    ax: Axes,
    values: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> AxesImage:
    """Draw ``values`` ``(len(rows), len(cols))`` float64 as a heatmap (NaN blank), with numbers
    in the cells when the matrix is small enough to read them."""
    image = ax.imshow(np.ma.masked_invalid(values), vmin=vmin, vmax=vmax, cmap="viridis")
    ax.set_xticks(range(len(cols)), list(cols), rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), list(rows))
    if max(values.shape) <= ANNOTATE_UP_TO:
        middle = (vmin + vmax) / 2
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                tone = "white" if value < middle else "black"
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", color=tone, fontsize=7)
    return image


def legend(fig: Figure, axes: np.ndarray) -> None:
    """One legend for the whole figure, right of the panels: every labelled artist once."""
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        handles, labels = ax.get_legend_handles_labels()
        entries.update({label: handle for handle, label in zip(handles, labels, strict=True)})
    if entries:
        fig.legend(list(entries.values()), list(entries), loc="outside right upper", fontsize=7)


def numeric(values: Sequence[str]) -> bool:
    """Whether every string parses as a number (a sweep setting such as T or a layer index)."""
    try:
        [float(v) for v in values]
    except ValueError:
        return False
    return True


def hide_unused(axes: np.ndarray, used: int) -> None:
    """Hide the panels after the first ``used`` of a grid."""
    for ax in axes.flat[used:]:
        ax.set_visible(False)
