"""Representation similarity of every pair of models from one split's covariance alone.

Two measures, both functions of the covariance blocks ``C_aa``, ``C_bb``, ``C_ab``:

- linear CKA (Kornblith et al. 2019). With centred data ``X``, ``Y`` the HSIC of the linear Gram
  matrices is ``||X^T Y||_F^2`` up to a constant, so
  ``CKA = ||C_ab||_F^2 / (||C_aa||_F ||C_bb||_F)``.
- mean canonical correlation, SVCCA-style (Raghu et al. 2017): each model keeps its top principal
  directions explaining a fraction ``keep`` of its variance and is whitened there; the canonical
  correlations are the singular values of ``W_a^T C_ab W_b`` and their mean is reported.

Both are symmetric, so the table lists each unordered pair once. ``similarity_tables`` computes
the tables of several splits at once, its work cut into one task per model and split (each on one
BLAS thread), so the cores the process may use all work until the end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.blas_threads import cpu_threads, one_blas_thread
from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.solver import SplitMoments

# A direction is dropped by ``keep = 1`` only when it holds less than this share of the variance:
# numerically zero directions are noise, not signal.
_KEEP_TOLERANCE = 1e-12


@dataclass(frozen=True)
class Similarity:
    """Similarity of two models on one split.

    Attributes:
        model_a, model_b: the pair, in block order.
        cka: linear CKA in ``[0, 1]``; NaN when a model has no variance.
        mean_cca: mean canonical correlation in ``[0, 1]``; NaN when a model has no variance.
        cca_dims: how many canonical correlations were averaged (the smaller kept dimension).
    """

    model_a: str
    model_b: str
    cka: float
    mean_cca: float
    cca_dims: int


def linear_cka(cov_aa: np.ndarray, cov_bb: np.ndarray, cov_ab: np.ndarray) -> float:
    """Linear CKA from ``(d_a, d_a)``, ``(d_b, d_b)`` and ``(d_a, d_b)`` float64 covariances."""
    return _cka(float(np.linalg.norm(cov_aa)), float(np.linalg.norm(cov_bb)), cov_ab)


def _cka(norm_aa: float, norm_bb: float, cov_ab: np.ndarray) -> float:
    """Linear CKA from the Frobenius norms of the two models' covariances (each computed once
    per table, not once per pair) and their cross-covariance."""
    denominator = norm_aa * norm_bb
    if denominator <= 0:
        return math.nan
    return float(np.linalg.norm(cov_ab) ** 2 / denominator)


def whitener(cov: np.ndarray, keep: float = 0.99, ridge: float = 1e-8) -> np.ndarray:
    """``(d, k) float64`` map onto the top ``k`` principal directions of ``cov``, whitened.

    ``k`` is the fewest directions explaining at least ``keep`` of the variance. Each direction
    is divided by ``sqrt(eigenvalue + ridge * mean eigenvalue)``, so ``W^T cov W`` is the identity
    up to the relative ``ridge``. A model without variance gets ``k = 0``.
    """
    _check_settings(keep, ridge)
    values, vectors = np.linalg.eigh(cov)
    return _whitened(values, vectors, keep, ridge)


def _whitened(values: np.ndarray, vectors: np.ndarray, keep: float, ridge: float) -> np.ndarray:
    """The whitener from ``eigh``'s ascending ``values`` and their ``vectors``."""
    values, vectors = np.clip(values[::-1], 0.0, None), vectors[:, ::-1]
    total = float(values.sum())
    if total <= 0:
        return np.zeros((vectors.shape[0], 0))
    wanted = keep * total * (1 - _KEEP_TOLERANCE)
    k = min(int(np.searchsorted(np.cumsum(values), wanted)) + 1, len(values))
    floor = ridge * total / len(values)
    return vectors[:, :k] / np.sqrt(values[:k] + floor)


def canonical_correlations(
    cov_aa: np.ndarray,
    cov_bb: np.ndarray,
    cov_ab: np.ndarray,
    keep: float = 0.99,
    ridge: float = 1e-8,
) -> np.ndarray:
    """Canonical correlations ``(min(k_a, k_b),) float64``, descending, in ``[0, 1]``.

    Each model is first reduced by :func:`whitener` (``keep``, ``ridge``).
    """
    return _correlations(whitener(cov_aa, keep, ridge), whitener(cov_bb, keep, ridge), cov_ab)


