"""Levenshtein distances between many strings at once (rapidfuzz's bit-parallel kernels).

Strings are compared by Unicode code point (rapidfuzz compares a ``str`` by its code points, so an
emoji counts as one). A matrix of distances is ``rapidfuzz.process.cdist`` with the Levenshtein
scorer, on ``workers`` threads; given ``cutoff``, a pair farther apart than it stops early and is
reported as ``cutoff + 1``. Distances are exact integers, the same on any CPU and thread count.
This replaced a numpy dynamic programme (one array pass per character of one side), which took
minutes for the MinED map of Gemma-3's 262,144 tokens onto SmolLM2's 49,152
(``bench/bench_mined_map.py`` measures both), and the table of remembered distances that causal
training kept beside it, which computing the distances afresh now beats (``bench/bench_causal.py``
times a batch's MinED alignment: 88 ms with the table and the numpy distances, 10.6 ms now).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from rapidfuzz.distance import Levenshtein
from rapidfuzz.process import cdist


def by_length(strings: Sequence[str]) -> dict[int, np.ndarray]:
    """Indices of ``strings`` grouped by length: ``length -> indices (m,) int64`` in input
    order, lengths ascending."""
    groups: dict[int, list[int]] = {}
    for index, text in enumerate(strings):
        groups.setdefault(len(text), []).append(index)
    return {n: np.asarray(groups[n], dtype=np.int64) for n in sorted(groups)}


def distance_matrix(
    a: Sequence[str], b: Sequence[str], workers: int = 1, cutoff: int | None = None
) -> np.ndarray:
    """``(len(a), len(b)) int32`` Levenshtein distances between every string of ``a`` and ``b``;
    with ``cutoff``, distances above it read ``cutoff + 1``."""
    if not len(a) or not len(b):
        return np.zeros((len(a), len(b)), dtype=np.int32)
    return cdist(
        a, b, scorer=Levenshtein.distance, dtype=np.int32, workers=workers, score_cutoff=cutoff
    )
