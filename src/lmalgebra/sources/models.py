"""Model references: resolve a hub id or local directory, load it, and fingerprint its weights.

A reference is resolved to a local path first (a hub snapshot lands in the Hugging Face cache, a
GGUF file is dequantised into a model directory in the lmalgebra cache), so every loader reads a
plain directory and the weights hash is always a hash of files, computed once and memoised by size,
times and inode.
Three kinds: a Hugging Face model (a directory), an ONNX encoder (a ``.onnx`` file run with
onnxruntime and a named tokenizer), and precomputed embeddings (a file of vectors, one per span).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.precision import device_map_memory
from lmalgebra.core.remote_code import announce_remote_code, load_failure
from lmalgebra.core.settings import Settings
from lmalgebra.core.text_files import absent
from lmalgebra.sources.gguf_models import GGUF_PREFIX, file_directory
from lmalgebra.sources.hub import looks_local, snapshot
from lmalgebra.sources.loaded_weights import refuse_incomplete
from lmalgebra.sources.packaged import ONNX_ASSETS, PACKAGE_PREFIX, asset_path
from lmalgebra.sources.precomputed import SUFFIXES as PRECOMPUTED_SUFFIXES
from lmalgebra.storage.atomic import write_text_atomic

log = logging.getLogger(__name__)

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "added_tokens.json",
)
_FILE_SUFFIXES = (".onnx", *PRECOMPUTED_SUFFIXES)

_AUTO_KINDS = {
    "AutoModel": "base model",
    "AutoModelForCausalLM": "causal language model",
    "AutoModelForMaskedLM": "masked language model",
}
ModelKind = Literal["transformers", "onnx", "precomputed", "memory"]
_KIND_PREFIXES: dict[str, ModelKind] = {"onnx:": "onnx", "precomputed:": "precomputed"}


def _split_kind(path: str) -> tuple[ModelKind | None, str, str | None]:
    """``"onnx:m.onnx#tok"`` -> ``("onnx", "m.onnx", "tok")``; no kind prefix -> ``(None, ...)``."""
    for prefix, kind in _KIND_PREFIXES.items():
        if path.startswith(prefix):
            path = path.removeprefix(prefix)
            if kind == "onnx" and "#" in path:
                path, _, tokenizer = path.rpartition("#")
                return kind, path, tokenizer or None
            return kind, path, None
    if path.startswith(PACKAGE_PREFIX) and path.removeprefix(PACKAGE_PREFIX) in ONNX_ASSETS:
        return "onnx", path, None
    return None, path, None


class ModelRef(Settings):
    """A model to embed with: where it comes from and how to load it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Short name used in tables and file names.")
    path: str = Field(
        description="Hugging Face hub id, local model directory, package:NAME (packaged model) "
        "or gguf:FILE (a GGUF file, dequantised once into the cache)."
    )
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    random_init: bool = Field(
        default=False,
        description="Use the architecture with freshly initialised weights (a null baseline).",
    )
    seed: int = Field(default=0, description="Seed of the random initialisation.")
    trust_remote_code: bool = Field(
        default=False, description="Allow code shipped with the model to run (off unless asked)."
    )
    kind: ModelKind = Field(
        default="transformers",
        description="transformers: a Hugging Face model; onnx: an ONNX encoder file run with "
        "onnxruntime; precomputed: a .npy/.parquet/.safetensors file of span embeddings; "
        "memory: a Python object given to lmalgebra.decompose() (not loadable from a recipe). "
        "A path prefix onnx: or precomputed: sets it too.",
    )
    tokenizer: str | None = Field(
        default=None,
        description="ONNX models: tokenizer directory, hub id or package:NAME (default: "
        "the ONNX file's own folder, or the packaged model's tokenizer).",
    )
    unchecked_order: bool = Field(
        default=False,
        description="Precomputed models: accept a file that carries no span order "
        "(a .npy without its .spans.sha256 sidecar).",
    )

    @model_validator(mode="before")
    @classmethod
    def _kind_prefix(cls, data: Any) -> Any:
        if not isinstance(data, dict) or not isinstance(data.get("path"), str):
            return data
        kind, path, tokenizer = _split_kind(data["path"])
        if kind is None:
            return data
        if data.get("kind", kind) != kind:
            raise UserInputError(
                f"model {data.get('name', path)!r}: path says {kind} but kind is {data['kind']}"
            )
        if tokenizer is not None and data.get("tokenizer", tokenizer) != tokenizer:
            raise UserInputError(f"model {data.get('name', path)!r}: two tokenizers given")
        update = {"kind": kind, "path": path}
        return {**data, **update, **({"tokenizer": tokenizer} if tokenizer else {})}

    @model_validator(mode="after")
    def _check_kind(self) -> ModelRef:
        wrong = []
        if self.kind != "transformers":
            wrong += [k for k in ("revision", "random_init") if getattr(self, k)]
        if self.kind != "onnx" and self.tokenizer is not None:
            wrong.append("tokenizer")
        if self.kind != "precomputed" and self.unchecked_order:
            wrong.append("unchecked_order")
        if wrong:
            raise UserInputError(
                f"model {self.name!r}: {', '.join(wrong)} does not apply to a {self.kind} model"
            )
        return self

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """CLI form: ``[NAME=][random:]PATH[@REVISION]``, ``[NAME=][random:]gguf:FILE``,
        ``[NAME=]onnx:FILE[#TOKENIZER]`` or ``[NAME=]precomputed:FILE``."""
        name, _, ref = text.rpartition("=") if "=" in text else ("", "", text)
        kind, file, tokenizer = _split_kind(ref)
        if kind is not None:
            if not file:
                raise UserInputError(f"model reference {text!r} names no file")
            stem = Path(file.rstrip("/")).stem if file.endswith(_FILE_SUFFIXES) else None
            default = stem or Path(file.removeprefix(PACKAGE_PREFIX).rstrip("/")).name
            return cls(name=name or default, path=file, kind=kind, tokenizer=tokenizer)
        random_init = ref.startswith("random:")
        ref = ref.removeprefix("random:")
        gguf = ref.startswith(GGUF_PREFIX)  # a file path: an @ in it is no revision
        path, _, revision = (ref, "", "") if gguf else ref.partition("@")
        if not path.removeprefix(GGUF_PREFIX):
            raise UserInputError(f"model reference {text!r} names no path or hub id")
        if not name:
            readable = path.removeprefix(PACKAGE_PREFIX)  # package:minilm -> minilm
            readable = Path(readable.removeprefix(GGUF_PREFIX)).stem if gguf else readable
            name = Path(readable.rstrip("/")).name + ("-random" if random_init else "")
        return cls(name=name, path=path, revision=revision or None, random_init=random_init)


