"""What a student (or a teacher pre-trained here) is made of, and what its training depends on.

``ModelSpec`` holds the sizes every transformer built here shares; ``MaskedModelSpec`` adds the
factorised embedding of a BERT/ALBERT masked LM, ``MaskedStudentSpec`` the union vocabulary's
size and the seeding of a masked student, ``CausalStudentSpec`` the tokenizer of a causal student
(``distill.vocab.tokenizer_choice``) or the pre-trained model it starts from (``init``, with the
decoder layers it keeps). ``student_inputs`` is what a student's checkpoints record of
the recipe and the teacher store, so a student is never resumed on a store rebuilt since.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import (
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from lmalgebra.core import plugins
from lmalgebra.core.errors import UserInputError, counted
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.settings import PathText, Settings
from lmalgebra.distill.layout import RunLayout


class ModelSpec(Settings):
    """The sizes of a transformer built here: a student, or a teacher pre-trained from scratch."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    hidden_size: int = Field(default=256, ge=8, description="Hidden width.")
    num_layers: int = Field(default=4, ge=1, description="Transformer layers.")
    num_heads: int = Field(
        default=4, ge=1, description="Attention heads (must divide hidden_size)."
    )
    intermediate_size: int = Field(default=1024, ge=8, description="Feed-forward width.")
    max_position_embeddings: int = Field(default=512, ge=8, description="Longest input in tokens.")
    dropout: float = Field(
        default=0.1, ge=0, lt=1, description="Dropout of hidden states and attention."
    )

    @model_validator(mode="after")
    def _check_heads(self) -> ModelSpec:
        if self.hidden_size % self.num_heads:
            raise UserInputError(
                f"hidden_size {self.hidden_size} is not divisible by num_heads {self.num_heads}"
            )
        return self


class MaskedModelSpec(ModelSpec):
    """A BERT-style masked LM; with ``embedding_size`` an ALBERT-style factorised embedding, so
    parameters stay fixed as the vocabulary grows."""

    embedding_size: int | None = Field(
        default=None,
        ge=8,
        description="Factorised embedding width (< hidden_size); None = hidden_size.",
    )

    @model_validator(mode="after")
    def _check_embedding(self) -> MaskedModelSpec:
        if self.embedding_size is not None and self.embedding_size > self.hidden_size:
            raise UserInputError(
                f"embedding_size {self.embedding_size} exceeds hidden_size {self.hidden_size}"
            )
        return self


class MaskedStudentSpec(MaskedModelSpec):
    """The masked student: a masked LM over the union vocabulary."""

    vocab_size: int | None = Field(
        default=None, description="Student vocabulary size; None = the union vocabulary's size."
    )
    init_embeddings: str = Field(
        default="random",
        description="Token embeddings and output bias at the start: random, or teachers (each "
        "token's teacher embeddings mapped to the student's width in closed form and averaged; "
        "see lmalgebra.experimental.seeding), or another entry point of the group "
        "lmalgebra.embedding_inits. teachers is experimental: 12.7% lower step-0 loss and "
        "22% fewer steps for targets of 20% and 30% (docs/benchmarks.md).",
    )

    @model_validator(mode="after")
    def _known_init(self) -> MaskedStudentSpec:
        inits = ["random", *plugins.declared(plugins.EMBEDDING_INITS)]
        if self.init_embeddings not in inits:
            raise UserInputError(
                f"student.init_embeddings {self.init_embeddings!r} is none of {', '.join(inits)}"
            )
        return self

    def embedding_init(self) -> Callable[..., Any] | None:
        """The function the ``init_embeddings`` entry point names, loaded (None: random);
        refused, naming it, when it does not load or is no function (by the dry run too)."""
        if self.init_embeddings == "random":
            return None
        return plugins.load(
            plugins.EMBEDDING_INITS,
            self.init_embeddings,
            callable,
            "a function of the student, the recipe and the vocabulary",
        )

    def fits(self, vocab_size: int, example_length: int) -> None:
        """Refuse sizes that cannot hold the vocabulary or the examples."""
        if self.vocab_size is not None and self.vocab_size < vocab_size:
            raise UserInputError(
                f"student vocab_size {self.vocab_size} is smaller than the union "
                f"vocabulary ({vocab_size} tokens)"
            )
        if self.max_position_embeddings < example_length:
            raise UserInputError(
                f"student max_position_embeddings {self.max_position_embeddings} "
                f"is shorter than example_length {example_length}"
            )


