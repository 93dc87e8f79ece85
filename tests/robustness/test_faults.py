"""Fault injection: kill -9 at random points of ``merge teach`` and ``merge train``, a truncated
checkpoint, a full disk during teach, train and decompose, two runs in one directory.

Each killed run is resumed with the same command and compared with an uninterrupted run: the
teacher store byte for byte (every shard and manifest), the student bit for bit. Kill points are
drawn from the seed (``fault_helpers.KillPoint``): after a random number of finished shards or
checkpointed steps, then either in the next write window seen (odd seeds) or after a random delay
within 1.5 shard or checkpoint intervals (even seeds). Each trial prints its seed and kill point.

The reference runs use the real command line (``python -m lmalgebra``). Killed and resumed runs
use ``lmalgebra.cli.main`` in children forked from a process that imported the toolkit once
(``cli_fork_server.py``), so that a trial costs the command's work, not Python's start-up.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from fault_helpers import (
    ForkServer,
    KillPoint,
    kill_at,
    median_gap,
    names_in,
    recipe_copy,
    stamps,
    temporaries,
    tree_bytes,
    wait_for,
)
from lmalgebra.cli import main
from lmalgebra.core.threads import pin_thread_count
from lmalgebra.distill import pipeline
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.storage.disk_space import is_out_of_space
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

SEEDS = [11, 12, 13]  # more under `make test-slow`
SLOW_SEEDS = [14, 15, *range(100, 116)]
ROOT = Path(__file__).resolve().parents[2]
STUDENT = TINY_STUDENT
TRAINING = {**TINY_TRAINING, "steps": 12, "checkpoint_every": 2}
SHARD = r"shard-\d+\.arrow$"
WRITING = r"^\..+\.tmp-\d+$"


@dataclass(frozen=True)
class Reference:
    recipe: Path
    run: Path
    topk_dirs: list[Path]
    shard_gap: float  # seconds between two teacher-store shards
    checkpoint_gap: float  # seconds between two checkpoints


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    command = [sys.executable, "-m", "lmalgebra", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def server():
    fork_server = ForkServer(ROOT)
    yield fork_server
    fork_server.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory, teacher_dirs) -> Reference:
    """Uninterrupted ``merge teach`` and ``merge train --name reference`` by the real CLI."""
    pin_thread_count()  # as the CLI does: in-process runs below must give the CLI's bits
    root = tmp_path_factory.mktemp("faults")
    path = write_recipe(root, teacher_dirs, student=STUDENT, training=TRAINING)
    recipe = load_recipe(path)
    pipeline.prepare(recipe, progress=False)
    done = _cli("merge", "teach", str(path), "--no-progress")
    assert done.returncode == 0, done.stderr
    pipeline.vocab(recipe)
    done = _cli("merge", "train", str(path), "--name", "reference", "--no-progress")
    assert done.returncode == 0, done.stderr
    run = recipe.output_dir
    topk_dirs = sorted(p.parent for p in (run / "topk").rglob("manifest.json"))
    checkpoints = sorted((run / "reference" / "checkpoints").glob("step-*"))
    return Reference(
        path,
        run,
        topk_dirs,
        median_gap(sorted((run / "topk").rglob("shard-*.arrow"))),
        median_gap([c / "state.json" for c in checkpoints]),
    )


def _teach_copy(reference: Reference, tmp_path: Path) -> tuple[Path, Path]:
    """A run directory with the reference's prepared examples; its recipe."""
    run = tmp_path / "run"
    for part in ("examples", "masked"):
        shutil.copytree(reference.run / part, run / part)
    return run, recipe_copy(reference.recipe, tmp_path / "recipe.yaml", run)


def _teach_trial(reference: Reference, server: ForkServer, tmp_path: Path, seed: int) -> None:
    run, recipe = _teach_copy(reference, tmp_path)
    dirs = [run / d.relative_to(reference.run) for d in reference.topk_dirs]
    total = len(list((reference.run / "topk").rglob("shard-*.arrow")))
    point = KillPoint.draw(seed, total - 2, 1, reference.shard_gap)
    args = ["merge", "teach", str(recipe), "--no-progress"]
    pid = server.start(args, tmp_path / "killed.log")
    how = kill_at(
        pid, point, lambda: len(names_in(dirs, SHARD)), lambda: bool(names_in(dirs, WRITING))
    )
    status = server.wait(pid)
    print(
        f"seed {seed}: teach killed {how}; {len(names_in(dirs, SHARD))}/{total} shards on disk, "
        f"{len(temporaries(run))} temporaries left"
    )
    assert status == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    assert server.run(args, tmp_path / "resumed.log") == 0, (tmp_path / "resumed.log").read_text()
    assert temporaries(run) == []
    assert tree_bytes(run / "topk") == tree_bytes(reference.run / "topk")


