"""Model references: resolve a hub id or local directory, load it, and fingerprint its weights.

A reference is resolved to a local directory first (a hub snapshot lands in the Hugging Face cache),
so the weights hash is always a hash of files, computed once and memoised by size and mtime.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from lmalgebra.errors import UserInputError
from lmalgebra.fingerprint import sha256_files, sha256_json
from lmalgebra.sources.packaged import PACKAGE_PREFIX, asset_path

log = logging.getLogger(__name__)

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx")
_TOKENIZER_FILES = (
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
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


class ModelRef(BaseModel):
    """A model to embed with: where it comes from and how to load it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Short name used in tables and file names.")
    path: str = Field(
        description="Hugging Face hub id, local model directory, or package:NAME (packaged model)."
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

    @classmethod
    def parse(cls, text: str) -> ModelRef:
        """CLI form: ``[NAME=][random:]PATH[@REVISION]``."""
        name, _, ref = text.rpartition("=") if "=" in text else ("", "", text)
        random_init = ref.startswith("random:")
        ref = ref.removeprefix("random:")
        path, _, revision = ref.partition("@")
        if not path:
            raise UserInputError(f"model reference {text!r} names no path or hub id")
        if not name:
            name = Path(path.rstrip("/")).name + ("-random" if random_init else "")
        return cls(name=name, path=path, revision=revision or None, random_init=random_init)


def resolve_directory(ref: ModelRef) -> Path:
    """The local directory holding the model's files, downloading a hub snapshot if needed."""
    if ref.path.startswith(PACKAGE_PREFIX):
        return asset_path(ref.path.removeprefix(PACKAGE_PREFIX))
    local = Path(ref.path).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise UserInputError(
                f"model {ref.name!r}: {local} is not a model directory (no config.json)"
            )
        return local
    looks_local = (
        ref.path.startswith((".", "/", "~")) or local.exists() or not _HUB_ID.match(ref.path)
    )
    if looks_local:
        raise UserInputError(f"model {ref.name!r}: directory {ref.path} does not exist")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(ref.path, revision=ref.revision))
    except Exception as err:  # the hub client raises many types; all mean "cannot get it"
        raise UserInputError(
            f"model {ref.name!r}: cannot fetch {ref.path!r} from the hub "
            f"({type(err).__name__}); give a local directory instead"
        ) from err


def _memoised_hash(files: list[Path], root: Path, memo_dir: Path | None) -> str:
    if not files:
        return sha256_json([])
    stamp = sha256_json([[str(f), f.stat().st_size, f.stat().st_mtime_ns] for f in sorted(files)])
    memo = memo_dir / f"{stamp}.hash" if memo_dir else None
    if memo is not None and memo.is_file():
        return memo.read_text().strip()
    digest = sha256_files(files, root)
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        memo.write_text(digest)
    return digest


def fingerprint(ref: ModelRef, directory: Path, memo_dir: Path | None = None) -> dict[str, str]:
    """Hashes of what changes the numbers: weights (or config + seed if random), tokenizer."""
    config = json.loads((directory / "config.json").read_text())
    if ref.random_init:
        weights = sha256_json({"config": config, "seed": ref.seed, "random_init": True})
    else:
        files = [
            p for p in directory.rglob("*") if p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES)
        ]
        if not files:
            raise UserInputError(f"model {ref.name!r}: no weight files in {directory}")
        weights = _memoised_hash(files, directory, memo_dir)
    tok_files = [directory / f for f in _TOKENIZER_FILES if (directory / f).is_file()]
    return {
        "weights": weights,
        "tokenizer": _memoised_hash(tok_files, directory, memo_dir),
        "config": sha256_json(config),
    }


def load_tokenizer(ref: ModelRef, directory: Path) -> Any:
    """A fast tokenizer (offsets are needed); refuses slow-only tokenizers."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            directory, trust_remote_code=ref.trust_remote_code
        )
    except Exception as err:
        raise UserInputError(
            f"model {ref.name!r}: cannot load a tokenizer from {directory}: {err}"
        ) from err
    if not getattr(tokenizer, "is_fast", False):
        raise UserInputError(f"model {ref.name!r}: tokenizer is not a fast (Rust) tokenizer")
    return tokenizer


def load_model(ref: ModelRef, directory: Path, dtype: str = "float32") -> Any:
    """The bare ``AutoModel`` (hidden states), in eval mode; random weights if asked."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    if ref.trust_remote_code:
        log.warning("model %r: trust_remote_code is on; code from %s will run", ref.name, directory)
    try:
        if ref.random_init:
            config = AutoConfig.from_pretrained(directory, trust_remote_code=ref.trust_remote_code)
            torch.manual_seed(ref.seed)
            model = AutoModel.from_config(config, trust_remote_code=ref.trust_remote_code)
            model = model.to(torch_dtype)
        else:
            model = AutoModel.from_pretrained(
                directory, dtype=torch_dtype, trust_remote_code=ref.trust_remote_code
            )
    except UserInputError:
        raise
    except Exception as err:
        raise UserInputError(f"model {ref.name!r}: cannot load from {directory}: {err}") from err
    return model.eval()


def check_layer(name: str, model: Any, layer: int) -> None:
    """Refuse a hidden-layer index the model does not have (0 = embeddings, -1 = the last)."""
    layers = getattr(model.config, "num_hidden_layers", None)
    if layers is not None and not -(layers + 1) <= layer <= layers:
        raise UserInputError(
            f"model {name!r}: layer {layer} does not exist "
            f"({layers} layers; use 0..{layers} or -{layers + 1}..-1)"
        )
