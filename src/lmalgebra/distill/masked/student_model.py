"""The masked student (and masked teachers pre-trained here): a BERT masked LM, or an ALBERT one
without layer sharing when the embedding is factorised (embedding width below hidden width), so
parameters stay fixed as the vocabulary grows."""

from __future__ import annotations

from typing import Any

from lmalgebra.distill.student import MaskedModelSpec
from lmalgebra.distill.student_memory import refuse_beyond_memory


def build_masked_lm(spec: MaskedModelSpec, vocab_size: int, pad_id: int = 0, seed: int = 0) -> Any:
    """A freshly initialised ``BertForMaskedLM`` (or ``AlbertForMaskedLM`` when the embedding is
    factorised) over ``vocab_size`` tokens."""
    import torch
    from transformers import BertForMaskedLM  # ALBERT's module only where used

    refuse_beyond_memory(spec, vocab_size)
    torch.manual_seed(seed)
    config = masked_config(spec, vocab_size, pad_id)
    if config.model_type == "bert":
        return BertForMaskedLM(config)
    from transformers import AlbertForMaskedLM

    return AlbertForMaskedLM(config)


def masked_config(spec: MaskedModelSpec, vocab_size: int, pad_id: int = 0) -> Any:
    """The configuration :func:`build_masked_lm` builds its model from (no weights made)."""
    from transformers import BertConfig

    common: dict[str, Any] = {
        "vocab_size": vocab_size,
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
        return BertConfig(**common)
    from transformers import AlbertConfig

    return AlbertConfig(
        **common,
        embedding_size=spec.embedding_size,
        num_hidden_groups=spec.num_layers,
        inner_group_num=1,
        hidden_act="gelu",
        classifier_dropout_prob=spec.dropout,
    )
