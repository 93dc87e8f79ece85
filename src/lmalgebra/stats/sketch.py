"""Streamed statistics of one model that stay linear in its width: per-column moments, and a
randomised sketch ``C Omega`` of its covariance.

``ColumnMoments`` keeps ``n``, column sums and column sums of squares around a fixed shift (as
:class:`~lmalgebra.stats.moments.SecondMoments` does, without the Gram matrix): each column's
variance, hence the model's total variance ``tr(C)`` on a split. ``CovarianceSketch`` adds the
product ``sum (x - shift)(x - shift)^T Omega`` with a seeded Gaussian ``Omega (d, s)``: after the
pass, ``C Omega`` (``d x s`` numbers instead of ``d x d``), from which
:func:`~lmalgebra.stats.principal.nystrom_subspace` finds the leading principal directions.
Products are float32 over at most ``FLOAT32_ROWS`` shift-centred rows, accumulated in float64.
Both merge exactly across shards and processes (``shifted_to``, ``+``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from lmalgebra.stats.moments import FLOAT32_ROWS


@dataclass
class ColumnMoments:
    """``n``, column sums and column sums of squares of ``x - shift``, in float64.

    Attributes:
        dim: number of columns.
        n: rows seen.
        shift: ``(dim,) float64``, the first rows' mean (float32-representable).
        sums, squares: ``(dim,) float64``, sums of ``x - shift`` and of its squares.
    """

    dim: int
    n: int = 0
    shift: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sums: np.ndarray = field(default_factory=lambda: np.zeros(0))
    squares: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __post_init__(self) -> None:
        if self.shift.size == 0:
            self.shift, self.sums, self.squares = (np.zeros(self.dim) for _ in range(3))

    def _centred(self, chunk: np.ndarray) -> np.ndarray:
        """The chunk's rows minus the shift, ``(rows, dim) float32`` (the shift is set by the
        first chunk); sums and squares are added in float64."""
        if chunk.ndim != 2 or chunk.shape[1] != self.dim:
            raise ValueError(f"chunk of shape {chunk.shape} does not match dimension {self.dim}")
        if self.n == 0:
            head = np.add.reduce(chunk[:FLOAT32_ROWS], 0, np.float64) / len(chunk[:FLOAT32_ROWS])
            self.shift = head.astype(np.float32).astype(np.float64)
        # a new float32 array: the input (perhaps read-only) is left alone
        centred = np.subtract(chunk, self.shift.astype(np.float32), dtype=np.float32)
        wide = centred.astype(np.float64)
        self.n += len(chunk)
        self.sums += wide.sum(0)
        self.squares += (wide * wide).sum(0)
        return centred

    def update(self, chunk: np.ndarray) -> None:
        """Add rows. ``chunk``: ``(rows, dim)``, any float dtype."""
        if len(chunk):
            self._centred(chunk)

    def mean(self) -> np.ndarray:
        """``(dim,) float64`` column means."""
        return self.shift + self.sums / max(self.n, 1)

    def total_variance(self) -> float:
        """``tr(C)``: the sum of the columns' population variances."""
        if self.n == 0:
            return 0.0
        centred_mean = self.sums / self.n
        return float((self.squares / self.n - centred_mean**2).sum())

    def shifted_to(self, shift: np.ndarray) -> ColumnMoments:
        """The same statistics around another shift (exact algebra)."""
        delta = self.shift - shift
        squares = self.squares + 2 * delta * self.sums + self.n * delta**2
        return ColumnMoments(self.dim, self.n, shift.copy(), self.sums + self.n * delta, squares)

    def __add__(self, other: ColumnMoments) -> ColumnMoments:
        """Statistics of the union of both sets of rows."""
        if other.n == 0 or self.n == 0:
            kept = self if other.n == 0 else other
            return ColumnMoments(
                self.dim, kept.n, kept.shift.copy(), kept.sums.copy(), kept.squares.copy()
            )
        moved = other.shifted_to(self.shift)
        return ColumnMoments(
            self.dim,
            self.n + moved.n,
            self.shift.copy(),
            self.sums + moved.sums,
            self.squares + moved.squares,
        )


def gaussian_test(dim: int, size: int, seed: int) -> np.ndarray:
    """The sketch's test matrix ``Omega``: ``(dim, size) float32`` standard normal, seeded (torch's
    generator, as the reductions recorded so far drew it)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn((dim, size), generator=generator, dtype=torch.float32).numpy()


@dataclass
class CovarianceSketch:
    """``sum (x - shift)(x - shift)^T Omega`` of one model's rows, with its column moments.

    Attributes:
        columns: the rows' :class:`ColumnMoments` (shift, sums, squares).
        test: ``Omega``, ``(dim, size) float32`` (:func:`gaussian_test`).
        product: ``(dim, size) float64``, the streamed product.
    """

    columns: ColumnMoments
    test: np.ndarray
    product: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def __post_init__(self) -> None:
        if self.product.size == 0:
            self.product = np.zeros(self.test.shape)

    @classmethod
    def empty(cls, dim: int, size: int, seed: int) -> CovarianceSketch:
        return cls(ColumnMoments(dim), gaussian_test(dim, min(size, dim), seed))

    @property
    def n(self) -> int:
        return self.columns.n

    def update(self, chunk: np.ndarray) -> None:
        """Add rows. ``chunk``: ``(rows, dim)``, any float dtype."""
        if not len(chunk):
            return
        centred = self.columns._centred(chunk)
        for start in range(0, len(centred), FLOAT32_ROWS):
            rows = centred[start : start + FLOAT32_ROWS]
            self.product += rows.T @ (rows @ self.test)

    def sketch(self) -> np.ndarray:
        """``C Omega``: ``(dim, size) float64``, with ``C`` the population covariance."""
        n = self.columns.n
        centred_mean = self.columns.sums / n
        return self.product / n - np.outer(centred_mean, centred_mean @ self.test)

    def shifted_to(self, shift: np.ndarray) -> CovarianceSketch:
        """The same sketch around another shift (exact algebra)."""
        delta = self.columns.shift - shift
        sums, omega = self.columns.sums, self.test.astype(np.float64)
        product = (
            self.product
            + np.outer(sums, delta @ omega)
            + np.outer(delta, sums @ omega)
            + self.columns.n * np.outer(delta, delta @ omega)
        )
        return CovarianceSketch(self.columns.shifted_to(shift), self.test, product)

    def __add__(self, other: CovarianceSketch) -> CovarianceSketch:
        if other.n == 0 or self.n == 0:
            kept = self if other.n == 0 else other
            return CovarianceSketch(
                kept.columns + ColumnMoments(self.columns.dim), self.test, kept.product.copy()
            )
        moved = other.shifted_to(self.columns.shift)
        return CovarianceSketch(
            self.columns + moved.columns, self.test, self.product + moved.product
        )
