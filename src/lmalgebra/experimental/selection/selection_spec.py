"""The settings of a teacher selection (``lmalgebra experimental select``, ``select_teachers``),
apart from the selection itself: the command line builds its flags without importing torch."""

from __future__ import annotations

from pathlib import Path

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings, refuse_ignored
from lmalgebra.lmd.settings.spans import HeldOutSpans
from lmalgebra.stats.choices import MAX_REPLICATES
from lmalgebra.storage.output_paths import default_cache_dir


class SelectionSpec(Settings):
    """How teachers are compared (``lmalgebra experimental select``, ``select_teachers``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    size: int = Field(default=2, ge=1, description="Teachers per set.")
    languages: list[str] | None = Field(
        default=None, description="Only these languages (default: every language of the recipe)."
    )
    spans: HeldOutSpans = Field(
        default_factory=HeldOutSpans, description="Spans cut from each language's held-out text."
    )
    max_texts: int | None = Field(
        default=None, ge=1, description="Held-out examples per language (default: all)."
    )
    alpha: float = Field(default=0.01, description="Ridge strength (relative).")
    bootstrap: int = Field(
        default=1000,
        ge=0,
        le=MAX_REPLICATES,
        description=f"Bootstrap replicates ({MAX_REPLICATES:,} at most).",
    )
    level: float = Field(default=0.95, gt=0, lt=1, description="Confidence level of intervals.")
    seed: int = Field(default=0, description="Seed of the bootstrap.")
    batch_size: int = Field(default=32, ge=1, description="Spans per forward pass.")
    progress: bool = Field(default=True, description="Progress bars (in a log: a line a minute).")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Cache root for everything the command caches: embeddings, spans, hashes, "
        "packaged and dequantised GGUF models ($LMALGEBRA_CACHE, else ~/.cache/lmalgebra).",
    )

    @model_validator(mode="after")
    def _check(self) -> SelectionSpec:
        if self.languages is not None and not self.languages:  # had been every language
            raise UserInputError(
                "--languages (languages) names no language: name those to compare teachers "
                "for, or leave it out for every language of the recipe"
            )
        # named as keys, the flags' names and the call's keywords alike (--bootstrap, bootstrap=)
        if self.size == 1:  # a set of one has complementarity 1 in every replicate
            sets = "sets of two or more teachers (size above 1)"
            # bootstrap 0 asks for no interval, which a set of one gets: not ignored
            unused = ("bootstrap", "level", "seed") if self.bootstrap else ("level", "seed")
            refuse_ignored(self, "", dict.fromkeys(unused, sets))
        if self.bootstrap == 0:  # no interval is drawn: its level and seed would do nothing
            refuse_ignored(self, "", dict.fromkeys(("level", "seed"), "a bootstrap above 0"))
        return self
