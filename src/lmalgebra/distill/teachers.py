"""Teachers of either objective: what is known of one before its weights are read, the one loader
of a language model with its trained head, and offline inference over a store's shards.

Device and dtype of teacher inference (``merge teach``): a store computed in bfloat16 holds other
numbers than a float32 one, so the dtype the recipe's ``dtype`` resolves to is part of the key of
``topk/`` and ``logprobs/`` (``dtype_key``): a float32 store is never reused for a bfloat16
request, nor the reverse. The device is not: it changes where the numbers are computed, not what
they are.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import torch

from lmalgebra.core.allocator import release_free_memory
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import dtype_name, resolve_device, resolve_dtype
from lmalgebra.core.progress import progress_bar
from lmalgebra.core.remote_code import announce_remote_code, load_failure, refuse_code_replaced
from lmalgebra.core.text_files import read_text
from lmalgebra.sources.loaded_weights import CHECKED_LOAD, refuse_headless, refuse_incomplete
from lmalgebra.sources.model_files import refuse_damaged
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.shard_set import ShardSet

log = logging.getLogger(__name__)
# above this share of a tokenizer's tokens of a language unknown, it is said to read little of it
UNKNOWN_SHARE = 0.1
Head = Literal["masked", "causal"]
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
# per head: the Auto class, what messages call the model (the command that trains one: HEADS)
_HEADS: dict[str, tuple[str, str]] = {
    "masked": ("AutoModelForMaskedLM", "masked LM"),
    "causal": ("AutoModelForCausalLM", "causal LM"),
}
# teacher inference over one shard: (the teacher's model, a shard of its copies) -> its outputs
Inference = Callable[[Any, pa.Table], pa.Table]
TEACHER_HINT = {
    "masked": "; give causal teachers in a recipe with `objective: causal`",
    "causal": "; give masked-LM teachers in a recipe with `objective: masked`",
}


@dataclass
class Teacher:
    """A teacher opened for a recipe: its resolved directory, fingerprint and tokenizer."""

    name: str
    directory: Path
    hashes: dict[str, str]
    tokenizer: Any


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


def architecture(directory: Path) -> str | None:
    """The model class ``config.json`` names (``BertForMaskedLM``, ``GPT2LMHeadModel``...)."""
    names = model_config(directory).get("architectures")
    return str(names[0]) if isinstance(names, list) and names else None


def head_of(name: str | None) -> Head | None:
    """The head an architecture's name says the model has (None: it does not say)."""
    if name is not None and name.endswith(("ForCausalLM", "LMHeadModel")):
        return "causal"
    if name is not None and name.endswith("ForMaskedLM"):
        return "masked"
    return None


def refuse_other_head(
    owner: str, directory: Path, head: Head, hint: str = "", shown: str | None = None
) -> None:
    """Refuse a model whose ``config.json`` names the other head, or none (a bare encoder or
    decoder, ``BertModel``): a masked LM would load as a causal LM (BERT's masked-LM head fits
    ``BertLMHeadModel``) and score nonsense, and a causal LM has no masked-LM head. ``shown``:
    how the message names the model (``ModelRef.shown``; default the directory)."""
    found = architecture(directory)
    other = head_of(found)
    where = shown or str(directory)
    if other is not None and other != head:
        raise UserInputError(
            f"{owner}: {where} holds a {_HEADS[other][1]} ({found}), not a {_HEADS[head][1]}{hint}"
        )
    if other is None and found is not None and found.endswith("Model"):  # BertModel, GPT2Model
        raise UserInputError(
            f"{owner}: {where} holds a {found}, a model without a language-model head, "
            f"not a {_HEADS[head][1]}"
        )


def max_positions(directory: Path) -> int | None:
    """The longest input (tokens) the model in ``directory`` reads, from its ``config.json``."""
    config = model_config(directory)
    limit = config.get("max_position_embeddings", config.get("n_positions"))
    if not isinstance(limit, int):
        return None
    if config.get("model_type") in _OFFSET_POSITIONS:
        limit -= int(config.get("pad_token_id") or 0) + 1
    return limit


def check_top_k(name: str, top_k: int, tokenizer: Any) -> None:
    """Refuse a ``top_k`` larger than the teacher's vocabulary."""
    if top_k > len(tokenizer):
        raise UserInputError(
            f"top_k {top_k} exceeds the vocabulary of teacher {name!r} "
            f"({len(tokenizer)} tokens); use top_k <= {len(tokenizer)}"
        )


