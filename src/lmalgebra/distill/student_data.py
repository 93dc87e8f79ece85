"""Student training data from the teacher store: language sampling and multi-teacher modes.

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
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.store_view import TeacherCopies, load_copies
from lmalgebra.distill.vocab_union import UnionVocab
from lmalgebra.train.batches import Batch


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


class StoreBatches(SampledLanguages):
    """Batches of student-id copies from a run directory's store."""

    def __init__(
        self,
        run_dir: Path,
        teachers_of: dict[str, list[str]],
        vocab: UnionVocab,
        batch_size: int,
        alpha: float,
        mode: Literal["all", "best"],
        seed: int,
    ):
        pools = [
            language_pool([load_copies(run_dir, lang, t, vocab) for t in teachers], mode, lang)
            for lang, teachers in teachers_of.items()
        ]
        super().__init__(list(teachers_of), pools, batch_size, alpha, seed)

    def batch(self, index: int) -> Batch:
        slots = []
        for lang, item in self.draw(index):
            pool = self.pools[lang]
            slots.append((lang, pool.copies[pool.source[item]], int(pool.row[item])))
        return _collate(slots, len(self.languages))


def _collate(slots: list[tuple[int, TeacherCopies, int]], n_languages: int) -> Batch:
    width = max(int(c.token_offsets[r + 1] - c.token_offsets[r]) for _, c, r in slots)
    ids = torch.zeros((len(slots), width), dtype=torch.long)  # student [PAD] is id 0
    attention = torch.zeros((len(slots), width), dtype=torch.long)
    rows, cols, labels, langs, top_ids, top_lp = [], [], [], [], [], []
    tokens = torch.zeros(n_languages, dtype=torch.long)
    for b, (lang, c, r) in enumerate(slots):
        t0, t1 = c.token_offsets[r], c.token_offsets[r + 1]
        m0, m1 = c.mask_offsets[r], c.mask_offsets[r + 1]
        ids[b, : t1 - t0] = torch.from_numpy(c.input_ids[t0:t1])
        attention[b, : t1 - t0] = 1
        tokens[lang] += int(t1 - t0)
        rows.append(np.full(m1 - m0, b))
        cols.append(c.positions[m0:m1])
        labels.append(c.labels[m0:m1])
        langs.append(np.full(m1 - m0, lang))
        top_ids.append(c.topk_ids[m0:m1])
        top_lp.append(c.topk_logprobs[m0:m1])
    return Batch(
        input_ids=ids,
        attention_mask=attention,
        rows=torch.from_numpy(np.concatenate(rows)).long(),
        cols=torch.from_numpy(np.concatenate(cols)).long(),
        labels=torch.from_numpy(np.concatenate(labels)).long(),
        language=torch.from_numpy(np.concatenate(langs)).long(),
        tokens=tokens,
        topk_ids=torch.from_numpy(np.concatenate(top_ids)).long(),
        topk_logprobs=torch.from_numpy(np.concatenate(top_lp)).float(),
    )
