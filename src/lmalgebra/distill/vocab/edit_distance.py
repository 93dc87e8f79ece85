"""Levenshtein distances between many strings at once, vectorised with numpy.

Strings are compared by Unicode code point. Strings of equal length are processed together: for
each row of the dynamic programme the deletion/substitution step is one array operation, and the
insertion chain ``cur[j] = min(x[j], cur[j-1] + 1)`` is the closed form
``cur[j] = j + min_{k <= j} (x[k] - k)``, a running minimum. A block of
``g x h`` string pairs of lengths ``La x Lb`` costs ``La`` array passes over ``g * h * (Lb + 1)``
small integers.
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


def distance_matrix(a: Sequence[str], b: Sequence[str]) -> np.ndarray:
    """``(len(a), len(b)) int32`` Levenshtein distances between every string of ``a`` and ``b``."""
    out = np.zeros((len(a), len(b)), dtype=np.int32)
    groups_b = code_points(b)
    for rows_a, codes_a in code_points(a).values():
        for rows_b, codes_b in groups_b.values():
            out[np.ix_(rows_a, rows_b)] = pair_distances(codes_a, codes_b)
    return out


class RememberedDistances:
    """:func:`distance_matrix` that remembers the distances of the string pairs it has seen.

    Two tokenizations of a corpus repeat the same token strings from one example to the next, so
    after a few batches almost every pair is known. Each side's strings get ids in order of
    appearance; known distances sit in a dense ``int16`` table (-1: not computed), grown as
    strings appear. When either side exceeds ``capacity`` strings the table starts afresh, which
    bounds its memory at ``2 * capacity^2`` bytes. Results equal :func:`distance_matrix`'s.
    """

    def __init__(self, capacity: int = 4096):
        self.capacity = capacity
        self._clear()

    def _clear(self) -> None:
        self.ids: tuple[dict[str, int], dict[str, int]] = ({}, {})
        self.strings: tuple[list[str], list[str]] = ([], [])
        self.table = np.full((256, 256), -1, dtype=np.int16)

    def _ids(self, side: int, strings: Sequence[str]) -> np.ndarray:
        ids, known = self.ids[side], self.strings[side]
        out = np.empty(len(strings), dtype=np.int64)
        for position, text in enumerate(strings):
            index = ids.get(text)
            if index is None:
                index = ids[text] = len(known)
                known.append(text)
            out[position] = index
        return out

    def __call__(self, a: Sequence[str], b: Sequence[str]) -> np.ndarray:
        """``(len(a), len(b)) int32`` Levenshtein distances, as :func:`distance_matrix`."""
        if len(self.strings[0]) + len(a) > self.capacity or (
            len(self.strings[1]) + len(b) > self.capacity
        ):
            self._clear()
        rows, cols = self._ids(0, a), self._ids(1, b)
        self._grow(len(self.strings[0]), len(self.strings[1]))
        unique_rows, unique_cols = np.unique(rows), np.unique(cols)
        unknown = self.table[np.ix_(unique_rows, unique_cols)] < 0
        if unknown.any():
            new_rows = unique_rows[unknown.any(axis=1)]
            new_cols = unique_cols[unknown.any(axis=0)]
            self.table[np.ix_(new_rows, new_cols)] = distance_matrix(
                [self.strings[0][i] for i in new_rows], [self.strings[1][j] for j in new_cols]
            )
        return self.table[np.ix_(rows, cols)].astype(np.int32)

    def _grow(self, rows: int, cols: int) -> None:
        """Room for ``rows x cols`` strings: each side that is short at least doubles."""
        have = self.table.shape
        wanted = [h if n <= h else max(n, 2 * h) for n, h in zip((rows, cols), have, strict=True)]
        if wanted != list(have):
            grown = np.full(wanted, -1, dtype=np.int16)
            grown[: have[0], : have[1]] = self.table
            self.table = grown
