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

A model may be given by its principal coordinates (:mod:`lmalgebra.stats.principal`): its block
then holds ``k`` of its ``d`` dimensions, and ``scales`` carries the mean variance of all ``d``,
so its relative penalty is the one the whole model would get. Covariances stored in float32 (the
float32 precision of the statistics) give a float32 inverse and float32 held-out scores of the
group fits; single-model blocks are solved in float64 either way.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.stats.choices import AlphaMode
from lmalgebra.stats.loo_operators import leave_one_out_operators
from lmalgebra.stats.moments import ModelColumns, SecondMoments, layout, refuse_constant
from lmalgebra.stats.symmetric_kernels import (
    block_sums,
    cholesky,
    cholesky_solve,
    in_parallel,
    row_quadratics,
    spd_inverse,
)
from lmalgebra.stats.tail_fit import tail_fit

log = logging.getLogger(__name__)

# Above this estimated condition number of (C_BB + Lam) the fit is numerically fragile.
ILL_CONDITIONED = 1e10
# Above this penalty per unit of variance, the shortcut to a group fit's train residual (the
# difference of two numbers of the penalty's size) loses digits to rounding (all of them by
# 1e16): the residual is then taken in full, as a held-out split's is.
DROWNED = 1e6


def _wide(rows: np.ndarray) -> np.ndarray:
    """Rows of a covariance in float64 (a float32 covariance's rows are converted)."""
    return np.asarray(rows, dtype=np.float64)


@functools.cache
def _warn_once(message: str) -> None:
    """Log a warning once per process (sweeps repeat the same fits many times)."""
    log.warning(message)


class SingularBasisError(UserInputError):
    """A basis whose penalised covariance is not positive definite. Its message names the
    remedies of ``decompose``; a command without those flags words its own after ``what``."""

    what: str = ""

    @classmethod
    def of(cls, label: str) -> SingularBasisError:
        what = f"basis [{label}] is singular (covariance not positive definite)"
        err = cls(
            f"{what}; use a larger {either('--alpha', 'alpha=')} (or, where the statistics took "
            f"float32 products, {either('--products float64', 'products=' + repr('float64'))})"
        )
        err.what = what
        return err


@dataclass(frozen=True)
class SplitMoments:
    """Mean ``(D,) float64`` and covariance ``(D, D) float64`` of one split, with its size."""

    n: int
    mean: np.ndarray
    cov: np.ndarray

    @classmethod
    def of(cls, moments: SecondMoments, in_place: bool = False) -> SplitMoments:
        """From streamed statistics; ``in_place`` turns the Gram buffer into the covariance."""
        n, mean = moments.n, moments.mean()
        return cls(n, mean, moments.covariance(in_place=in_place))


@dataclass(frozen=True)
class Fit:
    """One decomposition: ``target ~ weight @ concat(basis) + bias``, with R^2 per split.

    ``df``: effective degrees of freedom of the slopes, ``d_B - tr(Lam (C_BB + Lam)^-1)``, where
    the fit computed it in passing (leave-one-out fits); otherwise ``None``.
    """

    target: str
    basis: tuple[str, ...]
    weight: np.ndarray  # (d_target, d_basis) float64 (float32 under float32 statistics)
    bias: np.ndarray  # (d_target,) float64
    r2: dict[str, float]
    df: float | None = None


