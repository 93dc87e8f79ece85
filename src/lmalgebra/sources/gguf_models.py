"""GGUF files as model directories: dequantised once into the cache, keyed by the file's sha256.

transformers reads a GGUF file (llama.cpp's format: quantised weights, the configuration and the
tokenizer's vocabulary in one file) by dequantising every tensor to float32, a minute or more for
a 100-300 MB file on a small machine. ``gguf_directory`` does that once: the model (float32
safetensors), its tokenizer (rebuilt from the file's vocabulary) and :data:`PROVENANCE` (the
file's sha256, size, architecture and quantisation, and the size and a hash of each file made)
land in ``$LMALGEBRA_CACHE/gguf/<stem>-<sha256[:16]>``, published whole by a rename
(``build_once``), so every loader reads a plain model directory and later loads take seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
from collections import Counter
from functools import partial
from importlib.metadata import version
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sealed, sha256_file, unseal
from lmalgebra.core.remote_code import load_failure
from lmalgebra.core.settings import home_expanded
from lmalgebra.core.text_files import absent
from lmalgebra.sources.gguf_tensors import model_class, refuse_foreign_tensors
from lmalgebra.sources.loaded_weights import CHECKED_LOAD, refuse_incomplete
from lmalgebra.sources.model_files import memoised_hash
from lmalgebra.storage.atomic import as_created
from lmalgebra.storage.output_paths import cache_directory, check_directory
from lmalgebra.storage.split_archive import build_lock_refusal, build_once, checked_file

GGUF_PREFIX = "gguf:"
log = logging.getLogger(__name__)

PROVENANCE = "gguf.json"  # written beside the dequantised model: what it was made from
RECORD_CHECK = "record_sha256"  # in gguf.json: of the rest of the record
TENSORS_CHECKED = "tensors_checked"  # in gguf.json: the file's tensors were checked first
GGUF_REQUIREMENT = "gguf==0.19.0"
_METADATA_SECTIONS = ("general", "tokenizer")  # keys of transformers' mapping that are no model
# llama.cpp's names of architectures that transformers knows by another, and reads as it
_LLAMA_CPP_NAMES = {
    "qwen2moe": "qwen2_moe",
    "qwen3moe": "qwen3_moe",
    "gpt-oss": "gpt_oss",
    "minimax-m2": "minimax_m2",
    "t5encoder": "t5",
}


def _gguf_package(owner: str) -> Any:
    try:
        import gguf
    except ImportError as err:
        raise UserInputError(
            f"{owner}: reading a GGUF file needs the gguf package: pip install {GGUF_REQUIREMENT}"
        ) from err
    return gguf


def supported_architectures() -> set[str]:
    """The GGUF architectures (``general.architecture``) transformers' loaders read: by its
    own names, and by llama.cpp's where they differ (``qwen2moe`` for ``qwen2_moe``)."""
    from transformers.integrations.gguf.gguf_conversion_mapping import GGUF_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    known = (set(GGUF_ARCHS) | set(GGUF_SUPPORTED_ARCHITECTURES)) - set(_METADATA_SECTIONS)
    return known | {name for name, own in _LLAMA_CPP_NAMES.items() if own in known}


def _why(path: Path, err: Exception) -> str:
    """Why ``GGUFReader`` could not read ``path`` (``err``), as a user can act on it."""
    try:
        with path.open("rb") as handle:
            magic, raw = handle.read(4), handle.read(4)
    except OSError:
        return str(err)
    if magic != b"GGUF":
        return "it does not start with the GGUF magic bytes: no GGUF file"
    from gguf.gguf_reader import READER_SUPPORTED_VERSIONS

    swapped = raw[:2] == b"\0\0"  # as the reader tells a file of the other byte order
    found = int.from_bytes(raw, "big" if swapped else "little") if len(raw) == 4 else None
    if found is not None and found < 256 and found not in READER_SUPPORTED_VERSIONS:  # else noise
        reads = ", ".join(str(v) for v in READER_SUPPORTED_VERSIONS)
        return (
            f"GGUF version {found}, which {GGUF_REQUIREMENT} cannot read (it reads versions "
            f"{reads}): a file of another llama.cpp release"
        )
    return f"damaged or cut short: {err}"


