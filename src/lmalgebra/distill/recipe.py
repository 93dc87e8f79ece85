"""The MergeDistill recipe: languages, teachers, objective (masked or causal), masking or text
cuts, example length, top-k, samples, run directory."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.recipe_files import read_yaml, validate
from lmalgebra.distill.student import StudentSpec
from lmalgebra.distill.vocab.tokenizer_choice import parse_student_tokenizer
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.sources.models import ModelRef
from lmalgebra.train.config import TrainingSpec

# [CLS], [SEP] and a few words: the shortest example that leaves tokens to mask
MIN_EXAMPLE_LENGTH = 8


class TeacherSpec(BaseModel):
    """A pre-trained LM with a trained head (masked or causal, as the recipe's objective says):
    hub id, local directory or package:NAME."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    path: str = Field(
        description="Hub id or local directory of an AutoModelForMaskedLM "
        "(objective masked) or AutoModelForCausalLM (objective causal)."
    )
    revision: str | None = Field(default=None, description="Hub revision.")
    trust_remote_code: bool = Field(default=False, description="Allow the model's own code to run.")

    def ref(self, name: str) -> ModelRef:
        return ModelRef(
            name=name,
            path=self.path,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
        )


class LanguageSpec(BaseModel):
    """One language: its text and the teachers that cover it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    corpus: CorpusSpec = Field(description="The language's text.")
    teachers: list[str] = Field(
        description="Names of teachers (keys of `teachers`) for this language."
    )
    max_examples: int | None = Field(
        default=None, ge=1, description="Use at most this many examples."
    )


class MaskingSpec(BaseModel):
    """BERT-style masking, drawn per (example, teacher) from the seed."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    probability: float = Field(default=0.15, gt=0, lt=1, description="Share of tokens to predict.")
    replace: tuple[float, float, float] = Field(
        default=(0.8, 0.1, 0.1), description="Of those: [MASK], random token, unchanged."
    )
    whole_word: bool = Field(
        default=False, description="Mask all pieces of a chosen word together."
    )
    seed: int = Field(default=0, description="Masking seed.")

    @model_validator(mode="after")
    def _check(self) -> MaskingSpec:
        if any(r < 0 for r in self.replace) or abs(sum(self.replace) - 1) > 1e-9:
            raise UserInputError(
                f"masking.replace must be >= 0 and sum to 1, got {list(self.replace)}"
            )
        return self


class CausalSpec(BaseModel):
    """How a causal recipe cuts its examples and what its store keeps besides the top-k.

    Examples are cut by text, not by tokens: every teacher (and later the student) sees exactly
    the same bytes of an example, which cross-tokenizer alignment needs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    example_bytes: int = Field(
        default=2048,
        ge=16,
        description="Each document is cut to its first example_bytes UTF-8 bytes "
        "(at a character boundary); every teacher reads the same text.",
    )
    samples: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Tokens drawn (with replacement) from each teacher's next-token distribution "
        "at every position, stored with their log-probabilities (Sparse Logit Sampling); 0: none.",
    )
    sample_seed: int = Field(default=0, description="Seed of the drawn tokens.")


class MergeRecipe(BaseModel):
    """Everything before student training: data, teachers, masking, the teacher store."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    languages: dict[str, LanguageSpec] = Field(description="Language code -> corpus and teachers.")
    teachers: dict[str, TeacherSpec] = Field(description="Teacher name -> model reference.")
    objective: Literal["masked", "causal"] = Field(
        default="masked",
        description="masked: masked-LM teachers, union vocabulary (MergeDistill); causal: causal "
        "LM teachers with any tokenizers, examples cut by text.",
    )
    masking: MaskingSpec = Field(default_factory=MaskingSpec, description="Masked recipes only.")
    example_length: int = Field(
        default=128,
        ge=MIN_EXAMPLE_LENGTH,
        description="Tokens per example per teacher (cut); masked recipes only.",
    )
    causal: CausalSpec = Field(
        default_factory=CausalSpec, description="Text cut and samples; causal recipes only."
    )
    heldout_fraction: float = Field(
        default=0.05, ge=0, lt=1, description="Examples kept for evaluation."
    )
    top_k: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Teacher log-probabilities kept per masked token (causal: per token).",
    )
    batch_size: int = Field(default=32, ge=1, description="Examples per teacher forward pass.")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        default="float32",
        description="Compute precision of teacher inference: float32; bfloat16 (autocast: "
        "weights stay float32, log-probabilities are taken in float32 from the bfloat16 logits; "
        "refused where the hardware lacks it unless LMALGEBRA_ALLOW_SLOW_BF16=1); auto: "
        "bfloat16 where native, else float32. The store records the dtype it resolves to.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="cpu",
        description="Where teacher inference runs: cpu, cuda, or auto (cuda when present).",
    )
    shard_rows: int = Field(default=1024, ge=1, description="Examples per store shard.")
    output_dir: Path = Field(default=Path("runs/merge"), description="Run directory.")
    student: StudentSpec = Field(default_factory=StudentSpec, description="Student architecture.")
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Student training.")

    @model_validator(mode="after")
    def _check(self) -> MergeRecipe:
        if not self.languages:
            raise UserInputError("the recipe names no language")
        for code, lang in self.languages.items():
            if not lang.teachers:
                raise UserInputError(f"language {code!r} has no teacher")
            repeated = sorted({t for t in lang.teachers if lang.teachers.count(t) > 1})
            if repeated:
                raise UserInputError(
                    f"language {code!r} lists teacher {repeated[0]!r} more than once"
                )
            for name in lang.teachers:
                if name not in self.teachers:
                    raise UserInputError(
                        f"language {code!r} names teacher {name!r}, "
                        "which is not defined under `teachers`"
                    )
        unused = sorted(
            set(self.teachers) - {t for lang in self.languages.values() for t in lang.teachers}
        )
        if unused:
            raise UserInputError(f"teacher {unused[0]!r} is defined but no language uses it")
        self._check_objective()
        if self.objective == "causal" and self.student.tokenizer is not None:
            parse_student_tokenizer(self.student.tokenizer, self.teachers)
        return self

    def _check_objective(self) -> None:
        """Refuse a setting the objective would ignore (a non-default value of the other's)."""
        default_length = MergeRecipe.model_fields["example_length"].get_default()
        if self.objective == "causal":
            ignored = [
                key
                for key, changed in (
                    ("masking", self.masking != MaskingSpec()),
                    ("example_length", self.example_length != default_length),
                )
                if changed
            ]
            fix = "causal recipes mask nothing and cut examples by text (causal.example_bytes)"
        else:
            ignored = [
                key
                for key, changed in (
                    ("causal", self.causal != CausalSpec()),
                    ("student.tokenizer", self.student.tokenizer is not None),
                    ("training.objective_mix", self.training.objective_mix is not None),
                )
                if changed
            ]
            fix = "set `objective: causal` for causal teachers"
        if ignored:
            raise UserInputError(
                f"{ignored[0]} does not apply to a recipe with objective {self.objective}: "
                f"remove it ({fix})"
            )

    def data_hash(self) -> str:
        """Hash of everything that changes the stored examples and teacher outputs."""
        exclude = {"output_dir", "batch_size", "device", "student", "training"}
        if self.objective == "masked":  # as before the causal objective: existing stores stay valid
            exclude |= {"objective", "causal"}
        return sha256_json(self.model_dump(mode="json", exclude=exclude))


def load_recipe(path: Path) -> MergeRecipe:
    recipe = validate(MergeRecipe, read_yaml(path), str(path))
    return recipe