class Decomposer:
    """Ridge fits of any target on any basis, from per-split moments over the same block layout.

    Args:
        blocks: the model layout of the concatenated embedding.
        splits: split name -> moments; must contain ``"train"`` (where every fit is estimated).
        alpha: ridge strength (see the module docstring for the two modes).
        alpha_mode: ``"relative"`` to each basis model's mean variance, or ``"absolute"``.
        scales: ``(blocks,) float64``, each block's mean per-dimension variance that relative
            alpha multiplies; default the mean of the block's training variances.
        interpolation_named: the caller names the widest basis that interpolates the training
            spans in one line of its own (a decomposition run's caveats): no fit warns of it.
    """

    def __init__(
        self,
        blocks: Sequence[ModelColumns],
        splits: dict[str, SplitMoments],
        alpha: float = 1e-2,
        alpha_mode: AlphaMode = "relative",
        scales: Sequence[float] | np.ndarray | None = None,
        *,
        interpolation_named: bool = False,
    ) -> None:
        if "train" not in splits:
            raise ValueError("the training split is required")
        if not alpha >= 0 or not math.isfinite(alpha):
            raise UserInputError(f"alpha must be a finite number >= 0, got {alpha}")
        self.blocks = list(blocks)
        self.splits = splits
        self.alpha, self.alpha_mode = alpha, alpha_mode
        self.interpolation_named = interpolation_named
        self.train = splits["train"]
        self._by_name = {b.name: b for b in self.blocks}
        self._inverses: dict[int, np.ndarray] = {}  # single-model bases, inverted once
        diag = np.diag(self.train.cov).astype(np.float64)
        # given scales stay with a decomposer refitted on other training rows; derived ones follow
        self.given_scales = None if scales is None else np.asarray(scales, dtype=np.float64)
        if scales is None:
            scales = [diag[b.start : b.basis_stop].mean() for b in self.blocks]
        self.scales = np.asarray(scales, dtype=np.float64)
        if self.scales.shape != (len(self.blocks),):
            raise ValueError(f"{self.scales.shape} scales for {len(self.blocks)} blocks")
        for b, scale in zip(self.blocks, self.scales, strict=True):
            refuse_constant(b.name, float(scale))
        self.penalty = np.empty(self.train.cov.shape[0])
        with np.errstate(over="ignore"):  # an overflow is refused below, in one line
            for b, scale in zip(self.blocks, self.scales, strict=True):
                relative = scale if alpha_mode == "relative" else 1.0
                self.penalty[b.start : b.stop] = alpha * relative
        if not np.isfinite(self.penalty).all():  # alpha times a variance beyond float64
            raise UserInputError(
                f"alpha {alpha:g} times a basis model's variance overflows float64: every fit "
                "would be the training mean; use a smaller alpha (--alpha on the command line)"
            )

    def subset(self, names: Sequence[str]) -> Decomposer:
        """The same decomposer over only ``names`` (in that order, blocks laid out afresh).

        Every split's mean and covariance keep those models' rows and columns; alpha and its mode
        carry over, so each remaining model keeps its penalty and every fit is unchanged.
        """
        if not names:
            raise UserInputError("the subset of models is empty")
        if len(set(names)) != len(names):
            raise UserInputError(f"the subset names a model twice: {list(names)}")
        cols = np.concatenate([np.arange(self.block(n).start, self.block(n).stop) for n in names])
        splits = {
            split: SplitMoments(m.n, m.mean[cols], m.cov[np.ix_(cols, cols)])
            for split, m in self.splits.items()
        }
        picked = [self.block(n) for n in names]
        blocks = layout(list(names), [b.dim for b in picked], [b.tail for b in picked])
        scales = [self.scales[self.blocks.index(self.block(n))] for n in names]
        return self.like(blocks, splits, scales)

    def with_basis(self, keep: dict[str, int]) -> Decomposer:
        """The same statistics with model ``name``'s basis cut to its first ``keep[name]``
        columns: the rest of its block joins its target-only tail, so it is still fitted as a
        target. Penalties are unchanged (no copy of the statistics is made)."""
        blocks = [
            ModelColumns(b.name, b.start, b.stop, b.dim - min(keep.get(b.name, b.dim), b.basis_dim))
            for b in self.blocks
        ]
        return self.like(blocks, self.splits, self.scales)

    def like(
        self,
        blocks: Sequence[ModelColumns],
        splits: dict[str, SplitMoments],
        scales: Sequence[float] | np.ndarray | None,
    ) -> Decomposer:
        """A decomposer of other blocks or statistics, with this one's settings."""
        return Decomposer(
            blocks,
            splits,
            self.alpha,
            self.alpha_mode,
            scales,
            interpolation_named=self.interpolation_named,
        )

    # -- helpers -------------------------------------------------------------------------------
    def block(self, name: str) -> ModelColumns:
        try:
            return self._by_name[name]
        except KeyError:
            known = ", ".join(self._by_name)
            raise UserInputError(f"model {name!r} is not among the models ({known})") from None

    def basis_columns(self, names: Sequence[str]) -> np.ndarray:
        """The columns the models ``names`` bring to a basis, in that order (tails left out)."""
        return np.concatenate([self.block(n).basis_columns() for n in names])

    _columns = basis_columns

    def check_fit(self, target: str, basis: Sequence[str], empty: str) -> None:
        """Refuse a fit of ``target`` on ``basis``: an empty basis (``empty`` says so), the
        target in it, a model named twice, or a model not among these."""
        if not basis:
            raise UserInputError(empty)
        if target in basis:
            raise UserInputError(f"the basis contains the target {target!r}")
        if len(set(basis)) != len(basis):
            raise UserInputError(f"the basis names a model twice: {list(basis)}")
        for name in (target, *basis):
            self.block(name)

    def _check_factor(
        self, ok: bool, diag: np.ndarray, basis: Sequence[str], fitted: Sequence[str] = ()
    ) -> None:
        """Fail naming the basis when its system is not SPD; warn when it is ill-conditioned
        (condition estimated from the Cholesky diagonal ``diag``) or when spans are few for the
        widest basis a fit uses, ``fitted`` (default: ``basis`` itself; the leave-one-out
        system's is every model but the narrowest)."""
        label = "+".join(basis)
        if not ok:
            raise SingularBasisError.of(label)
        condition = float((diag.max() / diag.min()) ** 2)
        if condition > ILL_CONDITIONED:
            log.warning(
                "basis [%s] is ill-conditioned (condition ~%.1e); consider a larger alpha "
                "(--alpha on the command line)",
                label,
                condition,
            )
        fitted = fitted or basis
        dimension = sum(self.block(name).basis_dim for name in fitted)
        if self.train.n < dimension and not self.interpolation_named:
            _warn_once(
                f"basis [{'+'.join(fitted)}] has dimension {dimension} but only {self.train.n} "
                "training spans: the fit can interpolate, trust held-out R^2 only"
            )

    def _cholesky(self, matrix: np.ndarray, basis: Sequence[str]) -> np.ndarray:
        """Cholesky factor of an SPD matrix; warns or fails naming the basis."""
        factor, ok = cholesky(matrix)
        self._check_factor(ok, np.diagonal(factor), basis)
        return factor

    def _block_inverse(self, j: int) -> np.ndarray:
        """``(C_jj + Lam_j)^-1`` of block ``j`` (float64), once per decomposer, checked as a
        basis is (:meth:`_check_factor`). NumPy's LAPACK and products only: the single-model
        fits run in a loop over the blocks, and NumPy's and SciPy's BLAS are separate thread
        pools, each of whose idle threads spin against the other's between calls."""
        if j not in self._inverses:
            cj = slice(self.blocks[j].start, self.blocks[j].basis_stop)
            system = self.train.cov[cj, cj].astype(np.float64) + np.diag(self.penalty[cj])
            try:
                factor = np.linalg.cholesky(system)
            except np.linalg.LinAlgError:
                self._check_factor(False, np.ones(1), [self.blocks[j].name])
            self._check_factor(True, np.diagonal(factor), [self.blocks[j].name])
            half = np.linalg.inv(factor)  # L^-1 (triangular)
            self._inverses[j] = half.T @ half
        return self._inverses[j]

    def single_basis_coef(self, j: int) -> np.ndarray:
        """``(d_j, D) float64`` ``(C_jj + Lam_j)^-1 C_j,:`` (``d_j``: block ``j``'s basis
        columns): column block ``i`` is the transposed weight of target ``i`` fitted on model
        ``j`` alone."""
        rows = self.train.cov[self.blocks[j].start : self.blocks[j].basis_stop]
        return self._block_inverse(j) @ _wide(rows)

    def r2(
        self, weight: np.ndarray, target: ModelColumns, basis_cols: np.ndarray
    ) -> dict[str, float]:
        """R^2 on every split of ``u_hat = W (z_B - mean_B) + mean_u`` (train means).

        With the residual operator ``R`` (``I`` on the target's columns, ``-W`` on the basis'),
        the residual is ``R (z - mean_train)`` and its mean square on split ``s`` is
        ``tr(R C^s R^T) + ||R (mean_s - mean_train)||^2``, read from the columns used only.
        """
        cols = np.concatenate([np.arange(target.start, target.stop), basis_cols])
        operator = np.empty((target.dim, cols.size))
        operator[:, : target.dim] = np.eye(target.dim)
        operator[:, target.dim :] = -weight
        return {split: self._score(operator, cols, target, m) for split, m in self.splits.items()}

    def _score(
        self, operator: np.ndarray, cols: np.ndarray, target: ModelColumns, m: SplitMoments
    ) -> float:
        total = float(np.trace(m.cov[target.start : target.stop, target.start : target.stop]))
        if total <= 0:
            return float("nan")
        shift = operator @ (m.mean[cols] - self.train.mean[cols])
        spread = row_quadratics(operator, m.cov, cols)
        return 1 - float(spread.sum() + shift @ shift) / total

    def _fit(self, target: str, basis: Sequence[str], weight: np.ndarray) -> Fit:
        cols = self._columns(basis)
        t = self.block(target)
        bias = self.train.mean[t.start : t.stop] - weight @ self.train.mean[cols]
        return Fit(target, tuple(basis), weight, bias, self.r2(weight, t, cols))

    # -- fits -------------------------------------------------------------------------------------
    def fit(self, target: str, basis: Sequence[str]) -> Fit:
        """Decompose ``target`` on ``basis`` (a list of other model names, in this order)."""
        self.check_fit(target, basis, "the basis is empty: name at least one model")
        t, cols = self.block(target), self._columns(basis)
        cov = self.train.cov
        rhs = _wide(np.ascontiguousarray(cov[cols, t.start : t.stop]))
        if len(basis) == 1:  # the inverse the pairwise fits share
            weight = (self._block_inverse(self.blocks.index(self.block(basis[0]))) @ rhs).T
        else:
            factor = self._cholesky(cov[np.ix_(cols, cols)] + np.diag(self.penalty[cols]), basis)
            weight = cholesky_solve(factor, rhs).T
        return self._fit(target, basis, weight)

    def leave_one_out(self) -> list[Fit]:
        """Every model decomposed on all the others, all from one inverse over the basis columns.

        ``P = (C + Lam)^-1`` is computed in one buffer, whose rows then become each target's
        residual operator ``R_t = P_tt^-1 P_t`` (``I`` on t, ``-W`` on the rest); held-out
        residuals are quadratic forms of the stacked operators, taken over all targets at once.
        A target's tail columns (target-only, see ``ModelColumns``) are fitted on the same basis
        from ``P C_{:, tail}``, taken before ``P`` is overwritten (:func:`tail_fit`).
        """
        names, cov = [b.name for b in self.blocks], self.train.cov
        heads = self.basis_columns(names)
        tails = np.setdiff1d(np.arange(cov.shape[0]), heads)
        # the one D x D copy (of a file-backed covariance: read into memory)
        system = np.array(cov) if not tails.size else cov[np.ix_(heads, heads)]
        system[np.diag_indices(heads.size)] += self.penalty[heads].astype(system.dtype)
        inverse, diag = spd_inverse(system)
        narrowest = min(self.blocks, key=lambda b: b.basis_dim).name
        widest = [n for n in names if n != narrowest]  # the basis of the narrowest's fit
        self._check_factor(inverse is not None, diag, names, widest)
        assert inverse is not None  # _check_factor raised otherwise
        carried = inverse @ cov[np.ix_(heads, tails)] if tails.size else None  # P C_{:, tails}
        edges = np.cumsum([0, *(b.basis_dim for b in self.blocks)])
        operators = inverse
        train_residual, dfs = leave_one_out_operators(operators, edges, self.penalty[heads])
        residuals = {"train": train_residual}
        # where the penalty dwarfs the variance, rounding leaves nothing of that shortcut (a
        # train R^2 of 1e84 had been written)
        drowned = self.penalty[heads].sum() > DROWNED * np.diagonal(cov)[heads].sum()
        for split, m in self.splits.items():
            if split != "train" or drowned:
                spread = row_quadratics(operators, m.cov, heads)
                moved = (m.mean - self.train.mean)[heads].astype(operators.dtype)
                shift = (operators @ moved).astype(np.float64)
                residuals[split] = block_sums(spread + shift**2, edges.tolist())
        fits = []
        mean = self.train.mean[heads].astype(operators.dtype)
        for k, b in enumerate(self.blocks):
            others = [n for n in names if n != b.name]
            rows = operators[edges[k] : edges[k + 1]]
            bias = (rows @ mean).astype(np.float64)  # mean_t - W mean_B
            kept = np.r_[0 : edges[k], edges[k + 1] : edges[-1]]
            # in the statistics' precision: a wide float32 run's weights (about 4 heads^2 bytes
            # in all) are its largest arrays after the statistics
            weight = rows[:, kept]
            np.negative(weight, out=weight)
            residual = {split: residuals[split][k] for split in self.splits}
            if b.tail:
                assert carried is not None
                placed = np.searchsorted(tails, np.arange(b.basis_stop, b.stop))
                weight, bias, extra = tail_fit(
                    self.splits,
                    b,
                    self.basis_columns(others),
                    weight,
                    bias,
                    carried[:, placed],
                    (edges[k], edges[k + 1]),
                )
                residual = {split: residual[split] + extra[split] for split in residual}
            scores = {}
            for split, m in self.splits.items():
                total = float(np.trace(m.cov[b.start : b.stop, b.start : b.stop]))
                scores[split] = 1 - residual[split] / total if total > 0 else float("nan")
            fits.append(Fit(b.name, tuple(others), weight, bias, scores, dfs[k]))
        return fits

    def pairwise(self) -> dict[str, np.ndarray]:
        """R^2 of every target (rows) from every single basis model (columns), per split.

        One inverse per basis model serves all targets at once; the basis models are shared out
        by ``in_parallel``. The diagonal is NaN.
        """
        m = len(self.blocks)
        out = {split: np.full((m, m), np.nan) for split in self.splits}
        starts = [b.start for b in self.blocks]
        # per split: each column's variance, and its blocks' total variance (the denominators)
        var = {split: np.diag(s.cov) for split, s in self.splits.items()}
        totals = {split: np.add.reduceat(v, starts) for split, v in var.items()}

        def column(j: int) -> None:  # basis j: column j of every table
            bj = self.blocks[j]
            cj = slice(bj.start, bj.basis_stop)
            coef = self.single_basis_coef(j)  # (d_j, D)
            for split, s in self.splits.items():
                c_j = _wide(s.cov[cj])
                if s is self.train:  # (C_jj + Lam_j) coef = C_j: fitted - 2 C_j = -(C_j + Lam coef)
                    work = self.penalty[cj][:, None] * coef
                    work += c_j
                    np.negative(work, out=work)
                else:  # fitted - 2 C_j
                    work = c_j[:, cj] @ coef
                    work -= c_j
                    work -= c_j
                work *= coef
                quad = work.sum(axis=0)
                d_mean = s.mean - self.train.mean
                shift = d_mean - coef.T @ d_mean[cj]
                residual = np.add.reduceat(var[split] + quad + shift**2, starts)
                total = totals[split]
                with np.errstate(invalid="ignore", divide="ignore"):
                    r2 = np.where(total > 0, 1 - residual / total, np.nan)
                r2[j] = np.nan
                out[split][:, j] = r2

        in_parallel(column, [(j,) for j in range(m)])
        return out

    def pairwise_fits(self, table: dict[str, np.ndarray] | None = None) -> list[Fit]:
        """Every ordered pair (target, one basis model) as a :class:`Fit`, target-major.

        The weights are those of :meth:`pairwise` (``(C_jj + Lam_j)^-1 C_j,:`` for basis ``j``);
        R^2 comes from ``table``, the result of :meth:`pairwise`, computed here when not given.
        """
        table = self.pairwise() if table is None else table
        weights: dict[tuple[int, int], np.ndarray] = {}
        for j in range(len(self.blocks)):
            coef = self.single_basis_coef(j)
            for i, bi in enumerate(self.blocks):
                if i != j:
                    weights[i, j] = np.ascontiguousarray(coef[:, bi.start : bi.stop].T)
        fits = []
        mean = self.train.mean
        for (i, j), weight in sorted(weights.items()):
            bi, bj = self.blocks[i], self.blocks[j]
            bias = mean[bi.start : bi.stop] - weight @ mean[bj.start : bj.basis_stop]
            r2 = {split: float(table[split][i, j]) for split in self.splits}
            fits.append(Fit(bi.name, (bj.name,), weight, bias, r2))
        return fits