def resolve_directory(ref: ModelRef, weights: bool = True) -> Path:
    """The local path of the model: its directory (a hub snapshot is downloaded if needed), or
    the file itself for ONNX and precomputed models. ``weights=False``: a hub snapshot of the
    tokenizer files and ``config.json`` alone, or a GGUF file's configuration and tokenizer
    without dequantising it into the cache (enough to plan a run)."""
    if ref.kind == "memory":
        raise UserInputError(
            f"model {ref.name!r} was a Python object given to lmalgebra.decompose(): "
            "a recipe or the command line cannot load it"
        )
    if ref.kind == "onnx":
        return _onnx_file(ref)
    if ref.kind == "precomputed":
        return _precomputed_file(ref)
    if ref.path.startswith(PACKAGE_PREFIX):
        return asset_path(ref.path.removeprefix(PACKAGE_PREFIX), weights)
    if ref.path.startswith(GGUF_PREFIX):
        return file_directory(ref.path.removeprefix(GGUF_PREFIX), f"model {ref.name!r}", weights)
    local = Path(ref.path).expanduser()
    if local.is_symlink() and not local.exists():  # no hub id: a link to nothing
        raise UserInputError(f"model {ref.name!r}: {ref.path} {absent(local)}")
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise UserInputError(
                f"model {ref.name!r}: {local} is not a model directory (no config.json)"
            )
        return local
    if local.exists():
        raise UserInputError(f"model {ref.name!r}: {ref.path} is a file, not a model directory")
    if looks_local(ref.path):
        raise UserInputError(f"model {ref.name!r}: directory {ref.path} does not exist")
    patterns = None if weights else [*TOKENIZER_FILES, "config.json"]
    return snapshot(f"model {ref.name!r}", ref.path, ref.revision, patterns)


