"""Ridge fits of one target on one basis at every alpha, from one eigendecomposition.

Scaling each basis column by ``1 / sqrt(s_i)``, with ``s`` the penalty at alpha = 1 (each model's
mean variance in relative mode, 1 in absolute mode), makes the penalty ``alpha * I``. With
``X = diag(s_B)^-1/2`` applied to the basis (training moments):

    C'_BB = X C_BB X = V diag(e) V^T,    G = V^T X C_Bt  (d_B, d_t),    f_k = 1 / (e_k + alpha)
    W     = G^T diag(f) V^T X                                  (d_t, d_B)
    train mean square residual  = tr C_tt - sum_k |G_k|^2 (e_k + 2 alpha) f_k^2
    effective degrees of freedom = sum_k e_k f_k               (slopes; the intercept adds 1)

For another split ``s`` (mean ``mu_s``, covariance ``C^s``; ``delta = mu_s - mu_train``), with
``U = X V``, ``S = U^T C^s_BB U``, ``H = U^T C^s_Bt``, ``m = U^T delta_B``, the mean square of the
residual ``u - W z_B - b`` on ``s`` is

    tr C^s_tt - 2 sum_k f_k (H_k . G_k) + f^T (S o G G^T) f + |delta_t - G^T (f o m)|^2

(``o``: elementwise product). ``S o G G^T``, ``H``, ``m`` are computed once per split, after which
each alpha costs ``O(d_B^2)``: one eigendecomposition serves the whole grid.
"""

from __future__ import annotations

import numpy as np

from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.solver import SplitMoments


class HeldOut:
    """What scoring a :class:`RidgePath` on one other split needs, for any alpha.

    Attributes:
        total: ``tr(C^s_tt)``, the split's pooled target variance around its own mean.
        cross: ``(d_B,) float64``, ``H_k . G_k``.
        quad: ``(d_B, d_B) float64``, ``S o G G^T``.
        mean_shift: ``(d_B,) float64``, ``m``; ``target_shift``: ``(d_t,) float64``, ``delta_t``.
    """

    def __init__(self, path: RidgePath, split: SplitMoments) -> None:
        t, b = path.target_cols, path.basis_cols
        scaled = path.scaled_vectors  # U = X V
        delta = split.mean - path.train_mean
        self.total = float(np.diag(split.cov)[t].sum())
        c_bb = split.cov[np.ix_(b, b)]
        s = scaled.T @ (c_bb @ scaled)
        del c_bb
        h = scaled.T @ split.cov[np.ix_(b, t)]
        g = path.projection
        self.cross = (h * g).sum(axis=1)
        s *= g @ g.T
        self.quad = s
        self.mean_shift = scaled.T @ delta[b]
        self.target_shift = delta[t]


class RidgePath:
    """One target's ridge fit on one basis, for every alpha, from the training moments.

    Args:
        train: moments of the split the fits are estimated on.
        scale: ``(D,) float64`` penalty per column at alpha = 1 (``Decomposer(..., 1.0).penalty``).
        target: the target model's column block.
        basis_cols: ``(d_B,) int64`` columns of the basis, in order.
    """

    def __init__(
        self, train: SplitMoments, scale: np.ndarray, target: ModelColumns, basis_cols: np.ndarray
    ) -> None:
        self.n = train.n
        self.target_cols = np.arange(target.start, target.stop)
        self.basis_cols = np.asarray(basis_cols)
        self.train_mean = train.mean
        t, b = self.target_cols, self.basis_cols
        inv_root = 1 / np.sqrt(scale[b])
        system = np.array(train.cov[np.ix_(b, b)], dtype=np.float64)
        system *= np.outer(inv_root, inv_root)
        eigenvalues, vectors = np.linalg.eigh(system)
        del system
        # C'_BB is positive semi-definite; rounding can leave tiny negative eigenvalues
        self.eigenvalues = np.clip(eigenvalues, 0, None)
        vectors *= inv_root[:, None]
        self.scaled_vectors = vectors  # (d_B, d_B) U = X V
        self.projection = vectors.T @ train.cov[np.ix_(b, t)]  # (d_B, d_t) G
        self.power = (self.projection**2).sum(axis=1)  # |G_k|^2
        self.total = float(np.diag(train.cov)[t].sum())

    def _shrink(self, alphas: np.ndarray) -> np.ndarray:
        """``(d_B, A)`` factors ``f_k = 1 / (e_k + alpha)``."""
        return 1 / (self.eigenvalues[:, None] + np.asarray(alphas, dtype=float)[None, :])

    def weight(self, alpha: float) -> np.ndarray:
        """``(d_t, d_B) float64`` ridge weight at ``alpha``."""
        f = self._shrink(np.array([alpha]))[:, 0]
        return (self.scaled_vectors @ (f[:, None] * self.projection)).T

    def bias(self, alpha: float) -> np.ndarray:
        """``(d_t,) float64`` intercept at ``alpha`` (``mean_t - W mean_B``)."""
        mean = self.train_mean
        return mean[self.target_cols] - self.weight(alpha) @ mean[self.basis_cols]

    def df(self, alphas: np.ndarray) -> np.ndarray:
        """``(A,)`` effective degrees of freedom of the slopes, ``sum_k e_k / (e_k + alpha)``."""
        return (self.eigenvalues[:, None] * self._shrink(alphas)).sum(axis=0)

    def train_residual(self, alphas: np.ndarray) -> np.ndarray:
        """``(A,)`` mean over training rows of the squared residual, summed over target dims."""
        f = self._shrink(alphas)
        gain = (self.eigenvalues[:, None] + 2 * np.asarray(alphas)[None, :]) * f**2
        return self.total - self.power @ gain

    def train_r2(self, alphas: np.ndarray) -> np.ndarray:
        """``(A,)`` pooled training R^2."""
        return 1 - self.train_residual(alphas) / self.total

    def gcv(self, alphas: np.ndarray) -> np.ndarray:
        """``(A,)`` GCV = (RSS / n) / (1 - df / n)^2, ``df`` counting the intercept.

        ``inf`` where ``df >= n`` (the fit interpolates: the criterion is undefined).
        """
        keep = 1 - (1 + self.df(alphas)) / self.n
        with np.errstate(divide="ignore"):
            return np.where(keep > 0, self.train_residual(alphas) / keep**2, np.inf)

    def held_out(self, split: SplitMoments) -> HeldOut:
        """Precompute the scoring of every alpha on ``split`` (``O(d_B^3)``, once)."""
        return HeldOut(self, split)

    def r2(self, held: HeldOut, alphas: np.ndarray) -> np.ndarray:
        """``(A,)`` pooled R^2 on a held-out split (its own mean in the denominator)."""
        if held.total <= 0:
            return np.full(len(alphas), np.nan)
        f = self._shrink(alphas)
        quad = (f * (held.quad @ f)).sum(axis=0)
        offset = held.target_shift[:, None] - self.projection.T @ (f * held.mean_shift[:, None])
        residual = held.total - 2 * held.cross @ f + quad + (offset**2).sum(axis=0)
        return 1 - residual / held.total
