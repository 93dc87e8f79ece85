"""The baseline of ``bench_mined_map.py``: the MinED search as lmalgebra had it before rapidfuzz,
with Levenshtein distances from a numpy dynamic programme (kept here as it was, to be measured).

Strings of equal length are processed together: for each row of the dynamic programme the
deletion/substitution step is one array operation, and the insertion chain
``cur[j] = min(x[j], cur[j-1] + 1)`` is the closed form ``cur[j] = j + min_{k <= j} (x[k] - k)``,
a running minimum. A block of ``g x h`` string pairs of lengths ``La x Lb`` costs ``La`` array
passes over ``g * h * (Lb + 1)`` small integers.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# DP cells per block: small enough to stay in the CPU cache (measured fastest at 2^16).
BLOCK_CELLS = 1 << 16


def code_points(strings: Sequence[str]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Strings grouped by length: ``length -> (indices (m,) int64, codes (m, length) int32)``."""
    by_length: dict[int, list[int]] = {}
    for index, text in enumerate(strings):
        by_length.setdefault(len(text), []).append(index)
    groups = {}
    for length, indices in sorted(by_length.items()):
        joined = "".join(strings[i] for i in indices)
        codes = np.frombuffer(joined.encode("utf-32-le"), dtype=np.int32)
        groups[length] = (np.asarray(indices, dtype=np.int64), codes.reshape(len(indices), length))
    return groups


def block_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Levenshtein distance of every pair of rows: ``a (g, La)``, ``b (h, Lb)`` int32 code points
    (each side's strings of one length) -> ``(g, h) int16``. Lengths up to 32,000."""
    g, la = a.shape
    h, lb = b.shape
    if la == 0 or lb == 0:
        return np.full((g, h), max(la, lb), dtype=np.int16)
    # Rows hold E[j] = D[j] - j laid out (Lb + 1, g * h), so every operation runs along long
    # contiguous rows and the insertion chain is a plain running minimum:
    # E_i[j] = min over k <= j of x[k], x[0] = i, x[j] = min(E_{i-1}[j] + 1, E_{i-1}[j-1] - eq).
    prev = np.zeros((lb + 1, g * h), dtype=np.int16)
    cur = np.empty_like(prev)
    b_cols = b.T[:, None, :]  # (lb, 1, h)
    eq = np.empty((lb, g, h), dtype=np.bool_)
    flat_eq = eq.reshape(lb, g * h)
    for i in range(la):
        np.equal(a[None, :, i, None], b_cols, out=eq)
        np.subtract(prev[:-1], flat_eq, out=cur[1:])
        np.minimum(cur[1:], prev[1:] + 1, out=cur[1:])
        cur[0] = i + 1
        for j in range(1, lb + 1):  # row by row: minimum.accumulate along axis 0 is far slower
            np.minimum(cur[j], cur[j - 1], out=cur[j])
        prev, cur = cur, prev
    return (prev[lb] + lb).reshape(g, h)


def pair_distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """:func:`block_distances` in blocks that keep at most ``BLOCK_CELLS`` DP cells in memory."""
    g, h, lb = a.shape[0], b.shape[0], b.shape[1]
    out = np.empty((g, h), dtype=np.int16)
    cols = max(1, min(h, BLOCK_CELLS // (lb + 1)))
    rows = max(1, BLOCK_CELLS // (cols * (lb + 1)))
    for r in range(0, g, rows):
        for c in range(0, h, cols):
            out[r : r + rows, c : c + cols] = block_distances(a[r : r + rows], b[c : c + cols])
    return out


def nearest_strings(queries: Sequence[str], pool: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """For each query, the pool index minimising ``(distance, |length difference|, index)``.

    Returns ``(indices (len(queries),) int64, distances (len(queries),) int32)``.
    """
    if not pool:
        raise ValueError("cannot map tokens onto an empty vocabulary")
    best = np.full(len(queries), np.iinfo(np.int32).max, dtype=np.int64)
    found = np.full((2, len(queries)), -1, dtype=np.int64)  # (index, Δ) of the best so far
    first: dict[str, int] = {}
    for index, text in enumerate(pool):
        first.setdefault(text, index)
    for q, text in enumerate(queries):
        if text in first:
            best[q], found[:, q] = 0, (first[text], 0)
    rest = [q for q in range(len(queries)) if best[q] > 0]
    pool_groups = code_points(pool)
    longest = max(pool_groups)
    for length, (rows, codes) in code_points([queries[q] for q in rest]).items():
        rows = np.asarray(rest, dtype=np.int64)[rows]
        for delta in range(max(length, longest) + 1):
            open_ = best[rows] > delta  # a candidate Δ off in length is at least Δ away
            if not open_.any():
                break
            for other in sorted({length - delta, length + delta}):
                if other in pool_groups:
                    group = pool_groups[other]
                    _improve(best, found, rows[open_], codes[open_], group, delta)
    return found[0], best.astype(np.int32)


def _improve(
    best: np.ndarray,
    found: np.ndarray,
    rows: np.ndarray,
    codes: np.ndarray,
    group: tuple[np.ndarray, np.ndarray],
    delta: int,
) -> None:
    """Update ``best``/``found`` at ``rows`` with the nearest string of one pool length bucket,
    ``delta`` off in length.

    Within a bucket ``argmin`` takes the smallest pool index among ties (buckets are in index
    order); across the two buckets of one ``Δ`` the smaller index wins a tie, and a tie with a
    string found at a smaller ``Δ`` keeps that one.
    """
    pool_rows, pool_codes = group
    distances = pair_distances(codes, pool_codes)
    nearest = distances.argmin(axis=1)
    d = distances[np.arange(len(rows)), nearest].astype(np.int64)
    index = pool_rows[nearest]
    tie = (d == best[rows]) & (found[1, rows] == delta) & (index < found[0, rows])
    better = (d < best[rows]) | tie
    best[rows[better]] = d[better]
    found[0, rows[better]] = index[better]
    found[1, rows[better]] = delta
