"""The offline demo: a real decomposition over packaged encoders and packaged Wikipedia text.

Models: all-MiniLM-L6-v2, its fine-tune on operations text (a near-duplicate pair), and a
random-initialised copy of the same architecture (a null that should be poorly explained). The
recipe is the shipped ``recipes/decompose-minilm-wiki.yaml``.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

RECIPE = "decompose-minilm-wiki.yaml"


def shipped_recipe(name: str) -> dict:
    import yaml

    text = resources.files("lmalgebra.recipes").joinpath(name).read_text(encoding="utf-8")
    return dict(yaml.safe_load(text))


def demo_config(out: Path, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """The shipped recipe's keys, writing to ``out`` (smaller spans when ``quick``)."""
    data = shipped_recipe(RECIPE)
    data.update(out=str(out), progress=progress)
    if quick:
        data["spans"] = {**data["spans"], "counts": [600, 150, 150]}
    return data
