"""Teachers: masked LMs with a trained head, loaded from a hub id, a directory or a package.

(Causal teachers, for recipes with objective causal, are ``causal_teachers``'s.)"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.remote_code import announce_remote_code, load_failure
from lmalgebra.core.text_files import read_text
from lmalgebra.sources.model_fingerprints import fingerprint
from lmalgebra.sources.models import ModelRef, load_tokenizer, resolve_directory

log = logging.getLogger(__name__)
# families whose position ids start after the padding id (RoBERTa's convention)
_OFFSET_POSITIONS = (
    "roberta",
    "xlm-roberta",
    "xlm-roberta-xl",
    "camembert",
    "longformer",
    "data2vec-text",
    "roberta-prelayernorm",
    "xmod",
)


@dataclass
class Teacher:
    name: str
    directory: Path
    hashes: dict[str, str]
    tokenizer: Any


def architecture(directory: Path) -> str | None:
    """The model class ``config.json`` names (``BertForMaskedLM``, ``GPT2LMHeadModel``...)."""
    path = directory / "config.json"
    if not path.is_file():
        return None
    try:
        names = json.loads(read_text(path, "model configuration")).get("architectures")
    except (ValueError, AttributeError):  # not JSON, or not an object: loading will say so
        return None
    return str(names[0]) if isinstance(names, list) and names else None


def is_causal_architecture(name: str | None) -> bool:
    return name is not None and name.endswith(("ForCausalLM", "LMHeadModel"))


def is_masked_architecture(name: str | None) -> bool:
    return name is not None and name.endswith("ForMaskedLM")


def check_top_k(name: str, top_k: int, tokenizer: Any) -> None:
    """Refuse a ``top_k`` larger than the teacher's vocabulary."""
    if top_k > len(tokenizer):
        raise UserInputError(
            f"top_k {top_k} exceeds the vocabulary of teacher {name!r} "
            f"({len(tokenizer)} tokens); use top_k <= {len(tokenizer)}"
        )


def open_teacher(
    ref: ModelRef, memo_dir: Path | None = None, example_length: int | None = None
) -> Teacher:
    """Resolve and fingerprint a teacher and load its tokenizer (which must have a mask token);
    with ``example_length``, refuse a teacher whose positions cannot hold that many tokens."""
    directory = resolve_directory(ref)
    found = architecture(directory)
    if is_causal_architecture(found):
        raise UserInputError(
            f"teacher {ref.name!r}: {directory} holds a causal LM ({found}), not a masked LM; "
            "give causal teachers in a recipe with `objective: causal`"
        )
    tokenizer = teacher_tokenizer(ref, directory, example_length)
    return Teacher(ref.name, directory, fingerprint(ref, directory, memo_dir), tokenizer)


def teacher_tokenizer(ref: ModelRef, directory: Path, example_length: int | None = None) -> Any:
    """The teacher's tokenizer, refused without a mask token or (given ``example_length``) when
    the model's positions cannot hold that many tokens; nothing of the weights is read."""
    tokenizer = load_tokenizer(ref, directory)
    if tokenizer.mask_token_id is None:
        raise UserInputError(f"teacher {ref.name!r}: tokenizer in {directory} has no mask token")
    limit = max_positions(directory)
    if example_length is not None and limit is not None and example_length > limit:
        raise UserInputError(
            f"example_length {example_length} exceeds the {limit} positions teacher "
            f"{ref.name!r} can read ({directory / 'config.json'}); use example_length <= {limit}"
        )
    return tokenizer


def load_masked_lm(ref: ModelRef, directory: Path) -> Any:
    """``AutoModelForMaskedLM`` in eval mode; refused when head weights are missing from the files.

    A model saved without its masked-LM head (an encoder-only checkpoint) would otherwise load with
    a randomly initialised head and produce confident nonsense.
    """
    from transformers import AutoModelForMaskedLM

    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(
            directory, output_loading_info=True, trust_remote_code=ref.trust_remote_code
        )
    except Exception as err:
        raise UserInputError(
            f"teacher {ref.name!r}: cannot load a masked LM from {directory}: {load_failure(err)}"
        ) from err
    missing = sorted(info.get("missing_keys", []))
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise UserInputError(
            f"teacher {ref.name!r}: {directory} has no trained masked-LM head "
            f"(missing weights: {shown}); pre-train one with `lmalgebra pretrain` or use another"
        )
    return model.eval()


def model_config(directory: Path) -> dict[str, Any]:
    """The model's ``config.json`` as a dict (empty when missing or not a JSON object)."""
    path = directory / "config.json"
    if not path.is_file():
        return {}
    try:
        config = json.loads(read_text(path, "model configuration"))
    except ValueError:
        return {}
    return config if isinstance(config, dict) else {}


def max_positions(directory: Path) -> int | None:
    """The longest input (tokens) the model in ``directory`` reads, from its ``config.json``."""
    config = model_config(directory)
    limit = config.get("max_position_embeddings", config.get("n_positions"))
    if not isinstance(limit, int):
        return None
    if config.get("model_type") in _OFFSET_POSITIONS:
        limit -= int(config.get("pad_token_id") or 0) + 1
    return limit
