"""The tail of a reduced target fitted on a leave-one-out basis, from the one inverse.

A reduced model's tail columns (:class:`~lmalgebra.stats.moments.ModelColumns`) belong to it as a
target and never to a basis, so they stay out of the inverse ``P = (C + Lam)^-1`` over the basis
columns that gives every leave-one-out fit; their weights follow from ``P C_{:, tail}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import numpy as np

from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.symmetric_kernels import row_quadratics


class Moments(Protocol):
    """A split's first and second moments (the solver's ``SplitMoments``)."""

    @property
    def mean(self) -> np.ndarray: ...

    @property
    def cov(self) -> np.ndarray: ...


def tail_fit(
    splits: Mapping[str, Moments],
    target: ModelColumns,
    basis: np.ndarray,
    weight: np.ndarray,
    bias: np.ndarray,
    carried: np.ndarray,
    rows: tuple[int, int],
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """The target's tail columns fitted on the basis of a leave-one-out fit.

    ``splits``: the statistics per split (``"train"`` among them); ``basis``: the columns of
    the basis, in the order of ``weight``'s. ``weight (d_t, D_B)``, ``bias (d_t,)``: the fit
    of the target's basis columns;
    ``carried (D_y, s) = P C_{:, tail}`` over every basis column (``rows``: the target's).
    With ``(C_BB + Lam_B)^-1 = P_BB - P_Bt P_tt^-1 P_tB`` and ``P_tt^-1 P_tB = -W``, the
    tail's weight is ``W_tail = carried_B^T + carried_t^T W``. Returns the weight and bias of
    all the target's columns and the tail's residual mean square on every split.
    """
    carried = np.asarray(carried, dtype=np.float64)
    inside = np.zeros(carried.shape[0], dtype=bool)
    inside[rows[0] : rows[1]] = True
    tail_weight = carried[~inside].T + carried[inside].T @ weight  # (s, D_B)
    tail = np.arange(target.basis_stop, target.stop)
    cols = np.concatenate([tail, basis])
    operator = np.hstack([np.eye(tail.size), -tail_weight])
    extra = {}
    train = splits["train"]
    for split, m in splits.items():
        spread = row_quadratics(operator, m.cov, cols)
        shift = operator @ (m.mean - train.mean)[cols]
        extra[split] = float(spread.sum() + shift @ shift)
    mean = train.mean
    tail_bias = mean[tail] - tail_weight @ mean[basis]
    return (
        np.vstack([weight, tail_weight.astype(weight.dtype, copy=False)]),
        np.concatenate([bias, tail_bias]),
        extra,
    )
