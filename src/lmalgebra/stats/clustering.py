"""Hierarchical clustering of models by pairwise R^2, for the order of heatmap rows and columns.

Average linkage (UPGMA) in numpy; the linkage matrix and leaf order follow the conventions of
``scipy.cluster.hierarchy.linkage(..., "average")`` and ``leaves_list``.
"""

from __future__ import annotations

import numpy as np


def average_linkage(distance: np.ndarray) -> np.ndarray:
    """UPGMA on a symmetric ``(n, n)`` distance matrix.

    Returns the ``(n - 1, 4)`` float64 linkage matrix: per merge, the two cluster ids (smaller
    first; ids ``n + k`` are the clusters formed by merge ``k``), their distance and the size of
    the new cluster. O(n^3): meant for tens of models.
    """
    n = distance.shape[0]
    if distance.shape != (n, n):
        raise ValueError(f"distance must be square, got shape {distance.shape}")
    full = np.full((2 * n - 1, 2 * n - 1), np.inf)
    full[:n, :n] = distance
    size = np.ones(2 * n - 1)
    active = list(range(n))
    linkage = np.zeros((max(n - 1, 0), 4))
    for k in range(n - 1):
        ids = np.array(active)
        block = full[np.ix_(ids, ids)].copy()
        block[np.tril_indices(len(ids))] = np.inf
        flat = int(np.argmin(block))
        a, b = ids[flat // len(ids)], ids[flat % len(ids)]
        new = n + k
        others = ids[(ids != a) & (ids != b)]
        merged = (size[a] * full[a, others] + size[b] * full[b, others]) / (size[a] + size[b])
        full[new, others] = full[others, new] = merged
        size[new] = size[a] + size[b]
        linkage[k] = (min(a, b), max(a, b), full[a, b], size[new])
        active = [*others.tolist(), new]
    return linkage


def leaf_order(linkage: np.ndarray) -> list[int]:
    """Leaves left to right (pre-order, first-listed child first), as ``scipy``'s leaves_list."""
    n = linkage.shape[0] + 1
    order: list[int] = []
    stack = [2 * n - 2]
    while stack:
        node = stack.pop()
        if node < n:
            order.append(node)
        else:
            left, right = linkage[node - n, :2].astype(int)
            stack += [int(right), int(left)]
    return order


def r2_distance(r2: np.ndarray) -> np.ndarray:
    """``1 - (R + R^T) / 2`` for an ``(n, n)`` pairwise R^2 matrix, zero on the diagonal.

    NaN cells count as R^2 = 0 and R^2 is clipped to [0, 1] first (a negative held-out R^2 means
    the basis explains nothing), so distances lie in [0, 1].
    """
    clipped = np.clip(np.nan_to_num(np.asarray(r2, dtype=np.float64), nan=0.0), 0.0, 1.0)
    distance = 1.0 - (clipped + clipped.T) / 2.0
    np.fill_diagonal(distance, 0.0)
    return distance


def cluster_order(r2: np.ndarray) -> list[int]:
    """Order of the models of an ``(n, n)`` pairwise R^2 matrix putting similar models together."""
    n = r2.shape[0]
    if n <= 2:
        return list(range(n))
    return leaf_order(average_linkage(r2_distance(r2)))
