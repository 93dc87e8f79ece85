"""Training settings: optimisation (every run, a teacher's pre-training included), a student's
distillation settings (``TrainingSpec``), and a causal student's mix of cross-tokenizer losses
(``CausalTrainingSpec``)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.settings import Settings, section_key, switched_on
from lmalgebra.train.schedules import LambdaSchedule

# what weighs and shapes the distillation term: nothing of it is read without one
KD_SETTINGS = ("lambda_schedule", "lambda_value", "temperature")
# below it a softmax's logits divided by the temperature overflow float32 (inf, then NaN), and
# the distribution is already its argmax
MIN_TEMPERATURE = 1e-4


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
        default=100,
        ge=0,
        description="Linear warm-up steps, then linear decay; at most steps when given (the "
        "default, above steps, is kept and warned of: the peak learning rate is not reached).",
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

    @model_validator(mode="after")
    def _warmup_within_steps(self) -> OptimisationSpec:
        # a warm-up of its own longer than the run never reaches ``lr``; the default (100 where
        # it is not derived from the steps) is kept as runs trained with it (``train`` warns)
        field = type(self).model_fields["warmup_steps"]
        default = None if field.default_factory else field.default
        if 0 < self.steps < self.warmup_steps and self.warmup_steps != default:
            key = training_key(OptimisationSpec)
            raise UserInputError(
                f"{key}warmup_steps {self.warmup_steps} exceeds {key}steps "
                f"{self.steps}: the learning rate would never reach {key}lr; use "
                f"warmup_steps <= {self.steps}"
            )
        return self


class TrainingSpec(OptimisationSpec):
    """A student's training: optimisation, and the distillation weight, temperature and data
    mix."""

    public_module: ClassVar[str | None] = "lmalgebra"

    lambda_schedule: LambdaSchedule = Field(
        default="linear",
        description="KD weight: constant, linear 1->0 (teacher annealing), cosine 1->0.",
    )
    lambda_value: float = Field(default=0.5, description="KD weight for the constant schedule.")
    temperature: float = Field(
        default=1.0,
        ge=MIN_TEMPERATURE,
        description="Softmax temperature of the KD term (1e-4 at least: the teacher's argmax).",
    )
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
    teachers: list[str] | dict[str, list[str]] | None = Field(
        default=None,
        description="Distil from these of the recipe's teachers only (the same store; e.g. one "
        "teacher's student beside the merge of all): a list for every language, or language -> "
        "its list (a language not named keeps all its teachers; e.g. {en: [smollm2], fr: "
        "[gemma]}); every language keeps at least one. None: every teacher.",
    )

    @model_validator(mode="after")
    def _check(self) -> TrainingSpec:
        key = training_key(TrainingSpec)
        if not 0 <= self.lambda_value <= 1:
            raise UserInputError(f"{key}lambda_value must be in [0, 1], got {self.lambda_value}")
        default = type(self).model_fields["lambda_value"].default
        # in a run that distils nothing, what makes it so is named (``without_kd``): a constant
        # schedule, which this refusal had offered, would not use the weight either
        idle = kd_free({"gold_only": self.gold_only, "objective_mix": self.mix_given()})
        if self.lambda_schedule != "constant" and self.lambda_value != default and not idle:
            raise UserInputError(
                f"{key}lambda_value {self.lambda_value:g} would be ignored: the "
                f"{self.lambda_schedule} lambda_schedule anneals the KD weight from 1 to 0; set "
                f"{key}lambda_schedule constant to use it"
            )
        if self.teachers is not None:
            self._check_teacher_lists(self.teachers)
        if self.gold_only:
            without_kd(self, switched_on(TrainingSpec, "training.", "gold_only"))
        weights = self.kd_weights()
        if weights is not None and not any(weights):
            self._refuse_unweighted()
        return self

    @staticmethod
    def _check_teacher_lists(teachers: list[str] | dict[str, list[str]]) -> None:
        """Refuse an empty ``training.teachers`` (or a language's empty list) and a teacher
        listed twice in one list (as ``languages.<lang>.teachers`` refuses it)."""
        own = f"{training_key(TrainingSpec)}teachers"
        if not teachers:
            raise UserInputError(f"{own} is empty: name at least one teacher, or omit it")
        lists = teachers if isinstance(teachers, dict) else {"": teachers}
        for lang, names in lists.items():
            key = f"{own}.{lang}" if lang else own
            if not names:
                raise UserInputError(f"{key} is empty: name at least one teacher")
            repeated = [name for i, name in enumerate(names) if name in names[:i]]
            if repeated:
                raise UserInputError(f"{key} lists teacher {repeated[0]!r} more than once")

    def mix_given(self) -> dict[str, float] | None:
        """The losses' mix given (a causal student's ``objective_mix``; None here)."""
        return None

    def kd_weights(self) -> list[float] | None:
        """The constant KD weights the run trains with (None: the schedule anneals it)."""
        return [self.lambda_value] if self.lambda_schedule == "constant" else None

    def kd_weights_given(self) -> str:
        """The setting that gives :meth:`kd_weights`, as a message names it."""
        key = training_key(TrainingSpec)
        return f"{key}lambda_value {self.lambda_value:g} (a constant schedule)"

    def kd_shaping(self) -> dict[str, Any]:
        """The settings of this run, other than their defaults, that shape the distillation term
        (and nothing else)."""
        default = type(self).model_fields["temperature"].default
        return {} if self.temperature == default else {"temperature": self.temperature}

    def _refuse_unweighted(self) -> None:
        """Refuse a setting that shapes the distillation term where every KD weight is 0."""
        for name, value in self.kd_shaping().items():
            raise UserInputError(
                f"{training_key(TrainingSpec)}{name} {value!r} would be ignored: "
                f"{self.kd_weights_given()} weighs "
                "the distillation term by nothing; leave it out"
            )

    @classmethod
    def gold(cls, optimisation: OptimisationSpec) -> TrainingSpec:
        """A run on gold labels alone (a teacher's pre-training) with ``optimisation``."""
        return cls(**optimisation.model_dump(), gold_only=True)


class CausalTrainingSpec(TrainingSpec):
    """A causal student's training: the settings of every run, its mix of losses, and how the
    distillation term is balanced against CE."""

    objective_mix: dict[str, float] | None = Field(
        default=None,
        description="Causal students: weight of each loss of the table "
        "(``lmalgebra.train.cross_tokenizer.LOSSES``: ce alone is the CE-only baseline; mined_kl, "
        "uld, alm, sampled, tail_kl, prefix_kl, prefix_all_kl); loss = (1 - lambda) * CE + "
        "lambda * sum of weight * loss against the example's teacher. None: {alm: 1}. mined_kl "
        "and uld are experimental: worse than CE alone in the recorded runs "
        '(docs/merge/causal.md, "Recorded causal demo run"); prefix_all_kl too: behind '
        'prefix_kl in a pilot of the merge ("The merge").',
    )
    label_smoothing: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Label smoothing of the CE term (the regularisation of soft targets without "
        "a teacher: the twin a distilled student's gain is measured beyond).",
    )
    kd_balance: Literal["lambda", "gradient"] = Field(
        default="lambda",
        description="lambda: the distillation term weighted as the lambda schedule says; "
        "gradient: scaled first to the gradient magnitude of CE on the logits (tokenkit's "
        "balancing), then weighted by lambda.",
    )

    validation_fraction: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Share of each language's training examples kept out of training to "
        "validate on (chosen by a hash of their ids: the same for every student of the run; "
        "never the held-out examples students are evaluated on).",
    )
    validation_every: int = Field(
        default=0,
        ge=0,
        description="Steps between validations (bits per byte on the validation examples); the "
        "best-scoring weights are the student. 0: no validation.",
    )
    patience: int = Field(
        default=0,
        ge=0,
        description="Stop early after this many validations in a row without improvement "
        "(0: train every step).",
    )
    lambda_candidates: list[float] | None = Field(
        default=None,
        description="Train one student per KD weight listed (constant schedule) and keep the one "
        "with the best validation score; the choice and every candidate's score are recorded.",
    )

    @model_validator(mode="after")
    def _check_validation(self) -> CausalTrainingSpec:
        key = training_key(CausalTrainingSpec)
        if (self.validation_fraction > 0) != (self.validation_every > 0):
            raise UserInputError(
                f"{key}validation_fraction and {key}validation_every go together: "
                f"got {self.validation_fraction:g} and {self.validation_every} (set both, or "
                "neither)"
            )
        if self.patience and not self.validation_every:
            raise UserInputError(
                f"{key}patience {self.patience} would be ignored: it counts validations; "
                f"set {key}validation_every and {key}validation_fraction"
            )
        checks = -(-self.steps // self.validation_every) if self.validation_every else 0
        # steps 0 keeps the model as it starts: its training section is kept as a baseline does
        if self.patience and self.steps and checks <= self.patience:
            raise UserInputError(
                f"{key}patience {self.patience} would be ignored: {key}validation_every "
                f"{self.validation_every} over {key}steps {self.steps} validates {checks} "
                f"time(s), and a run stops only after {self.patience} validations without "
                "improvement on the first; validate more often, or leave patience out"
            )
        if self.lambda_candidates is not None:
            self._check_candidates(self.lambda_candidates)
        return self

    def _check_candidates(self, candidates: list[float]) -> None:
        key = training_key(CausalTrainingSpec)
        if not candidates or any(not 0 <= c <= 1 for c in candidates):
            raise UserInputError(
                f"{key}lambda_candidates must list KD weights in [0, 1], got {candidates}"
            )
        if len(set(candidates)) != len(candidates):
            raise UserInputError(f"{key}lambda_candidates repeats a value: {candidates}")
        if not self.validation_every:
            raise UserInputError(
                f"{key}lambda_candidates are chosen on validation: set "
                f"{key}validation_every and {key}validation_fraction"
            )
        # before the schedule: under CE alone, setting the schedule would be refused in turn
        if self.gold_only or (self.objective_mix is not None and "ce" in self.objective_mix):
            raise UserInputError(
                f"{key}lambda_candidates would be ignored: CE alone has no KD weight"
            )
        if self.lambda_schedule != "constant":
            raise UserInputError(
                f"{key}lambda_candidates are constant KD weights: set {key}lambda_schedule constant"
            )

    def kd_weights(self) -> list[float] | None:
        return self.lambda_candidates or super().kd_weights()

    def kd_weights_given(self) -> str:
        if self.lambda_candidates:
            return f"{training_key(CausalTrainingSpec)}lambda_candidates {self.lambda_candidates}"
        return super().kd_weights_given()

    def mix_given(self) -> dict[str, float] | None:
        return self.objective_mix

    def kd_shaping(self) -> dict[str, Any]:
        shaping = super().kd_shaping()
        if self.kd_balance != "lambda":
            shaping["kd_balance"] = self.kd_balance
        if self.objective_mix is not None and "ce" not in self.objective_mix:
            shaping["objective_mix"] = self.objective_mix
        return shaping

    @model_validator(mode="after")
    def _check_weights(self) -> CausalTrainingSpec:
        key = training_key(CausalTrainingSpec)
        default = type(self).model_fields["lambda_value"].default
        if self.lambda_candidates is not None and self.lambda_value != default:
            raise UserInputError(
                f"{key}lambda_value {self.lambda_value:g} would be ignored: "
                f"{key}lambda_candidates gives the KD weight of each run; leave it out"
            )
        weights = self.kd_weights()
        if self.label_smoothing and weights is not None and all(w == 1 for w in weights):
            raise UserInputError(
                f"{key}label_smoothing {self.label_smoothing:g} would be ignored: "
                f"{self.kd_weights_given()} weighs the CE term it smooths by nothing; leave it out"
            )
        return self

    @model_validator(mode="after")
    def _check_mix(self) -> CausalTrainingSpec:
        key = training_key(CausalTrainingSpec)
        gold = switched_on(CausalTrainingSpec, "training.", "gold_only")
        ce_only = self.objective_mix is not None and "ce" in self.objective_mix
        if self.kd_balance != "lambda" and (self.gold_only or ce_only):
            raise UserInputError(
                f"{key}kd_balance {self.kd_balance} would be ignored: "
                f"{gold if self.gold_only else key + 'objective_mix {ce: ...}'} trains on CE "
                "alone, with no distillation term to balance"
            )
        if self.objective_mix is None:
            return self
        # the table of losses imports torch: read only when a mix is checked, so that the
        # command line parses and refuses without it
        from lmalgebra.train.cross_tokenizer.registry import LOSSES, tempered_names

        for name, weight in self.objective_mix.items():
            if name not in LOSSES:
                raise UserInputError(
                    f"{key}objective_mix: unknown loss {name!r}; losses are {', '.join(LOSSES)}"
                )
            if weight < 0:
                raise UserInputError(f"{key}objective_mix: {name} weight {weight} is below 0")
        if not self.objective_mix or sum(self.objective_mix.values()) <= 0:
            raise UserInputError(f"{key}objective_mix: give at least one positive weight")
        idle = [name for name, weight in self.objective_mix.items() if weight == 0]
        if idle:
            raise UserInputError(
                f"{key}objective_mix: {idle[0]} weight 0 would be ignored (the loss is not "
                "computed); leave it out"
            )
        if "ce" in self.objective_mix and len(self.objective_mix) > 1:
            raise UserInputError(
                f"{key}objective_mix: ce stands alone (the CE-only baseline); the "
                "distillation losses are always added to CE by the lambda schedule"
            )
        if self.gold_only:
            raise UserInputError(
                f"{key}objective_mix would be ignored: {gold} trains on gold labels alone; give "
                "one of them"
            )
        if "ce" in self.objective_mix:
            without_kd(self, f"{key}objective_mix {{ce}} (the CE-only baseline)")
        used = [n for n, w in self.objective_mix.items() if w > 0]
        default = type(self).model_fields["temperature"].default
        if self.temperature != default and not any(LOSSES[n].tempered for n in used):
            raise UserInputError(
                f"{key}temperature {self.temperature:g} would be ignored: none of "
                f"{', '.join(used)} is tempered (tempered: "
                f"{', '.join(tempered_names())})"
            )
        return self


def without_kd(spec: TrainingSpec, why: str) -> None:
    """Refuse a distillation setting (``KD_SETTINGS``) other than its default in a run that
    distils nothing (``why`` names what makes it so): it would be ignored."""
    fields = type(spec).model_fields
    for name in KD_SETTINGS:
        value = getattr(spec, name)
        if value != fields[name].get_default(call_default_factory=True):
            raise UserInputError(
                f"{training_key(TrainingSpec)}{name} {value!r} would be ignored under {why}: it "
                "shapes the "
                "distillation term, and this run distils nothing; leave it out"
            )


def kd_free(training: dict[str, Any]) -> bool:
    """Whether a run of these training settings (a mapping of its keys) distils nothing."""
    mix = training.get("objective_mix")
    return bool(training.get("gold_only")) or (isinstance(mix, dict) and "ce" in mix)


def training_key(section: type[OptimisationSpec]) -> str:
    """The prefix of a key of ``section`` (``training.``) as a refusal names it: a recipe's
    (its flag to the command line), none where the caller gave the section's keys alone
    (``TrainingSpec(gold_only=True, temperature=2)`` had been told of ``training.temperature``)."""
    return section_key(section, "training.")