def load_lm(
    ref: ModelRef, directory: Path, head: Head, role: str = "teacher", owner: str | None = None
) -> Any:
    """The language model in ``directory`` with its ``head`` (``AutoModelForMaskedLM`` or
    ``AutoModelForCausalLM``), in eval mode; ``role``: what messages call it, with the model's
    name unless ``owner`` says how they start.

    Refused when ``config.json`` names the other head, when head weights are missing from the
    files (a randomly initialised head would produce confident nonsense), and when any other
    weight is missing or found no place in the model (it would be random, or the files describe
    another model)."""
    import transformers

    auto, what = _HEADS[head]
    owner = owner or f"{role} {ref.name!r}"
    hint = TEACHER_HINT[head] if role == "teacher" else ""
    refuse_other_head(owner, directory, head, hint, ref.shown(directory))
    refuse_damaged(owner, directory)
    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    else:
        refuse_code_replaced(owner, ref.shown(directory), directory, auto)
    try:
        loaded: Any = getattr(transformers, auto).from_pretrained(
            directory, **CHECKED_LOAD, trust_remote_code=ref.trust_remote_code
        )
    except Exception as err:
        raise UserInputError(
            f"{owner}: cannot load a {what} from {directory}: {load_failure(err)}"
        ) from err
    model, info = loaded
    base = getattr(model, "base_model_prefix", "")
    shown = ref.shown(directory)
    refuse_headless(owner, shown, auto, base, info.get("missing_keys", ()))
    refuse_incomplete(owner, directory, model, info, shown=shown)
    return model.eval()


def inference_setup(recipe: Any) -> tuple[torch.device, torch.dtype]:
    """Where teacher inference runs and in which dtype, resolved for this machine (``auto``
    logs its choice; an unusable device or an unsupported bfloat16 is refused in one line)."""
    device = resolve_device(recipe.device, "merge recipe device")
    return device, resolve_dtype(recipe.dtype, device, "merge recipe dtype")


def dtype_key(dtype: torch.dtype | str) -> dict[str, Any]:
    """The store-key entry of a compute dtype: nothing for float32, the name of any other."""
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return {} if name == "float32" else {"dtype": name}


def accepted_dtypes(recipe: Any) -> tuple[str, ...]:
    """The store dtypes a reader of the store accepts for the recipe's ``dtype``: ``auto`` may
    have resolved to either on the machine that ran ``merge teach``."""
    return ("float32", "bfloat16") if recipe.dtype == "auto" else (recipe.dtype,)


def infer_shards(
    source: ShardSet,
    target: ShardSet,
    label: str,
    load: Callable[[], Any],
    infer: Inference,
    progress: bool,
    owner: str | None = None,
    **finish: Any,
) -> None:
    """Teacher inference over the shards of ``source``, written to ``target``, resumable: shard
    ``i`` of ``target`` is ``infer(model, source shard i)``. Under several processes each rank
    computes the shards it owns that are missing; the model (``load()``) is loaded only when a
    shard is to be computed, and once its shards are written the memory inference freed (kept
    for reuse while it ran, ``core.allocator``) goes back to the system.
    ``finish``: what the completed set's manifest records; ``owner`` (``teacher 'wp'``) names
    the model when a shard holds token ids past its token embeddings (a tokenizer of another
    model beside its weights)."""
    count = len(source.manifest["shards"])
    todo = set(target.plan(count))
    if target.complete:
        return
    model: Any = None
    with progress_bar(label, count, progress) as advance:
        for index in range(count):
            if index in todo:
                if model is None:
                    model = load()
                shard = source.read(index)
                _refuse_foreign_ids(owner or label, model, shard)
                target.write(index, infer(model, shard))
            advance(1)
    if model is not None:
        del model
        release_free_memory()
    target.finish(**finish)


def _refuse_foreign_ids(owner: str, model: Any, shard: Any) -> None:
    """Refuse a shard of token ids (``input_ids`` of a masked copy, ``token_ids`` of a causal
    one) past the rows of ``model``'s token embeddings, before the forward pass fails on them."""
    import pyarrow.compute as pc

    from lmalgebra.sources.embed import refuse_foreign_ids

    column = next((c for c in ("input_ids", "token_ids") if c in shard.column_names), None)
    if column is None:
        return
    largest = pc.max(pc.list_flatten(shard[column])).as_py()
    if largest is not None:
        refuse_foreign_ids(owner, model, [[int(largest)]])


def warn_unknown(owner: str, unknown: int, total: int, language: str, token: str) -> None:
    """Warn when ``owner``'s tokenizer reads more than ``UNKNOWN_SHARE`` of a language's
    ``total`` tokens as its unknown ``token``: a model reading the text so has little to learn
    or teach of it, which no stage had said."""
    if total and unknown / total > UNKNOWN_SHARE:
        log.warning(
            "%s reads %.0f%% of the tokens of language %r (%d of %d) as its unknown token %r: "
            "it has little to teach of this text; check that its tokenizer covers the language",
            owner,
            100 * unknown / total,
            language,
            unknown,
            total,
            token,
        )