def similarity_table(
    blocks: Sequence[ModelColumns], moments: SplitMoments, keep: float = 0.99, ridge: float = 1e-8
) -> list[Similarity]:
    """CKA and mean canonical correlation of every unordered pair of models (``a`` before ``b``
    in block order), from one split's ``(D, D)`` covariance (``moments.cov``).

    ``keep``: share of each model's variance its principal subspace keeps before CCA, in
    ``(0, 1]``; ``1`` keeps every direction with non-negligible variance. ``ridge``: added to
    each kept eigenvalue, relative to the model's mean eigenvalue.
    """
    return similarity_tables(blocks, {"split": moments}, keep, ridge)["split"]


def similarity_tables(
    blocks: Sequence[ModelColumns],
    splits: Mapping[str, SplitMoments],
    keep: float = 0.99,
    ridge: float = 1e-8,
) -> dict[str, list[Similarity]]:
    """:func:`similarity_table` of every split of ``splits``, by split, the work shared out on
    as many threads as the process has cores, each on one BLAS thread (NumPy's LAPACK calls
    release the GIL): first every model's whitener and norm, then every model's pairs with the
    models after it (one task a model and split each, the most pairs first), so that no core
    waits on one split's table while another has none. The same figures as one at a time."""
    _check_settings(keep, ridge)
    for name, moments in splits.items():
        _check_layout(blocks, moments, f"{name}: ")
    spans = [slice(b.start, b.basis_stop) for b in blocks]  # a reduced model: its coordinates
    rows = sorted(
        ((name, i) for name in splits for i in range(len(blocks) - 1)), key=lambda t: t[1]
    )  # model i has len(blocks) - 1 - i pairs: the longest first
    with one_blas_thread(), ThreadPoolExecutor(max(1, cpu_threads())) as pool:
        started = {
            name: [pool.submit(_model, m.cov[s, s], keep, ridge) for s in spans]
            for name, m in splits.items()
        }
        models = {name: [t.result() for t in tasks] for name, tasks in started.items()}
        done = {
            (name, i): pool.submit(_pairs_of, i, blocks, spans, splits[name].cov, models[name])
            for name, i in rows
        }
        return {
            name: [pair for i in range(len(blocks) - 1) for pair in done[name, i].result()]
            for name in splits
        }


def _check_layout(blocks: Sequence[ModelColumns], moments: SplitMoments, where: str) -> None:
    size = moments.cov.shape[0]
    if size != (blocks[-1].stop if blocks else 0):
        raise ValueError(f"{where}covariance of size {size} does not match the block layout")


def _model(cov: np.ndarray, keep: float, ridge: float) -> tuple[np.ndarray, float]:
    """A model's whitener and its covariance's Frobenius norm, computed once per table."""
    return whitener(cov, keep, ridge), float(np.linalg.norm(cov))


def _pairs_of(
    i: int,
    blocks: Sequence[ModelColumns],
    spans: Sequence[slice],
    cov: np.ndarray,
    models: Sequence[tuple[np.ndarray, float]],
) -> list[Similarity]:
    """The table's rows of model ``i`` with every model after it, in block order
    (``models``: each model's whitener and norm)."""
    (white_i, norm_i), rows = models[i], []
    for j in range(i + 1, len(blocks)):
        cross = cov[spans[i], spans[j]]
        white_j, norm_j = models[j]
        corr = _correlations(white_i, white_j, cross)
        rows.append(
            Similarity(
                model_a=blocks[i].name,
                model_b=blocks[j].name,
                cka=_cka(norm_i, norm_j, cross),
                mean_cca=float(corr.mean()) if corr.size else math.nan,
                cca_dims=int(corr.size),
            )
        )
    return rows


def _correlations(white_a: np.ndarray, white_b: np.ndarray, cov_ab: np.ndarray) -> np.ndarray:
    if white_a.shape[1] == 0 or white_b.shape[1] == 0:
        return np.zeros(0)
    cross = white_a.T @ cov_ab @ white_b
    # the singular values of ``cross`` are the square roots of the eigenvalues of its smaller
    # Gram matrix: a symmetric eigensolver takes about half the time of an SVD
    gram = cross @ cross.T if cross.shape[0] <= cross.shape[1] else cross.T @ cross
    values = np.sqrt(np.clip(np.linalg.eigvalsh(gram)[::-1], 0.0, 1.0))
    return values


def _check_settings(keep: float, ridge: float) -> None:
    if not 0 < keep <= 1:
        raise UserInputError(f"keep must be in (0, 1], got {keep}")
    if not ridge >= 0 or not math.isfinite(ridge):
        raise UserInputError(f"the CCA ridge must be a finite number >= 0, got {ridge}")
