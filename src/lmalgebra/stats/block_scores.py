"""Per-block scores of fixed predictors: the statistics that make a bootstrap replicate cheap.

A fitted predictor ``u_hat = W z_B + b`` (from the training split) has, on every row, the residual
``r = R (z - mu_train)`` with the residual operator ``R`` (``I`` on the target's columns, ``-W`` on
the basis'). For block ``p`` of a split (rows ``i in p``; ``n_p`` rows, shift ``a_p``, sums
``s_p = sum (z_i - a_p)``, Gram ``G_p``) and ``delta_p = a_p - mu_train``:

    S_p = sum_i ||r_i||^2 = <R^T R, G_p> + 2 (R delta_p) . (R s_p) + n_p ||R delta_p||^2
    U_p = sum_i ||u_i - c||^2       V_p = sum_i (u_i - c)                (target only; c: a shift)

A replicate that counts block ``p`` ``k_p`` times has ``N = sum_p k_p n_p`` rows and

    R^2 = 1 - (sum_p k_p S_p / N) / (sum_p k_p U_p / N - ||sum_p k_p V_p / N||^2)

which is the split's R^2 (each split's own mean in the denominator) of the fixed predictor on the
rows repeated by the counts. ``<R^T R, G_p>`` is computed piece by piece over pairs of model blocks
``(r, m)``, ``r <= m``: the piece ``R_r^T R_m`` of each fit touching both (doubled off the
diagonal, by symmetry of ``G_p``) is flattened, and one matrix product per pair scores every block
against every fit: ``(parts, d_r d_m) @ (d_r d_m, fits)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import ModelColumns, SecondMoments
from lmalgebra.stats.solver import Decomposer, Fit
from lmalgebra.stats.span_blocks import SpanBlockMoments


@dataclass(frozen=True)
class BlockStatistics:
    """Everything a replicate's R^2 needs, for fixed fits on one split cut into ``P`` blocks.

    Attributes:
        n: ``(P,) float64`` rows per block.
        residual: ``(P, F) float64`` ``S_p`` per block and fit.
        spread: ``(P, T) float64`` ``U_p`` per block and target model.
        cross: ``(T, P, P) float64`` ``V^T V`` per target model (``V``: ``(d_t, P)``).
        target_index: ``(F,) int64`` which target model (column of ``spread``) each fit has.
    """

    n: np.ndarray
    residual: np.ndarray
    spread: np.ndarray
    cross: np.ndarray
    target_index: np.ndarray

    def r2(self, counts: np.ndarray) -> np.ndarray:
        """``(B, F) float64`` R^2 of every fit for ``counts`` ``(B, P)`` (block multiplicities).

        NaN where a replicate has no rows or no target variance.
        """
        counts = np.asarray(counts, dtype=np.float64)
        if counts.ndim != 2 or counts.shape[1] != self.n.size:
            raise ValueError(f"counts of shape {counts.shape} do not match {self.n.size} blocks")
        rows = counts @ self.n  # (B,)
        with np.errstate(divide="ignore", invalid="ignore"):
            residual = (counts @ self.residual) / rows[:, None]
            mean_square = (counts @ self.spread) / rows[:, None]  # (B, T)
            # k^T (V^T V) k = ||V k||^2 per target model: (B, T)
            square_mean = (np.tensordot(counts, self.cross, axes=(1, 1)) * counts[:, None]).sum(-1)
            total = mean_square - square_mean / rows[:, None] ** 2
            r2 = 1 - residual / total[:, self.target_index]
        r2[~(total[:, self.target_index] > 0)] = np.nan
        return r2


class FixedScorer:
    """Scores fixed fits on blocks of any split of the decomposer's layout.

    The pieces ``R_r^T R_m`` are computed on the first call and kept: about
    ``sum_f |c_f|^2 / 2`` float64 values for fits touching ``|c_f|`` columns (1.1 GB for 12
    leave-one-out fits over D = 4608), so that each further split costs one pass over its blocks.
    """

    def __init__(self, solver: Decomposer, fits: Sequence[Fit]) -> None:
        if not fits:
            raise UserInputError("no fits to score: give at least one")
        self.solver = solver
        self.fits = list(fits)
        self._index = {b.name: k for k, b in enumerate(solver.blocks)}
        for fit in self.fits:
            cols = _columns(solver, fit.basis)
            if fit.weight.shape != (solver.block(fit.target).dim, cols.size):
                raise ValueError(
                    f"fit of {fit.target!r} on {list(fit.basis)}: weight of shape "
                    f"{fit.weight.shape} does not match the layout"
                )
        self.targets = sorted({self._index[f.target] for f in self.fits})
        self._pieces: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] | None = None

    # -- the operator of a fit, by model block ----------------------------------------------------
    def _coefficients(self, fit: Fit) -> dict[int, np.ndarray | None]:
        """Model index -> ``R`` restricted to its columns (``None`` for the target's identity;
        zero on a basis model's tail columns)."""
        coef: dict[int, np.ndarray | None] = {self._index[fit.target]: None}
        offset = 0
        for name in fit.basis:  # a basis model's tail columns (probes) take no weight
            block = self.solver.block(name)
            part = np.zeros((fit.weight.shape[0], block.dim))
            part[:, : block.basis_dim] = -fit.weight[:, offset : offset + block.basis_dim]
            coef[self._index[name]] = part
            offset += block.basis_dim
        return dict(sorted(coef.items()))

    def _pieces_by_pair(self) -> dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]:
        """``(r, m) -> (fit indices (F_rm,), pieces (F_rm, d_r d_m))``, weights folded in."""
        if self._pieces is not None:
            return self._pieces
        blocks = self.solver.blocks
        coefs = [self._coefficients(fit) for fit in self.fits]
        users: dict[tuple[int, int], list[int]] = {}
        for f, coef in enumerate(coefs):
            for r in coef:
                for m in coef:
                    if m >= r:
                        users.setdefault((r, m), []).append(f)
        out = {
            pair: (np.array(fs), np.empty((len(fs), blocks[pair[0]].dim * blocks[pair[1]].dim)))
            for pair, fs in users.items()
        }
        slot = {pair: {f: k for k, f in enumerate(fs)} for pair, fs in users.items()}
        for f, coef in enumerate(coefs):
            models = list(coef)
            dims = [blocks[m].dim for m in models]
            starts = np.cumsum([0, *dims])
            # R on the fit's blocks, in layout order: (d_t, sum_m d_m)
            dense = np.hstack([_dense(coef[m], d) for m, d in zip(models, dims, strict=True)])
            for pos, r in enumerate(models):
                rest = dense[:, starts[pos] :]  # R on the blocks >= r
                left = coef[r]
                product = rest if left is None else left.T @ rest  # (d_r, ...): R_r^T R_{>=r}
                for k, m in enumerate(models[pos:], start=pos):
                    piece = product[:, starts[k] - starts[pos] : starts[k + 1] - starts[pos]]
                    target = out[r, m][1][slot[r, m][f]].reshape(piece.shape)
                    np.multiply(piece, 1.0 if m == r else 2.0, out=target)
        self._pieces = out
        return out

    # -- per-block statistics ----------------------------------------------------------------------
    def statistics(self, split: str, blocked: SpanBlockMoments) -> BlockStatistics:
        """The block statistics of ``split`` (its blocks ``blocked``) for every fit."""
        solver = self.solver
        if split not in solver.splits:
            raise UserInputError(f"split {split!r} is not among the decomposer's splits")
        placed = placement(solver.blocks, blocked, split)
        cols = np.concatenate([np.arange(b.start, b.stop) for b in placed])
        parts = blocked.parts
        n = np.array([part.n for part in parts], dtype=np.float64)
        if blocked.rows != solver.splits[split].n or n.sum() != blocked.rows:
            raise UserInputError(
                f"block statistics of split {split!r} hold {int(n.sum())} of {blocked.rows} rows, "
                f"but the decomposer's {split!r} has {solver.splits[split].n}"
            )
        shifts = np.stack([part.shift[cols] for part in parts], axis=1)  # (D, P)
        sums = np.stack([part.sums[cols] for part in parts], axis=1)  # (D, P)
        mean, expected = (shifts * n + sums).sum(axis=1) / n.sum(), solver.splits[split].mean
        scale = np.abs(expected).max() + np.sqrt(np.diag(solver.splits[split].cov).max())
        if not np.allclose(mean, expected, rtol=0, atol=1e-8 * scale):
            raise UserInputError(
                f"the block statistics of split {split!r} do not match the decomposer's "
                f"{split!r} (different means)"
            )
        residual = self._linear(shifts - solver.train.mean[:, None], sums, n)
        for (r, m), (fits, pieces) in self._pieces_by_pair().items():
            br, bm = placed[r], placed[m]
            grams = np.stack([p.gram[br.start : br.stop, bm.start : bm.stop] for p in parts])
            residual[:, fits] += grams.reshape(len(parts), -1) @ pieces.T
        spread, cross = self._denominators(parts, placed, mean, shifts, sums, n)
        where = {t: k for k, t in enumerate(self.targets)}
        target_index = np.array([where[self._index[f.target]] for f in self.fits])
        return BlockStatistics(n, residual, spread, cross, target_index)

    def _linear(self, delta: np.ndarray, sums: np.ndarray, n: np.ndarray) -> np.ndarray:
        """``(P, F)``: ``2 (R delta_p) . (R s_p) + n_p ||R delta_p||^2`` per block and fit."""
        out = np.empty((n.size, len(self.fits)))
        for f, fit in enumerate(self.fits):
            t, cols = self.solver.block(fit.target), _columns(self.solver, fit.basis)
            r_delta = delta[t.start : t.stop] - fit.weight @ delta[cols]  # (d_t, P)
            r_sums = sums[t.start : t.stop] - fit.weight @ sums[cols]
            out[:, f] = 2 * (r_delta * r_sums).sum(axis=0) + n * (r_delta**2).sum(axis=0)
        return out

    def _denominators(
        self,
        parts: Sequence[SecondMoments],
        placed: Sequence[ModelColumns],
        mean: np.ndarray,
        shifts: np.ndarray,
        sums: np.ndarray,
        n: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``U`` ``(P, T)`` and ``V^T V`` ``(T, P, P)`` around the split's mean ``c = mean``."""
        spread = np.empty((n.size, len(self.targets)))
        cross = np.empty((len(self.targets), n.size, n.size))
        for k, t in enumerate(self.targets):
            at, own = placed[t], self.solver.blocks[t]
            trace = np.array(
                [np.trace(p.gram[at.start : at.stop, at.start : at.stop]) for p in parts]
            )
            cols = slice(own.start, own.stop)
            offset = shifts[cols] - mean[cols, None]  # (d_t, P): a_p - c
            spread[:, k] = trace + 2 * (offset * sums[cols]).sum(0) + n * (offset**2).sum(0)
            v = sums[cols] + n * offset
            cross[k] = v.T @ v
        return spread, cross


def _columns(solver: Decomposer, names: Sequence[str]) -> np.ndarray:
    """Columns of the models ``names`` (in that order) in the solver's layout."""
    return solver.basis_columns(names)


def _dense(block: np.ndarray | None, dim: int) -> np.ndarray:
    """A block of ``R``: the identity for the target (``None``), else the coefficients."""
    return np.eye(dim) if block is None else block


def placement(
    blocks: Sequence[ModelColumns], blocked: SpanBlockMoments, split: str
) -> list[ModelColumns]:
    """Where each of ``blocks`` lies in ``blocked``'s layout, which may hold further models."""
    where = {b.name: b for b in blocked.blocks}
    placed = [where.get(b.name) for b in blocks]
    for b, found in zip(blocks, placed, strict=True):
        if found is None or found.dim != b.dim:
            raise UserInputError(
                f"the block statistics of split {split!r} lack model {b.name!r} (dimension {b.dim})"
            )
    return [b for b in placed if b is not None]
