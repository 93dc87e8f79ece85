"""Integrity: checksums and atomic writes on the real write paths.

What checksums (sha256) and atomic writes (temporary file, fsync, rename) cost per unit a run
writes: an embedding-cache shard (2,048 x 384 float32 all-MiniLM-L6-v2 embeddings), a teacher-store
shard (1,024 examples of 128 tokens, top-8) and a checkpoint (a 4 x 256 BERT student, 11.2M
parameters, with AdamW and RNG state). Baseline: the same library writes the same bytes straight to
the final name. Ours: ``EmbeddingCache.ensure``, ``ShardSet.write``, ``save_checkpoint``; the
writer inside ``write_atomic`` and ``sha256_file`` are timed too. Write times are medians of
interleaved repeats in one process (milliseconds: an interpreter per write would swamp them), after
an untimed ``os.sync()``. The stage time of one unit is measured on the real compute: ``embed`` of
256 spans (x 8), ``masked_topk`` on 256 examples (x 4), the loop's step time (from 2- and 6-step
runs) x 200 steps. Target: overhead = (ours - plain) / (stage time + plain) <= 5%.

    python bench/bench_integrity.py [--repeats 5] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import pyarrow as pa
import torch
from safetensors.numpy import save_file as save_numpy
from safetensors.torch import save_file, save_model

from harness import (
    WORK,
    CpuWatch,
    Session,
    fastest,
    figure,
    goal,
    measure_work,
    parse_args,
    peak_rss_mib,
    table,
    wait_for_idle,
)
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.distill.examples import example_id
from lmalgebra.distill.masked.masking import TeacherMasker
from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.masked.topk import masked_topk
from lmalgebra.distill.pretrain.masked import TextBatches
from lmalgebra.distill.recipe import MaskingSpec
from lmalgebra.distill.student import MaskedStudentSpec
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.embed import EmbedSpec, TokenReport, embed
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.packaged import asset_path
from lmalgebra.storage.arrow_columns import list_column
from lmalgebra.storage.atomic import write_atomic
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.checkpoint import FILES, _optimizer_tensors, save_checkpoint
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train

NAME = "bench_integrity"
MEASURED = ("src/lmalgebra/storage", "src/lmalgebra/core/fingerprint.py")
TARGET = 0.05
CACHE_ROWS, STORE_ROWS, CHECKPOINT_EVERY = 2048, 1024, 200
SAMPLE = 256


def timed_write(write: Callable[[Path], object], target: Path) -> float:
    """Seconds of ``write(target)`` into a fresh directory, the page cache flushed before it."""
    target.mkdir(parents=True)
    os.sync()
    clock = time.perf_counter()
    write(target)
    seconds = time.perf_counter() - clock
    shutil.rmtree(target)
    return seconds


def measure_path(
    name: str,
    plain: Callable[[Path], Path],
    ours: Callable[[Path], None],
    atomic: Callable[[Path], None],
    repeats: int,
    work: Path,
) -> dict[str, Any]:
    """Median plain, ours, atomic-only and sha256 times of one unit, the variants interleaved
    (rotating order) after one untimed warm-up each; ``plain`` returns what it wrote."""
    variants: dict[str, Callable[[Path], object]] = {"plain": plain, "ours": ours, "atomic": atomic}
    for key, write in variants.items():
        timed_write(write, work / f"warm-{key}")
    wait_for_idle()
    watch = CpuWatch()
    times: dict[str, list[float]] = {key: [] for key in variants}
    keys = list(variants)
    for index in range(repeats):
        for key in keys[index % 3 :] + keys[: index % 3]:
            times[key].append(timed_write(variants[key], work / f"{key}-{index}"))
    result: dict[str, Any] = {key: statistics.median(t) for key, t in times.items()}
    sample = work / "sample"
    sample.mkdir(parents=True)
    written = plain(sample)
    files = sorted(p for p in written.rglob("*") if p.is_file()) if written.is_dir() else [written]
    result["bytes"] = sum(p.stat().st_size for p in files)
    hashes = []
    for _ in range(repeats):
        clock = time.perf_counter()
        for path in files:
            sha256_file(path)
        hashes.append(time.perf_counter() - clock)
    result["sha256"] = statistics.median(hashes)
    shutil.rmtree(sample)
    result["others_share"] = watch.stop()["others_share"]
    print(f"{name}: {result}", flush=True)
    return result


def quiet_seconds(run: Callable[[], object], attempts: int) -> tuple[float, float]:
    """Fastest time of ``run()`` on an idle machine, and other processes' CPU share during it."""
    best = fastest(lambda: measure_work(lambda: {"done": run() is None}), attempts)
    return best["seconds"], best["others_share"]


