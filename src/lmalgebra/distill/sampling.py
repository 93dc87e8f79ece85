"""Language sampling and multi-teacher modes of student training data, for both objectives.

Languages are sampled with probability proportional to ``n_k ** alpha`` (``n_k`` = the language's
training examples; alpha = 0.7 smooths towards small languages), independently for each slot of a
batch, so languages mix within a batch. A language with several teachers contributes either every
teacher's copy of each example (``all``) or only the copy whose teacher had the lowest loss on that
example (``best``). Batch ``i`` is drawn from a generator seeded by ``(seed, i)``: any batch can be
rebuilt from its index alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from lmalgebra.core.errors import UserInputError


def language_probabilities(counts: dict[str, int], alpha: float) -> dict[str, float]:
    """``p_k = n_k^alpha / sum_j n_j^alpha``."""
    weights = {k: float(n) ** alpha for k, n in counts.items()}
    total = sum(weights.values())
    return {k: w / total for k, w in weights.items()}


class Copies(Protocol):
    """One teacher's copy of a language's examples: ``heldout (rows,) bool`` and the teacher's
    ``loss (rows,) float`` on each example (NaN: unknown), rows aligned across teachers."""

    @property
    def heldout(self) -> np.ndarray: ...

    @property
    def loss(self) -> np.ndarray: ...


@dataclass
class LanguagePool:
    """A language's training items: which teacher's copies, which row."""

    copies: Sequence[Any]
    source: np.ndarray  # (items,) index into copies
    row: np.ndarray  # (items,) row within that copy set
    examples: int


def language_pool(
    copies: Sequence[Copies], mode: Literal["all", "best"], lang: str
) -> LanguagePool:
    """The training items of a language with ``copies`` (one per teacher) in ``mode``."""
    train = [np.flatnonzero(~c.heldout) for c in copies]
    if not train[0].size:
        raise UserInputError(f"language {lang!r} has no training example (all held out)")
    if mode == "all" or len(copies) == 1:
        source = np.concatenate([np.full(len(rows), i) for i, rows in enumerate(train)])
        return LanguagePool(copies, source, np.concatenate(train), len(train[0]))
    # best: copies are row-aligned (the same examples in the same order for every teacher)
    losses = np.stack([np.nan_to_num(c.loss[train[0]], nan=np.inf) for c in copies])
    return LanguagePool(copies, np.argmin(losses, axis=0), train[0], len(train[0]))


class SampledLanguages:
    """Languages drawn per batch slot with the smoothed probabilities; items of each language's
    pool drawn uniformly. Batch ``index``'s draw depends on ``(seed, index)`` alone."""

    def __init__(
        self,
        languages: list[str],
        pools: list[LanguagePool],
        batch_size: int,
        alpha: float,
        seed: int,
    ):
        self.languages, self.pools = languages, pools
        counts = {lang: p.examples for lang, p in zip(self.languages, self.pools, strict=True)}
        self.probabilities = language_probabilities(counts, alpha)
        self._p = np.array([self.probabilities[lang] for lang in self.languages])
        self.batch_size, self.seed = batch_size, seed

    def draw(self, index: int) -> list[tuple[int, int]]:
        """``(language, item)`` pairs of batch ``index``."""
        rng = np.random.default_rng([self.seed, index])
        langs = rng.choice(len(self.languages), size=self.batch_size, p=self._p)
        return [(int(k), int(rng.integers(len(self.pools[k].row)))) for k in langs]