def _local_file(ref: ModelRef, what: str) -> Path:
    if ref.path.startswith(PACKAGE_PREFIX):
        return asset_path(ref.path.removeprefix(PACKAGE_PREFIX))
    path = Path(ref.path).expanduser()
    if not path.exists():
        raise UserInputError(f"model {ref.name!r}: {what} {ref.path} {absent(path)}")
    return path


def _onnx_file(ref: ModelRef) -> Path:
    path = _local_file(ref, "ONNX file")
    if path.is_dir():  # an exported folder: model.onnx, or its only .onnx file
        found = [path / "model.onnx"] if (path / "model.onnx").is_file() else []
        found = found or sorted(path.glob("*.onnx"))
        if len(found) != 1:
            raise UserInputError(
                f"model {ref.name!r}: {path} holds {len(found)} .onnx files; name one of them"
            )
        path = found[0]
    return path


def _precomputed_file(ref: ModelRef) -> Path:
    path = _local_file(ref, "embeddings file")
    if not path.is_file() or path.suffix.lower() not in PRECOMPUTED_SUFFIXES:
        raise UserInputError(
            f"model {ref.name!r}: {path} is not a file of embeddings "
            f"({', '.join(PRECOMPUTED_SUFFIXES)})"
        )
    return path


def tokenizer_directory(ref: ModelRef, onnx_file: Path) -> Path:
    """Where an ONNX model's tokenizer lives: ``ref.tokenizer``, the packaged model's default,
    or the ONNX file's own folder when it holds tokenizer files."""
    source = ref.tokenizer
    if source is None and ref.path.startswith(PACKAGE_PREFIX):
        source = ONNX_ASSETS.get(ref.path.removeprefix(PACKAGE_PREFIX))
    if source is None:
        if any((onnx_file.parent / f).is_file() for f in TOKENIZER_FILES):
            return onnx_file.parent
        raise UserInputError(
            f"model {ref.name!r}: an ONNX model needs a tokenizer: onnx:FILE#TOKENIZER on the "
            "command line or tokenizer: in the recipe (a directory, hub id or package:NAME)"
        )
    return resolve_tokenizer(source, f"model {ref.name!r}")


def resolve_tokenizer(source: str, owner: str) -> Path:
    """The directory of the tokenizer ``source`` names: a directory, ``package:NAME``,
    ``gguf:FILE`` (the tokenizer the file describes) or a hub id (``ID[@REVISION]``, its
    tokenizer files fetched). ``owner`` starts every message."""
    if source.startswith(PACKAGE_PREFIX):
        return asset_path(source.removeprefix(PACKAGE_PREFIX))
    if source.startswith(GGUF_PREFIX):
        return file_directory(source.removeprefix(GGUF_PREFIX), owner)
    local = Path(source).expanduser()
    if local.is_symlink() and not local.exists():
        raise UserInputError(f"{owner}: tokenizer {source} {absent(local)}")
    if local.is_dir():
        return local
    if local.exists():
        raise UserInputError(f"{owner}: tokenizer {source} is a file, not a directory")
    repo, _, revision = source.partition("@")
    if looks_local(repo):
        raise UserInputError(f"{owner}: tokenizer directory {source} does not exist")
    return snapshot(owner, repo, revision or None, [*TOKENIZER_FILES, "config.json"])


def sibling_config(path: Path) -> dict[str, Any]:
    config = path.parent / "config.json"
    try:
        return dict(json.loads(config.read_text())) if config.is_file() else {}
    except (json.JSONDecodeError, TypeError, ValueError):
        log.warning("ignoring %s: not a JSON object", config)
        return {}