def cache_path(vectors: np.ndarray, repeats: int, work: Path) -> dict[str, Any]:
    texts = [f"span {i}" for i in range(len(vectors))]
    report = TokenReport(80.0, 0, len(vectors))

    def plain(directory: Path) -> Path:
        save_numpy({"embeddings": vectors}, str(directory / "shard-00000.safetensors"))
        return directory / "shard-00000.safetensors"

    def ours(directory: Path) -> None:
        cache = EmbeddingCache(directory, {"model": "bench"}, texts, shard_rows=CACHE_ROWS)
        cache.ensure(lambda part: (vectors, report))

    def atomic(directory: Path) -> None:
        path = directory / "shard-00000.safetensors"
        write_atomic(path, lambda tmp: save_numpy({"embeddings": vectors}, str(tmp)))

    return measure_path("embedding cache shard", plain, ours, atomic, repeats, work)


def store_path(table: pa.Table, repeats: int, work: Path) -> dict[str, Any]:
    def write_ipc(path: Path) -> None:
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)

    def plain(directory: Path) -> Path:
        write_ipc(directory / "shard-00000.arrow")
        return directory / "shard-00000.arrow"

    def ours(directory: Path) -> None:
        ShardSet(directory, {"stage": "bench"}).write(0, table)

    def atomic(directory: Path) -> None:
        write_atomic(directory / "shard-00000.arrow", write_ipc)

    return measure_path("teacher store shard", plain, ours, atomic, repeats, work)


def checkpoint_path(model: Any, optimizer: Any, repeats: int, work: Path) -> dict[str, Any]:
    import json

    def plain(directory: Path) -> Path:
        final = directory / "step-0000200"
        final.mkdir()
        save_model(model, str(final / "model.safetensors"))
        tensors, groups = _optimizer_tensors(optimizer)
        save_file(tensors, str(final / "optimizer.safetensors"))
        save_file({"torch": torch.get_rng_state()}, str(final / "rng.safetensors"))
        (final / "state.json").write_text(json.dumps({"step": 200, "param_groups": groups}))
        return final

    def ours(directory: Path) -> None:
        save_checkpoint(directory, 200, model, optimizer, {"languages": ["en"]})

    def atomic(directory: Path) -> None:
        tmp = directory / ".tmp-step-0000200"
        plain(directory)
        (directory / "step-0000200").rename(tmp)  # the same writes, then fsync each and rename
        for name in (*FILES, "state.json"):
            with (tmp / name).open("rb+") as handle:
                os.fsync(handle.fileno())
        tmp.rename(directory / "step-0000200")

    return measure_path("checkpoint", plain, ours, atomic, repeats, work)