def _opened(path: Path, owner: str) -> tuple[Any, str]:
    """``path``'s ``GGUFReader`` and the architecture it declares; refuses a file that is no
    GGUF and an architecture transformers cannot read."""
    gguf = _gguf_package(owner)
    try:
        reader = gguf.GGUFReader(path)
        architecture = str(reader.fields["general.architecture"].contents())
    except (ValueError, KeyError, IndexError, OSError) as err:
        raise UserInputError(
            f"{owner}: {path} is not a readable GGUF file ({_why(path, err)})"
        ) from err
    supported = supported_architectures()
    if architecture not in supported:
        raise UserInputError(
            f"{owner}: {path} holds a {architecture!r} model, which transformers "
            f"cannot read from GGUF (it reads {', '.join(sorted(supported))}); convert the "
            "original checkpoint instead, or give its Hugging Face directory"
        )
    return reader, architecture


def checked_gguf(path: Path, owner: str) -> tuple[dict[str, Any], Any]:
    """What ``path``'s metadata says (architecture, file type: llama.cpp's name of its
    quantisation, e.g. ``MOSTLY_Q4_K_M``, and how many tensors of each storage type it holds)
    and the transformers configuration it gives. Refuses a file that is no GGUF, an
    architecture transformers cannot read and tensors that are not that model's."""
    reader, architecture = _opened(path, owner)
    config = _config(path, owner)
    tensors = {t.name: (tuple(map(int, t.shape)), t.tensor_type.name) for t in reader.tensors}
    refuse_foreign_tensors(path, config, architecture, tensors, owner)
    gguf = _gguf_package(owner)
    file_type = reader.fields.get("general.file_type")
    try:
        quantisation = gguf.LlamaFileType(int(file_type.contents())).name if file_type else None
    except ValueError:  # a file type newer than the gguf package
        quantisation = f"file type {int(file_type.contents())}"
    header = {
        "architecture": architecture,
        "quantisation": quantisation,
        "tensor_types": dict(Counter(t.tensor_type.name for t in reader.tensors)),
    }
    return header, config


def _cache_directory(stem: str, sha256: str) -> Path:
    return cache_directory() / "gguf" / f"{stem}-{sha256[:16]}"


def gguf_directory(
    parts: list[Path], name: str, sha256: str | None, owner: str, remedy: str
) -> Path:
    """The model directory of the GGUF file ``parts`` form (joined in order), made on first use.

    Args:
        parts: the file, or its pieces in order.
        name: the file's name (``model.gguf``); its stem names the cache directory.
        sha256: the expected sha256 of the file; None to take the file as it is (one part).
        owner: starts every message ("model 'smol'").
        remedy: what to do when the file's sha256 is not ``sha256``.

    Raises ``UserInputError`` (one line) for a wrong hash, a missing ``gguf`` package, a file
    that is no GGUF or an architecture transformers cannot read; nothing is left in the cache.
    """
    verify = sha256 is not None
    if sha256 is None:
        if len(parts) != 1:
            raise ValueError("a GGUF in parts needs its expected sha256")
        sha256 = sha256_file(parts[0])
    target = _cache_directory(Path(name).stem, sha256)
    checked = partial(_checked, sha256=sha256)
    if target.is_dir() and checked(target):
        return target
    _gguf_package(owner)  # before joining hundreds of MB

    def build(work: Path) -> Path:
        path = checked_file(parts, work, name, sha256, owner, remedy) if verify else parts[0]
        header, config = checked_gguf(path, owner)
        made = work / "model"
        log.info("%s: dequantising %s into the cache, once (a minute or more)", owner, name)
        _dequantise(path, made, owner, config)
        provenance = {"file": name, "sha256": sha256, "bytes": path.stat().st_size, **header}
        provenance["versions"] = {p: version(p) for p in ("transformers", "gguf")}
        seal(made, {**provenance, TENSORS_CHECKED: True})
        return made

    return build_once(target, build, f"{owner} ({name}, dequantised)", checked)


def _checked(directory: Path, remember: bool = True, sha256: str | None = None) -> bool:
    """:func:`intact`, made from the file of ``sha256``, and built after the file's tensors were
    checked against the architecture it declares: an entry of an older release, which
    dequantised without that check (a tensor of no place dropped), is built again once."""
    if not intact(directory, remember, sha256=sha256):
        return False
    provenance = read_provenance(directory)
    return provenance is not None and provenance.get(TENSORS_CHECKED) is True


