"""Data parallelism on two CPU processes (gloo): statistics, caches, teacher store, training.

The collectives and the manifest parts run in two processes started with
``torch.multiprocessing``; ``decompose``, ``merge teach`` and ``merge train`` run as the real CLI
under ``torchrun`` and ``accelerate launch``, each compared with a one-process run.
"""

from __future__ import annotations

import contextlib
import filecmp
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml
from safetensors.numpy import load_file as load_np
from safetensors.torch import load_file

from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distributed import same_on_every_rank, world
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.sources.embed import TokenReport
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.reduce import reduce_moments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.manifest_parts import part_path
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.batches import Batch
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

# Two processes of the same global batch agree with one process to this much after TRAINING's
# six AdamW steps at lr 1e-3 (each weight moves by up to ~6e-3); measured: 1.0e-7, the same order
# as one process with 1 vs 2 threads (6e-8), and once 5.8e-6 on a loaded machine (Adam divides
# tiny early gradients by their own size, which magnifies reduction-order differences).
# Losses: measured 5e-7 absolute on ~5.7. The per-rank loss weighting is checked exactly below.
WEIGHT_ATOL = 2e-5
LOSS_RTOL = 1e-6
STATS_RTOL = 1e-10
# A decompose run takes float32 Gram products of rows centred on each rank's own shift: one and
# two processes round differently, within the float32 path's precision (test_float32_products).
RUN_STATS_RTOL, RUN_R2_ATOL = 1e-6, 1e-6

# dropout masks are drawn per rank: parity with one process needs none
STUDENT = {**TINY_STUDENT, "dropout": 0.0}
TRAINING = TINY_TRAINING


# ---------------------------------------------------------------- collectives in two processes

DIM = 5
CACHE_KEY = {"model": "fake", "layer": -1}
CACHE_TEXTS = [f"span {i} of the corpus" + " word" * (i % 4) for i in range(11)]  # 4 shards of 3
STORE_KEY = {"stage": "fake"}


def _rows(n: int = 500, dim: int = 7, seed: int = 0) -> np.ndarray:
    """Rows with large offsets, where a naive one-pass covariance would lose digits."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, dim)) * rng.uniform(0.5, 2, dim) + rng.uniform(-1e3, 1e3, dim)


def _vector(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


class _Compute:
    """Deterministic embeddings from the text; remembers the rows it was asked for."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, TokenReport]:
        self.calls.append(list(texts))
        return np.stack([_vector(t) for t in texts]), TokenReport(4.0, 0, len(texts))


def _table(index: int) -> pa.Table:
    return pa.table({"x": np.arange(index * 5, index * 5 + 5, dtype=np.int64)})


def _one_process_store(directory: Path, count: int = 5) -> ShardSet:
    shards = ShardSet(directory, STORE_KEY)
    for index in shards.plan(count):
        shards.write(index, _table(index), note=index)
    shards.finish(top_k=8)
    return shards


