"""How a UPOS evaluation runs (``PosOptions``), and what ``lmalgebra evaluate-pos`` reads
(``PosSpec``: the models, the mode and where results go, besides the options)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings, refuse_ignored, setting
from lmalgebra.sources.models import ModelRef

Mode = Literal["probe", "finetune"]
# each mode's epochs and learning rate where none is given
MODE_DEFAULTS: dict[str, tuple[int, float]] = {"probe": (30, 1e-2), "finetune": (3, 5e-5)}
_MAX_LR = 3.4e37  # a tenth of float32's largest: torch's AdamW raised an overflow beyond it


def refuse_repeated_names(names: Sequence[str]) -> None:
    """Refuse two models of one name: an evaluation keys its results, its record and its
    resumption by name, so the second would be kept as the first's."""
    repeated = sorted({n for n in names if list(names).count(n) > 1})
    if repeated:
        raise UserInputError(
            f"model names must be unique; repeated: {', '.join(repeated)} (name each model: "
            "--models NAME=REFERENCE)"
        )


class PosOptions(Settings):
    """How one evaluation runs; ``None`` epochs/lr take the mode's default."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    layer: int = Field(default=-1, description="Hidden layer (0 embeddings, -1 the last).")
    epochs: int | None = Field(default=None, description="Most epochs (probe 30, finetune 3).")
    lr: float | None = Field(
        default=None, description="AdamW learning rate (probe 1e-2, finetune 5e-5)."
    )
    patience: int = Field(
        default=3, description="Stop after this many epochs without a better dev accuracy."
    )
    batch_size: int = Field(default=32, description="Sentences per forward pass.")
    probe_batch_words: int = Field(default=256, description="Words per probe optimisation step.")
    max_train_sentences: int | None = Field(
        default=None, description="A seeded sample of train, kept in file order."
    )
    max_eval_sentences: int | None = Field(
        default=None, description="The first this many sentences of dev and of test."
    )
    max_length: int | None = Field(
        default=None, description="Subwords per sentence (default: the model's limit)."
    )
    seed: int = Field(default=0, description="Seed.")
    progress: bool = Field(default=True, description="Progress bars (in a log: a line a minute).")

    @model_validator(mode="after")
    def _check(self) -> PosOptions:
        for name in type(self).model_fields:
            value = getattr(self, name)
            if type(value) is int and name not in ("layer", "seed") and value < 1:
                raise UserInputError(f"POS evaluation: {name} must be at least 1, got {value}")
        if self.lr is not None and not 0 < self.lr <= _MAX_LR:
            raise UserInputError(
                f"POS evaluation: lr must be positive and at most {_MAX_LR:g} (AdamW's first "
                f"step, ten times lr, steps float32 weights), got {self.lr:g}"
            )
        return self


class PosSpec(PosOptions):
    """``lmalgebra evaluate-pos``: which models, how, where the results go."""

    models: list[ModelRef] = Field(
        description="[NAME=][random:]PATH_OR_HUB_ID[@REVISION] of each model to evaluate."
    )
    mode: Mode = Field(
        default="probe", description="probe (frozen states) or finetune (the whole encoder)."
    )
    out: Path = Field(default=Path("pos-output"), description="Output directory.")
    overwrite: bool = Field(
        default=False,
        description="Replace an evaluation of other treebank files, models, mode or options in "
        "the output directory (its files only).",
    )

    @model_validator(mode="after")
    def _check_mode(self) -> PosSpec:
        refuse_repeated_names([ref.name for ref in self.models])
        if self.mode == "finetune":  # no probe is fitted
            refuse_ignored(self, setting(""), {"probe_batch_words": f"{setting('mode')} probe"})
        epochs = self.epochs or MODE_DEFAULTS[self.mode][0]
        if epochs <= self.patience:  # the run ends before so many epochs can pass unimproved
            runs = (
                f"runs of more than {self.patience} epochs (this one has {epochs}: "
                f"{setting('epochs')})"
            )
            refuse_ignored(self, setting(""), {"patience": runs})
        return self

    def options(self) -> PosOptions:
        """The evaluation's options (the fields of ``PosOptions``)."""
        return PosOptions(**self.model_dump(include=set(PosOptions.model_fields)))
