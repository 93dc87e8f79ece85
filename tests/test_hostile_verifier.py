"""``merge verify`` trusts nothing that is missing: a shard set whose manifest was deleted is found
by its shards, and a whole set deleted by the recipe that says it belongs there, each named (exit
2), instead of every remaining set being reported fine."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hostile_helpers import assert_one_line, built_store, digests


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    """A masked run whose examples, masked copies, teacher store and vocabulary are built."""
    return built_store(tmp_path_factory.mktemp("verifier"), teacher_dirs).parent / "run"


@pytest.mark.parametrize("part", ["examples", "masked", "topk"])
def test_a_deleted_manifest_is_named(part: str, built: Path, tmp_path: Path, cli) -> None:
    run = tmp_path / "run"
    shutil.copytree(built, run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr  # the intact run passes
    manifest = sorted((run / part).rglob("manifest.json"))[-1]
    manifest.unlink()
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(manifest.parent), "no manifest.json", "run the stage again"])
    assert "every shard matches" not in stderr
    assert digests(run) == before  # verifying repairs nothing and removes nothing


@pytest.mark.parametrize(
    ("deleted", "named", "stage"),
    [
        ("examples/yy", ["examples/yy"], "prepare"),
        ("masked/yy/sp", ["masked/yy/sp"], "prepare"),
        ("topk/yy", ["topk/yy/wp", "topk/yy/sp"], "teach"),
        ("topk", ["topk/xx/wp", "topk/yy/wp", "topk/yy/sp"], "teach"),
    ],
)
def test_a_deleted_shard_set_is_named(
    deleted: str, named: list[str], stage: str, built: Path, tmp_path: Path, cli
) -> None:
    """A whole set gone (no manifest, no shard left to find it by) while the run holds what was
    made after it: the recipe says it belongs there."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    shutil.rmtree(run / deleted)
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [*(str(run / n) for n in named), f"merge {stage} RECIPE"])
    assert digests(run) == before


def test_a_run_not_yet_taught_is_not_called_damaged(built: Path, tmp_path: Path, cli) -> None:
    """What a stage not yet run would make is not missing: a prepared run verifies clean."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    for part in ("topk", "vocab"):
        shutil.rmtree(run / part)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr
