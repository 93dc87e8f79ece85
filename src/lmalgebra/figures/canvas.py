"""The one matplotlib set-up of the package: Agg figures, annotated matrices, atomic PNG writes.

Every figure (run tables, evaluation, demo) is built here on ``matplotlib.figure.Figure`` with an
Agg canvas: no pyplot state, so nothing global is touched, no display is needed and nothing needs
closing. A saved PNG is cropped to what is drawn, so no title, label or legend is ever cut off.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from lmalgebra.storage.atomic import write_atomic

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.colorbar import Colorbar
    from matplotlib.figure import Figure
    from matplotlib.image import AxesImage

DPI = 100
LINESTYLES = {"train": "-", "validation": "--", "test": ":"}
ANNOTATE_UP_TO = 16  # cells per side; beyond this the numbers are unreadable
# the least extent of a scale below 0: a value of -0.001 should not take the darkest red
MIN_NEGATIVE_SPAN = 0.1
LABEL_CHARS = 24  # a tick label longer than this (a long model name) goes on several lines
INCHES_PER_CHAR = 0.075  # of a tick label at the default 10 points


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
    """Write ``fig`` as PNG to ``path`` atomically, cropped to everything drawn: a title or a tick
    label reaching past the figure's edge widens the image instead of being cut."""
    write_atomic(
        path,
        lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, bbox_inches="tight", pad_inches=0.1),
    )
    return path


def literal(text: str) -> str:
    """``text`` drawn as written: matplotlib reads a pair of dollar signs as mathematics, and a
    model named ``$\\foo$`` stopped the figure with a parse error (``a$x$`` drew an italic x)."""
    return text.replace("$", r"\$")


def wrap(text: str, width: int) -> str:
    """``text`` on lines of at most ``width`` characters (long model names broken where needed),
    for titles and labels that would otherwise run into the next panel; drawn as written
    (:func:`literal`)."""
    return literal("\n".join(textwrap.wrap(text, width, break_on_hyphens=True)) or text)


def colour(index: int) -> Any:
    """The ``index``-th colour of a qualitative map (tab10, then tab20 beyond ten)."""
    from matplotlib import colormaps

    return colormaps["tab10" if index < 10 else "tab20"](index % 20)


def tick_labels(labels: Sequence[str]) -> list[str]:
    """``labels`` wrapped at ``LABEL_CHARS`` characters: tick labels that stay near their axis."""
    return [wrap(label, LABEL_CHARS) for label in labels]


def slanted_ticks(ax: Axes, positions: Sequence[float] | np.ndarray, labels: Sequence[str]) -> None:
    """x tick labels at 45 degrees, wrapped, each ending under its tick: long names side by
    side stay apart."""
    ax.set_xticks(
        list(positions), tick_labels(labels), rotation=45, ha="right", rotation_mode="anchor"
    )


def label_inches(labels: Sequence[str]) -> float:
    """Room the longest tick label among ``labels`` takes once wrapped (inches): what a figure
    adds to its size so that long model names leave the panels their size."""
    lines = [line for label in labels for line in wrap(label, LABEL_CHARS).splitlines()]
    return INCHES_PER_CHAR * max((len(line) for line in lines), default=0)


def lower_bound(*arrays: np.ndarray) -> float:
    """The bottom of a colour scale for ``arrays``: 0, or below it when a finite value is
    negative (at least ``MIN_NEGATIVE_SPAN`` below, so that a value close to 0 stays pale)."""
    finite = [float(np.nanmin(a)) for a in arrays if np.isfinite(a).any()]
    low = min([0.0, *finite])
    return min(low, -MIN_NEGATIVE_SPAN) if low < 0 else 0.0


def matrix(
    ax: Axes,
    values: np.ndarray,
    rows: Sequence[str],
    cols: Sequence[str],
    *,
    vmin: float | None = None,
    vmax: float = 1.0,
    annotate_up_to: int | None = ANNOTATE_UP_TO,
    text_size: float = 7,
) -> AxesImage:
    """Draw ``values`` ``(len(rows), len(cols))`` float64 as a heatmap (NaN grey), with numbers
    in the cells when no side exceeds ``annotate_up_to`` (None: always).

    The scale runs from ``vmin`` (default :func:`lower_bound` of ``values``; pass one bound to
    panels that share a colour bar) to ``vmax``. From 0 it is viridis; below 0 it is a diverging
    map centred at 0 (red below, white at 0, blue above), so negative cells stand apart instead of
    sharing the colour of 0. Numbers are white on dark cells and black on light ones.
    """
    from matplotlib import colormaps
    from matplotlib.colors import Normalize, TwoSlopeNorm

    low = lower_bound(values) if vmin is None else vmin
    if low < 0:
        norm: Normalize = TwoSlopeNorm(vcenter=0.0, vmin=low, vmax=vmax)
        cmap = colormaps["RdBu"]
    else:
        norm, cmap = Normalize(vmin=low, vmax=vmax), colormaps["viridis"]
    # grey for a cell without a value: white is 0 on the diverging map
    image = ax.imshow(np.ma.masked_invalid(values), norm=norm, cmap=cmap.with_extremes(bad="0.85"))
    slanted_ticks(ax, range(len(cols)), cols)
    ax.set_yticks(range(len(rows)), tick_labels(rows))
    if annotate_up_to is None or max(values.shape) <= annotate_up_to:
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                red, green, blue, _ = image.cmap(image.norm(value))
                dark = 0.2126 * red + 0.7152 * green + 0.0722 * blue < 0.5
                tone = "white" if dark else "black"
                ax.text(
                    j, i, f"{value:.2f}", ha="center", va="center", color=tone, fontsize=text_size
                )
    return image


def colorbar(fig: Figure, image: AxesImage, ax: Any, label: str, **options: Any) -> Colorbar:
    """A labelled colour bar for ``image`` beside ``ax`` (an axes or a list of them); a scale
    that reaches below 0 gets a black line at 0 on the bar."""
    bar = fig.colorbar(image, ax=ax, label=label, **options)
    if below_zero(image):
        bar.ax.axhline(0.0, color="black", linewidth=1.0)
    return bar


def below_zero(image: AxesImage) -> bool:
    """Whether ``image``'s colour scale reaches below 0."""
    low = image.norm.vmin
    return isinstance(low, float | int) and not math.isnan(low) and low < 0


def legend(fig: Figure, axes: np.ndarray) -> None:
    """One legend for the whole figure, right of the panels: every labelled artist once."""
    entries: dict[str, Any] = {}
    for ax in axes.flat:
        handles, labels = ax.get_legend_handles_labels()
        entries.update(
            {literal(label): handle for handle, label in zip(handles, labels, strict=True)}
        )
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
