"""Training settings: optimisation (every run, a teacher's pre-training included), a student's
distillation settings (``TrainingSpec``), and a causal student's mix of cross-tokenizer losses
(``CausalTrainingSpec``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings
from lmalgebra.train.schedules import LambdaSchedule

OBJECTIVE_LOSSES = ("ce", "mined_kl", "uld", "alm", "sampled")
# what weighs and shapes the distillation term: nothing of it is read without one
KD_SETTINGS = ("lambda_schedule", "lambda_value", "temperature")


class OptimisationSpec(Settings):
    """Optimisation, data order and bookkeeping of one training run: what every run has, a
    teacher's pre-training included."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    steps: int = Field(
        default=1000,
        ge=0,
        description="Optimizer steps; 0 saves the model as it starts (untrained: the floor a "
        "trained one is compared with).",
    )
    batch_size: int = Field(default=32, ge=1, description="Examples per micro-batch.")
    grad_accum: int = Field(default=1, ge=1, description="Micro-batches per optimizer step.")
    lr: float = Field(default=5e-4, gt=0, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(
        default=100, ge=0, description="Linear warm-up steps, then linear decay."
    )
    weight_decay: float = Field(
        default=0.01, ge=0, description="AdamW weight decay (not on biases/norms)."
    )
    max_grad_norm: float = Field(default=1.0, gt=0, description="Gradient clipping norm.")
    seed: int = Field(default=0, description="Seed of initialisation, dropout and data order.")
    log_every: int = Field(default=10, ge=1, description="Steps between log lines.")
    checkpoint_every: int = Field(default=200, ge=1, description="Steps between checkpoints.")
    keep_checkpoints: int = Field(
        default=2,
        ge=0,
        description="Checkpoints kept, the newest; 0 keeps one while training and removes it "
        "once the model is saved (no disk left behind; a finished run can then no longer be "
        "continued with more steps).",
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = Field(
        default="no",
        description="Accelerate mixed precision: no (float32), bf16 (refused where the hardware "
        "has no native bfloat16, unless LMALGEBRA_ALLOW_SLOW_BF16=1), fp16 (refused off a GPU).",
    )
    dropout_masks: Literal["lanes", "torch"] = Field(
        default="lanes",
        description="Where the model's dropout modules draw their masks when training on the "
        "CPU: lanes (four 16-bit lanes of one 64-bit draw per four elements, 1.9x faster "
        "forward and backward; "
        "drop probability within 7.7e-6 of p) or torch (its dropout, one Bernoulli draw per "
        "element). Other devices always use torch's.",
    )


class TrainingSpec(OptimisationSpec):
    """A student's training: optimisation, and the distillation weight, temperature and data
    mix."""

    lambda_schedule: LambdaSchedule = Field(
        default="linear",
        description="KD weight: constant, linear 1->0 (teacher annealing), cosine 1->0.",
    )
    lambda_value: float = Field(default=0.5, description="KD weight for the constant schedule.")
    temperature: float = Field(default=1.0, gt=0, description="Softmax temperature of the KD term.")
    sampling_exponent: float = Field(
        default=0.7,
        ge=0,
        le=1,
        description="Language sampling: p_k ~ n_k^sampling_exponent (the paper's alpha; "
        "1 = proportional to data, 0 = uniform).",
    )
    multi_teacher: Literal["all", "best"] = Field(
        default="all",
        description="Several teachers for a language: every copy, or the lowest-loss one.",
    )
    gold_only: bool = Field(default=False, description="Train on gold labels only (no KD).")
    teachers: list[str] | None = Field(
        default=None,
        description="Distil from these of the recipe's teachers only (the same store; e.g. one "
        "teacher's student beside the merge of all); every language keeps at least one. "
        "None: every teacher.",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        if not 0 <= self.lambda_value <= 1:
            raise UserInputError(f"lambda_value must be in [0, 1], got {self.lambda_value}")
        default = type(self).model_fields["lambda_value"].default
        if self.lambda_schedule != "constant" and self.lambda_value != default:
            raise UserInputError(
                f"training.lambda_value {self.lambda_value:g} would be ignored: the "
                f"{self.lambda_schedule} lambda_schedule anneals the KD weight from 1 to 0; set "
                "lambda_schedule: constant to use it"
            )
        if self.teachers is not None and not self.teachers:
            raise UserInputError(
                "training.teachers is empty: name at least one teacher, or omit it"
            )
        if self.gold_only:
            without_kd(self, "training.gold_only: true")
        return self

    @classmethod
    def gold(cls, optimisation: OptimisationSpec) -> TrainingSpec:
        """A run on gold labels alone (a teacher's pre-training) with ``optimisation``."""
        return cls(**optimisation.model_dump(), gold_only=True)


class CausalTrainingSpec(TrainingSpec):
    """A causal student's training: the settings of every run, and its mix of losses."""

    objective_mix: dict[str, float] | None = Field(
        default=None,
        description="Causal students: weight of each loss, among ce (alone: the CE-only "
        "baseline), mined_kl, uld, alm and sampled; loss = (1 - lambda) * CE + lambda * "
        "sum of weight * loss against the example's teacher. None: {alm: 1}. mined_kl and uld "
        "are experimental: worse than CE alone in the recorded runs (docs/merge/causal.md, "
        '"Recorded causal demo run").',
    )

    @model_validator(mode="after")
    def _check_mix(self) -> CausalTrainingSpec:
        if self.objective_mix is None:
            return self
        for name, weight in self.objective_mix.items():
            if name not in OBJECTIVE_LOSSES:
                raise UserInputError(
                    f"training.objective_mix: unknown loss {name!r}; "
                    f"losses are {', '.join(OBJECTIVE_LOSSES)}"
                )
            if weight < 0:
                raise UserInputError(f"training.objective_mix: {name} weight {weight} is below 0")
        if not self.objective_mix or sum(self.objective_mix.values()) <= 0:
            raise UserInputError("training.objective_mix: give at least one positive weight")
        if "ce" in self.objective_mix and len(self.objective_mix) > 1:
            raise UserInputError(
                "training.objective_mix: ce stands alone (the CE-only baseline); the "
                "distillation losses are always added to CE by the lambda schedule"
            )
        if self.gold_only:
            raise UserInputError(
                "training.objective_mix would be ignored: training.gold_only: true trains on "
                "gold labels alone; give one of them"
            )
        if "ce" in self.objective_mix:
            without_kd(self, "training.objective_mix {ce} (the CE-only baseline)")
        return self


def without_kd(spec: TrainingSpec, why: str) -> None:
    """Refuse a distillation setting (``KD_SETTINGS``) other than its default in a run that
    distils nothing (``why`` names what makes it so): it would be ignored."""
    fields = type(spec).model_fields
    for name in KD_SETTINGS:
        value = getattr(spec, name)
        if value != fields[name].get_default(call_default_factory=True):
            raise UserInputError(
                f"training.{name} {value!r} would be ignored under {why}: it shapes the "
                "distillation term, and this run distils nothing; leave it out"
            )


def kd_free(training: dict[str, Any]) -> bool:
    """Whether a run of these training settings (a mapping of its keys) distils nothing."""
    mix = training.get("objective_mix")
    return bool(training.get("gold_only")) or (isinstance(mix, dict) and "ce" in mix)
