"""What each kind of teacher pre-training reads, one spec per kind: a masked LM from scratch
(``MaskedPretrainSpec``), a causal LM from scratch (``CausalPretrainSpec``), a masked-LM head on a
frozen encoder (``HeadOnlySpec``). ``lmalgebra pretrain masked|causal|head-only`` has a flag for
every key (a YAML file of the same keys may hold them), and the Python functions take the spec.

Every kind trains on a language's text, minus the examples a recipe with the same language and
held-out fraction holds out (the decision depends on the example's id alone), so a teacher never
sees the text it is evaluated on.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ConfigDict, Field, field_validator, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.recipe_files import with_default
from lmalgebra.core.settings import PathText, Settings, refuse_ignored
from lmalgebra.distill.layout import check_plain_name
from lmalgebra.distill.recipe import MIN_EXAMPLE_LENGTH
from lmalgebra.distill.student import MaskedModelSpec, ModelSpec
from lmalgebra.distill.vocab.tokenizer_choice import TokenizerKind, check_vocab_size
from lmalgebra.sources.corpus import CorpusSpec, refuse_other_languages
from lmalgebra.train.config import OptimisationSpec


class TeacherTrainingSpec(OptimisationSpec):
    """A teacher's training: optimisation alone (pre-training learns the gold tokens); the
    warm-up and the checkpoints follow the number of steps unless given."""

    lr: float = with_default(OptimisationSpec, "lr", 1e-3)
    warmup_steps: int = Field(
        default_factory=lambda data: min(100, data["steps"] // 10),
        ge=0,
        description="Linear warm-up steps, then linear decay (default: a tenth of the steps, "
        "at most 100).",
    )
    checkpoint_every: int = Field(
        default_factory=lambda data: max(1, data["steps"] // 5),
        ge=1,
        description="Steps between checkpoints (default: a fifth of the steps).",
    )

    @model_validator(mode="after")
    def _untrained(self) -> TeacherTrainingSpec:
        # steps 0 saves the model as it starts: of the training settings only the seed (of its
        # initialisation) is read; one given would be recorded beside a model it never shaped
        if self.steps == 0:
            given = [f for f in type(self).model_fields if f in self.model_fields_set]
            ignored = [f for f in given if f not in ("steps", "seed")]
            if ignored:
                raise UserInputError(
                    f"training.{ignored[0]} {getattr(self, ignored[0])!r} would be ignored: "
                    "training.steps 0 keeps the model "
                    "as it starts (nothing is trained); leave it out, or give steps above 0"
                )
        return self


class TeacherSizes(ModelSpec):
    """A teacher's sizes, small by default: a teacher trains in minutes on a CPU."""

    hidden_size: int = with_default(ModelSpec, "hidden_size", 128)
    num_layers: int = with_default(ModelSpec, "num_layers", 2)
    num_heads: int = with_default(ModelSpec, "num_heads", 2)
    intermediate_size: int = Field(
        default_factory=lambda data: 4 * data["hidden_size"],
        ge=8,
        description="Feed-forward width (default: 4 x hidden_size).",
    )


class TeacherModelSpec(TeacherSizes, MaskedModelSpec):
    """A masked teacher's sizes (:class:`TeacherSizes`, and a factorised embedding if asked)."""


class CausalTeacherModelSpec(TeacherSizes):
    """A causal teacher's sizes (:class:`TeacherSizes`)."""


class PretrainText(Settings):
    """What every kind of pre-training reads: a language's text, where the teacher goes, how
    examples are cut and held out, how it trains."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    corpus: CorpusSpec = Field(description="The language's text.")
    language: str = Field(
        description="Language code: held-out examples are chosen by id, as a recipe with this "
        "language and heldout_fraction chooses them."
    )
    out: Path = Field(description="Model directory to write.")
    heldout_fraction: float = Field(
        default=0.05,
        ge=0,
        lt=1,
        description="Held-out share, as in the recipe (those examples are never trained on).",
    )
    training: TeacherTrainingSpec = Field(
        default_factory=TeacherTrainingSpec, description="Training."
    )

    def made_from(self, texts: Sequence[str]) -> dict[str, Any]:
        """What makes a saved teacher this spec's, its training aside (``keep_saved`` keeps one
        trained for more or fewer steps): the spec less its output, corpus and training, and
        the hash of the ``texts`` it trains on (what the corpus settings give)."""
        return {
            "spec": self.model_dump(mode="json", exclude={"out", "corpus", "training"}),
            "corpus text": sha256_texts(texts),
        }

    @field_validator("language")
    @classmethod
    def _recipe_language(cls, code: str) -> str:
        """A code a merge recipe can name: a teacher trained for another (``''``, ``../x``)
        could join no recipe, its held-out examples chosen for a language none has."""
        return check_plain_name(code, "language", "like a merge recipe's language codes")

    @model_validator(mode="after")
    def _one_language(self) -> PretrainText:
        refuse_other_languages(self.corpus, self.language, f"language {self.language!r}")
        return self


class WordPieceSpec(Settings):
    """A masked teacher's tokenizer: a WordPiece one trained on the text, or one given."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    vocab_size: int | None = Field(
        default=None, ge=31, description="Pieces of the WordPiece vocabulary trained on the text."
    )
    lowercase: bool = Field(default=False, description="Lower-case the trained tokenizer.")
    path: PathText | None = Field(
        default=None,
        description="A tokenizer to use instead of training one (directory, hub id or "
        "package:NAME; it needs mask and pad tokens): teachers that share one tokenizer give "
        "students one vocabulary.",
    )

    @model_validator(mode="after")
    def _one_source(self) -> WordPieceSpec:
        if self.vocab_size is None and self.path is None:
            raise UserInputError(
                "tokenizer: give tokenizer.vocab_size (a WordPiece tokenizer trained on the text) "
                "or tokenizer.path (a tokenizer to use)"
            )
        if self.vocab_size is not None and self.path is not None:
            raise UserInputError("tokenizer: give tokenizer.vocab_size or tokenizer.path, not both")
        if self.path is not None and self.lowercase:
            raise UserInputError("tokenizer.lowercase applies to a tokenizer trained here")
        if self.vocab_size is not None:
            check_vocab_size(
                "wordpiece", self.vocab_size, f"tokenizer.vocab_size {self.vocab_size}"
            )
        return self


