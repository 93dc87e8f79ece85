"""Tiny GGUF files written by the ``gguf`` package's writer: a Llama with a byte-level BPE
tokenizer (as SmolLM2's), float32 tensors, laid out as llama.cpp's converter writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tiny import sentences


def tiny_llama(seed: int = 0, layers: int = 2, positions: int = 64) -> tuple[Any, Any]:
    """A random tiny ``LlamaForCausalLM`` (hidden 32, ``layers`` layers, 4 heads, 2 key-value
    heads, tied embeddings, ``positions`` positions) and its byte-level BPE tokenizer of about
    300 tokens."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmalgebra.distill.vocab.tokenizer_trainers import train_causal_tokenizer

    texts = sentences(300, seed=seed + 3)
    tokenizer = train_causal_tokenizer(texts, "bytelevel-bpe", 300, positions)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=positions,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # norms away from 1, so a lost norm weight shows in the logits
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return model, tokenizer


def _llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter reorders each query/key head's rows (rotary halves interleaved)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
        .swapaxes(1, 2)
        .reshape(weight.shape)
    )


def _tensors(model: Any) -> dict[str, np.ndarray]:
    """The model's weights under GGUF names (tied head left out, as in SmolLM2's file)."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, config.num_hidden_layers)
    out = {}
    for name, param in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        array = param.detach().float().numpy()
        if name.endswith("q_proj.weight"):
            array = _llama_cpp_permute(array, config.num_attention_heads)
        elif name.endswith("k_proj.weight"):
            array = _llama_cpp_permute(array, config.num_key_value_heads)
        found = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert found is not None, name
        out[found] = np.ascontiguousarray(array)
    return out


def write_llama_gguf(model: Any, tokenizer: Any, path: Path, architecture: str = "llama") -> Path:
    """``model`` and ``tokenizer`` as a GGUF file at ``path`` (float32 tensors).

    ``architecture``: written as ``general.architecture`` (another name makes a file that
    transformers refuses to read)."""
    import gguf

    config = model.config
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny llama")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(float(config.rope_parameters["rope_theta"]))
    writer.add_rope_dimension_count(config.head_dim)
    writer.add_vocab_size(config.vocab_size)
    _add_tokenizer(writer, tokenizer)
    for name, array in _tensors(model).items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _add_tokenizer(writer: Any, tokenizer: Any) -> None:
    """The byte-level BPE vocabulary and merges, special tokens marked as control tokens."""
    import gguf

    data = json.loads(tokenizer.backend_tokenizer.to_str())
    vocab = data["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.get)
    assert [vocab[t] for t in tokens] == list(range(len(tokens)))
    special = set(tokenizer.all_special_tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    control, normal = gguf.TokenType.CONTROL, gguf.TokenType.NORMAL
    writer.add_token_types([control if t in special else normal for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokenizer.bos_token_id)
    writer.add_eos_token_id(tokenizer.eos_token_id)
    writer.add_pad_token_id(tokenizer.pad_token_id)
    writer.add_unk_token_id(tokenizer.unk_token_id)
    writer.add_add_bos_token(True)  # as the source tokenizer, which starts every text with <s>


def write_gpt2_gguf(tokenizer: Any, path: Path, drop: tuple[str, ...] = ()) -> Path:
    """A random tiny GPT-2 (hidden 32, 2 layers, 4 heads, 1024 positions) as llama.cpp's
    converter writes one: ``gpt2`` tensor names, the attention and MLP weights transposed, the
    head as ``output.weight``; the tensors named in ``drop`` left out."""
    import gguf
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_embd=32,
        n_layer=2,
        n_head=4,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(0)
    model = GPT2LMHeadModel(config).eval()
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT2, config.n_layer)
    writer = gguf.GGUFWriter(str(path), "gpt2")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_context_length(config.n_positions)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(4 * config.n_embd)
    writer.add_block_count(config.n_layer)
    writer.add_head_count(config.n_head)
    writer.add_layer_norm_eps(config.layer_norm_epsilon)
    _add_tokenizer(writer, tokenizer)
    for name, param in model.state_dict().items():
        array = param.detach().float().numpy()
        if name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
            array = array.T  # Conv1D stores (in, out); llama.cpp's tensors are (out, in)
        found = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert found is not None, name
        if found not in drop:
            writer.add_tensor(found, np.ascontiguousarray(array))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