def seal(made: Path, record: dict[str, Any], name: str = PROVENANCE) -> None:
    """Write ``record`` as ``made/name`` with what :func:`intact` checks: every file below
    ``made`` with its size, their hash together, and a checksum of the whole record."""
    files = sorted(p for p in made.rglob("*") if p.is_file())
    record = {**record, "files": {p.relative_to(made).as_posix(): p.stat().st_size for p in files}}
    record["files_sha256"] = memoised_hash(files, made, None)
    record = sealed(record, RECORD_CHECK)
    (made / name).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def intact(
    directory: Path, remember: bool = True, name: str = PROVENANCE, sha256: str | None = None
) -> bool:
    """Whether a directory :func:`seal` recorded (a dequantised model, an unpacked packaged
    asset) is as it was built: its record ``name`` (:data:`PROVENANCE`) readable and of the
    checksum it carries, made from the file or archive of ``sha256`` (when given: an entry of
    another file copied under this one's name is not this file's), and every file it lists there
    at the size it had and, all together, of the hash recorded (a file deleted, cut short or
    damaged in place since, a record edited or torn: built again). The hash is remembered in the
    cache's ``hashes/`` under each file's size, times and inode, so an intact entry is read whole
    once per change; ``remember=False`` (a plan, which writes nothing) reads that memory without
    adding to it. An entry of an older release, without the record's checksum, is built again
    once."""
    try:
        provenance = read_provenance(directory, name)
    except (OSError, ValueError, TypeError):
        return False
    if provenance is None or not unseal(provenance, RECORD_CHECK):
        return False  # a record edited (its hash removed, say) had switched the check off
    if sha256 is not None and provenance.get("sha256") != sha256:
        return False
    files = provenance.get("files")
    if not isinstance(files, dict):
        return False
    paths = [directory / str(file) for file in files]
    for path, size in zip(paths, files.values(), strict=True):
        if not path.is_file() or path.stat().st_size != size:
            return False
    recorded = provenance.get("files_sha256")
    return memoised_hash(paths, directory, cache_directory() / "hashes", remember) == recorded


def file_directory(path: str, owner: str, weights: bool = True) -> Path:
    """``gguf:PATH``'s model directory (``path`` without the prefix). ``weights=False`` (a dry
    run): its configuration and tokenizer alone, from the cache when it holds the model, else
    read from the file into a temporary directory: a plan writes nothing to the cache."""
    file = home_expanded(Path(path))
    if not file.is_file():
        what = "is a directory, not a GGUF file" if file.is_dir() else absent(file)
        raise UserInputError(f"{owner}: GGUF file {path} {what}")
    if not weights:
        return _planning_directory(file, owner)
    return gguf_directory([file], file.name, None, owner, "")


def _planning_directory(file: Path, owner: str) -> Path:
    """The dequantised model of ``file`` when the cache holds it intact; else a temporary
    directory (removed when the process ends) holding the configuration and tokenizer the file
    describes, its architecture checked as a build checks it, nothing dequantised."""
    sha256 = sha256_file(file)
    target = _cache_directory(file.stem, sha256)
    if target.is_dir() and _checked(target, remember=False, sha256=sha256):
        return target
    refuse_unwritable_part(target)
    return _described(file, owner, scratch())


def planning_directory(parts: list[Path], name: str, sha256: str, owner: str, remedy: str) -> Path:
    """:func:`gguf_directory`'s model for a plan (a dry run): the cache's when it holds it
    intact; else the configuration and tokenizer of the file ``parts`` form (joined and checked
    in a temporary directory), nothing written to the cache, nothing dequantised."""
    target = _cache_directory(Path(name).stem, sha256)
    if target.is_dir() and _checked(target, remember=False, sha256=sha256):
        return target
    refuse_unwritable_part(target)
    _gguf_package(owner)
    work = scratch()
    return _described(checked_file(parts, work, name, sha256, owner, remedy), owner, work / "plan")


def refuse_unwritable_part(target: Path) -> None:
    """What the run refuses of the cache's entry ``target`` it would build a model into,
    refused by a plan, which builds it elsewhere: its directory (``gguf/``, ``packaged/``) a
    file, a link to nothing or without permission, and the build's lock file beside it a link,
    a directory or a FIFO (the dry run had passed them)."""
    try:
        check_directory(target.parent, "cache directory")
    except UserInputError as err:
        raise UserInputError(f"{err} (the run builds the model there)") from None
    if (refusal := build_lock_refusal(target)) is not None:
        raise UserInputError(refusal)