def stage_times(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Compute time of one unit of each stage, and the data each unit writes."""
    minilm = asset_path("minilm")
    ref = ModelRef(name="all-MiniLM-L6-v2", path=str(minilm))
    tokenizer = source_of(ref, minilm).load_tokenizer()
    wiki = asset_path("wiki-en")
    docs = [d.strip() for d in read_documents(CorpusSpec(paths=[str(wiki)], text_column="extract"))]
    rng = random.Random(args.seed)
    picked = rng.sample(docs, 2 * SAMPLE)
    shares: dict[str, float] = {}
    spans = [" ".join(d.split()[: rng.randint(1, 120)]) for d in picked[:SAMPLE]]
    encoder = source_of(ref, minilm).load()
    spec = EmbedSpec(batch_size=32)
    embed(spans[:32], encoder, tokenizer, spec)  # warm-up
    vectors, _ = embed(spans, encoder, tokenizer, spec)
    seconds, shares["embed"] = quiet_seconds(
        lambda: embed(spans, encoder, tokenizer, spec), args.attempts
    )
    embed_s = seconds * CACHE_ROWS / SAMPLE
    shard_vectors = np.tile(vectors, (CACHE_ROWS // SAMPLE, 1)).astype(np.float32)

    masker = TeacherMasker("bert", tokenizer, MaskingSpec(seed=args.seed), 128)
    copies = [masker(example_id("en", d), d) for d in picked[SAMPLE:]]
    teacher_spec = MaskedStudentSpec(
        hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024
    )
    teacher = build_masked_lm(
        teacher_spec, len(tokenizer), tokenizer.pad_token_id, args.seed
    ).eval()
    masked_topk(teacher, copies[:32], 8, tokenizer.pad_token_id, 32)  # warm-up
    outputs = masked_topk(teacher, copies, 8, tokenizer.pad_token_id, 32)
    seconds, shares["teach"] = quiet_seconds(
        lambda: masked_topk(teacher, copies, 8, tokenizer.pad_token_id, 32), args.attempts
    )
    teach_s = seconds * STORE_ROWS / SAMPLE
    dtype = np.uint16
    part = pa.table(
        {
            "topk_ids": list_column([o.topk_ids for o in outputs], dtype),
            "topk_logprobs": list_column([o.topk_logprobs for o in outputs], np.float16),
            "loss": pa.array(np.array([o.loss for o in outputs], dtype=np.float32)),
        }
    )
    table = pa.concat_tables([part] * (STORE_ROWS // SAMPLE)).combine_chunks()
    masked = sum(len(c.positions) for c in copies) / len(copies)

    source = TextBatches(
        [f"d{i}" for i in range(len(picked))],
        picked,
        tokenizer,
        MaskingSpec(seed=args.seed),
        128,
        32,
        args.seed,
        "en",
    )
    student = build_masked_lm(teacher_spec, len(tokenizer), tokenizer.pad_token_id, args.seed)

    def training(steps: int) -> None:
        model = build_masked_lm(teacher_spec, len(tokenizer), tokenizer.pad_token_id, args.seed)
        spec = TrainingSpec(
            steps=steps, batch_size=32, warmup_steps=1, gold_only=True, checkpoint_every=10**6
        )
        train(model, source, spec, work / f"train-{steps}", progress=False)
        shutil.rmtree(work / f"train-{steps}")

    short, _ = quiet_seconds(lambda: training(2), args.attempts)
    long, shares["train"] = quiet_seconds(lambda: training(6), args.attempts)
    step_s = (long - short) / 4
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4)
    for param in student.parameters():
        param.grad = torch.zeros_like(param)
    optimizer.step()  # the AdamW state a checkpoint holds
    params = sum(p.numel() for p in student.parameters())
    print(
        f"stage: embed {embed_s:.2f} s/shard, teach {teach_s:.2f} s/shard, {step_s:.3f} s/step "
        f"(other processes' CPU share {shares})",
        flush=True,
    )
    return {
        "embed_s": embed_s,
        "teach_s": teach_s,
        "step_s": step_s,
        "vectors": shard_vectors,
        "table": table,
        "masked_per_example": masked,
        "model": student,
        "optimizer": optimizer,
        "params": params,
        "shares": shares,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, attempts=2)
    torch.set_num_threads(args.threads)
    session = Session(NAME, MEASURED)
    WORK.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="integrity-", dir=WORK))
    try:
        stage = stage_times(args, work)
        paths = {
            "embedding cache shard": (
                cache_path(stage["vectors"], args.repeats, work),
                stage["embed_s"],
            ),
            "teacher store shard": (
                store_path(stage["table"], args.repeats, work),
                stage["teach_s"],
            ),
            "checkpoint": (
                checkpoint_path(
                    stage["model"], stage["optimizer"], max(3, args.repeats // 2), work
                ),
                stage["step_s"] * CHECKPOINT_EVERY,
            ),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    save(stage, paths, args, session)


def save(
    stage: dict[str, Any],
    paths: dict[str, tuple[dict[str, Any], float]],
    args: argparse.Namespace,
    session: Session,
) -> None:
    figures, rows, worst = [], [], 0.0
    for name, (r, compute) in paths.items():
        overhead = r["ours"] - r["plain"]
        share = overhead / (compute + r["plain"])
        worst = max(worst, share)
        figures.append(
            figure(
                f"{name}, {r['bytes'] / 2**20:,.1f} MiB",
                "ms",
                1e3 * r["plain"],
                1e3 * r["ours"],
                others_share=(r["others_share"], r["others_share"]),
                cost=True,
            )
        )
        rows.append(
            [
                name,
                round(1e3 * r["atomic"], 1),
                round(1e3 * r["sha256"], 1),
                round(1e3 * overhead, 1),
                round(compute, 1),
                f"{share:.2%}",
            ]
        )
    session.save(
        __doc__,
        {
            "cache shard": f"{CACHE_ROWS:,} x 384 float32",
            "store shard": f"{STORE_ROWS:,} examples of 128 tokens",
            "masked per example": round(stage["masked_per_example"], 1),
            "checkpoint parameters": f"{stage['params'] / 1e6:.1f}M",
            "repeats": args.repeats,
        },
        figures,
        targets=[
            goal(
                f"overhead <= {TARGET:.0%} of the stage time",
                worst <= TARGET,
                f"largest {worst:.2%}",
            )
        ],
        tables=[
            table(
                "Overhead against the stage",
                [
                    "write path",
                    "atomic only (ms)",
                    "sha256 re-read (ms)",
                    "overhead (ms)",
                    "stage time per unit (s)",
                    "overhead share of stage",
                ],
                rows,
            )
        ],
        notes=[
            f"Stage step time {stage['step_s']:.2f} s at batch 32 x 128; other processes took "
            + ", ".join(f"{v:.0%} ({k})" for k, v in stage["shares"].items())
            + " of the CPUs while the stages were timed.",
            "`save_checkpoint` does not fsync its tensor files (the atomic-only column shows what "
            "that would add): a torn file fails its sha256 and the previous checkpoint is used.",
            f"Peak RSS of the benchmark process: {peak_rss_mib():,.0f} MiB.",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
