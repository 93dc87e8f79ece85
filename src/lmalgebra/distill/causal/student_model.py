"""The causal student (and causal teachers pre-trained here): a GPT-2-style causal LM built of
the spec's sizes, or the pre-trained model ``student.init`` names (``student_init``)."""

from __future__ import annotations

from typing import Any

from lmalgebra.distill.causal.student_init import InitModel, init_student
from lmalgebra.distill.student import ModelSpec
from lmalgebra.distill.student_memory import refuse_beyond_memory


def build_causal_lm(spec: ModelSpec, tokenizer: Any, seed: int = 0) -> Any:
    """A freshly initialised ``GPT2LMHeadModel`` of ``spec``'s sizes for ``tokenizer``."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    refuse_beyond_memory(spec, len(tokenizer))
    config = GPT2Config(
        vocab_size=len(tokenizer),
        **causal_sizes(spec),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


def causal_sizes(spec: ModelSpec) -> dict[str, Any]:
    """The GPT-2 configuration's settings that ``spec`` gives, whatever the tokenizer (a dry
    run compares them with a checkpoint's, making no tokenizer)."""
    dropout = {k: spec.dropout for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")}
    return {
        "n_positions": spec.max_position_embeddings,
        "n_embd": spec.hidden_size,
        "n_layer": spec.num_layers,
        "n_head": spec.num_heads,
        "n_inner": spec.intermediate_size,
        **dropout,
    }


def causal_student(spec: ModelSpec, tokenizer: Any, seed: int, init: InitModel | None) -> Any:
    """The student a causal run trains: started from ``init`` (its layers kept), or built fresh
    of ``spec``'s sizes for ``tokenizer`` from ``seed``."""
    return build_causal_lm(spec, tokenizer, seed) if init is None else init_student(init)
