"""Each model's leading principal subspace: the per-model reduction of the approximate methods.

A model of width ``d`` is replaced by its coordinates ``y = (x - c) V`` along ``k`` orthonormal
directions ``V (d, k)``, the leading principal directions of its training covariance (``c``: the
training mean). Rotating a model's coordinates changes no fit (ridge penalties and R^2 are
invariant under orthonormal maps), so with ``k = d`` the reduced statistics give the exact fits;
with ``k < d`` each model keeps the share ``retained`` of its variance.

Two ways to find ``V``, both seeded:

- from the model's ``(d, d)`` covariance (``leading_subspace``): randomised subspace iteration
  (Halko, Martinsson and Tropp 2011, Alg. 4.4) on ``size = k + oversample`` columns, then the
  Rayleigh-Ritz step in float64; ``size = d`` is a full eigendecomposition.
- from a streamed sketch ``C Omega`` (``nystrom_subspace``): the Nystrom approximation of a
  positive semi-definite matrix from one pass (Tropp, Yurtsever, Udell and Cevher 2017, Alg. 3),
  which never forms the ``(d, d)`` covariance; exact when the sketch is ``d`` wide.

``components_for`` chooses ``k`` as the fewest leading directions holding a share of the variance.

The variance a model loses (its tail, ``tr(C) - sum of the kept variances``) still belongs to it as
a target: ``s`` tail probes ``G^T (x - c)``, with ``G`` Gaussian and orthogonal to ``V``, are kept
as target-only columns (``ModelColumns.tail``). As ``E[G G^T]`` is the projector onto the tail, a
fit's residual on the probes estimates its residual on the whole tail without bias (Hutchinson's
trace estimator), so a target's R^2 pools all ``d`` of its dimensions; only the basis is reduced.
From the covariance the probes are scaled so that their training variance is the tail's exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.linalg import solve_triangular

from lmalgebra.stats.choices import PROBES
from lmalgebra.stats.symmetric_kernels import cholesky

# Subspace iterations after the first product: enough for the leading directions of a decaying
# spectrum to converge to a share of a percent of their variance.
ITERATIONS = 3
OVERSAMPLE = 16  # extra columns of the random start, beyond the k directions kept
FIRST_SIZE = 256  # the first subspace tried when k is chosen by retained variance


@dataclass(frozen=True)
class Reduction:
    """One model's principal coordinates: ``y = (x - center) @ basis``.

    Attributes:
        name: the model (block) it reduces.
        center: ``(d,) float64``, the training mean (subtracted before projecting).
        basis: ``(d, k) float64``, orthonormal columns by decreasing training variance.
        variances: ``(k,) float64``, the training variance along each column.
        total: the model's total training variance ``tr(C)``.
    """

    name: str
    center: np.ndarray
    basis: np.ndarray
    variances: np.ndarray
    total: float
    probes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))

    def __post_init__(self) -> None:
        if self.probes.size == 0:
            object.__setattr__(self, "probes", np.zeros((self.width, 0)))

    @property
    def width(self) -> int:
        return int(self.basis.shape[0])

    @property
    def k(self) -> int:
        return int(self.basis.shape[1])

    @property
    def tail(self) -> int:
        """Number of tail probes (0 when every dimension is kept)."""
        return int(self.probes.shape[1])

    @property
    def retained(self) -> float:
        """Share of the training variance the ``k`` directions keep (1 when none to keep)."""
        return float(self.variances.sum() / self.total) if self.total > 0 else 1.0

    def projector(self) -> tuple[np.ndarray, np.ndarray]:
        """``(center (d,) float32, [basis | probes] (d, k + s) float32)`` for :func:`project`."""
        center = self.center.astype(np.float32)
        return center, np.hstack([self.basis, self.probes]).astype(np.float32)


def project(rows: np.ndarray, projector: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``(r, k) float32`` coordinates of ``rows (r, d)`` (float32): ``(rows - center) @ basis``.

    Centred first, so float32 rounding is relative to each row's spread, not to its offset."""
    center, basis = projector
    centred = np.asarray(rows, dtype=np.float32) - center
    return centred @ basis


def components_for(values: np.ndarray, total: float, retained: float) -> int | None:
    """Fewest leading ``values`` (decreasing) whose sum reaches ``retained * total``; ``None``
    when all of them together fall short."""
    if total <= 0:
        return min(1, values.size)
    reached = np.flatnonzero(np.cumsum(values) >= retained * total * (1 - 1e-12))
    return int(reached[0]) + 1 if reached.size else None


def _gaussian(rows: int, cols: int, seed: int) -> np.ndarray:
    """Standard normal ``(rows, cols) float64``, seeded (torch's generator, as the reductions
    recorded so far drew it)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return torch.randn((rows, cols), generator=generator, dtype=torch.float64).numpy()


def _iterate(cov: np.ndarray, size: int, iterations: int, seed: int) -> np.ndarray:
    """``(d, size) float64`` orthonormal basis of ``cov^(iterations + 1) Omega``, orthonormalised
    after every product (the products in float32: the subspace needs no more)."""
    d = cov.shape[0]
    if size >= d:
        return np.eye(d)
    single = cov.astype(np.float32)
    basis = _gaussian(d, size, seed)
    for _ in range(iterations + 1):
        basis = np.linalg.qr((single @ basis.astype(np.float32)).astype(np.float64)).Q
    return basis


def _ritz(cov: np.ndarray, basis: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rayleigh-Ritz: ``(basis @ U, values)``, decreasing, of ``cov`` within ``span(basis)``."""
    values, vectors = np.linalg.eigh(basis.T @ cov @ basis)
    order = np.argsort(values)[::-1]
    return basis @ vectors[:, order], np.clip(values[order], 0, None)