def load_tokenizer(ref: ModelRef, directory: Path) -> Any:
    """A fast tokenizer (offsets are needed); refuses slow-only tokenizers."""
    if ref.kind == "precomputed":
        raise UserInputError(f"model {ref.name!r} is a precomputed embeddings file: no tokenizer")
    if ref.kind == "onnx":
        directory = tokenizer_directory(ref, directory)
    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    return _fast_tokenizer(directory, f"model {ref.name!r}", ref.trust_remote_code)


def load_named_tokenizer(source: str, owner: str) -> Any:
    """The fast tokenizer ``source`` names (a directory, hub id or ``package:NAME``), without
    remote code; ``owner`` starts every message."""
    return _fast_tokenizer(resolve_tokenizer(source, owner), owner, False)


def load_reference_tokenizer(source: str, models: Sequence[str]) -> Any:
    """The fast tokenizer ``source`` names (a directory, hub id or ``package:NAME``) when it is
    no model of the run: a ``reference_tokenizer`` that cuts spans without embedding anything.
    ``models``: the run's model names, listed when ``source`` turns out to be unusable."""
    try:
        return load_named_tokenizer(source, f"reference_tokenizer {source!r}")
    except UserInputError as err:
        if not models:
            raise
        raise UserInputError(f"{err} (nor is it a model of this run: {', '.join(models)})") from err


