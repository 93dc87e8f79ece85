"""Fingerprints of models: hashes of what changes the numbers (weights, tokenizer, config).

Weight hashes are memoised by file path, size, modification and change times and inode, so a
large model is read once per change, not once per run, and an edit whose modification time was
set back is still seen. A model dequantised from a GGUF file also records that file's
sha256 and quantisation.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_files, sha256_json
from lmalgebra.sources.gguf_models import read_provenance
from lmalgebra.sources.models import (
    TOKENIZER_FILES,
    WEIGHT_SUFFIXES,
    ModelRef,
    sibling_config,
    tokenizer_directory,
)
from lmalgebra.storage.atomic import write_text_atomic


def _onnx_files(path: Path) -> list[Path]:
    """The graph and its external-data files (``<name>_data``, ``<name>.data``)."""
    extra = [path.with_name(path.name + s) for s in ("_data", ".data")]
    return [path, *(p for p in extra if p.is_file())]


def _stat_key(path: Path) -> list[int]:
    """What changes whenever ``path``'s bytes do: size, modification and change times, inode
    and device. The modification time alone can be set back (``touch -d``, ``cp -p``, an
    unpacked archive) after an edit of the same size; the change time is set by the kernel on
    every write and cannot be."""
    found = path.stat()
    return [found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino, found.st_dev]


def _memoised_hash(files: list[Path], root: Path, memo_dir: Path | None) -> str:
    if not files:
        return sha256_json([])
    stamp = sha256_json([[str(f), *_stat_key(f)] for f in sorted(files)])
    memo = memo_dir / f"{stamp}.hash" if memo_dir else None
    if memo is not None and memo.is_file():
        memoised = memo.read_text().strip()
        if re.fullmatch(r"[0-9a-f]{64}", memoised):  # a memo torn by a killed run is redone
            return memoised
    digest = sha256_files(files, root)
    if memo is not None:
        write_text_atomic(memo, digest)
    return digest


def fingerprint(ref: ModelRef, directory: Path, memo_dir: Path | None = None) -> dict[str, str]:
    """Hashes of what changes the numbers: weights (or config + seed if random), tokenizer; for
    a model dequantised from a GGUF file also ``gguf_sha256`` and ``quantisation`` (llama.cpp's
    file type, e.g. ``MOSTLY_Q4_K_M``).

    ``directory`` is what :func:`resolve_directory` returned (a file for ONNX and precomputed).
    """
    if ref.kind == "precomputed":
        return {
            "weights": _memoised_hash([directory], directory.parent, memo_dir),
            "tokenizer": sha256_json(None),
            "config": sha256_json({"kind": "precomputed"}),
        }
    if ref.kind == "onnx":
        tok_dir = tokenizer_directory(ref, directory)
        tok_files = [tok_dir / f for f in TOKENIZER_FILES if (tok_dir / f).is_file()]
        config = {"kind": "onnx", "config": sibling_config(directory)}
        return {
            "weights": _memoised_hash(_onnx_files(directory), directory.parent, memo_dir),
            "tokenizer": _memoised_hash(tok_files, tok_dir, memo_dir),
            "config": sha256_json(config),
        }
    config = json.loads((directory / "config.json").read_text())
    if ref.random_init:
        weights = sha256_json({"config": config, "seed": ref.seed, "random_init": True})
    else:
        # the files from_pretrained reads: the directory's own, not a subfolder's (a teacher made by
        # `pretrain` keeps its training checkpoints under training/, which must not count)
        files = [p for p in directory.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES)]
        if not files:
            raise UserInputError(f"model {ref.name!r}: no weight files in {directory}")
        weights = _memoised_hash(files, directory, memo_dir)
    tok_files = [directory / f for f in TOKENIZER_FILES if (directory / f).is_file()]
    hashes = {
        "weights": weights,
        "tokenizer": _memoised_hash(tok_files, directory, memo_dir),
        "config": sha256_json(config),
    }
    source = read_provenance(directory)
    if source is not None:
        hashes["gguf_sha256"] = str(source["sha256"])
        hashes["quantisation"] = str(source["quantisation"])
    return hashes