def leading_subspace(
    cov: np.ndarray,
    k: int | None = None,
    retained: float | None = None,
    *,
    oversample: int = OVERSAMPLE,
    iterations: int = ITERATIONS,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(basis (d, k'), variances (k',))`` float64: the leading principal directions of
    ``cov (d, d)`` and the variance along each, decreasing.

    ``k``: how many (at most ``d``); with ``retained`` as well, the fewest holding that share of
    the variance, at most ``k``. ``retained`` alone: the fewest holding it (the subspace tried
    doubles until they are found). One of the two is required.
    """
    d = cov.shape[0]
    if k is None and retained is None:
        raise ValueError("give the number of components, the retained variance, or both")
    cap = d if k is None else max(1, min(k, d))
    total = float(np.trace(cov))
    matrix = np.ascontiguousarray(cov, dtype=np.float64)
    size = min(d, (cap if retained is None else min(cap, FIRST_SIZE)) + oversample)
    while True:
        basis, values = _ritz(matrix, _iterate(matrix, size, iterations, seed))
        if retained is None:
            keep = cap
            break
        needed = components_for(values[: max(1, size - oversample)], total, retained)
        if needed is not None or size >= d or size >= cap + oversample:
            keep = min(cap, needed if needed is not None else size)
            break
        size = min(d, 2 * size)
    return basis[:, :keep], values[:keep]


def nystrom_subspace(
    sketch: np.ndarray,
    test: np.ndarray,
    k: int | None = None,
    retained: float | None = None,
    total: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """``(basis (d, k'), variances (k',))`` float64 from the sketch ``Y = C Omega`` of a positive
    semi-definite ``C (d, d)`` and its test matrix ``Omega (d, s)``.

    The Nystrom approximation ``Y (Omega^T Y)^+ Y^T`` is taken in its stable form (a shift of
    ``eps * ||Y||`` before the Cholesky factor, removed from the eigenvalues after), and its
    leading eigenvectors kept: ``k`` of them (at most ``s``), or with ``retained`` the fewest whose
    estimated variance reaches that share of ``total`` (``tr(C)``, known exactly).
    """
    y = np.asarray(sketch, dtype=np.float64)
    omega = np.asarray(test, dtype=np.float64)
    d, s = y.shape
    shift = float(np.finfo(np.float64).eps * max(d, s) * np.linalg.norm(y, 2))
    shifted = y + shift * omega
    core = omega.T @ shifted
    factor, ok = cholesky((core + core.T) / 2)
    if not ok:  # Omega^T Y + shift is SPD in exact arithmetic; rounding can break it
        values, vectors = np.linalg.eigh((core + core.T) / 2)
        floor = np.clip(values, values.max() * 1e-12, None)
        root_inverse = vectors / np.sqrt(floor)
        half = shifted @ root_inverse
    else:
        half = solve_triangular(factor, shifted.T, lower=True, check_finite=False).T
    basis, singular, _ = np.linalg.svd(half, full_matrices=False)
    variances = np.clip(singular**2 - shift, 0, None)
    cap = s if k is None else max(1, min(k, s))
    keep = cap
    if retained is not None:
        needed = components_for(variances, total, retained)
        keep = min(cap, needed if needed is not None else s)
    return basis[:, :keep], variances[:keep]


def tail_probes(
    basis: np.ndarray, count: int, seed: int, cov: np.ndarray | None = None, tail: float = 0.0
) -> np.ndarray:
    """``(d, count) float64`` probes of the variance outside ``span(basis)`` (see the module).

    Gaussian with variance ``1 / count``, projected off ``basis``; none when ``basis`` spans
    everything. With ``cov`` the probes are scaled so that their total variance is ``tail``.
    """
    d, k = basis.shape
    if k >= d or count < 1:
        return np.zeros((d, 0))
    probes = _gaussian(d, count, seed) / np.sqrt(count)
    probes -= basis @ (basis.T @ probes)
    if cov is not None:
        seen = float(np.einsum("ij,ij->", probes, cov @ probes))
        if seen > 0 and tail > 0:
            probes *= np.sqrt(tail / seen)
    return probes


def reduce_covariance(
    name: str,
    mean: np.ndarray,
    cov: np.ndarray,
    components: int | None,
    retained: float | None,
    probes: int = PROBES,
    seed: int = 0,
) -> Reduction:
    """One model reduced from its training mean ``(d,)`` and covariance ``(d, d)`` float64."""
    basis, variances = leading_subspace(cov, components, retained, seed=seed)
    total = float(np.trace(cov))
    kept = float(np.einsum("ij,ij->", basis, cov @ basis))  # exact for the subspace used
    tail = tail_probes(basis, probes, seed + 1, cov, max(total - kept, 0.0))
    return Reduction(name, mean, basis, variances, total, tail)


def reduce_sketch(
    name: str,
    mean: np.ndarray,
    sketch: np.ndarray,
    test: np.ndarray,
    total: float,
    components: int | None,
    retained: float | None,
    probes: int = PROBES,
    seed: int = 0,
) -> Reduction:
    """One model reduced from its training mean, the sketch ``C Omega`` of its covariance, the
    test matrix ``Omega`` and ``tr(C)`` (no ``d x d`` matrix is formed)."""
    basis, variances = nystrom_subspace(sketch, test, components, retained, total)
    tail = tail_probes(basis, probes, seed + 1)
    return Reduction(name, mean, basis, variances, total, tail)