def _fast_tokenizer(directory: Path, owner: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except Exception as err:
        raise UserInputError(
            f"{owner}: cannot load a tokenizer from {directory}: {load_failure(err)}"
        ) from err
    if not getattr(tokenizer, "is_fast", False):
        raise UserInputError(
            f"{owner}: tokenizer is not a fast (Rust) tokenizer, so it reports no token offsets"
        )
    return tokenizer


def load_model(
    ref: ModelRef,
    directory: Path,
    device: str = "cpu",
    weights_dtype: str = "float32",
    device_map: str | None = None,
) -> Any:
    """The bare ``AutoModel`` (hidden states) in eval mode on ``device``; random weights if asked.
    A model whose files lack weights it uses, or hold weights it has no place for, is refused
    (:func:`~lmalgebra.sources.loaded_weights.refuse_incomplete`).

    Weights are float32 unless ``weights_dtype`` is ``bfloat16`` (half the memory of a model too
    large for one device; its forward pass is then bfloat16). Otherwise lower precision is the
    forward pass's business (autocast), not the weights'. ``device_map="auto"`` spreads the
    model over the devices instead, layer by layer (under several processes on one machine,
    each on its share: :func:`~lmalgebra.core.precision.device_map_memory`).

    An ONNX model loads as an :class:`~lmalgebra.sources.onnx_encoder.OnnxEncoder`, which the
    embedding loop drives like an ``AutoModel``; it runs on the CPU whatever ``device`` says.
    """
    if ref.kind == "precomputed":
        raise UserInputError(f"model {ref.name!r} is a file of precomputed embeddings: no network")
    if ref.kind == "onnx":
        from lmalgebra.sources.onnx_encoder import OnnxEncoder

        if device != "cpu":
            log.warning("model %r: an ONNX graph runs on the CPU, not on %s", ref.name, device)
        return OnnxEncoder.load(ref.name, directory, sibling_config(directory))
    import torch
    from transformers import AutoConfig, AutoModel

    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    # float32 whatever the checkpoint stores, unless asked: weights kept in half precision make
    # every product half precision, autocast or not
    dtype = torch.bfloat16 if weights_dtype == "bfloat16" else torch.float32
    placement = {} if device_map is None else {"device_map": device_map, **device_map_memory()}
    try:
        if ref.random_init:
            config = AutoConfig.from_pretrained(directory, trust_remote_code=ref.trust_remote_code)
            torch.manual_seed(ref.seed)
            model = AutoModel.from_config(config, trust_remote_code=ref.trust_remote_code)
            model = model.to(dtype)
        else:
            model, info = AutoModel.from_pretrained(
                directory,
                dtype=dtype,
                trust_remote_code=ref.trust_remote_code,
                output_loading_info=True,
                **placement,
            )
            # hidden states are all that is read: a pooler the files lack goes unused
            refuse_incomplete(f"model {ref.name!r}", directory, model, info, unused=("pooler",))
    except UserInputError:
        raise
    except Exception as err:
        raise UserInputError(
            f"model {ref.name!r}: cannot load from {directory}: {load_failure(err)}"
        ) from err
    if getattr(model, "hf_device_map", None) is not None:
        return model.eval()  # placed layer by layer: left where Accelerate put it
    return model.to(device).eval()


def check_architecture(
    ref: ModelRef,
    directory: Path,
    auto: str = "AutoModel",
    owner: str | None = None,
    memo_dir: Path | None = None,
    remember: bool = True,
) -> None:
    """Refuse a model whose configuration transformers cannot read, or whose architecture has
    no ``auto`` form (``AutoModel``, ``AutoModelForCausalLM``...), from ``config.json`` alone:
    planned and checked before any work, by a dry run too, rather than found when its weights
    are loaded after the run's other models. A model allowed to run its own code
    (``trust_remote_code``) may bring an architecture of its own: it is left to its load, so
    that none of its code runs before then. ``owner`` starts the message.

    ``memo_dir``: where a passed check is remembered (``remember``; a dry run only reads),
    keyed on ``config.json`` as it is and the transformers release, so a run whose embeddings
    are all cached does not import transformers to check again."""
    if ref.kind != "transformers" or ref.trust_remote_code:
        return
    memo = _architecture_memo(directory, auto, memo_dir)
    if memo is not None and memo.is_file():
        return
    import transformers
    from transformers import AutoConfig

    owner = owner or f"model {ref.name!r}"
    try:
        config = AutoConfig.from_pretrained(directory)
    except Exception as err:
        raise UserInputError(
            f"{owner}: transformers cannot read the configuration in {directory}: "
            f"{load_failure(err)}"
        ) from err
    if type(config) not in getattr(transformers, auto)._model_mapping:
        kind = _AUTO_KINDS.get(auto, auto)
        raise UserInputError(
            f"{owner}: transformers has no {kind} for the {config.model_type!r} architecture "
            f"of {directory}"
        )
    if memo is not None and remember:
        write_text_atomic(memo, "checked\n")


def _architecture_memo(directory: Path, auto: str, memo_dir: Path | None) -> Path | None:
    """Where a passed :func:`check_architecture` of ``directory`` is remembered (None: nowhere,
    or no ``config.json`` to key it on)."""
    config = directory / "config.json"
    if memo_dir is None or not config.is_file():
        return None
    from importlib.metadata import version

    found = config.stat()
    stamp = [str(config.resolve()), found.st_size, found.st_mtime_ns, found.st_ctime_ns]
    key = sha256_json([auto, *stamp, found.st_ino, version("transformers")])
    return memo_dir / f"architecture-{key}.checked"


def model_depth(ref: ModelRef, directory: Path) -> int:
    """Number of hidden layers (the embedding output is layer 0), for layer studies.

    ONNX graphs have layers only when they expose ``hidden_states.0..N``; precomputed files none.
    """
    if ref.kind == "precomputed":
        raise UserInputError(f"model {ref.name!r} is a precomputed embeddings file: no layers")
    if ref.kind == "onnx":
        model = load_model(ref, directory)
        model.check_layer(0)
        return int(model.config.num_hidden_layers)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(directory, trust_remote_code=ref.trust_remote_code)
    return int(config.num_hidden_layers)


def check_layer(name: str, model: Any, layer: int) -> None:
    """Refuse a hidden-layer index the model does not have (0 = embeddings, -1 = the last)."""
    from lmalgebra.sources.onnx_encoder import OnnxEncoder

    if isinstance(model, OnnxEncoder):
        model.check_layer(layer)
        return
    layers = getattr(model.config, "num_hidden_layers", None)
    if layers is not None and not -(layers + 1) <= layer <= layers:
        raise UserInputError(
            f"model {name!r}: layer {layer} does not exist "
            f"({layers} layers; use 0..{layers} or -{layers + 1}..-1)"
        )