class MaskedPretrainSpec(PretrainText):
    """A small BERT masked LM and its WordPiece tokenizer, trained from scratch."""

    public_module: ClassVar[str | None] = "lmalgebra.api.pretrain"

    example_length: int = Field(
        default=128,
        ge=MIN_EXAMPLE_LENGTH,
        description="Tokens per training example (cut), at most model.max_position_embeddings.",
    )
    tokenizer: WordPieceSpec = Field(description="The tokenizer.")
    model: TeacherModelSpec = Field(default_factory=TeacherModelSpec, description="Sizes.")

    @model_validator(mode="after")
    def _fits(self) -> MaskedPretrainSpec:
        _check_positions(self.example_length, self.model.max_position_embeddings)
        if not self.model.dropout:
            _refuse_masks(self.training, "models with dropout (model.dropout above 0)")
        return self


class CausalTokenizerSpec(Settings):
    """A causal teacher's tokenizer, trained on the text."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: TokenizerKind = Field(
        default="bytelevel-bpe",
        description="bytelevel-bpe (GPT-2's), unigram, bpe (SentencePiece style) or wordpiece.",
    )
    vocab_size: int = Field(ge=1, description="Tokens of the vocabulary.")

    @model_validator(mode="after")
    def _trainable(self) -> CausalTokenizerSpec:
        check_vocab_size(self.kind, self.vocab_size, f"tokenizer.vocab_size {self.vocab_size}")
        return self


class CausalPretrainSpec(PretrainText):
    """A small GPT-2-style causal LM and its tokenizer, trained from scratch."""

    public_module: ClassVar[str | None] = "lmalgebra.api.pretrain"

    example_length: int = Field(
        default=128,
        ge=2,
        description="Tokens per training window, at most model.max_position_embeddings.",
    )
    tokenizer: CausalTokenizerSpec = Field(description="The tokenizer.")
    model: CausalTeacherModelSpec = Field(
        default_factory=CausalTeacherModelSpec, description="Sizes."
    )

    @model_validator(mode="after")
    def _fits(self) -> CausalPretrainSpec:
        if self.training.steps:  # the windows training cuts; none where nothing is trained
            _check_positions(self.example_length, self.model.max_position_embeddings)
        if not self.model.dropout:
            _refuse_masks(self.training, "models with dropout (model.dropout above 0)")
        _refuse_untrained(self, ["example_length"])  # the windows training cuts
        return self


class HeadOnlySpec(PretrainText):
    """A masked-LM head fitted on an existing encoder, kept frozen, with its own tokenizer."""

    public_module: ClassVar[str | None] = "lmalgebra.api.pretrain"

    encoder: PathText = Field(
        description="The encoder: a directory, package:NAME or hub id of a transformers model."
    )
    trust_remote_code: bool = Field(
        default=False,
        description="Allow the encoder's own code to run.",
        # the spelling of every other command's flag (--trust_remote_code, the key's, had been
        # this command's alone, and --trust-remote-code refused as no such option)
        json_schema_extra={"short_flag": "--trust-remote-code"},
    )
    example_length: int = Field(
        default=128,
        ge=MIN_EXAMPLE_LENGTH,
        description="Tokens per training example (cut), at most the encoder's positions.",
    )
    max_examples: int | None = Field(
        default=None, ge=1, description="Fit on the first this many training examples only."
    )

    def made_from(self, texts: Sequence[str]) -> dict[str, Any]:
        """:meth:`PretrainText.made_from`, and the hashes of the encoder's weights and tokenizer:
        an encoder replaced at the same place makes another teacher."""
        from lmalgebra.sources.kinds import source_of
        from lmalgebra.sources.models import ModelRef

        ref = ModelRef.parse(self.encoder)
        hashes = source_of(ref, ref.source.resolve()).fingerprint()
        encoder = {k: hashes[k] for k in ("weights", "tokenizer") if k in hashes}
        return {**super().made_from(texts), "encoder": encoder}

    @model_validator(mode="after")
    def _no_dropout(self) -> HeadOnlySpec:
        # the head fitted here has no dropout, and the frozen encoder's states are cached
        _refuse_masks(self.training, "models with dropout (pretrain masked or causal)")
        # what the head is fitted on: its own tokenizer is the encoder's
        _refuse_untrained(self, ["max_examples", "example_length", "heldout_fraction"])
        return self


def _refuse_masks(training: OptimisationSpec, applies_to: str) -> None:
    """Refuse a ``training.dropout_masks`` of its own where the model trained draws no dropout
    mask: it would be recorded and never used."""
    refuse_ignored(training, "training.", {"dropout_masks": applies_to})


def _refuse_untrained(spec: PretrainText, fields: list[str]) -> None:
    """Refuse a value of its own of ``fields``, which shape the examples training reads, where
    ``training.steps`` is 0: the model is saved as it starts, and would record them."""
    if not spec.training.steps:
        refuse_ignored(spec, "", dict.fromkeys(fields, "runs that train (training.steps above 0)"))


def _check_positions(example_length: int, positions: int) -> None:
    if example_length > positions:
        raise UserInputError(
            f"example_length {example_length} exceeds the model's {positions} positions "
            "(model.max_position_embeddings)"
        )
