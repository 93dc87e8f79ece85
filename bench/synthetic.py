"""Synthetic embeddings of M related models, shared by the LMD benchmarks.

Deterministic per row block, so any split and row range can be regenerated without storing it:
a latent shared by every model (decaying spectrum), a latent per family of models (m mod 3), a
private latent per model, isotropic noise and large per-coordinate offsets (with outliers), so
pairwise R^2 ranges from about 0 to high and the shift of the statistics matters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmalgebra.core.splits import SPLITS


@dataclass(frozen=True)
class Synthetic:
    """Generator of M models' embeddings of the same spans, deterministic per row block."""

    models: int
    dim: int
    seed: int = 0
    latent: int = 128  # shared by every model, with a decaying spectrum
    families: int = 3  # models m, m + 3, m + 6, ... share a family latent
    family_latent: int = 32
    private: int = 64  # each model's own latent

    def names(self) -> list[str]:
        return [f"model{m:02d}" for m in range(self.models)]

    def _params(self, m: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, 7, m])
        offset = rng.normal(0.0, 2.0, self.dim)
        offset[rng.choice(self.dim, 3, replace=False)] += rng.choice([-1, 1], 3) * 25.0
        return {
            "shared": rng.standard_normal((self.latent, self.dim))
            * rng.uniform(1.0, 2.0)
            / math.sqrt(self.latent),
            "family": rng.standard_normal((self.family_latent, self.dim))
            * rng.uniform(0.3, 1.2)
            / math.sqrt(self.family_latent),
            "private": rng.standard_normal((self.private, self.dim))
            * rng.uniform(0.2, 1.0)
            / math.sqrt(self.private),
            "noise": rng.uniform(0.05, 0.3),
            "offset": offset,
        }

    def rows(self, m: int, split: str, start: int, count: int) -> np.ndarray:
        """``(count, dim) float32`` embeddings by model ``m`` of rows ``[start, start+count)``."""
        p = self._params(m)
        shared_rng = np.random.default_rng([self.seed, 1000 + SPLITS.index(split), start])
        spectrum = 1 / np.sqrt(1 + np.arange(self.latent) / 8)
        z = shared_rng.standard_normal((count, self.latent)) * spectrum
        fam = shared_rng.standard_normal((count, self.families, self.family_latent))
        own_rng = np.random.default_rng([self.seed, 2000 + SPLITS.index(split), start, m])
        x = z @ p["shared"] + fam[:, m % self.families] @ p["family"]
        x += own_rng.standard_normal((count, self.private)) @ p["private"]
        x += p["noise"] * own_rng.standard_normal((count, self.dim))
        x += p["offset"]
        return x.astype(np.float32)

    def all_rows(self, split: str, start: int, count: int) -> np.ndarray:
        """``(count, models * dim) float32``: every model's rows, concatenated in model order."""
        return np.hstack([self.rows(m, split, start, count) for m in range(self.models)])


def split_sizes(n_train: int) -> dict[str, int]:
    held_out = max(1, n_train // 10)
    return {"train": n_train, "validation": held_out, "test": held_out}
