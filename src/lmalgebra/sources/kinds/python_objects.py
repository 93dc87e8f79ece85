"""Models handed over as Python objects (kind ``memory``): a ``(PreTrainedModel, tokenizer)``
pair, a ``SentenceTransformer``, or an array of precomputed span embeddings.

They take the place of a model reference in a decomposition run (``ModelRef`` of kind
``memory``, which alone loads nothing). They are embedded afresh on every run and never cached: a
notebook may change a model's weights between two calls. Their fingerprints (a hash of every
parameter and buffer, of the tokenizer and of the configuration) are recorded in the run's
provenance all the same.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, NoReturn

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.precision import module_device
from lmalgebra.core.splits import SPLITS
from lmalgebra.sources.embed_spec import EmbedSpec, TokenReport
from lmalgebra.sources.model_files import ModelShape, architecture, config_width
from lmalgebra.sources.model_source import ModelSource, ReferencedModel, check_layer
from lmalgebra.sources.precomputed import SPLIT_WORDS, Float32Spread, PrecomputedSplit


class ObjectReference(ReferencedModel):
    """A ``memory`` reference: what a recipe records of a Python object, which a run is given
    by name (:func:`~lmalgebra.sources.kinds.bound_sources`); alone, it loads nothing."""

    python_object: ClassVar[bool] = True
    cached: ClassVar[bool] = False
    what: ClassVar[str] = "a Python object given to lmalgebra.decompose()"

    def resolve(self, weights: bool = True) -> NoReturn:
        raise UserInputError(
            f"model {self.name!r} was a Python object given to lmalgebra.decompose(): "
            "a recipe or the command line cannot load it"
        )

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        self.resolve()

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        self.resolve()


class _GivenObject(ModelSource):
    """What the objects share: kind ``memory``, never cached, loaded already (the run's
    settings of loading, in ``IGNORES``, do not apply to them)."""

    kind = "memory"
    python_object: ClassVar[bool] = True
    cached: ClassVar[bool] = False
    IGNORES: ClassVar[tuple[str, ...]] = ("weights_dtype", "device_map")


def _weight_bytes(module: Any) -> int:
    return sum(int(p.numel() * p.element_size()) for p in module.parameters())


def _state_hash(module: Any) -> str:
    """sha256 over every parameter and buffer: name, dtype, shape and bytes, in name order."""
    import torch

    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        flat = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{flat.dtype}|{tuple(flat.shape)}\n".encode())
        digest.update(flat.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _tokenizer_hash(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(tokenizer)
    return sha256_json({"tokenizer": text, "special": str(tokenizer.all_special_tokens)})


def refuse_meta(name: str, module: Any) -> None:
    """Refuse a model whose weights are on PyTorch's meta device: shapes without values (built
    under ``torch.device("meta")`` or accelerate's ``init_empty_weights``), which can be neither
    hashed nor run."""
    tensors = (*module.parameters(), *module.buffers())
    if any(getattr(t, "is_meta", False) for t in tensors):
        raise UserInputError(
            f"model {name!r}: its weights are on the meta device (shapes without values, as "
            "init_empty_weights or torch.device('meta') build them); load its weights first"
        )


def check_fast_tokenizer(name: str, tokenizer: Any) -> None:
    """Spans are cut with character offsets: only fast (Rust) tokenizers give them."""
    if not getattr(tokenizer, "is_fast", False):
        raise UserInputError(
            f"model {name!r}: the tokenizer ({type(tokenizer).__name__}) is not a fast (Rust) "
            "tokenizer; load it with AutoTokenizer.from_pretrained(..., use_fast=True)"
        )


@dataclass
class TransformerPair(_GivenObject):
    """A loaded Hugging Face model (any ``AutoModel`` with hidden states) and its tokenizer,
    embedded by the one embedding loop exactly like a model named by a path."""

    name: str
    model: Any
    tokenizer: Any
    description: str = field(init=False)

    def __post_init__(self) -> None:
        if not hasattr(self.model, "config") or not callable(self.model):
            raise UserInputError(
                f"model {self.name!r}: {type(self.model).__name__} is not a transformers model "
                "(give (PreTrainedModel, tokenizer))"
            )
        check_fast_tokenizer(self.name, self.tokenizer)
        refuse_meta(self.name, self.model)
        self.description = f"{type(self.model).__name__} object"

    def _config(self) -> dict[str, Any]:
        config = self.model.config
        return config.to_dict() if hasattr(config, "to_dict") else {}

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        return {
            "weights": _state_hash(self.model),
            "tokenizer": _tokenizer_hash(self.tokenizer),
            "config": sha256_json({"kind": "memory", "config": self._config()}),
        }

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        config = self._config()
        width = config_width(config)
        layer, _, hidden, intermediate = architecture(config, width)
        return self._shape(width, layer, _weight_bytes(self.model), hidden, intermediate)

    def load_tokenizer(self) -> Any:
        return self.tokenizer

    def depth(self) -> int:
        layers = getattr(self.model.config, "num_hidden_layers", None)
        if layers is None:
            raise UserInputError(f"model {self.name!r}: its config has no num_hidden_layers")
        return int(layers)

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        import torch

        from lmalgebra.sources.embed import embed

        for layer in spec.layers or (spec.layer,):
            check_layer(self.name, self.model, layer)
        was_training = bool(getattr(self.model, "training", False))
        self.model.eval()  # no dropout in embeddings; the caller's mode and device are restored
        home = module_device(self.model)
        if home is not None and home != torch.device(spec.device):
            self.model.to(spec.device)
        # a model with a head (AutoModelForMaskedLM, ...) returns its logits, not its hidden
        # states: its base model is embedded, as a directory is read (AutoModel)
        network = getattr(self.model, "base_model", self.model)
        try:
            return embed(texts, network, self.tokenizer, spec, owner=f"model {self.name!r}")
        finally:
            if home is not None and home != torch.device(spec.device):
                self.model.to(home)
            if was_training:
                self.model.train()


@dataclass
class SentenceEncoder(_GivenObject):
    """A ``sentence_transformers.SentenceTransformer``: its own pipeline (tokenisation up to its
    ``max_seq_length``, pooling, normalisation) through ``encode``. The run's settings in
    ``IGNORES`` do not apply to it, and it has no layers for the layer studies."""

    name: str
    model: Any
    description: str = field(init=False)
    IGNORES: ClassVar[tuple[str, ...]] = (
        *_GivenObject.IGNORES,
        *("layer", "pooling", "exclude_special", "max_length"),  # its own pipeline's
    )

    def __post_init__(self) -> None:
        self.description = "SentenceTransformer object"
        check_fast_tokenizer(self.name, self.load_tokenizer())
        refuse_meta(self.name, self.model)

    def load_tokenizer(self) -> Any:
        return self.model.tokenizer

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        return {
            "weights": _state_hash(self.model),
            "tokenizer": _tokenizer_hash(self.load_tokenizer()),
            "config": sha256_json({"kind": "memory", "pipeline": repr(self.model)}),
        }

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        # sentence-transformers 5.x renamed get_sentence_embedding_dimension (deprecated since)
        dimension = getattr(self.model, "get_embedding_dimension", None)
        if dimension is None:
            dimension = self.model.get_sentence_embedding_dimension
        width = int(dimension() or 0)
        parameters = sum(int(p.numel()) for p in self.model.parameters())
        return self._shape(width, parameters, _weight_bytes(self.model), width, 4 * width)

    def depth(self) -> int:
        raise UserInputError(
            f"model {self.name!r} is a SentenceTransformer, embedded through its own encode(): "
            "no layers"
        )

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        from lmalgebra.sources.embed import tokenize

        if spec.layers is not None:
            self.depth()
        limit = int(getattr(self.model, "max_seq_length", None) or 512)
        _, _, report = tokenize(texts, self.load_tokenizer(), limit)
        was_training = bool(getattr(self.model, "training", False))
        try:  # encode() leaves it in eval mode: the caller's mode is restored, as a pair's is
            vectors = self.model.encode(
                texts, batch_size=spec.batch_size, convert_to_numpy=True, show_progress_bar=False
            )
        finally:
            if was_training:
                self.model.train()
        return np.asarray(vectors, dtype=np.float32).reshape(len(texts), -1), report


@dataclass
class GivenArrays(_GivenObject):
    """Precomputed span embeddings ``(spans, dim)``: one row per span of the run, train then
    validation then test, in the order ``lmalgebra.spans()`` lists them."""

    name: str
    array: np.ndarray
    given: np.ndarray = field(init=False, repr=False)
    description: str = field(init=False)
    has_tokenizer: ClassVar[bool] = False
    fixed_spans: ClassVar[bool] = True

    def __post_init__(self) -> None:
        array = np.asarray(self.array)
        if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
            raise UserInputError(
                f"model {self.name!r}: an array of embeddings must be 2-D (spans, dim), a row "
                f"per span and a column at least, got shape {array.shape}"
            )
        if array.dtype.kind not in "iufc":  # a timedelta64 is a number to numpy, no embedding
            raise UserInputError(f"model {self.name!r}: the array is not numeric ({array.dtype})")
        if np.issubdtype(array.dtype, np.complexfloating):
            raise UserInputError(
                f"model {self.name!r}: the array is complex ({array.dtype}); embeddings are real"
            )
        if not np.isfinite(array).all():
            row = int(np.flatnonzero(~np.isfinite(array).all(axis=1))[0])
            raise UserInputError(f"model {self.name!r}: non-finite (NaN/inf) value in row {row}")
        with np.errstate(over="ignore"):  # a value past float32's range is named below
            single = np.ascontiguousarray(array, dtype=np.float32)
        if not np.isfinite(single).all():
            row = int(np.flatnonzero(~np.isfinite(single).all(axis=1))[0])
            raise UserInputError(
                f"model {self.name!r}: a value in row {row} is beyond float32's range "
                f"(|x| > {np.finfo(np.float32).max:.3g}), in which embeddings are kept"
            )
        lost = Float32Spread(array.shape[1])
        lost.add(array, single)
        lost.refuse(f"model {self.name!r}: its embeddings")
        if (single == single[0]).all():  # the run refuses it once every other model embedded
            raise UserInputError(
                f"model {self.name!r} does not vary over the training spans (every row of the "
                "array is the same embedding): nothing can be fitted to it or from it; check "
                "its embeddings"
            )
        self.array, self.given = single, array  # the array given: each split's checked too
        self.description = f"array {self.array.shape[0]} x {self.array.shape[1]}"

    def span_rows(self) -> int:
        """Its rows, one per span of the run."""
        return int(self.array.shape[0])

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        return {
            "weights": hashlib.sha256(self.array.tobytes()).hexdigest(),
            "tokenizer": sha256_json(None),
            "config": sha256_json({"kind": "memory", "shape": list(self.array.shape)}),
        }

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        return self._shape(int(self.array.shape[1]))

    def depth(self) -> int:
        raise UserInputError(f"model {self.name!r} is an array of embeddings: no layers")

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        raise UserInputError(f"model {self.name!r} is an array of embeddings: it embeds no text")

    def rows(self, texts: Mapping[str, list[str]], order: str) -> dict[str, PrecomputedSplit]:
        """The rows of each split, read like cache entries; refuses a wrong row count."""
        counts = {split: len(texts[split]) for split in SPLITS}
        total = sum(counts[s] for s in SPLITS)
        if self.array.shape[0] != total:
            listed = ", ".join(f"{s} {counts[s]}" for s in SPLITS)
            raise UserInputError(
                f"model {self.name!r}: the array has {self.array.shape[0]} rows but the run has "
                f"{total} spans ({listed}); lmalgebra.spans() lists them in row order"
            )
        out, start = {}, 0
        for split in SPLITS:
            rows = slice(start, start + counts[split])
            lost = Float32Spread(self.array.shape[1])  # a held-out split's too, named
            lost.add(self.given[rows], self.array[rows])
            lost.refuse(f"model {self.name!r}: its {SPLIT_WORDS[split]} embeddings")
            out[split] = in_memory_split(self.array[rows])
            start += counts[split]
        return out


GivenModel = TransformerPair | SentenceEncoder | GivenArrays


def in_memory_split(vectors: np.ndarray) -> PrecomputedSplit:
    """Rows ``(n, dim) float32`` held in memory, read by the statistics pass like a cache entry."""

    def read(start: int, stop: int) -> np.ndarray:
        return vectors[start:stop]

    return PrecomputedSplit(read, int(vectors.shape[0]), int(vectors.shape[1]))
