"""Synthetic embeddings of many wide models with realistic spectra, written as precomputed files.

Each model's rows (``width`` columns, float32) are, per span:

- a latent shared by every model (``width / 8`` dimensions), a latent shared by its family
  (models ``m``, ``m + 3``, ...; ``width / 16``) and a private latent (``width / 8``), each with
  a power-law spectrum (variance of latent direction ``i`` proportional to ``i^-decay``, 1 by
  default: the middle of the spectrum measured on MiniLM's pooled embeddings decays as
  ``i^-1.0``), mixed into the model's columns by a random map of its own: shared subspaces seen
  in another basis by each model;
- a noise floor over every column with a power-law profile over the columns (``floor`` of the
  variance), so the spectrum has no cliff and every column varies;
- a few rogue columns with large variance and offset (``rogue`` per model), as pooled LLM states
  have, and a per-column offset.

Rows are generated block by block (``BLOCK`` rows, seeded by split, block and model), so any
model's file is written on its own, streamed, with the same shared latents as the others'.
Files are ``.npy`` with the run's order digest beside them (``FILE.spans.sha256``), the form
``lmalgebra decompose --models NAME=precomputed:FILE`` takes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.splits import SPLITS

BLOCK = 4096  # rows generated at once: a 4,096-wide block of float32 is 64 MiB
FAMILIES = 3
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "ta", "vi", "zo", "be", "du", "fa", "go", "hi", "pe"]


@dataclass(frozen=True)
class WideSpectra:
    """Generator of ``models`` related models of ``width`` columns (see the module)."""

    models: int
    width: int
    seed: int = 0
    decay: float = 1.0
    floor: float = 0.02
    rogue: int = 3

    @property
    def latents(self) -> tuple[int, int, int]:
        """Shared, family and private latent dimensions."""
        return max(4, self.width // 8), max(2, self.width // 16), max(4, self.width // 8)

    def names(self) -> list[str]:
        return [f"m{m:02d}" for m in range(self.models)]

    def _spectrum(self, size: int) -> np.ndarray:
        return (1.0 + np.arange(size)) ** (-self.decay / 2)  # standard deviations

    def _model(self, m: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, 7, m])
        shared, family, private = self.latents
        maps = {
            name: (rng.standard_normal((size, self.width)) * scale / math.sqrt(size)).astype(
                np.float32
            )
            for name, size, scale in (
                ("shared", shared, rng.uniform(0.8, 1.2) * math.sqrt(shared / 8)),
                ("family", family, rng.uniform(0.4, 0.8) * math.sqrt(family / 8)),
                ("private", private, rng.uniform(0.4, 0.8) * math.sqrt(private / 8)),
            )
        }
        latent_variance = sum(float((m_**2).sum()) for m_ in maps.values()) / self.width
        profile = self._spectrum(self.width)[rng.permutation(self.width)]
        profile *= math.sqrt(self.floor / (1 - self.floor) * latent_variance / np.mean(profile**2))
        offset = rng.normal(0.0, 1.0, self.width)
        rogue = rng.choice(self.width, self.rogue, replace=False)
        offset[rogue] += rng.choice([-1, 1], self.rogue) * 20.0
        boost = np.ones(self.width)
        boost[rogue] = 4.0
        return {**maps, "profile": profile, "offset": offset, "boost": boost}

    def rows(self, m: int, split: str, block: int, count: int) -> np.ndarray:
        """``(count, width) float32``: model ``m``'s rows of block ``block`` of ``split``."""
        p = self._model(m)
        shared, family, private = self.latents
        common = np.random.default_rng([self.seed, 100 + SPLITS.index(split), block])
        single = np.float32
        z = (common.standard_normal((count, shared)) * self._spectrum(shared)).astype(single)
        families = common.standard_normal((count, FAMILIES, family)) * self._spectrum(family)
        own = np.random.default_rng([self.seed, 200 + SPLITS.index(split), block, m])
        x = z @ p["shared"] + families[:, m % FAMILIES].astype(single) @ p["family"]
        latent = own.standard_normal((count, private)) * self._spectrum(private)
        x += latent.astype(single) @ p["private"]
        x *= p["boost"].astype(single)
        noise = own.standard_normal((count, self.width), dtype=single)
        x += noise * p["profile"].astype(single) + p["offset"].astype(single)
        return x

    def write(self, m: int, path: Path, counts: dict[str, int], digest: str) -> Path:
        """Model ``m``'s rows of every split, in order, streamed into ``path`` (``.npy``)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        total = sum(counts[s] for s in SPLITS)
        array = np.lib.format.open_memmap(path, "w+", np.float32, (total, self.width))
        start = 0
        for split in SPLITS:
            for block, first in enumerate(range(0, counts[split], BLOCK)):
                count = min(BLOCK, counts[split] - first)
                array[start + first : start + first + count] = self.rows(m, split, block, count)
            start += counts[split]
        array.flush()
        del array
        path.with_name(path.name + ".spans.sha256").write_text(digest + "\n")
        return path


def corpus(documents: int, words: int, seed: int = 0) -> list[str]:
    """Documents of pseudo-words (two or three syllables), enough text for many spans."""
    rng = random.Random(seed)
    vocabulary = [
        "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))) for _ in range(3000)
    ]
    return [" ".join(rng.choices(vocabulary, k=words)) + "." for _ in range(documents)]
