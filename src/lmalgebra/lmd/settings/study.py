"""What a decomposition run studies beyond its main fits: sweeps, intervals, alpha choice, nulls."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings, refuse_ignored, section_key
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

    @field_validator("lengths")
    @classmethod
    def _lengths(cls, lengths: list[int] | None) -> list[int] | None:
        if lengths is not None and not lengths:
            raise PydanticCustomError("empty", "the list of span lengths T is empty")
        if lengths is not None and min(lengths) < 1:
            raise PydanticCustomError("length", f"span length T must be >= 1, got {min(lengths)}")
        return lengths

    @field_validator("train_sizes")
    @classmethod
    def _train_sizes(cls, sizes: list[int] | None) -> list[int] | None:
        if sizes is not None and not sizes:
            raise PydanticCustomError("empty", "the list of training-set sizes is empty")
        if sizes is not None and min(sizes) < 2:
            raise PydanticCustomError("size", f"training-set sizes must be >= 2, got {sizes}")
        return sizes

    @field_validator("layer_map")
    @classmethod
    def _layer_map(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and len(names) != 2:
            raise PydanticCustomError("layer_map", f"layer_map names two models, got {names}")
        if names is not None and names[0] == names[1]:
            raise PydanticCustomError(
                "layer_map",
                f"layer_map names {names[0]!r} twice: it maps the layers of one model from "
                "those of another; name two models",
            )
        return names

    @field_validator("level")
    @classmethod
    def _level(cls, level: float) -> float:
        if not 0 < level < 1:
            raise PydanticCustomError("level", "confidence level must be in (0, 1)")
        return level

    @field_validator("alpha_grid")
    @classmethod
    def _alpha_grid(cls, grid: list[float]) -> list[float]:
        if not grid:
            raise PydanticCustomError("empty", "the alpha grid is empty")
        bad = [a for a in grid if not (a > 0 and math.isfinite(a))]
        if bad:
            raise PydanticCustomError(
                "alpha", f"alpha grid values must be finite and > 0, got {bad[0]}"
            )
        return grid

    @model_validator(mode="after")
    def _check(self) -> StudySpec:
        study = section_key(StudySpec, "study.")
        unused = {
            "folds": f"{study}alpha_select kfold",
            "level": f"{study}bootstrap intervals",
            "blocks": f"{study}bootstrap and {study}alpha_select kfold",
            "alpha_grid": f"{study}alpha_select gcv, kfold or validation",
            "null_seed": f"{study}nulls",
            "attribution_split": f"{study}attribution",
            "seed": f"{study}bootstrap and {study}attribution",
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
        refuse_ignored(self, study, {k: v for k, v in unused.items() if not applies[k]})
        if self.alpha_select == "kfold" and not 2 <= self.folds <= self.blocks:
            raise UserInputError(
                f"{study}folds must be between 2 and {study}blocks ({self.blocks}), "
                f"got {self.folds}"
            )
        return self

    @property
    def keeps_blocks(self) -> bool:
        """Whether per-block statistics are needed (intervals or k-fold)."""
        return self.bootstrap > 0 or self.alpha_select == "kfold"
