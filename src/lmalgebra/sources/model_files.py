"""What a model's files say without loading it: its sizes (``config.json``), its weight files,
and their hashes.

Hashes are memoised by file path, size, modification and change times and inode, so a large model
is read once per change, not once per run, and an edit whose modification time was set back is
still seen.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file, sha256_files, sha256_json, unseal
from lmalgebra.core.text_files import not_a_file, read_json_object
from lmalgebra.sources.loaded_weights import safetensors_files
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.split_archive import misplaced

log = logging.getLogger(__name__)
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".h5", ".msgpack", ".onnx")
MARKER = "lmalgebra.json"  # in a model directory written here: what made it; written last
# in a model directory being written here, from before its first file to after the marker: a
# directory a kill cut short is known for ours (a steps-0 student has no training log to say so)
SAVING = ".lmalgebra-saving"
FILES_KEY = "files"  # in the marker: file name -> sha256 of what write_model_directory wrote
CHECK_KEY = "sha256"  # in the marker: of the rest of the marker


def model_damage(directory: Path) -> str | None:
    """Why the complete model directory cannot be trusted (a file its marker lists is missing
    or no longer has the sha256 recorded when it was written, or the marker was edited), or
    None. A marker of an older release, without checksums, is taken as it is."""
    try:
        marker = read_json_object(directory / MARKER, "model directory marker")
    except UserInputError as err:
        return str(err)
    if unseal(marker, CHECK_KEY) is False:
        return f"{directory / MARKER} was edited since it was written (its sha256)"
    sums = marker.get(FILES_KEY, {})
    if not isinstance(sums, dict):  # hand-written, or torn: no check to switch off
        return f"{directory / MARKER} is damaged: its record of the model's files is no mapping"
    for name, digest in sums.items():
        path = directory / name
        if not path.is_file():
            return f"{path} is missing"
        if _file_sha256(path) != digest:
            return f"{path} is damaged (its sha256 is not the one recorded when it was written)"
    return None


_hashed: dict[tuple[str, ...], str] = {}  # this process's file digests, by what stat says


def _file_sha256(path: Path) -> str:
    """``sha256_file`` of ``path``, once per process while its bytes are unchanged (``_stat_key``):
    a teacher checked when a stage opens it is not read whole again when it is loaded."""
    key = (str(path.resolve()), *map(str, _stat_key(path)))
    if key not in _hashed:
        _hashed[key] = sha256_file(path)
    return _hashed[key]


def refuse_damaged(owner: str, directory: Path) -> None:
    """Refuse a model directory written here (a student, a teacher from ``lmalgebra pretrain``)
    whose files are not those its marker records, naming the file: read anyway, a damaged
    student had been scored, embedded or taught from as if it were the one trained."""
    if (directory / MARKER).is_file():
        damage = model_damage(directory)
        if damage is not None:
            raise UserInputError(f"{owner}: {damage}")


def weight_files(directory: Path, owner: str | None = None) -> list[Path]:
    """The weight files ``from_pretrained`` reads: the directory's own, not a subfolder's (a
    teacher made by ``pretrain`` keeps its training checkpoints under ``training/``), and the
    shards a sharded checkpoint's index names wherever they lie (``w/model-00002.safetensors``:
    left out, an edit of it had kept the model's fingerprint, and its cached embeddings and
    finished runs were taken for the edited model's). A weight file or shard index that is no
    regular file (a link to nothing, a directory, a FIFO), which transformers passes over for
    another file or calls missing, is refused naming it (``owner`` starts the message)."""
    found = [p for p in directory.iterdir() if p.name.endswith((*WEIGHT_SUFFIXES, ".index.json"))]
    for path in found:
        if not path.is_file():
            start = f"{owner}: " if owner else ""
            raise UserInputError(f"{start}weight file {path} {not_a_file(path)}")
    own = [p for p in found if p.name.endswith(WEIGHT_SUFFIXES)]
    return own + [p for p in safetensors_files(directory) if p.parent != directory]


def _stat_key(path: Path) -> list[int]:
    """What changes whenever ``path``'s bytes do: size, modification and change times, inode
    and device. The modification time alone can be set back (``touch -d``, ``cp -p``, an
    unpacked archive) after an edit of the same size; the change time is set by the kernel on
    every write and cannot be."""
    found = path.stat()
    return [found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino, found.st_dev]


def memoised_hash(
    files: list[Path], root: Path, memo_dir: Path | None, remember: bool = True
) -> str:
    """One hash over ``files`` (paths relative to ``root``), remembered in ``memo_dir`` with a
    checksum of itself and its key (``remember=False``: read from there, never written)."""
    if not files:
        return sha256_json([])
    stamp = sha256_json([[str(f), *_stat_key(f)] for f in sorted(files)])
    memo = memo_dir / f"{stamp}.hash" if memo_dir else None
    if memo is not None and memo.is_file():  # a memo torn by a killed run or edited is redone
        text = memo.read_bytes().decode("utf-8", errors="replace")  # garbled bytes: redone too
        memoised, _, check = text.strip().partition(" ")
        if check == sha256_json([stamp, memoised]):
            return memoised
    digest = sha256_files(files, root)
    if remember and memo is not None:
        remember_memo(memo, f"{digest} {sha256_json([stamp, digest])}")
    return digest


def remember_memo(memo: Path, text: str) -> None:
    """Write ``memo`` (a remembered hash or check) where this process may write: one of a place
    it may only read (a read-only run that ``merge verify`` checks, a shared cache, a read-only
    mount) is not written, and is computed again next time, as is one whose place holds what no
    writer of memos leaves (a FIFO, a directory, a link: the run had refused it, which its dry
    run, writing nothing, had passed); anything else in the way is named by the write."""
    if (kind := misplaced(memo, directory=False)) is not None:
        log.warning("remembered hash %s is %s: not written, computed again next time", memo, kind)
        return
    directory = memo.parent
    found = next((p for p in (directory, *directory.parents) if p.exists()), directory)
    if not found.is_dir() or os.access(found, os.W_OK | os.X_OK):
        write_text_atomic(memo, text)


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
        cached: whether its embeddings go to the embedding cache (models named by reference).
    """

    name: str
    kind: str
    width: int
    parameters: int = 0
    weight_bytes: int = 0
    hidden: int = 0
    intermediate: int = 0
    cached: bool = False

    @property
    def embeds(self) -> bool:
        return self.parameters > 0


