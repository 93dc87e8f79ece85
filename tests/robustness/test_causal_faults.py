"""Fault injection on the causal teacher store: ``merge teach`` of a causal recipe killed with
SIGKILL at random points, then resumed with the same command, ends with a ``logprobs/`` store
byte-identical (every shard and manifest) to an uninterrupted run's. Kill points are drawn as in
``test_faults`` (``fault_helpers.KillPoint``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from causal_fixtures import write_causal_recipe
from fault_helpers import (
    ForkServer,
    KillPoint,
    kill_at,
    median_gap,
    names_in,
    recipe_copy,
    temporaries,
    tree_bytes,
)
from lmalgebra.core.threads import pin_thread_count
from lmalgebra.distill import pipeline
from lmalgebra.distill.recipe import load_recipe

SEEDS = [21, 22, 23, *(pytest.param(s, marks=pytest.mark.slow) for s in (24, 25))]
ROOT = Path(__file__).resolve().parents[2]
SHARD = r"shard-\d+\.arrow$"
WRITING = r"^\..+\.tmp-\d+$"


@dataclass(frozen=True)
class Reference:
    recipe: Path
    run: Path
    store_dirs: list[Path]  # logprobs/<lang>/<teacher>
    shard_gap: float  # seconds between two shards


@pytest.fixture(scope="module")
def server():
    fork_server = ForkServer(ROOT)
    yield fork_server
    fork_server.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Reference:
    """``merge prepare`` in this process, then an uninterrupted ``merge teach`` by the real CLI."""
    pin_thread_count()
    root = tmp_path_factory.mktemp("causal-faults")
    path = write_causal_recipe(root, causal_teacher_dirs, shard_rows=4)
    recipe = load_recipe(path)
    pipeline.prepare(recipe, progress=False)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "lmalgebra", "merge", "teach", str(path), "--no-progress"]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    run = recipe.output_dir
    store_dirs = sorted(p.parent for p in (run / "logprobs").rglob("manifest.json"))
    gap = median_gap(sorted((run / "logprobs").rglob("shard-*.arrow")))
    return Reference(path, run, store_dirs, gap)


def _prepared_copy(reference: Reference, tmp_path: Path) -> tuple[Path, Path]:
    """A run directory with the reference's examples and tokens; its recipe."""
    run = tmp_path / "run"
    for part in ("examples", "tokens"):
        shutil.copytree(reference.run / part, run / part)
    return run, recipe_copy(reference.recipe, tmp_path / "recipe.yaml", run)


@pytest.mark.parametrize("seed", SEEDS)
def test_causal_teach_killed_at_a_random_point_resumes_to_an_identical_store(
    reference: Reference, server: ForkServer, tmp_path: Path, seed: int
) -> None:
    run, recipe = _prepared_copy(reference, tmp_path)
    dirs = [run / d.relative_to(reference.run) for d in reference.store_dirs]
    total = len(list((reference.run / "logprobs").rglob("shard-*.arrow")))
    point = KillPoint.draw(seed, total - 2, 1, reference.shard_gap)
    args = ["merge", "teach", str(recipe), "--no-progress"]
    pid = server.start(args, tmp_path / "killed.log")
    how = kill_at(
        pid, point, lambda: len(names_in(dirs, SHARD)), lambda: bool(names_in(dirs, WRITING))
    )
    status = server.wait(pid)
    print(f"seed {seed}: causal teach killed {how}; {len(names_in(dirs, SHARD))}/{total} shards")
    assert status == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    assert server.run(args, tmp_path / "resumed.log") == 0, (tmp_path / "resumed.log").read_text()
    assert temporaries(run) == []
    assert tree_bytes(run / "logprobs") == tree_bytes(reference.run / "logprobs")
