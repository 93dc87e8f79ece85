"""Every shipped recipe parses into its typed config."""

from __future__ import annotations

from importlib import resources

import pytest

from lmalgebra.core.recipe_files import validate
from lmalgebra.demo.packaged_lmd import demo_config, shipped_recipe
from lmalgebra.lmd.settings.recipe import DecomposeConfig

SHIPPED = sorted(
    p.name for p in resources.files("lmalgebra.recipes").iterdir() if p.name.endswith(".yaml")
)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_recipe_parses(name: str) -> None:
    config = validate(DecomposeConfig, shipped_recipe(name), name)
    assert len(config.models) >= 2


def test_demo_config_quick_is_smaller(tmp_path) -> None:
    full = validate(DecomposeConfig, demo_config(tmp_path), "demo")
    quick = validate(DecomposeConfig, demo_config(tmp_path, quick=True), "demo")
    assert sum(quick.spans.counts) < sum(full.spans.counts)
    assert [m.name for m in full.models] == ["minilm", "minilm-sre", "minilm-random"]
