"""Tokenizers: found by reference (a directory, hub id, ``package:NAME`` or ``gguf:FILE``) and
loaded fast (spans are cut with the character offsets only fast tokenizers report)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.remote_code import load_failure
from lmalgebra.core.settings import home_expanded
from lmalgebra.core.text_files import absent, not_a_directory, not_a_file
from lmalgebra.sources.gguf_models import GGUF_PREFIX, file_directory
from lmalgebra.sources.hub import looks_local, snapshot
from lmalgebra.sources.packaged import ONNX_ASSETS, PACKAGE_PREFIX, asset_path

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "spm.model",
    "sentencepiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "added_tokens.json",
)


def resolve_tokenizer(source: str, owner: str, weights: bool = True) -> Path:
    """The directory of the tokenizer ``source`` names: a directory, ``package:NAME`` (for a
    packaged ONNX graph, the packaged tokenizer it is run with), ``gguf:FILE`` (the tokenizer
    the file describes) or a hub id (``ID[@REVISION]``, its tokenizer files fetched).
    ``owner`` starts every message. ``weights=False`` (a plan): a packaged model or GGUF file is
    not unpacked or dequantised into the cache for it (the tokenizer files it yields are the
    same bytes)."""
    if source.startswith(PACKAGE_PREFIX):  # a packaged ONNX graph: the tokenizer it runs with
        name = ONNX_ASSETS.get(source.removeprefix(PACKAGE_PREFIX), source)
        return asset_path(name.removeprefix(PACKAGE_PREFIX), weights, "model")
    if source.startswith(GGUF_PREFIX):
        return file_directory(source.removeprefix(GGUF_PREFIX), owner, weights)
    local = home_expanded(Path(source))
    if local.is_symlink() and not local.exists():
        raise UserInputError(f"{owner}: tokenizer {source} {absent(local)}")
    if local.is_dir():
        return local
    if local.exists():
        raise UserInputError(f"{owner}: tokenizer {source} {not_a_directory(local)}")
    repo, _, revision = source.partition("@")
    if looks_local(repo):
        raise UserInputError(f"{owner}: tokenizer directory {source} does not exist")
    return snapshot(owner, repo, revision or None, [*TOKENIZER_FILES, "config.json"])


def load_named_tokenizer(source: str, owner: str, weights: bool = True) -> Any:
    """The fast tokenizer ``source`` names (a directory, hub id, ``package:NAME`` or
    ``gguf:FILE``), without remote code; ``owner`` starts every message; ``weights=False``: as a
    plan reads it (:func:`resolve_tokenizer`)."""
    return fast_tokenizer(resolve_tokenizer(source, owner, weights), owner, False)


def load_reference_tokenizer(source: str, models: Sequence[str], weights: bool = True) -> Any:
    """The fast tokenizer ``source`` names (a directory, hub id, ``package:NAME`` or
    ``gguf:FILE``) when it is no model of the run: a ``reference_tokenizer`` that cuts spans
    without embedding anything. ``models``: the run's model names, listed when ``source`` turns
    out to be unusable; ``weights=False``: as a plan reads it (:func:`resolve_tokenizer`)."""
    try:
        return load_named_tokenizer(source, f"reference_tokenizer {source!r}", weights)
    except UserInputError as err:
        if not models:
            raise
        raise UserInputError(f"{err} (nor is it a model of this run: {', '.join(models)})") from err


def fast_tokenizer(directory: Path, owner: str, trust_remote_code: bool) -> Any:
    from transformers import AutoTokenizer

    refuse_odd_files(directory, owner)
    try:
        tokenizer = AutoTokenizer.from_pretrained(directory, trust_remote_code=trust_remote_code)
    except Exception as err:
        why = _tokenizer_failure(err, directory)
        raise UserInputError(f"{owner}: cannot load a tokenizer from {directory}: {why}") from err
    if not getattr(tokenizer, "is_fast", False):
        raise UserInputError(
            f"{owner}: tokenizer is not a fast (Rust) tokenizer, so it reports no token offsets"
        )
    refuse_empty(tokenizer, directory, owner)
    return tokenizer


def _tokenizer_failure(err: Exception, directory: Path) -> str:
    """Why transformers made no tokenizer of ``directory``: for a directory without
    ``tokenizer.json`` or a vocabulary a fast tokenizer can be built from, which files it has
    (transformers' own line ends on a colon, before its list of what it looked for)."""
    if "Couldn't instantiate the backend tokenizer" not in str(err):
        return load_failure(err)
    files = [f for f in TOKENIZER_FILES if (directory / f).is_file()]
    return (
        f"it holds {', '.join(files) or 'no tokenizer file'} but no tokenizer.json, nor a "
        "vocabulary transformers builds a fast tokenizer from (vocab.txt; vocab.json with "
        "merges.txt; a sentencepiece model, with sentencepiece installed); give the model's "
        "own tokenizer files"
    )


def refuse_odd_files(directory: Path, owner: str) -> None:
    """Refuse a tokenizer file of ``directory`` that is no regular file (a directory, a FIFO, a
    link to nothing), naming it: transformers passes over it and fails on what is left, in a
    line that names no file ("Couldn't instantiate the backend tokenizer from one of:")."""
    for name in TOKENIZER_FILES:
        path = Path(directory) / name
        if (path.exists() or path.is_symlink()) and not path.is_file():
            raise UserInputError(f"{owner}: tokenizer file {path} {not_a_file(path)}")


def refuse_empty(tokenizer: Any, directory: Path, owner: str) -> None:
    """Refuse a tokenizer that holds no token but its special ones: what transformers makes of
    a model directory without tokenizer files (every word its unknown token, or no token at
    all), which would cut and embed every text as nothing."""
    special = set(tokenizer.all_special_ids)
    if any(i not in special for i in tokenizer.get_vocab().values()):
        return
    files = [f for f in TOKENIZER_FILES if (directory / f).is_file()]
    what = (
        f"holds none of the tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...)"
        if not files
        else f"holds tokenizer files ({', '.join(files)}) of no vocabulary"
    )
    raise UserInputError(
        f"{owner}: {directory} {what}: transformers makes of it a tokenizer of special tokens "
        "alone, which reads every text as nothing; give the model's own tokenizer"
    )
