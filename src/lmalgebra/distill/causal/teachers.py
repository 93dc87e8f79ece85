"""Causal teachers (recipes with ``objective: causal``): an ``AutoModelForCausalLM`` with a trained
head and a fast tokenizer of any kind, whose first token is predicted after a start token."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.remote_code import announce_remote_code, load_failure
from lmalgebra.distill.teachers import (
    Teacher,
    architecture,
    check_top_k,
    is_masked_architecture,
)
from lmalgebra.distill.vocab.token_forms import detect_convention
from lmalgebra.sources.model_fingerprints import fingerprint
from lmalgebra.sources.models import ModelRef, load_tokenizer, resolve_directory


def start_token_id(tokenizer: Any) -> int | None:
    """The token a text's first token is predicted after: the beginning-of-sequence token, or,
    for tokenizers with an end-of-text token only (GPT-2 style: one token separates documents
    in training), that token; None when the tokenizer has neither."""
    for found in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if found is not None:
            return int(found)
    return None


_TEACHER_HINT = "; give masked-LM teachers in a recipe with `objective: masked`"


def refuse_masked_lm(owner: str, directory: Path, hint: str = _TEACHER_HINT) -> None:
    """Refuse a masked LM where a causal LM is needed (it would load as a causal LM: BERT's
    masked-LM head fits ``BertLMHeadModel``, and score nonsense)."""
    found = architecture(directory)
    if is_masked_architecture(found):
        raise UserInputError(
            f"{owner}: {directory} holds a masked LM ({found}), not a causal LM{hint}"
        )


def open_causal_teacher(ref: ModelRef, memo_dir: Path | None, top_k: int) -> Teacher:
    """Resolve and fingerprint a causal teacher and load its tokenizer; refuse a masked LM, a
    tokenizer without offsets or start token, and a ``top_k`` beyond its vocabulary."""
    directory = resolve_directory(ref)
    refuse_masked_lm(f"teacher {ref.name!r}", directory)
    tokenizer = load_tokenizer(ref, directory)
    detect_convention(tokenizer, ref.name)  # refuses one whose tokens cannot be read as bytes
    if start_token_id(tokenizer) is None:
        raise UserInputError(
            f"teacher {ref.name!r}: the tokenizer in {directory} has neither a "
            "beginning-of-sequence nor an end-of-text token to predict the first token after"
        )
    check_top_k(ref.name, top_k, tokenizer)
    return Teacher(ref.name, directory, fingerprint(ref, directory, memo_dir), tokenizer)


def load_causal_lm(ref: ModelRef, directory: Path, role: str = "teacher") -> Any:
    """``AutoModelForCausalLM`` in eval mode; refused when it is a masked LM or head weights are
    missing from the files (an untrained head would produce confident nonsense). ``role``: what
    messages call the model."""
    from transformers import AutoModelForCausalLM

    owner = f"{role} {ref.name!r}"
    refuse_masked_lm(owner, directory, _TEACHER_HINT if role == "teacher" else "")
    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    try:
        loaded: Any = AutoModelForCausalLM.from_pretrained(
            directory, output_loading_info=True, trust_remote_code=ref.trust_remote_code
        )
    except Exception as err:
        raise UserInputError(
            f"{owner}: cannot load a causal LM from {directory}: {load_failure(err)}"
        ) from err
    model, info = loaded
    missing = sorted(info.get("missing_keys", []))
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise UserInputError(
            f"{owner}: {directory} has no trained causal-LM head "
            f"(missing weights: {shown}); pre-train one with `lmalgebra pretrain --causal`"
        )
    return model.eval()