class CausalStudentSpec(ModelSpec):
    """The causal student: a GPT-2-style causal LM of these sizes with a tokenizer of its own,
    or (``init``) a pre-trained causal LM with its tokenizer, all or some of its layers kept."""

    tokenizer: PathText | None = Field(
        default=None,
        description="The student's tokenizer: teacher:NAME (or NAME) for a teacher's, "
        "train:KIND:SIZE for one trained on the run's training text (KIND as "
        "pretrain causal --tokenizer.kind, e.g. train:bytelevel-bpe:8000), bytes for raw UTF-8 "
        "bytes, or a model reference (hub id, directory, package:NAME).",
    )
    init: PathText | None = Field(
        default=None,
        description="Start from this causal LM's weights and tokenizer: a model reference "
        "(directory, hub id[@REVISION], package:NAME, gguf:FILE). Its sizes, dropout and "
        "tokenizer are the student's: none of those may be set beside it.",
    )
    layers: list[int] | None = Field(
        default=None,
        description="With init: the decoder layers kept, in this order and renumbered from 0 "
        "(e.g. [0, 5, 11]); embeddings, final norm and head are kept whole. None: every layer.",
    )

    @model_validator(mode="after")
    def _check_init(self) -> CausalStudentSpec:
        if self.init is None:
            if self.layers is not None:
                raise UserInputError(
                    "student.layers needs student.init: the pre-trained model whose layers it keeps"
                )
            return self
        given = [f for f in (*ModelSpec.model_fields, "tokenizer") if f in self.model_fields_set]
        if given:
            raise UserInputError(
                f"student.{given[0]} cannot be set beside student.init: the student takes its "
                f"sizes, dropout and tokenizer from {self.init!r}"
            )
        if self.layers is not None:
            check_layer_list(self.layers)
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Without ``init``: the fields of a student built here (as before ``init`` existed);
        with it: ``init`` and ``layers`` alone, so the dump reads back as the same spec."""
        data = handler(self)
        built = (*ModelSpec.model_fields, "tokenizer")
        left_out = ("init", "layers") if self.init is None else built
        return {key: value for key, value in data.items() if key not in left_out}


def check_layer_list(layers: list[int], depth: int | None = None) -> None:
    """Refuse an empty ``student.layers``, a negative or repeated index, and (``depth``: the
    init model's decoder layers) an index the model does not have; one line naming it."""
    if not layers:
        raise UserInputError("student.layers is empty: list the layers to keep, or leave it out")
    for index, layer in enumerate(layers):
        if layer < 0 or (depth is not None and layer >= depth):
            have = f" (the model has {counted(depth, 'layer')}: 0..{depth - 1})" if depth else ""
            raise UserInputError(f"student.layers: layer {layer} does not exist{have}")
        if layer in layers[:index]:
            raise UserInputError(f"student.layers lists layer {layer} more than once")


def student_inputs(recipe: Any, outputs: str) -> dict[str, Any]:
    """``{"recipe": data settings, "store": {lang/teacher: key hash}}``: what a student's
    checkpoints record besides its own settings (``train.run_fingerprint``); ``outputs``: the
    store part that holds the teachers' outputs (``topk`` or ``logprobs``)."""
    # dtype and device of teacher inference are left out: the store's key records the dtype
    # it was computed in
    data = recipe.model_dump(
        mode="json", exclude={"output_dir", "batch_size", "dtype", "device", "student", "training"}
    )
    from lmalgebra.storage.shard_set import ShardSet  # numpy and pyarrow: not at start-up

    layout = RunLayout(recipe.output_dir)
    store = {
        f"{lang}/{teacher}": sha256_json(
            ShardSet.existing(layout.store(outputs, lang, teacher)).key
        )
        for lang, spec in recipe.languages.items()
        for teacher in spec.teachers
    }
    return {"recipe": data, "store": store}
