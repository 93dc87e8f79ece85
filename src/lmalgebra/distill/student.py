"""The student: a BERT-style masked LM over the union vocabulary, optionally with factorised
embeddings (embedding width below hidden width, as ALBERT) so parameters stay fixed as the
vocabulary grows. Saved as a normal Hugging Face model directory with the union tokenizer."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.disk_space import naming_file


class StudentSpec(BaseModel):
    """Student (or pre-trained teacher) architecture."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    hidden_size: int = Field(default=256, ge=8, description="Hidden width.")
    num_layers: int = Field(default=4, ge=1, description="Transformer layers.")
    num_heads: int = Field(
        default=4, ge=1, description="Attention heads (must divide hidden_size)."
    )
    intermediate_size: int = Field(default=1024, ge=8, description="Feed-forward width.")
    embedding_size: int | None = Field(
        default=None,
        ge=8,
        description="Factorised embedding width (< hidden_size); None = hidden_size.",
    )
    max_position_embeddings: int = Field(default=512, ge=8, description="Longest input in tokens.")
    dropout: float = Field(
        default=0.1, ge=0, lt=1, description="Dropout of hidden states and attention."
    )
    vocab_size: int | None = Field(
        default=None, description="Student vocabulary size; None = the union vocabulary's size."
    )
    tokenizer: str | None = Field(
        default=None,
        description="Causal recipes: the student's tokenizer: teacher:NAME (or NAME) for a "
        "teacher's, train:KIND:SIZE for one trained on the run's training text (KIND as "
        "pretrain --tokenizer-kind, e.g. train:bytelevel-bpe:8000), bytes for raw UTF-8 bytes, "
        "or a model reference (hub id, directory, package:NAME); masked students use the union "
        "vocabulary.",
    )
    init_embeddings: Literal["random", "teachers"] = Field(
        default="random",
        description="Token embeddings and output bias at the start: random, or teachers (each "
        "token's teacher embeddings mapped to the student's width in closed form and averaged; "
        "see distill.embedding_seed). teachers is experimental: 12.7% lower step-0 loss and "
        '22% fewer steps for targets of 20% and 30% (README "Benchmarks").',
    )

    @model_validator(mode="after")
    def _check(self) -> StudentSpec:
        if self.hidden_size % self.num_heads:
            raise UserInputError(
                f"student hidden_size {self.hidden_size} is not divisible by "
                f"num_heads {self.num_heads}"
            )
        if self.embedding_size is not None and self.embedding_size > self.hidden_size:
            raise UserInputError(
                f"student embedding_size {self.embedding_size} exceeds "
                f"hidden_size {self.hidden_size}"
            )
        return self

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


def build_student(spec: StudentSpec, vocab_size: int, pad_id: int = 0, seed: int = 0) -> Any:
    """A freshly initialised ``BertForMaskedLM`` (or ``AlbertForMaskedLM`` without layer sharing
    when the embedding is factorised)."""
    import torch
    from transformers import AlbertConfig, AlbertForMaskedLM, BertConfig, BertForMaskedLM

    size = spec.vocab_size or vocab_size
    torch.manual_seed(seed)
    common: dict[str, Any] = {
        "vocab_size": size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "intermediate_size": spec.intermediate_size,
        "max_position_embeddings": spec.max_position_embeddings,
        "hidden_dropout_prob": spec.dropout,
        "attention_probs_dropout_prob": spec.dropout,
        "pad_token_id": pad_id,
    }
    if spec.embedding_size is None or spec.embedding_size == spec.hidden_size:
        return BertForMaskedLM(BertConfig(**common))
    config = AlbertConfig(
        **common,
        embedding_size=spec.embedding_size,
        num_hidden_groups=spec.num_layers,
        inner_group_num=1,
        hidden_act="gelu",
        classifier_dropout_prob=spec.dropout,
    )
    return AlbertForMaskedLM(config)


def save_student(model: Any, tokenizer: Any, out: Path, metadata: dict[str, Any]) -> None:
    """``save_pretrained`` of model and tokenizer plus ``lmalgebra.json`` (recipe, hashes, maps).

    ``lmalgebra.json`` goes last and marks the directory complete; an older one is removed first.
    """
    (out / "lmalgebra.json").unlink(missing_ok=True)
    with naming_file(out):
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)
    write_json_atomic(out / "lmalgebra.json", metadata)