SCRATCH_PREFIX = "lmalgebra-plan-"
_SCRATCH: dict[int, Path] = {}  # pid -> the directory of this process's scratch directories


def scratch() -> Path:
    """A temporary directory, inside this process's own (``lmalgebra-plan-PID-*``), which is
    removed when the process ends; those of processes that ended without removing theirs (a
    ``kill -9``, an ``os._exit``) are removed as the first is made. Each had been left in the
    temporary directory for good by a process that did not end through Python's exit."""
    import os
    import tempfile

    pid = os.getpid()
    # a forked child makes its own (the parent removes the parent's); one removed meanwhile
    # (by a process of another PID namespace sharing the temporary directory) is made again
    if pid not in _SCRATCH or not _SCRATCH[pid].is_dir():
        import atexit

        _remove_orphans(Path(tempfile.gettempdir()))
        _SCRATCH[pid] = Path(tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{pid}-"))
        atexit.register(_remove_own, pid, _SCRATCH[pid])
    return Path(tempfile.mkdtemp(dir=_SCRATCH[pid]))


def _remove_own(pid: int, made: Path) -> None:
    """Process ``pid``'s scratch directory ``made`` removed, at its exit (not at the exit of a
    child forked from it)."""
    import os

    if os.getpid() == pid:
        shutil.rmtree(made, ignore_errors=True)


ORPHAN_AGE_S = 3600  # a scratch directory younger is kept (its process may be another host's)


def _remove_orphans(tmp: Path) -> None:
    """Remove the scratch directories under ``tmp`` of processes no longer running, an hour old
    at least (a process whose pid this one cannot see, in another PID namespace sharing the
    temporary directory, is taken for gone: its directory is made again when it is missing)."""
    import os
    import time

    for made in tmp.glob(f"{SCRATCH_PREFIX}*-*"):
        pid = made.name.removeprefix(SCRATCH_PREFIX).split("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if time.time() - made.stat().st_mtime < ORPHAN_AGE_S:
                continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(made, ignore_errors=True)
        except OSError:  # another user's process, running
            continue


def _described(file: Path, owner: str, made: Path) -> Path:
    """``made``, holding the configuration and tokenizer GGUF ``file`` describes; its
    architecture checked as a build checks it."""
    from transformers import AutoTokenizer

    _, config = checked_gguf(file, owner)  # refused as a build refuses it
    try:
        config.save_pretrained(made)
        AutoTokenizer.from_pretrained(file.parent, gguf_file=file.name).save_pretrained(made)
    except Exception as err:
        raise UserInputError(
            f"{owner}: transformers cannot load {file}: {load_failure(err)}"
        ) from err
    return made


def _config(file: Path, owner: str) -> Any:
    """The transformers configuration GGUF ``file``'s metadata gives."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(file.parent, gguf_file=file.name)
    except Exception as err:
        raise UserInputError(
            f"{owner}: transformers cannot load {file}: {load_failure(err)}"
        ) from err


def read_provenance(directory: Path, name: str = PROVENANCE) -> dict[str, Any] | None:
    """What a dequantised directory was made from (:data:`PROVENANCE`, or the record ``name``
    of another built directory); None for any other."""
    path = directory / name
    if not path.is_file():
        return None
    return dict(json.loads(path.read_text(encoding="utf-8")))


def _dequantise(path: Path, out: Path, owner: str, config: Any) -> None:
    """Load ``path`` (whose metadata gives the transformers ``config``) with transformers
    (float32) and save the model and tokenizer into ``out``."""
    import torch
    from transformers import AutoTokenizer, GgufConfig

    folder, name = path.parent, path.name
    auto = model_class(config)
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        model, info = auto.from_pretrained(
            folder,
            gguf_file=name,
            dtype=torch.float32,
            quantization_config=GgufConfig(dequantize=True),
            **CHECKED_LOAD,
        )
        # tensors that do not match the declared architecture would load as a fresh model
        refuse_incomplete(owner, path, model, info)
    except UserInputError:
        raise
    except Exception as err:
        raise UserInputError(
            f"{owner}: transformers cannot load {path}: {load_failure(err)}"
        ) from err
    # every weight is a plain float32 tensor now: nothing of the quantiser is left to save
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    as_created(out.glob("*.safetensors"))  # safetensors makes them 0600 whatever the umask
