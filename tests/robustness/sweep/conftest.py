"""The sweep's runs, built once per pytest run: a finished masked and causal MergeDistill run
(store, vocabulary, a trained and evaluated student) and a finished decomposition, over the tiny
fixtures; and the fork server every case runs in."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe
from sweep_helpers import SweepServer


@dataclass(frozen=True)
class FinishedRun:
    """A MergeDistill run every stage of which is done: its recipe and run directory."""

    recipe: Path
    run: Path


@dataclass(frozen=True)
class FinishedDecomposition:
    """A decomposition of two tiny models: its command line (output left out), the output
    directory and the cache it filled."""

    args: tuple[str, ...]
    out: Path
    cache: Path
    models: tuple[Path, Path]
    corpus: Path


@pytest.fixture(scope="session")
def sweep_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SweepServer]:
    root = tmp_path_factory.mktemp("sweep-server")
    (root / "logs").mkdir()
    server = SweepServer(root, root / "logs")
    yield server
    server.close()


def _finished(server: SweepServer, recipe: Path) -> FinishedRun:
    run = recipe.parent / "run"
    for args in (
        ["merge", "run", str(recipe), "--no-progress"],
        ["merge", "train", str(recipe), "--no-progress"],
        ["merge", "evaluate", str(run)],
    ):
        outcome = server.run(args, timeout=600)
        assert outcome.code == 0, outcome.shown()
    return FinishedRun(recipe, run)


@pytest.fixture(scope="session")
def masked_run(
    tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path], sweep_server
) -> FinishedRun:
    root = tmp_path_factory.mktemp("sweep-masked")
    recipe = write_recipe(root, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)
    return _finished(sweep_server, recipe)


@pytest.fixture(scope="session")
def causal_run(
    tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs: dict[str, Path], sweep_server
) -> FinishedRun:
    root = tmp_path_factory.mktemp("sweep-causal")
    training = {**TINY_TRAINING, "batch_size": 4}
    recipe = write_causal_recipe(
        root, causal_teacher_dirs, student=CAUSAL_STUDENT, training=training
    )
    return _finished(sweep_server, recipe)


@pytest.fixture(scope="session")
def decomposition(
    tmp_path_factory: pytest.TempPathFactory,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    sweep_server: SweepServer,
) -> FinishedDecomposition:
    root = tmp_path_factory.mktemp("sweep-decomposition")
    args = ("decompose", f"--models=a={bert_dir}", f"--models=b={bert2_dir}")
    args += ("--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5")
    args += ("--no-progress",)
    cache = root / "cache"
    outcome = sweep_server.run(
        [*args, "--out", str(root / "out")], timeout=600, env={"LMALGEBRA_CACHE": str(cache)}
    )
    assert outcome.code == 0, outcome.shown()
    return FinishedDecomposition(args, root / "out", cache, (bert_dir, bert2_dir), corpus_txt)
