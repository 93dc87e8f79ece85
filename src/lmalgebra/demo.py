"""The offline demo: a real decomposition over packaged encoders and packaged Wikipedia text.

Models: all-MiniLM-L6-v2, its fine-tune on operations text (a near-duplicate pair), and a
random-initialised copy of the same architecture (a null that should be poorly explained).
"""

from __future__ import annotations

from pathlib import Path

from lmalgebra.lmd.config import DecomposeConfig
from lmalgebra.sources.packaged import asset_path


def demo_config(out: Path, quick: bool = False, progress: bool = True) -> DecomposeConfig:
    minilm, sre = asset_path("minilm"), asset_path("minilm-sre")
    counts = (600, 150, 150) if quick else (3000, 500, 500)
    return DecomposeConfig.model_validate(
        {
            "models": [
                {"name": "minilm", "path": str(minilm)},
                {"name": "minilm-sre", "path": str(sre)},
                {"name": "minilm-random", "path": str(minilm), "random_init": True},
            ],
            "corpus": {"paths": [str(asset_path("wiki-en"))], "text_column": "extract"},
            "spans": {"length": 64, "counts": counts, "per_doc": 2},
            "out": out,
            "progress": progress,
            "save_weights": True,
        }
    )
