"""How a decomposition scales to wide studies: exact or reduced statistics, their precision, and
the memory the run may take (the recipe's ``scale:`` block)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings, refuse_ignored, section_key
from lmalgebra.stats.choices import PROBES, Precision

Method = Literal["exact", "reduced", "sketch"]
DEFAULT_RETAINED = 0.99  # the reduced method's share of variance when no k is given


class ScaleSpec(Settings):
    """The statistics' method and size; every field is a key of the recipe's ``scale:`` block."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    method: Method = Field(
        default="exact",
        description="exact: second moments of all D columns (D x D per split); reduced: each "
        "model's k leading principal coordinates, from its own covariance (two passes over the "
        "embeddings); sketch: the same from a one-pass randomised sketch of each model's "
        "covariance (no d x d matrix).",
    )
    components: int | None = Field(
        default=None,
        ge=1,
        description="k, the principal coordinates kept per model (reduced, sketch); with "
        "retained, the most kept. The sketch's size is k plus oversampling.",
    )
    retained: float | None = Field(
        default=None,
        description="Share of each model's training variance its k coordinates keep: k is the "
        f"fewest that do (reduced: {DEFAULT_RETAINED} when components is not given).",
    )
    probes: int = Field(
        default=PROBES,
        ge=0,
        description="Random probes of each reduced model's left-out variance, kept as target-only "
        "columns so that a target's R^2 covers all its dimensions (0: targets are their k "
        "coordinates alone).",
    )
    precision: Precision = Field(
        default="float64",
        description="dtype of the D x D statistics and of the inverse: float64, or float32 (half "
        "the memory; its effect on R^2 is measured in bench/bench_wide.py).",
    )
    memory_gib: float | None = Field(
        default=None,
        gt=0,
        description="Memory the run may use, in GiB, for its plan: a run planned above it is "
        "refused before any embedding. Default: the memory available now.",
    )
    seed: int = Field(default=0, description="Seed of the random subspaces, sketches and probes.")

    @model_validator(mode="after")
    def _check(self) -> ScaleSpec:
        scale = section_key(ScaleSpec, "scale.")
        if self.retained is not None and not 0 < self.retained <= 1:
            raise UserInputError(f"{scale}retained must be in (0, 1], got {self.retained}")
        if self.method == "exact" and (self.components or self.retained):
            raise UserInputError(
                f"{scale}components and {scale}retained choose k for the reduced and sketch "
                f"methods; the exact method keeps every column (set {scale}method)"
            )
        if not self.reduced:
            method = f"{scale}method reduced or sketch"
            refuse_ignored(self, scale, {"probes": method, "seed": method})
        if self.method == "sketch" and self.components is None:
            raise UserInputError(
                f"the sketch method needs {scale}components (k: the sketch holds k plus "
                "oversampling columns per model)"
            )
        return self

    @property
    def reduced(self) -> bool:
        return self.method != "exact"

    def choice(self) -> tuple[int | None, float | None]:
        """``(components, retained)`` as the reduction uses them (the default share filled in)."""
        if self.method == "reduced" and self.components is None and self.retained is None:
            return None, DEFAULT_RETAINED
        return self.components, self.retained
