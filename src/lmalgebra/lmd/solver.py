"""Closed-form ridge decomposition and R^2, computed from second moments alone.

A target model ``u`` is fitted on a basis of other models ``z_B``:

    min_{W, b}  E||u - W z_B - b||^2 + sum_j lam_j ||W_j||_F^2
    W = C_tB (C_BB + Lam)^-1,    b = E[u] - W E[z_B]

on the training split. R^2 on any split ``s`` pools all output dimensions and uses that split's own
mean in the denominator:

    R^2_s = 1 - E_s||u - W z_B - b||^2 / tr(C^s_tt)

Everything here takes :class:`SplitMoments` (mean and covariance of a split), never raw embeddings.

The penalty ``Lam`` is diagonal and constant within each basis model's block. With ``alpha_mode =
"relative"`` (the default) block ``j`` gets ``alpha * tr(C_jj) / d_j``: ridge alpha on each model
rescaled to unit mean variance, so models of different scales and widths are treated alike. Because
a model's penalty does not depend on which other models share the basis, every leave-one-model-out
fit comes from one inverse ``P = (C + Lam)^-1``: ``W_t = -(P_tt)^-1 P_tB``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from lmalgebra.errors import UserInputError
from lmalgebra.lmd.moments import Block, SecondMoments

log = logging.getLogger(__name__)

AlphaMode = Literal["relative", "absolute"]
# Above this estimated condition number of (C_BB + Lam) the fit is numerically fragile.
ILL_CONDITIONED = 1e10


@dataclass(frozen=True)
class SplitMoments:
    """Mean ``(D,) float64`` and covariance ``(D, D) float64`` of one split, with its size."""

    n: int
    mean: np.ndarray
    cov: np.ndarray

    @classmethod
    def of(cls, moments: SecondMoments) -> SplitMoments:
        return cls(moments.n, moments.mean(), moments.covariance())


@dataclass(frozen=True)
class Fit:
    """One decomposition: ``target ~ weight @ concat(basis) + bias``, with R^2 per split."""

    target: str
    basis: tuple[str, ...]
    weight: np.ndarray  # (d_target, d_basis) float64
    bias: np.ndarray  # (d_target,) float64
    r2: dict[str, float]


class Decomposer:
    """Ridge fits of any target on any basis, from per-split moments over the same block layout.

    Args:
        blocks: the model layout of the concatenated embedding.
        splits: split name -> moments; must contain ``"train"`` (where every fit is estimated).
        alpha: ridge strength (see the module docstring for the two modes).
        alpha_mode: ``"relative"`` to each basis model's mean variance, or ``"absolute"``.
    """

    def __init__(
        self,
        blocks: Sequence[Block],
        splits: dict[str, SplitMoments],
        alpha: float = 1e-2,
        alpha_mode: AlphaMode = "relative",
    ) -> None:
        if "train" not in splits:
            raise ValueError("the training split is required")
        if not alpha >= 0 or not math.isfinite(alpha):
            raise UserInputError(f"alpha must be a finite number >= 0, got {alpha}")
        self.blocks = list(blocks)
        self.splits = splits
        self.train = splits["train"]
        self._by_name = {b.name: b for b in self.blocks}
        diag = np.diag(self.train.cov)
        self.penalty = np.empty(self.train.cov.shape[0])
        for b in self.blocks:
            scale = diag[b.start : b.stop].mean() if alpha_mode == "relative" else 1.0
            self.penalty[b.start : b.stop] = alpha * scale

    # -- helpers -------------------------------------------------------------------------------
    def block(self, name: str) -> Block:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name)
            raise UserInputError(f"model {name!r} is not among the models ({known})") from None

    def _columns(self, names: Sequence[str]) -> np.ndarray:
        return np.concatenate([np.arange(self.block(n).start, self.block(n).stop) for n in names])

    def _cholesky(self, matrix: np.ndarray, basis: Sequence[str]) -> torch.Tensor:
        """Cholesky factor of an SPD matrix; warns or fails naming the basis."""
        factor, info = torch.linalg.cholesky_ex(torch.from_numpy(matrix))
        label = "+".join(basis)
        if int(info) != 0:
            raise UserInputError(
                f"basis [{label}] is singular (covariance not positive definite); "
                "use a larger --alpha"
            )
        diag = torch.diagonal(factor)
        condition = float((diag.max() / diag.min()) ** 2)
        if condition > ILL_CONDITIONED:
            log.warning(
                "basis [%s] is ill-conditioned (condition ~%.1e); consider a larger --alpha",
                label,
                condition,
            )
        dim = matrix.shape[0]
        if self.train.n < dim:
            log.warning(
                "basis [%s] has dimension %d but only %d training spans: the fit "
                "can interpolate, trust held-out R^2 only",
                label,
                dim,
                self.train.n,
            )
        return factor

    def r2(self, weight: np.ndarray, target: Block, basis_cols: np.ndarray) -> dict[str, float]:
        """R^2 on every split of ``u_hat = W (z_B - mean_B) + mean_u`` (train means)."""
        t = slice(target.start, target.stop)
        scores = {}
        for split, m in self.splits.items():
            c_tt = m.cov[t, t]
            c_tb = m.cov[t][:, basis_cols]
            c_bb = m.cov[np.ix_(basis_cols, basis_cols)]
            shift = (m.mean[t] - self.train.mean[t]) - weight @ (
                m.mean[basis_cols] - self.train.mean[basis_cols]
            )
            total = np.trace(c_tt)
            residual = (
                total - 2 * np.sum(weight * c_tb) + np.sum((weight @ c_bb) * weight) + shift @ shift
            )
            scores[split] = float(1 - residual / total) if total > 0 else float("nan")
        return scores

    def _fit(self, target: str, basis: Sequence[str], weight: np.ndarray) -> Fit:
        cols = self._columns(basis)
        t = self.block(target)
        bias = self.train.mean[t.start : t.stop] - weight @ self.train.mean[cols]
        return Fit(target, tuple(basis), weight, bias, self.r2(weight, t, cols))

    # -- fits -------------------------------------------------------------------------------------
    def fit(self, target: str, basis: Sequence[str]) -> Fit:
        """Decompose ``target`` on ``basis`` (a list of other model names, in this order)."""
        if not basis:
            raise UserInputError("the basis is empty: name at least one model")
        if target in basis:
            raise UserInputError(f"the basis contains the target {target!r}")
        if len(set(basis)) != len(basis):
            raise UserInputError(f"the basis names a model twice: {list(basis)}")
        t, cols = self.block(target), self._columns(basis)
        cov = self.train.cov
        system = cov[np.ix_(cols, cols)] + np.diag(self.penalty[cols])
        factor = self._cholesky(system, basis)
        rhs = torch.from_numpy(np.ascontiguousarray(cov[cols, t.start : t.stop]))
        weight = torch.cholesky_solve(rhs, factor).numpy().T
        return self._fit(target, basis, weight)

    def leave_one_out(self) -> list[Fit]:
        """Every model decomposed on all the others, all from one ``D x D`` inverse."""
        names = [b.name for b in self.blocks]
        system = self.train.cov + np.diag(self.penalty)
        factor = self._cholesky(system, names)
        inverse = torch.cholesky_inverse(factor).numpy()
        fits = []
        for b in self.blocks:
            others = [n for n in names if n != b.name]
            cols = self._columns(others)
            p_tt = inverse[b.start : b.stop, b.start : b.stop]
            p_tb = inverse[b.start : b.stop][:, cols]
            weight = -np.linalg.solve(p_tt, p_tb)
            fits.append(self._fit(b.name, others, weight))
        return fits

    def pairwise(self) -> dict[str, np.ndarray]:
        """R^2 of every target (rows) from every single basis model (columns), per split.

        One Cholesky per basis model serves all targets at once. The diagonal is NaN.
        """
        names = [b.name for b in self.blocks]
        m = len(names)
        out = {split: np.full((m, m), np.nan) for split in self.splits}
        cov = self.train.cov
        for j, bj in enumerate(self.blocks):
            cj = slice(bj.start, bj.stop)
            system = cov[cj, cj] + np.diag(self.penalty[cj])
            factor = self._cholesky(system, [bj.name])
            # A = (C_jj + Lam_j)^-1 C_j,: ; target i's weight is A[:, block_i].T
            coef = torch.cholesky_solve(torch.from_numpy(np.ascontiguousarray(cov[cj])), factor)
            coef_np = coef.numpy()
            for split, s in self.splits.items():
                cross = (coef_np * s.cov[cj]).sum(axis=0)
                quad = (coef_np * (s.cov[cj, cj] @ coef_np)).sum(axis=0)
                d_mean = s.mean - self.train.mean
                shift = d_mean - coef_np.T @ d_mean[cj]
                var = np.diag(s.cov)
                for i, bi in enumerate(self.blocks):
                    if i == j:
                        continue
                    ci = slice(bi.start, bi.stop)
                    total = var[ci].sum()
                    residual = total - 2 * cross[ci].sum() + quad[ci].sum() + shift[ci] @ shift[ci]
                    out[split][i, j] = 1 - residual / total if total > 0 else np.nan
        return out
