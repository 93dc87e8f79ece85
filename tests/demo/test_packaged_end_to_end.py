"""End to end on real packaged encoders and real Wikipedia text (installed by `make test`)."""

from __future__ import annotations

import json

import pytest

from lmalgebra.lmd.run.decompose import decompose
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.sources.packaged import asset_path


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory):
    minilm, sre = asset_path("minilm"), asset_path("minilm-sre")
    out = tmp_path_factory.mktemp("run")
    config = DecomposeConfig.model_validate(
        {
            "models": [
                {"name": "minilm", "path": str(minilm)},
                {"name": "sre", "path": str(sre)},
                {"name": "random", "path": str(minilm), "random_init": True},
            ],
            "corpus": {"paths": [str(asset_path("wiki-en"))], "text_column": "extract"},
            "spans": {"length": 16, "counts": [1200, 200, 200], "per_doc": 1},
            "out": out,
            "cache_dir": tmp_path_factory.mktemp("cache"),
            "progress": False,
        }
    )
    return decompose(config), out


def test_near_duplicates_are_dependent_and_a_random_copy_is_not(result) -> None:
    decomposition, out = result
    pairwise = decomposition.pairwise["test"]  # rows target, columns basis: minilm, sre, random
    assert pairwise[0, 1] > 0.7 and pairwise[1, 0] > 0.7
    assert pairwise[2, 0] < 0.3 and pairwise[0, 2] < 0.3
    group = {f.target: f.r2 for f in decomposition.group}
    assert group["minilm"]["test"] > 0.6  # basis of 768 dims from 1,200 spans: some overfit
    assert group["random"]["test"] < 0.3
    assert group["random"]["train"] > group["random"]["test"]  # the null only overfits
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete"
    assert summary["spans"] == {"train": 1200, "validation": 200, "test": 200}
    assert summary["truncated_spans"] == {"minilm": 0, "sre": 0, "random": 0}
    assert 17 <= summary["tokens_per_span"]["minilm"] <= 19  # 16 text tokens + [CLS] + [SEP]
