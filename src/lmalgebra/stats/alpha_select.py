"""Choice of the ridge strength over a grid, effective degrees of freedom and adjusted R^2.

Three curves per fit (a target on a basis), each from statistics alone:

* ``gcv``: generalised cross-validation on the training split,
  ``GCV = (RSS / n) / (1 - df / n)^2`` with ``RSS`` pooled over the target's dimensions and ``df``
  the ridge's effective degrees of freedom plus one for the intercept (lower is better);
* ``kfold``: mean over ``k`` folds of the pooled held-out R^2, a fold being a contiguous group of
  the training split's blocks, fitted on the other blocks (higher is better);
* ``validation``: pooled R^2 on the validation split (higher is better).

Every curve of a fit comes from one eigendecomposition of its (rescaled) training basis covariance
(one per fold for k-fold): see :mod:`lmalgebra.stats.ridge_path`.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.linalg import solve_triangular

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.stats.choices import default_alpha_grid
from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.ridge_path import RidgePath
from lmalgebra.stats.solver import AlphaMode, Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from lmalgebra.stats.symmetric_kernels import cholesky

log = logging.getLogger(__name__)

Method = Literal["gcv", "kfold", "validation"]
CRITERIA: tuple[str, ...] = ("gcv", "kfold", "validation")
FitSpec = tuple[str, tuple[str, ...]]


def check_grid(grid: Sequence[float] | np.ndarray | None) -> np.ndarray:
    """``(A,) float64`` grid of alphas; the default grid when ``None``. Refuses bad values."""
    values = default_alpha_grid() if grid is None else list(grid)
    if not values:
        raise UserInputError("the alpha grid is empty")
    for value in values:
        if not (isinstance(value, (int, float, np.floating, np.integer)) and math.isfinite(value)):
            raise UserInputError(f"alpha grid value {value!r} is not a finite number")
        if value <= 0:
            raise UserInputError(f"alpha grid value {value!r} must be > 0")
    return np.asarray(values, dtype=float)


def leave_one_out_fits(names: Sequence[str]) -> list[FitSpec]:
    """Every model on all the others, in layout order (the fits of ``Decomposer.leave_one_out``)."""
    return [(t, tuple(n for n in names if n != t)) for t in names]


def fold_groups(parts: int, folds: int) -> list[np.ndarray]:
    """Span-block indices of each fold: ``folds`` contiguous, near-equal groups of ``parts``."""
    if folds < 2:
        raise UserInputError(f"k-fold cross-validation needs k >= 2 folds, got k={folds}")
    if folds > parts:
        raise UserInputError(f"k={folds} folds exceed the {parts} blocks of the training split")
    return list(np.array_split(np.arange(parts), folds))


def penalty_scale(
    blocks: Sequence[ModelColumns],
    train: SplitMoments,
    alpha_mode: AlphaMode,
    scales: np.ndarray | None = None,
) -> np.ndarray:
    """``(D,) float64`` per-column penalty at alpha = 1, exactly as :class:`Decomposer` sets it
    (``scales``: each block's mean variance, as the decomposer's; default from ``train``)."""
    return Decomposer(blocks, {"train": train}, 1.0, alpha_mode, scales).penalty


def complement(total: SplitMoments, part: SplitMoments) -> SplitMoments:
    """Moments of the rows of ``total`` that are not in ``part`` (exact pooled-moment algebra)."""
    rest = total.n - part.n
    if rest <= 0:
        raise ValueError("the held-out part holds every training row")
    mean = (total.n * total.mean - part.n * part.mean) / rest
    gap = mean - part.mean
    # n C = rest C_rest + n_part C_part + (rest n_part / n) gap gap^T
    cov = total.n * total.cov - part.n * part.cov - (rest * part.n / total.n) * np.outer(gap, gap)
    return SplitMoments(rest, mean, cov / rest)


@dataclass(frozen=True)
class AlphaSelection:
    """The chosen alpha and every curve it was chosen from.

    Attributes:
        alpha: the chosen value (one of ``grid``).
        method: the criterion that chose it.
        alpha_mode: how alpha scales the penalty (see :mod:`lmalgebra.stats.solver`).
        grid: ``(A,) float64`` candidate alphas.
        labels: one label per fit: its target, or ``target~basis`` when two fits share a target.
        curves: criterion -> ``(fits, A) float64`` values.
    """

    alpha: float
    method: Method
    alpha_mode: AlphaMode
    grid: np.ndarray
    labels: tuple[str, ...]
    curves: dict[str, np.ndarray]

    def rows(self) -> list[dict[str, str | float]]:
        """Tidy rows ``target, alpha, criterion, value``, one per fit, criterion and alpha."""
        return [
            {"target": label, "alpha": float(a), "criterion": crit, "value": float(values[i, k])}
            for crit in CRITERIA
            if (values := self.curves.get(crit)) is not None
            for i, label in enumerate(self.labels)
            for k, a in enumerate(self.grid)
        ]

    def summary(self) -> dict[str, float | str]:
        """``{"value", "mode", "selected_by"}`` for the run's summary."""
        return {"value": self.alpha, "mode": self.alpha_mode, "selected_by": self.method}


