"""What a decomposition run studies beyond its main fits: sweeps, intervals, alpha choice, nulls."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings, refuse_ignored
from lmalgebra.stats.choices import MAX_REPLICATES, default_alpha_grid

AlphaSelect = Literal["fixed", "gcv", "kfold", "validation"]


class StudySpec(Settings):
    """Optional studies; everything is computed from the same one-pass statistics."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    lengths: list[int] | None = Field(
        default=None, description="Sweep span length T over these values (tokens)."
    )
    layers: bool = Field(
        default=False, description="Sweep every hidden layer of each target against the basis."
    )
    layer_map: list[str] | None = Field(
        default=None,
        description="Two model names: R^2 of every layer of one from every layer of the other.",
    )
    train_sizes: list[int] | None = Field(
        default=None, description="Learning curve: training-set sizes (spans)."
    )
    languages: bool = Field(
        default=False, description="Per-language results (LANG=PATH corpora or language_column)."
    )
    blocks: int = Field(
        default=32, ge=2, description="Blocks of spans per split kept for resampling."
    )
    bootstrap: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICATES,
        description=f"Bootstrap replicates (0 = no intervals; {MAX_REPLICATES:,} at most).",
    )
    level: float = Field(default=0.95, description="Confidence level of the intervals.")
    alpha_select: AlphaSelect = Field(
        default="fixed",
        description="fixed: use alpha; gcv | kfold | validation: choose it over alpha_grid.",
    )
    alpha_grid: list[float] = Field(
        default_factory=default_alpha_grid, description="Candidate alphas for alpha_select."
    )
    folds: int = Field(default=5, description="Folds (groups of training blocks) for kfold.")
    nulls: bool = Field(
        default=False, description="Also embed random-initialised copies of every model (nulls)."
    )
    null_seed: int = Field(
        default=12345, description="Seed of the random initialisation of the null copies."
    )
    attribution: bool = Field(
        default=False, description="Greedy, drop-one and Shapley attribution of each group fit."
    )
    attribution_split: Literal["validation", "test"] = Field(
        default="validation", description="Held-out split whose R^2 the attribution uses."
    )
    seed: int = Field(default=0, description="Seed of bootstrap and sampled Shapley values.")
    similarity: bool = Field(
        default=True,
        description="Linear CKA and mean CCA of every pair next to LMD (similarity.csv): an "
        "eigendecomposition per model and split, minutes each at widths of thousands.",
    )

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        if self.lengths is not None:
            if not self.lengths:
                raise UserInputError("study.lengths: the list of span lengths T is empty")
            bad = [t for t in self.lengths if t < 1]
            if bad:
                raise UserInputError(f"study.lengths: span length T must be >= 1, got {bad[0]}")
        if self.train_sizes is not None:
            if not self.train_sizes:
                raise UserInputError("study.train_sizes: the list of training-set sizes is empty")
            if any(s < 2 for s in self.train_sizes):
                raise UserInputError(
                    f"study.train_sizes: training-set sizes must be >= 2, got {self.train_sizes}"
                )
        if self.layer_map is not None and len(self.layer_map) != 2:
            raise UserInputError(f"study.layer_map names two models, got {self.layer_map}")
        if self.layer_map is not None and self.layer_map[0] == self.layer_map[1]:
            raise UserInputError(
                f"layer_map names {self.layer_map[0]!r} twice: it maps the layers of one model "
                "from those of another; name two models"
            )
        if not 0 < self.level < 1:
            raise UserInputError(
                f"study.level: confidence level must be in (0, 1), got {self.level}"
            )
        if not self.alpha_grid:
            raise UserInputError("study.alpha_grid: the alpha grid is empty")
        bad_alpha = [a for a in self.alpha_grid if not (a > 0 and math.isfinite(a))]
        if bad_alpha:
            raise UserInputError(
                f"study.alpha_grid: alpha grid values must be finite and > 0, got {bad_alpha[0]}"
            )
        unused = {
            "folds": "--study.alpha_select kfold",
            "level": "--study.bootstrap intervals",
            "blocks": "--study.bootstrap and --study.alpha_select kfold",
            "alpha_grid": "--study.alpha_select gcv, kfold or validation",
            "null_seed": "--study.nulls",
            "attribution_split": "--study.attribution",
            "seed": "--study.bootstrap and --study.attribution",
        }
        applies = {
            "folds": self.alpha_select == "kfold",
            "level": self.bootstrap > 0,
            "blocks": self.keeps_blocks,
            "alpha_grid": self.alpha_select != "fixed",
            "null_seed": self.nulls,
            "attribution_split": self.attribution,
            "seed": self.bootstrap > 0 or self.attribution,
        }
        refuse_ignored(self, "--study.", {k: v for k, v in unused.items() if not applies[k]})
        if self.alpha_select == "kfold" and not 2 <= self.folds <= self.blocks:
            raise UserInputError(
                f"folds must be between 2 and blocks ({self.blocks}), got {self.folds}"
            )
        return self

    @property
    def keeps_blocks(self) -> bool:
        """Whether per-block statistics are needed (intervals or k-fold)."""
        return self.bootstrap > 0 or self.alpha_select == "kfold"
