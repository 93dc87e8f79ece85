"""Integrity benchmark: what checksums (sha256) and atomic writes (temporary file, fsync, rename)
cost on the toolkit's real write paths, against plain writes and against the stage's own time.

Target: the overhead is at most 5% of the stage time.

Write paths, one unit each, at the sizes a real run writes:

* embedding cache shard: ``EmbeddingCache.ensure`` writing one 2,048-row shard of
  all-MiniLM-L6-v2 embeddings (384 float32 per span, 3 MiB) and its manifest;
* teacher store shard: ``ShardSet.write`` of one 1,024-example ``topk/`` shard (top-8 ids and
  fp16 log-probs at ~14 masked positions per 128-token example, per-example loss) and manifest;
* checkpoint: ``save_checkpoint`` of a BERT student (4 layers, hidden 256, 30,522-token
  vocabulary, 11M parameters) with its AdamW state and RNG state (~135 MB).

For each: *plain* writes the same bytes with the same library straight to the final name (no
temporary, no fsync, no checksum, no manifest); *ours* is the toolkit's function; the parts are
timed too: the writer inside ``write_atomic`` (temporary + fsync + rename) and ``sha256_file`` of
the written file. The page cache is flushed (``os.sync``, untimed) before every write, so no
write pays for another's dirty pages; each is repeated and the median kept.

The stage time of one unit is measured on the real compute and scaled to the unit: ``embed`` of
256 spans (x 8), ``masked_topk`` of a small BERT teacher (4 layers, hidden 256) on 256 examples
(x 4), and the training loop's step time (from 2- and 6-step runs of ``lmalgebra.train.loop``)
times 200 steps (the default ``checkpoint_every``). Overhead = (ours - plain) / (stage time +
plain).

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

from benchlib import (
    CpuWatch,
    code_version,
    machine,
    peak_rss_mib,
    utc_date,
    wait_for_idle,
    write_section,
)
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.distill.examples import example_id
from lmalgebra.distill.masking import TeacherMasker
from lmalgebra.distill.pretrain import TextBatches
from lmalgebra.distill.recipe import MaskingSpec
from lmalgebra.distill.student import StudentSpec, build_student
from lmalgebra.distill.topk import masked_topk
from lmalgebra.lmd.embed import EmbedSpec, TokenReport, embed
from lmalgebra.lmd.embedding_cache import EmbeddingCache
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.models import ModelRef, load_model, load_tokenizer
from lmalgebra.sources.packaged import asset_path
from lmalgebra.storage.arrow_columns import list_column
from lmalgebra.storage.atomic import write_atomic
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.checkpoint import FILES, _optimizer_tensors, save_checkpoint
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train

SECTION = "bench_integrity"
MEASURED = ("src/lmalgebra/atomic.py", "src/lmalgebra/fingerprint.py")
TARGET = 0.05
CACHE_ROWS, STORE_ROWS, CHECKPOINT_EVERY = 2048, 1024, 200
SAMPLE = 256
WORK = Path(__file__).resolve().parent / "_work"


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
    wait_for_idle(timeout=60)
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


def quiet_seconds(run: Callable[[], object], retries: int = 1) -> tuple[float, float]:
    """Fastest time of ``run()`` on an idle machine (again when other processes took > 5% of the
    CPUs, up to ``retries`` times) and the other processes' CPU share during it."""
    best = (float("inf"), 1.0)
    for _ in range(1 + retries):
        wait_for_idle(timeout=45)
        watch = CpuWatch()
        clock = time.perf_counter()
        run()
        seconds = time.perf_counter() - clock
        share = watch.stop()["others_share"]
        best = min(best, (seconds, share))
        if share <= 0.05:
            break
    return best


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
    tokenizer = load_tokenizer(ref, minilm)
    wiki = asset_path("wiki-en")
    docs = [d.strip() for d in read_documents(CorpusSpec(paths=[str(wiki)], text_column="extract"))]
    rng = random.Random(args.seed)
    picked = rng.sample(docs, 2 * SAMPLE)
    shares: dict[str, float] = {}
    spans = [" ".join(d.split()[: rng.randint(1, 120)]) for d in picked[:SAMPLE]]
    encoder = load_model(ref, minilm)
    spec = EmbedSpec(batch_size=32)
    embed(spans[:32], encoder, tokenizer, spec)  # warm-up
    vectors, _ = embed(spans, encoder, tokenizer, spec)
    seconds, shares["embed"] = quiet_seconds(lambda: embed(spans, encoder, tokenizer, spec))
    embed_s = seconds * CACHE_ROWS / SAMPLE
    shard_vectors = np.tile(vectors, (CACHE_ROWS // SAMPLE, 1)).astype(np.float32)

    masker = TeacherMasker("bert", tokenizer, MaskingSpec(seed=args.seed), 128)
    copies = [masker(example_id("en", d), d) for d in picked[SAMPLE:]]
    teacher_spec = StudentSpec(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024)
    teacher = build_student(teacher_spec, len(tokenizer), tokenizer.pad_token_id, args.seed).eval()
    masked_topk(teacher, copies[:32], 8, tokenizer.pad_token_id, 32)  # warm-up
    outputs = masked_topk(teacher, copies, 8, tokenizer.pad_token_id, 32)
    seconds, shares["teach"] = quiet_seconds(
        lambda: masked_topk(teacher, copies, 8, tokenizer.pad_token_id, 32)
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
    student = build_student(teacher_spec, len(tokenizer), tokenizer.pad_token_id, args.seed)

    def training(steps: int) -> None:
        model = build_student(teacher_spec, len(tokenizer), tokenizer.pad_token_id, args.seed)
        spec = TrainingSpec(
            steps=steps, batch_size=32, warmup_steps=1, gold_only=True, checkpoint_every=10**6
        )
        train(model, source, spec, work / f"train-{steps}", progress=False)
        shutil.rmtree(work / f"train-{steps}")

    short, _ = quiet_seconds(lambda: training(2))
    long, shares["train"] = quiet_seconds(lambda: training(6))
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
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    WORK.mkdir(exist_ok=True)
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
    text = report(stage, paths, started)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f} ms"


def report(
    stage: dict[str, Any], paths: dict[str, tuple[dict[str, Any], float]], started: float
) -> str:
    rows = []
    worst = 0.0
    for name, (r, compute) in paths.items():
        overhead = r["ours"] - r["plain"]
        share = overhead / (compute + r["plain"])
        worst = max(worst, share)
        rows.append(
            f"| {name} | {r['bytes'] / 2**20:,.1f} MiB | {_ms(r['plain'])} | {_ms(r['ours'])} | "
            f"{_ms(r['atomic'])} | {_ms(r['sha256'])} | {_ms(overhead)} "
            f"({overhead / r['plain']:+.0%}) | {compute:,.1f} s | **{share:.2%}** | "
            f"{100 * r['others_share']:.0f}% |"
        )
    verdict = "met" if worst <= TARGET else "NOT met"
    return "\n".join(
        [
            "## Integrity: checksums and atomic writes on the real write paths",
            "",
            f"- Date: {utc_date()}",
            f"- Machine: {machine()}",
            f"- Code: {code_version(MEASURED)}",
            f"- Units: embedding cache shard = {CACHE_ROWS} spans x 384 float32 "
            "(all-MiniLM-L6-v2, packaged `wiki-en` leads of 1..120 words); teacher store shard = "
            f"{STORE_ROWS} examples of 128 tokens, {stage['masked_per_example']:.1f} masked "
            "tokens each, top-8 (small random BERT teacher, 4 x 256, MiniLM vocabulary); "
            f"checkpoint = BERT student 4 x 256, {stage['params'] / 1e6:.1f}M parameters, "
            "30,522-token vocabulary, with AdamW state and RNG state.",
            "- Plain: the same library writes the same bytes straight to the final name. Ours: "
            "`EmbeddingCache.ensure` (atomic shard write with fsync, sha256 re-read, manifest "
            "written atomically twice), `ShardSet.write` (atomic shard write with fsync, sha256, "
            "manifest), `save_checkpoint` (files in a temporary directory, sha256 of each, "
            "state.json with fsync, rename). *Atomic only*: the writer inside a temporary name "
            "with fsync and rename (for the checkpoint: fsync of each file and a rename). "
            "`os.sync()` before every write (untimed); median of repeats.",
            "- Stage time of one unit: `embed` of 256 spans x 8; `masked_topk` on 256 examples "
            f"x 4; the loop's step time ({stage['step_s']:.2f} s at batch 32 x 128, from 2- and "
            f"6-step runs) x {CHECKPOINT_EVERY} steps (default `checkpoint_every`). Share = "
            "(ours - plain) / (stage time + plain). Each timed on an idle machine when one "
            "could be had (fastest of up to 2 tries); other processes took "
            + ", ".join(f"{100 * v:.0f}% ({k})" for k, v in stage["shares"].items())
            + " of the CPUs during them.",
            "",
            "| write path | size | plain | ours | atomic only | sha256 (re-read) | overhead "
            "(vs plain) | stage time per unit | overhead share of stage | other processes' CPU |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *rows,
            "",
            f"- Largest overhead share: **{worst:.2%}** (target <= 5%: **{verdict}**).",
            "- Against the plain write alone the extra cost is large (the sha256 re-read, the "
            "fsync of the shard and of the manifest written after each shard), but a unit's "
            "compute is 3-4 orders of magnitude longer than its write. Hashing while writing "
            "instead of re-reading would save the sha256 column; most of the rest is fsync.",
            "- `save_checkpoint` does not fsync its tensor files (its *atomic only* column shows "
            "what that would add): after a power cut a torn file fails its sha256 and the "
            "previous checkpoint is used.",
            f"- Peak RSS of the benchmark process: {peak_rss_mib():.0f} MiB.",
            f"- Total benchmark wall time {(time.perf_counter() - started) / 60:.1f} min.",
        ]
    )


if __name__ == "__main__":
    main()