def select_alpha(
    blocks: Sequence[ModelColumns],
    splits: Mapping[str, SplitMoments],
    *,
    alpha_mode: AlphaMode = "relative",
    method: Method = "gcv",
    grid: Sequence[float] | np.ndarray | None = None,
    fits: Sequence[tuple[str, Sequence[str]]] | None = None,
    train_blocks: SpanBlockMoments | None = None,
    folds: int = 5,
    criteria: Sequence[str] | None = None,
    scales: np.ndarray | None = None,
) -> AlphaSelection:
    """Choose alpha over ``grid`` for ``fits`` (default: every model on all the others).

    Args:
        blocks: the model layout; ``splits``: split -> moments, with ``"train"`` (and
            ``"validation"`` for the validation curve).
        method: ``gcv`` (lowest mean over fits of GCV / tr(C_tt), i.e. each fit's GCV relative to
            its target's training variance, so targets of large scale do not dominate), ``kfold``
            (highest mean k-fold R^2) or ``validation`` (highest mean validation R^2).
        train_blocks: the training split's block statistics, needed for k-fold; their sum must be
            ``splits["train"]``.
        folds: ``k``, between 2 and the number of training blocks.
        criteria: curves to compute; default: ``gcv``, ``validation`` when that split exists,
            ``kfold`` when it is the method. The method's own curve is always computed.
        scales: each block's mean variance for relative alpha (``Decomposer``'s ``scales``,
            which reduced models need); default from each training split used.
    """
    values = check_grid(grid)
    wanted = _criteria(method, criteria, splits)
    specs = _check_fits(blocks, splits["train"], fits)
    groups = None
    if "kfold" in wanted:
        if train_blocks is None:
            raise ValueError("k-fold cross-validation needs the training split's block statistics")
        groups = fold_groups(len(train_blocks.parts), folds)

    curves = _train_curves(blocks, splits, specs, values, alpha_mode, wanted, scales)
    if groups is not None and train_blocks is not None:
        per_fold = _fold_r2(
            blocks, splits["train"], train_blocks, groups, specs, values, alpha_mode, scales
        )
        curves["kfold"] = per_fold.mean(axis=0)
    totals = np.array([_target_variance(blocks, splits["train"], t) for t, _ in specs])
    with np.errstate(divide="ignore", invalid="ignore"):
        score = curves[method] / totals[:, None] if method == "gcv" else -curves[method]
    # fits undefined at every alpha (a target without variance) are left out; an alpha where
    # another fit is not finite (GCV of an interpolating fit) is never chosen
    score = score[~np.isnan(score).all(axis=1)]
    mean = score.mean(axis=0) if len(score) else np.full(len(values), np.nan)
    mean[~np.isfinite(mean)] = np.inf
    if np.isinf(mean).all():
        raise UserInputError(f"no alpha of the grid gives a finite {method} criterion")
    chosen = float(values[int(np.argmin(mean))])
    log.info("alpha %.3g chosen by %s over %d values (%s)", chosen, method, len(values), alpha_mode)
    labels = _labels(specs)
    return AlphaSelection(chosen, method, alpha_mode, values, labels, curves)


def _criteria(
    method: str, criteria: Sequence[str] | None, splits: Mapping[str, SplitMoments]
) -> set[str]:
    """The curves to compute: ``criteria`` (default gcv, and validation when it exists) and
    ``method``'s own; each known and computable from ``splits``."""
    if method not in CRITERIA:
        raise UserInputError(f"alpha selection method {method!r} is not one of {CRITERIA}")
    wanted = set(criteria or ["gcv", *(["validation"] if "validation" in splits else [])])
    wanted.add(method)
    unknown = sorted(wanted - set(CRITERIA))
    if unknown:
        raise UserInputError(f"alpha criterion {unknown[0]!r} is not one of {CRITERIA}")
    if "validation" in wanted and "validation" not in splits:
        raise UserInputError("the validation curve needs statistics of the validation split")
    return wanted


def _check_fits(
    blocks: Sequence[ModelColumns],
    train: SplitMoments,
    fits: Sequence[tuple[str, Sequence[str]]] | None,
) -> list[FitSpec]:
    names = [b.name for b in blocks]
    specs = leave_one_out_fits(names) if fits is None else [(t, tuple(b)) for t, b in fits]
    if not specs:
        raise UserInputError("no fit to choose alpha for")
    probe = Decomposer(blocks, {"train": train}, 1.0)
    for target, basis in specs:
        probe.check_fit(target, basis, f"the basis of target {target!r} is empty")
    return specs


def _labels(specs: list[FitSpec]) -> tuple[str, ...]:
    targets = [t for t, _ in specs]
    return tuple(t if targets.count(t) == 1 else f"{t}~{'+'.join(b)}" for t, b in specs)


