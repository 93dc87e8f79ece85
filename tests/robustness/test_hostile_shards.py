"""Damaged Arrow shards read outside ``merge verify`` (``merge inspect``): every reader goes
through the checked read, so a causal shard cut short is named in one line (exit 2), never a
pyarrow traceback; the stage that owns it recomputes it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, built_store, digests
from lmalgebra.distill import pipeline
from lmalgebra.distill.recipe import load_recipe


@pytest.fixture(scope="module")
def causal(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """The directory of a causal recipe (``recipe.yaml``) whose store is built."""
    root = tmp_path_factory.mktemp("causal-shards")
    recipe = load_recipe(write_causal_recipe(root, causal_teacher_dirs))
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    return root


@pytest.fixture(scope="module")
def masked(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    return built_store(tmp_path_factory.mktemp("masked-shards"), teacher_dirs).parent


def _copy(built: Path, tmp_path: Path) -> Path:
    """A copy of the recipe directory ``built`` (recipe, corpora, run) under ``tmp_path``, the
    recipe pointed at the copied run; the recipe's path."""
    root = tmp_path / "copy"
    shutil.copytree(built, root)
    recipe = root / "recipe.yaml"
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data["output_dir"] = str(root / "run")
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    return recipe


def _cut(run: Path, part: str) -> Path:
    """Cut the last shard of ``part`` to half its bytes; its path."""
    shard = sorted((run / part).rglob("shard-*.arrow"))[-1]
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    return shard


@pytest.mark.parametrize(
    ("which", "part", "stage"), [("causal", "tokens", "prepare"), ("causal", "logprobs", "teach")]
)
def test_inspect_names_a_shard_cut_short(
    which: str, part: str, stage: str, request: pytest.FixtureRequest, tmp_path: Path, cli
) -> None:
    """A shard cut short is named with the stage that writes it again: the line had said "run
    again to recompute it", and ``merge inspect`` again recomputes nothing."""
    recipe = _copy(request.getfixturevalue(which), tmp_path)
    run = recipe.parent / "run"
    shard = _cut(run, part)
    before = digests(run)
    code, stderr = cli(["merge", "inspect", str(run)])
    assert_one_line(code, stderr, [str(shard), "is corrupt", f"lmalgebra merge {stage} RECIPE"])
    assert digests(run) == before  # inspecting changes nothing


@pytest.mark.parametrize(
    ("which", "part", "stage"),
    [("masked", "masked", "prepare"), ("masked", "topk", "teach"), ("causal", "logprobs", "teach")],
)
def test_inspect_names_a_damaged_manifest(
    which: str, part: str, stage: str, request: pytest.FixtureRequest, tmp_path: Path, cli
) -> None:
    """A shard set whose manifest is damaged had been shown as a set of no examples and no
    tokens, exit 0: it is named, with the stage that writes it again."""
    recipe = _copy(request.getfixturevalue(which), tmp_path)
    manifest = sorted((recipe.parent / "run" / part).rglob("manifest.json"))[-1]
    manifest.write_text("garbage", encoding="utf-8")
    code, stderr = cli(["merge", "inspect", str(recipe.parent / "run")])
    assert_one_line(code, stderr, [str(manifest), "damaged", f"lmalgebra merge {stage} RECIPE"])


def test_prepare_again_recomputes_a_tokens_shard_cut_short(
    causal: Path, tmp_path: Path, cli
) -> None:
    """The stage that owns the shard redoes it, byte for byte; teach and verify then pass."""
    recipe = _copy(causal, tmp_path)
    run = recipe.parent / "run"
    whole = digests(run / "tokens")
    shard = _cut(run, "tokens")
    for args in (["prepare", str(recipe)], ["teach", str(recipe)]):
        code, stderr = cli(["merge", *args, "--no-progress"])
        assert code == 0, stderr
    assert digests(run / "tokens") == whole
    assert shard.stat().st_size > 0
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr
