"""The similarity table as it was before it ran on one BLAS thread: the baseline of
``bench_similarity.py``, kept verbatim (``lmalgebra.stats.similarity`` at commit 535291d, the
functions the table calls; the settings check and the row type are the library's)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.similarity import Similarity, _check_settings
from lmalgebra.stats.solver import SplitMoments

_KEEP_TOLERANCE = 1e-12


def linear_cka(cov_aa: np.ndarray, cov_bb: np.ndarray, cov_ab: np.ndarray) -> float:
    """Linear CKA from ``(d_a, d_a)``, ``(d_b, d_b)`` and ``(d_a, d_b)`` float64 covariances."""
    denominator = float(np.linalg.norm(cov_aa) * np.linalg.norm(cov_bb))
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
    values, vectors = np.clip(values[::-1], 0.0, None), vectors[:, ::-1]
    total = float(values.sum())
    if total <= 0:
        return np.zeros((cov.shape[0], 0))
    wanted = keep * total * (1 - _KEEP_TOLERANCE)
    k = min(int(np.searchsorted(np.cumsum(values), wanted)) + 1, len(values))
    floor = ridge * total / len(values)
    return vectors[:, :k] / np.sqrt(values[:k] + floor)


def similarity_table(
    blocks: Sequence[ModelColumns],
    moments: SplitMoments,
    keep: float = 0.99,
    ridge: float = 1e-8,
) -> list[Similarity]:
    """CKA and mean canonical correlation of every unordered pair of models (``a`` before ``b``
    in block order), from one split's ``(D, D)`` covariance.

    Args:
        blocks: the model layout of ``moments``.
        moments: one split's statistics; only ``cov`` is used.
        keep: share of each model's variance its principal subspace keeps before CCA, in
            ``(0, 1]``; ``1`` keeps every direction with non-negligible variance.
        ridge: added to each kept eigenvalue, relative to the model's mean eigenvalue.
    """
    _check_settings(keep, ridge)
    cov = moments.cov
    if cov.shape[0] != (blocks[-1].stop if blocks else 0):
        raise ValueError(f"covariance of size {cov.shape[0]} does not match the block layout")
    spans = [slice(b.start, b.basis_stop) for b in blocks]  # a reduced model: its coordinates
    whiteners = [whitener(cov[s, s], keep, ridge) for s in spans]
    rows = []
    for i, a in enumerate(blocks):
        for j in range(i + 1, len(blocks)):
            b, cross = blocks[j], cov[spans[i], spans[j]]
            corr = _correlations(whiteners[i], whiteners[j], cross)
            rows.append(
                Similarity(
                    model_a=a.name,
                    model_b=b.name,
                    cka=linear_cka(cov[spans[i], spans[i]], cov[spans[j], spans[j]], cross),
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