def _columns(blocks: Sequence[ModelColumns], names: Sequence[str]) -> np.ndarray:
    by_name = {b.name: b for b in blocks}
    return np.concatenate([by_name[n].basis_columns() for n in names])


def _target_block(blocks: Sequence[ModelColumns], name: str) -> ModelColumns:
    return next(b for b in blocks if b.name == name)


def _target_variance(blocks: Sequence[ModelColumns], train: SplitMoments, name: str) -> float:
    b = _target_block(blocks, name)
    return float(np.diag(train.cov)[b.start : b.stop].sum())


def _path(
    blocks: Sequence[ModelColumns], train: SplitMoments, scale: np.ndarray, spec: FitSpec
) -> RidgePath:
    target, basis = spec
    return RidgePath(train, scale, _target_block(blocks, target), _columns(blocks, basis))


def _train_curves(
    blocks: Sequence[ModelColumns],
    splits: Mapping[str, SplitMoments],
    specs: list[FitSpec],
    grid: np.ndarray,
    alpha_mode: AlphaMode,
    wanted: set[str],
    scales: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """GCV and validation R^2, ``(fits, A)`` each, from one eigendecomposition per fit."""
    train = splits["train"]
    scale = penalty_scale(blocks, train, alpha_mode, scales)
    out: dict[str, np.ndarray] = {
        c: np.empty((len(specs), len(grid))) for c in ("gcv", "validation") if c in wanted
    }
    for i, spec in enumerate(specs if out else []):
        path = _path(blocks, train, scale, spec)
        if "gcv" in out:
            out["gcv"][i] = path.gcv(grid)
        if "validation" in out:
            out["validation"][i] = path.r2(path.held_out(splits["validation"]), grid)
    return out


def _fold_r2(
    blocks: Sequence[ModelColumns],
    train: SplitMoments,
    train_blocks: SpanBlockMoments,
    groups: list[np.ndarray],
    specs: list[FitSpec],
    grid: np.ndarray,
    alpha_mode: AlphaMode,
    scales: np.ndarray | None = None,
) -> np.ndarray:
    """``(folds, fits, A)`` R^2 of each fold, fitted on the other folds' blocks."""
    if sum(p.n for p in train_blocks.parts) != train.n:
        raise ValueError("the training block statistics do not add up to the training split")
    out = np.empty((len(groups), len(specs), len(grid)))
    for f, group in enumerate(groups):
        counts = np.zeros(len(train_blocks.parts))
        counts[group] = 1
        held = SplitMoments.of(train_blocks.combine(counts), in_place=True)
        rest = complement(train, held)
        scale = penalty_scale(blocks, rest, alpha_mode, scales)
        for i, spec in enumerate(specs):
            path = _path(blocks, rest, scale, spec)
            out[f, i] = path.r2(path.held_out(held), grid)
    return out


# -- effective degrees of freedom and adjusted R^2 ----------------------------------------------
def effective_df(decomposer: Decomposer, basis: Sequence[str]) -> float:
    """Effective degrees of freedom of the slopes of a fit on ``basis`` at the decomposer's alpha.

    ``df = d_B - tr(Lam (C_BB + Lam)^-1)``: the trace of the ridge hat matrix on centred data
    (``d_B`` unpenalised; shrinks towards 0 as alpha grows). The intercept is not counted.
    """
    cols = _columns(decomposer.blocks, [decomposer.block(n).name for n in basis])
    penalty = decomposer.penalty[cols]
    system = np.array(decomposer.train.cov[np.ix_(cols, cols)], dtype=np.float64)
    system[np.diag_indices(len(cols))] += penalty
    factor, ok = cholesky(system)
    if not ok:
        raise UserInputError(
            f"basis [{'+'.join(basis)}] is singular; use a larger {either('--alpha', 'alpha=')}"
        )
    # tr(Lam P) = |L^-1 Lam^1/2|_F^2 with P = (L L^T)^-1
    solved = solve_triangular(factor, np.diag(np.sqrt(penalty)), lower=True, check_finite=False)
    return float(len(cols) - (solved**2).sum())


def group_effective_df(decomposer: Decomposer) -> dict[str, float]:
    """:func:`effective_df` of every leave-one-out fit, as ``leave_one_out`` computes it in
    passing from its one ``D x D`` inverse."""
    return {fit.target: float(fit.df) for fit in decomposer.leave_one_out() if fit.df is not None}


def adjusted_r2(r2: float, n: int, df: float) -> float:
    """``1 - (1 - R^2)(n - 1) / (n - df - 1)``; ``df`` counts slopes, the intercept is the ``-1``.

    NaN when ``n - df - 1 <= 0`` (the fit has as many degrees of freedom as rows).
    """
    room = n - df - 1
    return float(1 - (1 - r2) * (n - 1) / room) if room > 0 else float("nan")
