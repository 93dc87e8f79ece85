"""The one matplotlib set-up of the package: Agg figures, annotated matrices, atomic PNG writes.

Every figure (run tables, evaluation, demo) is built here on ``matplotlib.figure.Figure`` with an
Agg canvas: no pyplot state, so nothing global is touched, no display is needed and nothing needs
closing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from lmalgebra.storage.atomic import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

DPI = 100
LINESTYLES = {"train": "-", "validation": "--", "test": ":"}
ANNOTATE_UP_TO = 16  # cells per side; beyond this the numbers are unreadable


def figure(
    rows: int,
    cols: int,
    width: float,
    height: float,
    *,
    layout: Literal["constrained", "tight"] | None = "constrained",
) -> tuple[Figure, np.ndarray]:
    """A figure of ``rows x cols`` panels of ``width x height`` inches each; axes as a 2-D array.

    ``layout=None`` leaves placement to the caller (``fig.tight_layout()`` before saving).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(cols * width, rows * height), layout=layout)
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, squeeze=False)
    return fig, axes


def save(fig: Figure, path: Path, dpi: int = DPI) -> Path:
    """Write ``fig`` as PNG to ``path`` atomically."""
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi))
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
    annotate_up_to: int | None = ANNOTATE_UP_TO,
    text_size: float = 7,
    white_text_below: float | None = None,
) -> AxesImage:
    """Draw ``values`` ``(len(rows), len(cols))`` float64 as a heatmap (NaN blank), with numbers
    in the cells when no side exceeds ``annotate_up_to`` (None: always).

    Numbers below ``white_text_below`` (default: the middle of the colour range) are white, to
    read on the dark end of the map.
    """
    image = ax.imshow(np.ma.masked_invalid(values), vmin=vmin, vmax=vmax, cmap="viridis")
    ax.set_xticks(range(len(cols)), list(cols), rotation=45, ha="right")
    ax.set_yticks(range(len(rows)), list(rows))
    if annotate_up_to is None or max(values.shape) <= annotate_up_to:
        light = (vmin + vmax) / 2 if white_text_below is None else white_text_below
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                tone = "white" if value < light else "black"
                ax.text(
                    j, i, f"{value:.2f}", ha="center", va="center", color=tone, fontsize=text_size
                )
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