def _close(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def _check_moments(got: SecondMoments, rows: np.ndarray) -> None:
    ref = SecondMoments(got.blocks)
    ref.update(rows)
    assert got.n == rows.shape[0]
    assert _close(got.mean(), rows.mean(axis=0)) <= STATS_RTOL
    assert _close(got.covariance(), np.cov(rows.T, bias=True)) <= STATS_RTOL
    assert _close(got.shifted_to(ref.shift).gram, ref.gram) <= STATS_RTOL


def _moments_checks(rank: int) -> None:
    rows = _rows()
    blocks = layout(["a", "b"], [3, 4])
    halves = {0: [rows[:120], rows[120:200]], 1: [rows[200:350], rows[350:]]}
    scenarios = {
        "split": halves[rank],
        "rank 1 empty": [rows] if rank == 0 else [],
        "rank 0 empty": [rows] if rank == 1 else [],
    }
    for name, chunks in scenarios.items():
        local = SecondMoments(blocks)
        for chunk in chunks:
            local.update(chunk)
        try:
            _check_moments(reduce_moments(local), rows)
        except AssertionError as err:
            raise AssertionError(f"reduce_moments, {name}: {err}") from err
    assert reduce_moments(SecondMoments(blocks)).n == 0
    # row blocks: shards of 100 rows dealt round-robin, as the embedding cache deals them
    from lmalgebra.stats.reduce import reduce_blocked

    mine = SpanBlockMoments.empty(blocks, 500, 3)
    for first in range(rank * 100, 500, 200):
        mine.add_rows(rows[first : first + 100], first)
    reduced = reduce_blocked(mine)
    for p, part in enumerate(reduced.parts):
        _check_moments(part, rows[reduced.edges[p] : reduced.edges[p + 1]])


def _batch(masks: list[int], vocab: int = 60, width: int = 10) -> Batch:
    """A global batch of ``len(masks)`` examples, example ``i`` with ``masks[i]`` masked tokens."""
    gen = torch.Generator().manual_seed(1)
    rows = torch.cat([torch.full((m,), i) for i, m in enumerate(masks)]).long()
    cols = torch.cat([torch.randperm(width - 2, generator=gen)[:m] + 1 for m in masks]).long()
    n = int(rows.numel())
    return Batch(
        input_ids=torch.randint(5, vocab, (len(masks), width), generator=gen),
        attention_mask=torch.ones((len(masks), width), dtype=torch.long),
        rows=rows,
        cols=cols,
        labels=torch.randint(5, vocab, (n,), generator=gen),
        language=torch.zeros(n, dtype=torch.long),
        tokens=torch.tensor([len(masks) * width]),
        topk_ids=torch.randint(5, vocab, (n, 3), generator=gen),
        topk_logprobs=torch.log_softmax(torch.randn((n, 3), generator=gen), -1),
    )


def _gradient_checks() -> None:
    """Each rank's weighted slice loss, gradients averaged as DDP does, equals one process."""
    import torch.distributed as dist

    from lmalgebra.distill.masked.student_model import build_masked_lm
    from lmalgebra.distill.student import MaskedStudentSpec
    from lmalgebra.train.data_parallel import global_values, local_loss, local_part
    from lmalgebra.train.losses import combined_loss
    from lmalgebra.train.masked_head import masked_logits

    spec = MaskedStudentSpec(
        hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32, dropout=0.0
    )
    model = build_masked_lm(spec, 60, seed=0)
    # uneven: rank 0 holds 2 masked tokens, rank 1 holds 7; then none at all on rank 1
    for masks in ([1, 1, 4, 3], [2, 3, 0, 0]):
        full = _batch(masks)

        def loss_of(batch: Batch) -> torch.Tensor:
            logits = masked_logits(model, batch.head_inputs())
            parts = combined_loss(logits, batch.labels, 0.5, batch.topk_ids, batch.topk_logprobs)
            return parts.total

        model.zero_grad()
        expected = loss_of(full)
        expected.backward()
        reference = [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        local, share = local_part(full)
        loss = loss_of(local)
        local_loss(loss, share, model).backward()
        for param, ref in zip(model.parameters(), reference, strict=True):
            dist.all_reduce(param.grad)
            param.grad /= 2
            assert torch.allclose(param.grad, ref, rtol=1e-5, atol=1e-7), masks
        value = global_values([float(loss.detach())], share)[0]
        assert value == pytest.approx(float(expected), rel=1e-6), masks


def _worker(rank: int, root: str) -> None:
    """One of two gloo processes: every collective check, and the caches' manifest parts."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    base = Path(root)
    dist.init_process_group(
        "gloo", init_method=f"file://{base / 'rendezvous'}", rank=rank, world_size=2
    )
    try:
        assert world() == (rank, 2)
        assert same_on_every_rank("0123456789ab") and not same_on_every_rank(f"{rank:012x}")
        _moments_checks(rank)
        _gradient_checks()
        calls = {}
        for name in ("fresh", "resumed"):
            compute = _Compute()
            cache = EmbeddingCache(base / f"cache-{name}", CACHE_KEY, CACHE_TEXTS, shard_rows=3)
            cache.ensure(compute)
            assert np.array_equal(
                np.vstack(list(cache.chunks())), np.stack([_vector(t) for t in CACHE_TEXTS])
            )
            calls[f"cache-{name}"] = compute.calls
        for name in ("fresh", "resumed"):
            shards = ShardSet(base / f"store-{name}", STORE_KEY)
            todo = shards.plan(5)
            for index in todo:
                shards.write(index, _table(index), note=index)
            shards.finish(top_k=8)
            assert shards.complete and shards.rows == 25
            calls[f"store-{name}"] = todo
        (base / f"calls-{rank}.json").write_text(json.dumps(calls))
    finally:
        dist.destroy_process_group()


def _interrupted_run(tmp: Path) -> None:
    """What a three-process run killed midway leaves: some shards recorded only in parts."""
    cache = EmbeddingCache(tmp / "cache-resumed", CACHE_KEY, CACHE_TEXTS, shard_rows=3)
    cache.ensure(_Compute())
    manifest = json.loads(cache.manifest_path.read_text())
    cache.manifest_path.unlink()
    (cache.dir / "shard-00001.safetensors").unlink()
    for rank, names in ((0, ["shard-00000", "shard-00003"]), (2, ["shard-00002"])):
        shards = {f"{n}.safetensors": manifest["shards"][f"{n}.safetensors"] for n in names}
        part = {"key": cache.key, "rows": len(CACHE_TEXTS), "shards": shards}
        write_json_atomic(part_path(cache.manifest_path, rank), part)
    store = _one_process_store(tmp / "store-resumed")
    entries = store.manifest["shards"]
    (store.directory / "manifest.json").unlink()
    for index in (0, 2, 4):
        (store.directory / f"shard-{index:05d}.arrow").unlink()
    part = {"key": STORE_KEY, "shards": {"1": entries[1], "3": entries[3]}}
    write_json_atomic(part_path(store.directory / "manifest.json", 1), part)


@contextlib.contextmanager
def _threads(count: int) -> Iterator[None]:
    """Run in-process work on ``count`` torch threads, as each ``torchrun`` rank does
    (``OMP_NUM_THREADS=1``): the math library picks its float kernels per CPU and thread count, so
    files are byte-identical across process counts only when each side uses the same threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _same_embeddings(a: Path, b: Path) -> None:
    """Two embedding caches hold the same entries and rows; vectors agree to float32 rounding.

    Each rank embeds its own shards, so the vectors are those of one process up to the order of
    floating-point sums, which the math library may choose per CPU and thread count: equal bits are
    not promised across process counts, equal values to rounding are.
    """
    manifests_a = sorted(p.relative_to(a) for p in a.rglob("manifest.json"))
    assert manifests_a == sorted(p.relative_to(b) for p in b.rglob("manifest.json"))
    for name in manifests_a:
        one, two = (json.loads((root / name).read_text()) for root in (a, b))
        assert one["key"] == two["key"] and one["rows"] == two["rows"] and two["complete"]
        assert one["shards"].keys() == two["shards"].keys()
        for shard, entry in one["shards"].items():
            other = two["shards"][shard]
            assert [entry[k] for k in ("rows", "dim")] == [other[k] for k in ("rows", "dim")]
            assert entry["tokens"] == other["tokens"] and entry["truncated"] == other["truncated"]
            x, y = (load_np(str(root / name.parent / shard))["embeddings"] for root in (a, b))
            assert x.shape == y.shape and x.dtype == y.dtype
            np.testing.assert_allclose(y, x, rtol=1e-4, atol=1e-5 * float(np.abs(x).max()))


def _same_tree(a: Path, b: Path) -> None:
    names_a = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    names_b = sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    assert names_a == names_b
    for name in names_a:
        assert filecmp.cmp(a / name, b / name, shallow=False), f"{name} differs"


def test_two_processes_reduce_statistics_and_share_caches_and_stores(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    reference = _Compute()
    ref_cache = EmbeddingCache(tmp_path / "ref" / "cache", CACHE_KEY, CACHE_TEXTS, shard_rows=3)
    ref_cache.ensure(reference)
    _one_process_store(tmp_path / "ref" / "store")
    _interrupted_run(tmp_path)
    mp.spawn(_worker, args=(str(tmp_path),), nprocs=2, join=True)

    calls = [json.loads((tmp_path / f"calls-{r}.json").read_text()) for r in (0, 1)]
    # fresh: rank r embeds shards r, r+2 (rows 0-2 and 6-8 on rank 0)
    assert calls[0]["cache-fresh"] == [CACHE_TEXTS[0:3], CACHE_TEXTS[6:9]]
    assert calls[1]["cache-fresh"] == [CACHE_TEXTS[3:6], CACHE_TEXTS[9:11]]
    # resumed: only shard 1 was missing; rank 1 owns it
    assert calls[0]["cache-resumed"] == [] and calls[1]["cache-resumed"] == [CACHE_TEXTS[3:6]]
    assert calls[0]["store-fresh"] == [0, 2, 4] and calls[1]["store-fresh"] == [1, 3]
    assert calls[0]["store-resumed"] == [0, 2, 4] and calls[1]["store-resumed"] == []
    # every result is byte for byte what one process writes, and no part is left behind
    for name in ("fresh", "resumed"):
        _same_tree(tmp_path / "ref" / "cache", tmp_path / f"cache-{name}")
        _same_tree(tmp_path / "ref" / "store", tmp_path / f"store-{name}")


def test_one_process_resumes_from_parts_left_by_several(tmp_path: Path) -> None:
    _interrupted_run(tmp_path)
    compute = _Compute()
    cache = EmbeddingCache(tmp_path / "cache-resumed", CACHE_KEY, CACHE_TEXTS, shard_rows=3)
    cache.ensure(compute)
    assert compute.calls == [CACHE_TEXTS[3:6]]
    store = ShardSet(tmp_path / "store-resumed", STORE_KEY)
    # the manifest lists shards in order: the recorded shard 1 follows a missing shard 0
    assert store.plan(5) == [0, 1, 2, 3, 4]
    for index in range(5):
        store.write(index, _table(index), note=index)
    store.finish(top_k=8)
    ref = tmp_path / "ref"
    EmbeddingCache(ref / "cache", CACHE_KEY, CACHE_TEXTS, shard_rows=3).ensure(_Compute())
    _one_process_store(ref / "store")
    _same_tree(ref / "cache", tmp_path / "cache-resumed")
    _same_tree(ref / "store", tmp_path / "store-resumed")


# ---------------------------------------------------------------- the real CLI, two processes


def _env() -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": "1",
        "CUDA_VISIBLE_DEVICES": "",  # gloo on CPU, also on a machine with one GPU
    }


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(command, capture_output=True, text=True, env=_env(), check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def torchrun(*args: str) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return _run([*launcher, "--nproc-per-node", "2", "-m", "lmalgebra", *args])


def accelerate_launch(*args: str) -> subprocess.CompletedProcess[str]:
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
    options = ["--num_processes", "2", "--num_machines", "1", "--mixed_precision", "no"]
    options += ["--dynamo_backend", "no", "--main_process_port", str(_free_port())]
    return _run([*launcher, *options, "-m", "lmalgebra", *args])


# about half a minute: `make test-slow` (two processes reducing statistics stay in the default run)
@pytest.mark.slow
def test_decompose_on_two_processes_matches_one(tmp_path: Path) -> None:
    from lmalgebra.lmd.run.decompose import decompose
    from lmalgebra.lmd.settings.recipe import load_config
    from lmalgebra.sources.models import ModelRef
    from tiny import build_bert, documents

    models = [build_bert(tmp_path / "m1"), build_bert(tmp_path / "m2", hidden=24, seed=1)]
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n\n".join(documents(900)) + "\n", encoding="utf-8")
    # 2600 training spans: two cache shards of 2048 rows, one per rank; validation and test
    # fit in one shard, so rank 1 holds no row of them
    flags = ["-T", "8", "--spans.counts", "2600,300,300", "--spans.per_doc", "8", "--no-progress"]
    flags.append("--save_statistics")
    named = [f"a={models[0]}", f"b={models[1]}"]
    flags += ["--corpus.paths", str(corpus), "--models", named[0], "--models", named[1]]
    torchrun("decompose", *flags, "--out", str(tmp_path / "two"), "--cache_dir", f"{tmp_path}/c2")
    overrides = {
        "models": [ModelRef.parse(spec).model_dump() for spec in named],
        "corpus": {"paths": [str(corpus)]},
        "spans": {"length": 8, "counts": [2600, 300, 300], "per_doc": 8},
        "progress": False,
        "save_statistics": True,
    }
    overrides.update(out=tmp_path / "one", cache_dir=tmp_path / "c1")
    with _threads(1):
        decompose(load_config(None, overrides))
    _same_embeddings(tmp_path / "c1" / "embeddings", tmp_path / "c2" / "embeddings")
    for split in ("train", "validation", "test"):
        one = SecondMoments.load(tmp_path / "one" / "stats" / f"{split}.safetensors")
        two = SecondMoments.load(tmp_path / "two" / "stats" / f"{split}.safetensors")
        assert one.n == two.n
        assert _close(two.mean(), one.mean()) <= STATS_RTOL
        assert _close(two.covariance(), one.covariance()) <= RUN_STATS_RTOL
    one = json.loads((tmp_path / "one" / "summary.json").read_text())["group_r2"]
    two = json.loads((tmp_path / "two" / "summary.json").read_text())["group_r2"]
    assert one.keys() == two.keys()
    for target, r2 in one.items():
        assert np.allclose(list(two[target].values()), list(r2.values()), atol=RUN_R2_ATOL)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, teacher_dirs) -> tuple[Path, Path]:
    """The same prepared recipe in two run directories: taught by one and by two processes."""
    from lmalgebra.distill import pipeline

    root = tmp_path_factory.mktemp("dp")
    one = write_recipe(root, teacher_dirs, student=STUDENT, training=TRAINING)
    data = yaml.safe_load(one.read_text())
    two = root / "recipe-two.yaml"
    two.write_text(yaml.safe_dump({**data, "output_dir": str(root / "run-two")}))
    for path in (one, two):
        pipeline.prepare(load_recipe(path), progress=False)
    with _threads(1):  # as each torchrun rank: the same kernels, so the same bytes
        pipeline.teach(load_recipe(one), progress=False)
    torchrun("merge", "teach", str(two), "--no-progress")
    pipeline.vocab(load_recipe(two))
    return load_recipe(one).output_dir, two


def test_teacher_store_of_two_processes_is_byte_identical(runs: tuple[Path, Path]) -> None:
    one, two = runs
    _same_tree(one / "topk", load_recipe(two).output_dir / "topk")
    assert not list((load_recipe(two).output_dir / "topk").rglob("*.rank-*"))


# about a minute: `make test-slow` (the masked store on two processes stays in the default run)
@pytest.mark.slow
def test_training_on_two_processes_matches_one_and_resumes(runs: tuple[Path, Path]) -> None:
    _, recipe = runs
    out = load_recipe(recipe).output_dir
    _run([sys.executable, "-m", "lmalgebra", "merge", "train", str(recipe), "--name", "one"])
    accelerate_launch("merge", "train", str(recipe), "--name", "two", "--no-progress")
    one, two = (load_file(str(out / n / "model" / "model.safetensors")) for n in ("one", "two"))
    assert one.keys() == two.keys()
    assert max(float((one[k] - two[k]).abs().max()) for k in one) <= WEIGHT_ATOL
    logs = {
        n: [json.loads(ln) for ln in (out / n / "train_log.jsonl").read_text().splitlines()]
        for n in ("one", "two")
    }
    assert [r["step"] for r in logs["two"]] == [1, 2, 3, 4, 5, 6]  # written once, by rank 0
    for a, b in zip(logs["one"], logs["two"], strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=LOSS_RTOL)
        assert b["tokens_per_s/xx"] > 0
    # interrupted after the step-3 checkpoint: two processes resume to the same bits
    finished = {k: v.clone() for k, v in two.items()}
    shutil.rmtree(out / "two" / "checkpoints" / "step-0000006")
    shutil.rmtree(out / "two" / "model")
    done = accelerate_launch("merge", "train", str(recipe), "--name", "two", "--no-progress")
    assert "resuming from step 3" in done.stderr
    resumed = load_file(str(out / "two" / "model" / "model.safetensors"))
    assert all(torch.equal(resumed[k], finished[k]) for k in finished)


# a causal student with a tokenizer each rank trains, every cross-tokenizer loss in the mix
CAUSAL_TRAINING = {
    **TINY_TRAINING,
    "lambda_schedule": "constant",
    "lambda_value": 0.5,
    "objective_mix": {"mined_kl": 0.5, "uld": 0.5, "alm": 1.0, "sampled": 0.5},
}


# about a minute: `make test-slow` (the masked store on two processes stays in the default run)
@pytest.mark.slow
def test_causal_store_and_student_of_two_processes_match_one(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """The store is byte-identical; the student trained on two processes matches one process
    (each loss term averaged over the global batch's own positions) and resumes."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
    from lmalgebra.distill import pipeline

    student = {**CAUSAL_STUDENT, "tokenizer": "train:unigram:200"}
    path_one = write_causal_recipe(
        tmp_path, causal_teacher_dirs, student=student, training=CAUSAL_TRAINING
    )
    one = load_recipe(path_one)
    two = one.model_copy(update={"output_dir": tmp_path / "run-two"})
    path_two = tmp_path / "recipe-two.yaml"
    path_two.write_text(yaml.safe_dump(two.model_dump(mode="json"), allow_unicode=True))
    for recipe in (one, two):
        pipeline.prepare(recipe, progress=False)
    with _threads(1):
        pipeline.teach(one, progress=False)
    torchrun("merge", "teach", str(path_two), "--no-progress")
    _same_tree(one.output_dir / "logprobs", two.output_dir / "logprobs")
    assert not list(two.output_dir.rglob("*.rank-*"))

    _run([sys.executable, "-m", "lmalgebra", "merge", "train", str(path_one), "--no-progress"])
    torchrun("merge", "train", str(path_two), "--no-progress")
    students = [r.output_dir / "student" for r in (one, two)]
    weights = [load_file(str(d / "model" / "model.safetensors")) for d in students]
    assert weights[0].keys() == weights[1].keys()
    gap = max(float((weights[0][k] - weights[1][k]).abs().max()) for k in weights[0])
    assert gap <= WEIGHT_ATOL
    logs = [
        [json.loads(ln) for ln in (d / "train_log.jsonl").read_text().splitlines()]
        for d in students
    ]
    assert [r["step"] for r in logs[1]] == [1, 2, 3, 4, 5, 6]
    for a, b in zip(*logs, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], rel=LOSS_RTOL)
        assert b["kd"] == pytest.approx(a["kd"], rel=LOSS_RTOL) and b["kd"] > 0
    finished = weights[1]
    shutil.rmtree(two.output_dir / "student" / "checkpoints" / "step-0000006")
    shutil.rmtree(two.output_dir / "student" / "model")
    done = torchrun("merge", "train", str(path_two), "--no-progress")
    assert "resuming from step 3" in done.stderr
    resumed = load_file(str(two.output_dir / "student" / "model" / "model.safetensors"))
    assert all(torch.equal(resumed[k], finished[k]) for k in finished)


# ---------------------------------------------------------- commands and waits under a launcher


def _waiting_worker(rank: int, root: str, port: int) -> None:
    """One of two processes set up as torchrun sets them up: the main rank works alone for longer
    than ``$LMALGEBRA_DIST_TIMEOUT`` while the other waits at the barrier."""
    import time

    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distributed import main_rank_only

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    os.environ["LMALGEBRA_DIST_TIMEOUT"] = "1"
    outcome = "finished"
    try:
        main_rank_only(lambda: time.sleep(4))()
    except UserInputError as err:
        outcome = str(err)
    except RuntimeError as err:  # rank 0, after its work: the other rank has ended already
        outcome = str(err)
    (Path(root) / f"outcome-{rank}").write_text(outcome)


def test_a_rank_that_waits_longer_than_its_limit_ends_in_one_line(tmp_path: Path) -> None:
    """The main rank alone runs ``merge prepare`` while the others wait: torch's own limit (30
    minutes with gloo, 10 with NCCL) had ended a long one in a gloo traceback on the waiting
    ranks; the limit is ``$LMALGEBRA_DIST_TIMEOUT`` (6 hours unset), named when a wait outlasts
    it."""
    import torch.multiprocessing as mp

    mp.spawn(_waiting_worker, args=(str(tmp_path), _free_port()), nprocs=2, join=True)
    waited = (tmp_path / "outcome-1").read_text()
    assert "rank 1 waited longer than $LMALGEBRA_DIST_TIMEOUT (1 s)" in waited
    assert "merge prepare" in waited


def _main_rank_worker(rank: int, root: str, port: int) -> None:
    """One of two processes: the main rank's work holds a collective (an evaluation's LMD
    coverage reduces statistics over the ranks) that must not wait for the other rank, which
    waits for the main rank and reads its result back; then the same with a failing work."""
    import numpy as np

    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distributed import all_reduce_sum, on_main_rank

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank))
    os.environ.update(WORLD_SIZE="2", LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2")
    os.environ["LMALGEBRA_DIST_TIMEOUT"] = "20"
    out = Path(root)

    def compute() -> str:
        total = all_reduce_sum(np.array([1.0, 2.0])).sum()  # alone: its own values alone
        (out / "result").write_text(f"{total:g}")
        return f"computed {total:g}"

    found = on_main_rank(compute, lambda: "read " + (out / "result").read_text(), "the work")

    def fail() -> str:
        raise UserInputError("the recipe is bad")

    try:
        on_main_rank(fail, lambda: "read", "the work")
    except UserInputError as err:
        found += f"; {err}"
    (out / f"outcome-{rank}").write_text(found)


def test_the_main_rank_works_alone_and_the_others_read_its_result(tmp_path: Path) -> None:
    """``MergeRun.evaluate`` under a launcher: every rank had scored and written the same files;
    the main rank alone does it now (a collective inside it sees one process), the others read
    its record back, and a failure on the main rank ends them too, in one line."""
    import torch.multiprocessing as mp

    mp.spawn(_main_rank_worker, args=(str(tmp_path), _free_port()), nprocs=2, join=True)
    assert (tmp_path / "outcome-0").read_text() == "computed 3; the recipe is bad"
    assert (tmp_path / "outcome-1").read_text() == (
        "read 3; the work failed on the main rank (its message says why)"
    )


def test_the_process_group_waits_as_long_as_the_limit_says(monkeypatch) -> None:
    """The group is set up with the wait limit, not torch's 30 minutes."""
    import datetime

    import accelerate

    from lmalgebra import distributed

    seen: dict[str, object] = {}
    monkeypatch.setattr(accelerate, "PartialState", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setattr("atexit.register", lambda fn: None)
    distributed._group()
    assert seen["timeout"] == datetime.timedelta(hours=6)
    monkeypatch.setenv("LMALGEBRA_DIST_TIMEOUT", "90.5")
    distributed._group()
    assert seen["timeout"] == datetime.timedelta(seconds=90.5)


def test_a_command_that_does_not_split_runs_on_rank_0_alone(monkeypatch, capsys) -> None:
    """``merge evaluate``, ``report``, ``evaluate-pos``... do not share their work out: every
    rank had run the whole command and written the same files. Rank 0 runs it as if launched
    alone (no process group), the others end at once."""
    from hostile_helpers import run_main

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    code, stdout, _ = run_main(["packaged"], monkeypatch, capsys)
    assert code == 0 and stdout == ""
    monkeypatch.setenv("RANK", "0")
    code, stdout, _ = run_main(["packaged"], monkeypatch, capsys)
    assert code == 0 and "minilm" in stdout
    assert "WORLD_SIZE" not in os.environ and "RANK" not in os.environ


def test_a_command_that_splits_prints_its_summary_on_the_main_rank_only(monkeypatch, capsys):
    """Every rank of ``merge train`` had printed its own summary, the others' before the main
    rank saved the student (a ``next:`` line naming no student)."""
    from lmalgebra.cli.app import console
    from lmalgebra.cli.launched import SPLIT, _placed

    assert "merge train" in SPLIT and "merge evaluate" not in SPLIT
    monkeypatch.setenv("WORLD_SIZE", "2")
    ran = []
    for count, rank in enumerate(("1", "0"), start=1):
        monkeypatch.setenv("RANK", rank)
        _placed("merge train", lambda: ran.append(console.print("student saved")))()
        assert len(ran) == count  # the work runs on every rank
        assert ("student saved" in capsys.readouterr().out) == (rank == "0")
    assert not console.quiet


def test_the_main_rank_alone_writes_a_model_directory(bert_dir: Path, tmp_path: Path, monkeypatch):
    """``pretrain`` under torchrun had every rank write the same model directory."""
    from transformers import AutoModel, AutoTokenizer

    from lmalgebra.distill import layout

    model, tokenizer = AutoModel.from_pretrained(bert_dir), AutoTokenizer.from_pretrained(bert_dir)
    monkeypatch.setattr(layout, "is_main", lambda: False)
    assert layout.write_model_directory(tmp_path / "m", model, tokenizer, {}) == tmp_path / "m"
    assert not (tmp_path / "m").exists()
    monkeypatch.setattr(layout, "is_main", lambda: True)
    layout.write_model_directory(tmp_path / "m", model, tokenizer, {})
    assert layout.is_complete(tmp_path / "m")
