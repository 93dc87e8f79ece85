"""The sizes a decomposition's plan needs, read without loading any weights: each model's width
(the columns it adds), its parameters (for the embedding estimate) and the bytes of its weights.

Hugging Face models are read from ``config.json`` (a hub model's config and tokenizer files are
fetched, not its weights); ONNX graphs from their declared outputs; files of precomputed
embeddings from their headers; models given as Python objects from the objects.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.sources.given_models import (
    GivenArrays,
    GivenModel,
    SentenceEncoder,
    TransformerPair,
)
from lmalgebra.sources.models import (
    WEIGHT_SUFFIXES,
    ModelRef,
    check_architecture,
    resolve_directory,
)
from lmalgebra.sources.precomputed import file_shape
from lmalgebra.stats.nulls import random_copy

_WIDTH = ("hidden_size", "d_model", "n_embd", "dim")
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_FEED_FORWARD = ("intermediate_size", "ffn_dim", "n_inner", "hidden_dim")


@dataclass(frozen=True)
class ModelShape:
    """One model as the plan sees it.

    Attributes:
        name: its name in the run.
        kind: transformers, onnx, precomputed or memory (a Python object).
        width: the columns it adds to the concatenation (its pooled hidden size; 0 when its
            configuration does not say).
        parameters: weights of its layers (2 FLOPs each per token embedded; token embeddings
            cost no FLOPs); 0 when it embeds nothing here (a file or an array of vectors).
        weight_bytes: bytes of its weights in memory while embedding.
        hidden: its hidden size, and ``intermediate`` its feed-forward width (activations).
    """

    name: str
    kind: str
    width: int
    parameters: int = 0
    weight_bytes: int = 0
    hidden: int = 0
    intermediate: int = 0

    @property
    def embeds(self) -> bool:
        return self.parameters > 0

    @property
    def cached(self) -> bool:
        """Whether its embeddings go to the embedding cache (models named by reference)."""
        return self.kind in ("transformers", "onnx")


def model_shapes(
    config: DecomposeConfig, given: Mapping[str, GivenModel] | None = None, dry: bool = False
) -> list[ModelShape]:
    """Every model of the run (and the random-initialised copies a ``nulls`` study adds), each
    model's architecture checked (remembered in the cache's ``hashes/``, which a ``dry`` run
    only reads)."""
    given = dict(given or {})
    bytes_per_weight = 2 if config.weights_dtype == "bfloat16" else 4
    memo = Memo(config.cache_dir / "hashes", not dry)
    shapes = [_shape(ref, given.get(ref.name), bytes_per_weight, memo) for ref in config.models]
    if config.study.nulls:
        copies = [r for r in config.models if r.kind == "transformers" and not r.random_init]
        originals = {s.name: s for s in shapes}
        shapes += [_copy(originals[r.name]) for r in copies]
    return shapes


def _copy(shape: ModelShape) -> ModelShape:
    return ModelShape(
        random_copy(shape.name),
        shape.kind,
        shape.width,
        shape.parameters,
        shape.weight_bytes,
        shape.hidden,
        shape.intermediate,
    )


@dataclass(frozen=True)
class Memo:
    """Where passed architecture checks are remembered, and whether this run writes there."""

    directory: Path
    write: bool


def _shape(
    ref: ModelRef, given: GivenModel | None, bytes_per_weight: int, memo: Memo
) -> ModelShape:
    if given is not None:
        return _given_shape(ref.name, given)
    path = resolve_directory(ref, weights=False)
    if ref.kind == "precomputed":
        return ModelShape(ref.name, ref.kind, file_shape(ref.name, path)[1])
    if ref.kind == "onnx":
        from lmalgebra.sources.models import sibling_config
        from lmalgebra.sources.onnx_encoder import OnnxEncoder

        encoder = OnnxEncoder.load(ref.name, path, sibling_config(path))
        width = int(encoder.config.hidden_size)
        layer, _, hidden, intermediate = _architecture(sibling_config(path), width)
        size = path.stat().st_size
        return ModelShape(ref.name, ref.kind, width, layer, size, hidden, intermediate)
    # refused here, by the dry run too, before any embedding
    check_architecture(ref, path, memo_dir=memo.directory, remember=memo.write)
    config = _read_config(ref, path / "config.json")
    width = _first(config, _WIDTH)  # 0: not named (the plan cannot be made)
    layer, total, hidden, intermediate = _architecture(config, width)
    files = [p for p in path.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)]
    on_disk = sum(p.stat().st_size for p in files)
    # weights are loaded in float32 whatever the checkpoint stores (or bfloat16 when asked);
    # the files' size stands in for an architecture the config does not describe
    weight_bytes = bytes_per_weight * total or on_disk
    return ModelShape(ref.name, ref.kind, width, layer, weight_bytes, hidden, intermediate)


def _read_config(ref: ModelRef, path: Any) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserInputError(f"model {ref.name!r}: cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"model {ref.name!r}: {path} is not a JSON object")
    text = data.get("text_config")  # multimodal configs keep the language model's sizes there
    return {**data, **text} if isinstance(text, dict) else data


def _first(config: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def _architecture(config: Mapping[str, Any], width: int) -> tuple[int, int, int, int]:
    """``(layer weights, all weights, hidden, intermediate)``: attention and feed-forward
    weights per layer, ``4 H^2 + 2 H I``, times the layers; all of them adds the token
    embeddings ``V H``."""
    hidden = _first(config, _WIDTH) or width
    layers = _first(config, _LAYERS)
    intermediate = _first(config, _FEED_FORWARD) or 4 * hidden
    layer = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return layer, layer + _first(config, ("vocab_size",)) * hidden, hidden, intermediate


def _given_shape(name: str, given: GivenModel) -> ModelShape:
    if isinstance(given, GivenArrays):
        return ModelShape(name, "memory", int(given.array.shape[1]))
    module = given.model
    parameters = sum(int(p.numel()) for p in module.parameters())
    weight_bytes = sum(int(p.numel() * p.element_size()) for p in module.parameters())
    if isinstance(given, SentenceEncoder):
        # sentence-transformers 5.x renamed get_sentence_embedding_dimension (deprecated since)
        dimension = getattr(module, "get_embedding_dimension", None)
        if dimension is None:
            dimension = module.get_sentence_embedding_dimension
        width = int(dimension() or 0)
        return ModelShape(name, "memory", width, parameters, weight_bytes, width, 4 * width)
    assert isinstance(given, TransformerPair)
    config = module.config.to_dict() if hasattr(module.config, "to_dict") else {}
    width = _first(config, _WIDTH)
    layer, _, hidden, intermediate = _architecture(config, width)
    return ModelShape(name, "memory", width, layer, weight_bytes, hidden, intermediate)