def _log_losses(out: Path) -> list[tuple[int, float, float]]:
    lines = (out / "train_log.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"], r["kd"]) for r in map(json.loads, lines)]


def _weights(out: Path) -> dict[str, torch.Tensor]:
    return load_file(str(out / "model" / "model.safetensors"))


def _weight_differences(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """Tensors that are not bit-identical, with their largest difference (empty: identical)."""
    if a.keys() != b.keys():
        return [f"tensor names differ: {sorted(a.keys() ^ b.keys())}"]
    return [
        f"{k}: max |diff| {float((a[k].double() - b[k].double()).abs().max()):.3g}"
        for k in a
        if not torch.equal(a[k], b[k])
    ]


def _train_trial(reference: Reference, server: ForkServer, tmp_path: Path, seed: int) -> None:
    name = f"killed-{seed}"
    out = reference.run / name
    shutil.rmtree(out, ignore_errors=True)  # a rerun of the same seed starts afresh
    checkpoints = out / "checkpoints"
    tmp_path.mkdir(parents=True, exist_ok=True)

    def checkpointed() -> int:
        steps = [int(n.split("-")[1]) for n in names_in([checkpoints], r"step-\d+$")]
        return max(steps, default=0)

    every = TRAINING["checkpoint_every"]
    point = KillPoint.draw(seed, TRAINING["steps"] - 2 * every, every, reference.checkpoint_gap)
    args = ["merge", "train", str(reference.recipe), "--name", name, "--no-progress"]
    pid = server.start(args, tmp_path / "killed.log")
    how = kill_at(pid, point, checkpointed, lambda: bool(names_in([checkpoints], r"^\.tmp-step-")))
    status = server.wait(pid)
    print(f"seed {seed}: train killed {how} (step {checkpointed()} checkpointed)")
    assert status == -signal.SIGKILL, (tmp_path / "killed.log").read_text()
    assert server.run(args, tmp_path / "resumed.log") == 0, (tmp_path / "resumed.log").read_text()
    assert temporaries(out) == []
    killed_log = (tmp_path / "killed.log").read_text() + (tmp_path / "resumed.log").read_text()
    differences = _weight_differences(_weights(out), _weights(reference.run / "reference"))
    assert not differences, f"seed {seed}, killed {how}: {differences[:5]}\n{killed_log}"
    assert _log_losses(out) == _log_losses(reference.run / "reference"), killed_log


@pytest.mark.parametrize("seed", SEEDS)
def test_teach_killed_at_a_random_point_resumes_to_an_identical_store(
    reference: Reference, server: ForkServer, tmp_path: Path, seed: int
) -> None:
    _teach_trial(reference, server, tmp_path, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_train_killed_at_a_random_point_resumes_to_identical_weights(
    reference: Reference, server: ForkServer, tmp_path: Path, seed: int
) -> None:
    _train_trial(reference, server, tmp_path, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SLOW_SEEDS)
def test_many_kills_of_teach_and_train(
    reference: Reference, server: ForkServer, tmp_path: Path, seed: int
) -> None:
    _teach_trial(reference, server, tmp_path / "teach", seed)
    _train_trial(reference, server, tmp_path / "train", seed)


def test_second_run_in_the_same_directory_is_refused(
    reference: Reference, server: ForkServer, tmp_path: Path
) -> None:
    run, recipe = _teach_copy(reference, tmp_path)
    dirs = [run / d.relative_to(reference.run) for d in reference.topk_dirs]
    args = ["merge", "teach", str(recipe), "--no-progress"]
    first = server.start(args, tmp_path / "first.log")
    wait_for(lambda: len(names_in(dirs, SHARD)) >= 1)  # the first run is writing
    os.kill(first, signal.SIGSTOP)  # held there (its lock too) however loaded the machine is
    try:
        assert server.run(args, tmp_path / "second.log") == 2
    finally:
        os.kill(first, signal.SIGCONT)
    message = (tmp_path / "second.log").read_text()
    assert f"{run.resolve()} is in use by another lmalgebra run" in message
    assert f"pid {first} on {socket.gethostname()} (merge teach" in message
    assert server.wait(first) == 0, (tmp_path / "first.log").read_text()
    assert tree_bytes(run / "topk") == tree_bytes(reference.run / "topk")  # nothing interleaved


def test_truncated_checkpoint_is_named_and_the_previous_one_used(
    reference: Reference, caplog: pytest.LogCaptureFixture
) -> None:
    out = reference.run / "truncated"
    shutil.copytree(reference.run / "reference" / "checkpoints", out / "checkpoints")
    victim = out / "checkpoints" / "step-0000012" / "model.safetensors"
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    # a run killed while appending to its log leaves a torn last line
    log_lines = (reference.run / "reference" / "train_log.jsonl").read_text()
    (out / "train_log.jsonl").write_text(log_lines + '{"step": 13, "lo')
    caplog.set_level(logging.INFO)
    train_student(load_recipe(reference.recipe), "truncated", progress=False)
    assert f"checkpoint file {victim} is damaged (checksum mismatch" in caplog.text
    assert "resuming from step 10" in caplog.text
    assert not _weight_differences(_weights(out), _weights(reference.run / "reference"))
    assert _log_losses(out) == _log_losses(reference.run / "reference")


def test_with_every_checkpoint_damaged_training_restarts_cleanly(
    reference: Reference, caplog: pytest.LogCaptureFixture
) -> None:
    out = reference.run / "all-damaged"
    shutil.copytree(reference.run / "reference" / "checkpoints", out / "checkpoints")
    state = out / "checkpoints" / "step-0000012" / "state.json"
    state.write_text(state.read_text()[:40])
    optimizer = out / "checkpoints" / "step-0000010" / "optimizer.safetensors"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    caplog.set_level(logging.INFO)
    train_student(load_recipe(reference.recipe), "all-damaged", progress=False)
    assert f"checkpoint file {state} is damaged" in caplog.text
    assert f"checkpoint file {optimizer} is damaged" in caplog.text
    assert "training starts again from step 0" in caplog.text
    assert "resuming" not in caplog.text
    assert not _weight_differences(_weights(out), _weights(reference.run / "reference"))


def _main(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str
) -> tuple[int, str]:
    """Exit status and stderr of the CLI run in-process."""
    monkeypatch.setattr(sys, "argv", ["lmalgebra", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as done:
        code = int(done.code or 0)
    return code, capsys.readouterr().err


def _full_disk_line(err: str) -> Path:
    """The one error line of a full disk; the file it names."""
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    found = re.search(
        r"no space left on device \(or disk quota exceeded\) while writing (\S+);", lines[0]
    )
    assert found, lines[0]
    return Path(found.group(1))


def _fill_disk_at(monkeypatch: pytest.MonkeyPatch, suffix: str, nth: int) -> Any:
    """The ``nth`` shard file ending in ``suffix`` fills the disk after a few bytes (ENOSPC);
    returns the real ``Path.write_bytes`` to put back."""
    real, calls = Path.write_bytes, []

    def filling(self: Path, data: Any) -> int:
        if self.name.startswith(".shard-") and f".{suffix}.tmp-" in self.name:
            calls.append(self)
            if len(calls) == nth:
                real(self, b"\0" * 64)
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", filling)
    return real


def test_full_disk_during_teach(
    reference: Reference, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    run, recipe = _teach_copy(reference, tmp_path)
    real = _fill_disk_at(monkeypatch, "arrow", 6)  # the sixth shard: the disk fills halfway
    code, err = _main(monkeypatch, capsys, "merge", "teach", str(recipe), "--no-progress")
    assert code == 2
    victim = _full_disk_line(err)
    assert victim.parent.parent.parent == run / "topk" and victim.name.startswith("shard-")
    assert not victim.exists() and temporaries(run) == []
    assert not json.loads((victim.parent / "manifest.json").read_text())["complete"]
    written = sorted((run / "topk").rglob("shard-*.arrow"))
    before = stamps(written)
    monkeypatch.setattr(Path, "write_bytes", real)
    assert _main(monkeypatch, capsys, "merge", "teach", str(recipe), "--no-progress")[0] == 0
    assert stamps(written) == before  # what was written before the disk filled is kept
    assert tree_bytes(run / "topk") == tree_bytes(reference.run / "topk")


def test_full_disk_during_train(
    reference: Reference, monkeypatch: pytest.MonkeyPatch, capsys, caplog
) -> None:
    import lmalgebra.train.checkpoint as checkpoint

    out = reference.run / "full-disk"
    real = checkpoint.save_file

    def filling(tensors, filename, *args, **kwargs):
        if ".tmp-step-0000004" in str(filename) and "optimizer" in str(filename):
            Path(filename).write_bytes(b"\0" * 64)  # safetensors' own error type and wording
            raise SafetensorError(
                "Error while serializing: I/O error: No space left on device (os error 28)"
            )
        return real(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", filling)
    args = ["merge", "train", str(reference.recipe), "--name", "full-disk", "--no-progress"]
    code, err = _main(monkeypatch, capsys, *args)
    assert code == 2
    assert _full_disk_line(err) == out / "checkpoints" / "step-0000004" / "optimizer.safetensors"
    assert [p.name for p in (out / "checkpoints").iterdir()] == ["step-0000002"]
    assert temporaries(out) == [] and not (out / "model").exists()
    monkeypatch.setattr(checkpoint, "save_file", real)
    caplog.set_level(logging.INFO)
    assert _main(monkeypatch, capsys, *args)[0] == 0
    assert "resuming from step 2" in caplog.text
    assert not _weight_differences(_weights(out), _weights(reference.run / "reference"))


def test_full_disk_during_decompose(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys,
) -> None:
    out, cache = tmp_path / "out", tmp_path / "cache"
    models = ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    sizes = ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args = ["decompose", *models, *sizes, "--out", str(out), "--cache_dir", str(cache)]
    real = _fill_disk_at(monkeypatch, "safetensors", 3)
    code, err = _main(monkeypatch, capsys, *args, "--no-progress")
    assert code == 2
    victim = _full_disk_line(err)
    assert victim.is_relative_to(cache) and victim.suffix == ".safetensors"
    assert not victim.exists() and temporaries(tmp_path) == []
    assert not (out / "summary.json").exists()
    manifest = victim.parent / "manifest.json"  # none yet, or one that is not complete
    assert not manifest.exists() or not json.loads(manifest.read_text())["complete"]
    written = sorted(cache.rglob("shard-*.safetensors"))
    assert len(written) == 2
    before = stamps(written)
    monkeypatch.setattr(Path, "write_bytes", real)
    assert _main(monkeypatch, capsys, *args, "--no-progress")[0] == 0
    assert stamps(written) == before  # complete cache entries are reused, not recomputed
    assert json.loads((out / "summary.json").read_text())["status"] == "complete"


def test_full_disk_while_a_cache_entry_is_built_names_the_entry(tmp_path: Path) -> None:
    """A GGUF file dequantised (or a packaged model unpacked) into a cache on a full disk: the
    line had named no file, so the user could not tell the cache's disk from the run's."""
    from lmalgebra.storage.disk_space import OutOfSpaceError
    from lmalgebra.storage.split_archive import build_once

    def build(work: Path) -> Path:
        (work / "model").mkdir()
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    target = tmp_path / "cache" / "gguf" / "entry"
    with pytest.raises(OutOfSpaceError, match=f"while writing {re.escape(str(target))};"):
        build_once(target, build, what="model 'x'")
    assert not (tmp_path / "cache").exists()


def test_full_disk_is_recognised_in_every_writers_wording() -> None:
    assert is_out_of_space(OSError(errno.ENOSPC, "No space left on device"))
    assert is_out_of_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    rust = SafetensorError("Error while serializing: I/O error: Disk quota exceeded (os error 122)")
    assert is_out_of_space(rust)
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("writing failed") from inner
    except RuntimeError as outer:
        assert is_out_of_space(outer)
    assert not is_out_of_space(OSError(errno.EACCES, "Permission denied"))
    assert not is_out_of_space(SafetensorError("I/O error: File too large (os error 27)"))


def test_thread_count_is_pinned_for_mkl() -> None:
    """MKL's dynamic mode (fewer threads on a busy machine) changes results' last bits."""
    import ctypes

    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        get_dynamic = ctypes.CDLL(str(library)).mkl_serv_get_dynamic
    except (OSError, AttributeError):
        pytest.skip("torch is not built with MKL here")
    assert pin_thread_count() == torch.get_num_threads()
    assert get_dynamic() == 0


def test_thread_count_is_pinned_for_mkl_before_torch_is_imported() -> None:
    """The command line imports torch only where a command computes: ``MKL_DYNAMIC=FALSE``,
    set before, must leave MKL pinned as ``pin_thread_count`` does."""
    library = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    script = (
        "import ctypes, sys\n"
        "from lmalgebra.core.threads import pin_thread_count_when_imported\n"
        "pin_thread_count_when_imported()\n"
        "assert 'torch' not in sys.modules\n"
        "import torch\n"
        f"library = ctypes.CDLL({str(library)!r})\n"
        "if not hasattr(library, 'mkl_serv_get_dynamic'):\n"
        "    sys.exit(3)\n"
        "print(library.mkl_serv_get_dynamic())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MKL_DYNAMIC"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    if done.returncode == 3:
        pytest.skip("torch is not built with MKL here")
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "0"
