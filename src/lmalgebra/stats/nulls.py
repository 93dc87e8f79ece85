"""Null baselines for an R^2: shuffled pairing (exact, from moments) and random-initialised models.

Shuffled pairing. A fit ``u_hat = W z + b`` scored on a split whose target rows are paired with
the basis rows of a uniformly random permutation ``pi``. Over permutations,
``E sum_i u_pi(i) p_i^T = (1/n) (sum u)(sum p)^T``, so with ``p = W z + b`` the expected residual
mean square is ``tr(C_uu) + tr(W C_BB W^T) + ||mean_u - W mean_B - b||^2`` and

    E_pi R^2_shuffled = -(tr(W C_BB W^T) + ||mean_u - W mean_B - b||^2) / tr(C_uu)   <= 0

(all moments of that split). It is what an R^2 would be if the rows carried no pairing at all.

Random-initialised null. Each real model ``NAME`` has a copy ``NAME~random`` with the same
architecture and random weights, embedded like the others; fitting a real target on those copies
shows how much R^2 tokenisation and architecture alone buy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.solver import Decomposer, Fit, SplitMoments
from lmalgebra.stats.symmetric_kernels import row_quadratics

RANDOM_SUFFIX = "~random"


def random_copy(name: str) -> str:
    """The block name of the random-initialised copy of model ``name``."""
    return f"{name}{RANDOM_SUFFIX}"


def shuffled_r2(decomposer: Decomposer, fit: Fit, split: str = "validation") -> float:
    """Expected R^2 of ``fit`` on ``split`` over uniformly random row pairings (see the module).

    ``fit.weight`` ``(d_target, d_basis)`` and ``fit.bias`` ``(d_target,)`` are used as given, so
    any linear predictor over ``fit.basis`` (in that column order) can be scored. NaN when the
    target has no variance on the split.
    """
    m = _split(decomposer, split)
    t = decomposer.block(fit.target)
    cols = decomposer.basis_columns(fit.basis)
    total = float(np.trace(m.cov[t.start : t.stop, t.start : t.stop]))
    if total <= 0:
        return math.nan
    spread = float(row_quadratics(np.ascontiguousarray(fit.weight), m.cov, cols).sum())
    shift = m.mean[t.start : t.stop] - fit.weight @ m.mean[cols] - fit.bias
    return -(spread + float(shift @ shift)) / total


def shuffled_from_r2(decomposer: Decomposer, fit: Fit, split: str = "validation") -> float:
    """:func:`shuffled_r2` of a fit this decomposer made, from its R^2 on ``split``.

    With the residual operator ``R = [I, -W]`` and the fitted bias, ``(1 - R^2) tr(C_tt) =
    tr(R C R^T) + ||R dmean||^2`` and ``tr(W C_BB W^T) = tr(R C R^T) - tr(C_tt) + 2 tr(W C_Bt)``,
    so the shuffled R^2 is ``R^2 - 2 tr(W C_Bt) / tr(C_tt)``: no quadratic form over the basis.
    Only for fits of ``decomposer`` (its ``fit``, ``leave_one_out``, ``pairwise_fits``): their R^2
    and bias are read as this decomposer computed them.
    """
    m = _split(decomposer, split)
    t = decomposer.block(fit.target)
    cols = decomposer.basis_columns(fit.basis)
    total = float(np.trace(m.cov[t.start : t.stop, t.start : t.stop]))
    if total <= 0:
        return math.nan
    cross = float((fit.weight * m.cov[t.start : t.stop][:, cols]).sum())
    return fit.r2[split] - 2 * cross / total


def shuffled_pairwise(decomposer: Decomposer) -> dict[str, np.ndarray]:
    """:func:`shuffled_r2` of every single-model fit: ``split -> (m, m) float64``, target rows,
    basis columns, NaN diagonal (the shuffled counterpart of ``Decomposer.pairwise``).

    One solve per basis model serves all targets, with the factors ``Decomposer.pairwise`` uses.
    """
    names = [b.name for b in decomposer.blocks]
    out = {split: np.full((len(names), len(names)), np.nan) for split in decomposer.splits}
    train = decomposer.train
    for j, bj in enumerate(decomposer.blocks):
        cj = slice(bj.start, bj.basis_stop)
        coef = decomposer.single_basis_coef(j)  # coef[:, block_i].T: i's weight on j
        for split, s in decomposer.splits.items():
            spread = (coef * (s.cov[cj, cj] @ coef)).sum(axis=0)
            d_mean = s.mean - train.mean  # the fitted bias moves the train means onto each other
            shift = d_mean - coef.T @ d_mean[cj]
            var = np.diag(s.cov)
            for i, bi in enumerate(decomposer.blocks):
                ci = slice(bi.start, bi.stop)
                total = var[ci].sum()
                if i != j and total > 0:
                    out[split][i, j] = -(spread[ci].sum() + shift[ci] @ shift[ci]) / total
    return out


@dataclass(frozen=True)
class RandomNull:
    """Fits of real targets on random-initialised copies.

    Attributes:
        group: per real target, the fit on the copies of all the other real models.
        pairwise: per ordered pair (target, other), the fit on the copy of ``other`` alone.
    """

    group: list[Fit]
    pairwise: list[Fit]


def random_null_fits(decomposer: Decomposer, real_names: Sequence[str]) -> RandomNull:
    """Fit every real model on the random copies of the other real models, together and singly.

    ``decomposer`` must hold a block ``NAME~random`` for every name in ``real_names``.
    """
    names = list(real_names)
    if len(names) < 2:
        raise UserInputError(f"the random-initialised null needs at least 2 real models: {names}")
    if len(set(names)) != len(names):
        raise UserInputError(f"the real models name a model twice: {names}")
    known = {b.name for b in decomposer.blocks}
    for name in names:
        if name.endswith(RANDOM_SUFFIX):
            raise UserInputError(f"{name!r} is a random-initialised copy, not a real model")
        decomposer.block(name)
        if random_copy(name) not in known:
            raise UserInputError(
                f"model {name!r} has no random-initialised copy {random_copy(name)!r}"
            )
    group: list[Fit] = []
    pairwise: list[Fit] = []
    for target in names:
        others = [n for n in names if n != target]
        group.append(decomposer.fit(target, [random_copy(n) for n in others]))
        pairwise.extend(decomposer.fit(target, [random_copy(n)]) for n in others)
    return RandomNull(group, pairwise)


def _split(decomposer: Decomposer, split: str) -> SplitMoments:
    if split not in decomposer.splits:
        known = ", ".join(decomposer.splits)
        raise UserInputError(f"split {split!r} is not among the splits ({known})")
    return decomposer.splits[split]