def read_config(name: str, path: Path) -> dict[str, Any]:
    """The ``config.json`` at ``path`` of model ``name``, with a multimodal configuration's
    language-model sizes (``text_config``) on top."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserInputError(f"model {name!r}: cannot read {path}: {err}") from None
    if not isinstance(data, dict):
        raise UserInputError(f"model {name!r}: {path} is not a JSON object")
    text = data.get("text_config")  # multimodal configs keep the language model's sizes there
    return {**data, **text} if isinstance(text, dict) else data


def config_width(config: Mapping[str, Any]) -> int:
    """The hidden size a configuration names (0: none)."""
    return config_int(config, _WIDTH)


def config_int(config: Mapping[str, Any], keys: tuple[str, ...]) -> int:
    """The first of ``keys`` that ``config`` sets to a positive integer (not a boolean); 0: none."""
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def config_sizes(config: Mapping[str, Any], width: int = 0) -> tuple[int, int, int]:
    """``(layers, hidden, intermediate)`` a configuration names, whichever family's keys it
    uses (transformers' own names first); ``width`` for a hidden size it does not name, and a
    feed-forward width of ``4 * hidden`` where it names none."""
    hidden = config_int(config, _WIDTH) or width
    return config_int(config, _LAYERS), hidden, config_int(config, _FEED_FORWARD) or 4 * hidden


def architecture(config: Mapping[str, Any], width: int) -> tuple[int, int, int, int]:
    """``(layer weights, all weights, hidden, intermediate)``: attention and feed-forward
    weights per layer, ``4 H^2 + 2 H I``, times the layers; all of them adds the token
    embeddings ``V H``."""
    layers, hidden, intermediate = config_sizes(config, width)
    layer = layers * (4 * hidden * hidden + 2 * hidden * intermediate)
    return layer, layer + config_int(config, ("vocab_size",)) * hidden, hidden, intermediate
