"""Scaling from one to two processes: embedding + statistics, and teacher inference.

Both workloads run under ``torchrun --standalone --nproc-per-node P`` (P = 1, then 2), launched by
this script, which then runs itself as the worker (``--worker``). Every process gets
``cores / P`` torch threads (``OMP_NUM_THREADS`` and ``torch.set_num_threads``), so both runs use
all cores: on a machine with few cores the gain from more processes is small, since one process
already keeps every core busy with its own threads.

* Embedding + statistics (``lmalgebra decompose``'s heavy stage): the packaged MiniLM
  (all-MiniLM-L6-v2) embeds spans of 64 tokens of packaged ``wiki-en`` into an ``EmbeddingCache``
  (each rank computes its own shards), then each rank accumulates ``SecondMoments`` over its
  shards and ``reduce_moments`` sums them. Timed on rank 0 from a barrier after the model is
  loaded and warmed up to a barrier after the reduction.
* Teacher inference (``lmalgebra merge teach``): ``stages.teach`` over a prepared store
  (prepared once, untimed, copied for each run) with a random small BERT (4 layers, hidden 256,
  MiniLM's 30,522-token vocabulary) as the teacher. Timed on rank 0 between barriers around
  ``teach`` (model loading included).

    flock /tmp/lmalgebra-bench.lock .venv/bin/python bench/bench_scaling.py [--spans 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchlib import (
    _busy_seconds,
    code_version,
    machine,
    peak_rss_mib,
    utc_date,
    wait_for_idle,
    write_section,
)

SECTION = "bench_scaling"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/merge", "src/lmalgebra/distributed.py")
CONTAMINATED = 0.05  # share of all CPUs used by other processes above which a run is repeated
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


# -- workers (one per rank, under torchrun) -----------------------------------------------------
def _embed_worker(work: Path, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from lmalgebra.distributed import barrier, owned, world
    from lmalgebra.lmd.embed import EmbedSpec, embed
    from lmalgebra.lmd.embedding_cache import EmbeddingCache
    from lmalgebra.sources.models import ModelRef, load_model, load_tokenizer
    from lmalgebra.sources.packaged import asset_path
    from lmalgebra.stats.moments import SecondMoments, layout
    from lmalgebra.stats.reduce import reduce_moments

    torch.set_num_threads(threads)
    rank, size = world()
    setup = json.loads((work / "embed.json").read_text())
    path = asset_path("minilm")
    ref = ModelRef(name="minilm", path=str(path))
    model, tokenizer = load_model(ref, path, "float32"), load_tokenizer(ref, path)
    spec = EmbedSpec(batch_size=32)
    embed(setup["warmup"], model, tokenizer, spec)

    def compute(texts: list[str]) -> Any:
        return embed(texts, model, tokenizer, spec)

    cache = EmbeddingCache(
        work / f"cache-{size}", {"model": "minilm"}, setup["texts"], setup["shard_rows"]
    )
    barrier()
    clock = time.perf_counter()
    cache.ensure(compute)
    moments = SecondMoments(layout(["minilm"], [cache.dim]))
    for chunk in cache.chunks(owned(len(cache.ranges))):
        moments.update(chunk)
    total = reduce_moments(moments)
    barrier()
    seconds = time.perf_counter() - clock
    if rank == 0:
        total.save(work / f"stats-{size}.safetensors")
    return {"seconds": seconds, "rows": total.n, "mean_norm": float(np.linalg.norm(total.mean()))}


def _teach_worker(work: Path, threads: int) -> dict[str, Any]:
    import torch

    from lmalgebra.distill import stages
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.distributed import barrier, world

    torch.set_num_threads(threads)
    size = world()[1]
    recipe = load_recipe(work / f"recipe-{size}.yaml")
    barrier()
    clock = time.perf_counter()
    stages.teach(recipe, progress=False)
    barrier()
    return {"seconds": time.perf_counter() - clock}


def worker(kind: str, work: Path) -> None:
    from lmalgebra.distributed import world

    rank, size = world()
    threads = int(os.environ.get("OMP_NUM_THREADS", "1"))
    result = (_embed_worker if kind == "embed" else _teach_worker)(work, threads)
    result.update(rank=rank, size=size, threads=threads, peak_rss_mib=peak_rss_mib())
    (work / f"{kind}-{size}-rank{rank}.json").write_text(json.dumps(result))


# -- setup (in this process, untimed) -----------------------------------------------------------
def setup_embed(work: Path, spans: int, shard_rows: int) -> dict[str, Any]:
    from lmalgebra.lmd.spans import SpanSpec, draw_spans, span_texts
    from lmalgebra.sources.corpus import CorpusSpec, read_documents
    from lmalgebra.sources.models import ModelRef, load_tokenizer
    from lmalgebra.sources.packaged import asset_path

    wiki = asset_path("wiki-en")
    docs = read_documents(CorpusSpec(paths=[str(wiki)], text_column="extract"))
    path = asset_path("minilm")
    tokenizer = load_tokenizer(ModelRef(name="minilm", path=str(path)), path)
    drawn = draw_spans(docs, tokenizer, SpanSpec(length=64, counts=(spans, 64, 1), per_doc=4))
    texts = span_texts(docs, drawn["train"])
    warmup = span_texts(docs, drawn["validation"])
    setup = {"texts": texts, "warmup": warmup, "shard_rows": shard_rows}
    (work / "embed.json").write_text(json.dumps(setup))
    return {"spans": len(texts), "shard_rows": shard_rows, "docs": len(docs)}


def setup_teach(work: Path, examples: int, shard_rows: int) -> dict[str, Any]:
    import torch
    import yaml
    from transformers import BertConfig, BertForMaskedLM

    from lmalgebra.distill import stages
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.sources.models import ModelRef, load_tokenizer
    from lmalgebra.sources.packaged import asset_path
    from lmalgebra.storage.shard_set import ShardSet

    path = asset_path("minilm")
    tokenizer = load_tokenizer(ModelRef(name="minilm", path=str(path)), path)
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    BertForMaskedLM(config).save_pretrained(work / "teacher")
    tokenizer.save_pretrained(work / "teacher")
    recipe: dict[str, Any] = {
        "languages": {
            "en": {
                "corpus": {"paths": [str(asset_path("wiki-en"))], "text_column": "extract"},
                "teachers": ["bert"],
                "max_examples": examples,
            }
        },
        "teachers": {"bert": {"path": str(work / "teacher")}},
        "example_length": 128,
        "shard_rows": shard_rows,
        "output_dir": str(work / "run-1"),
    }
    (work / "recipe-1.yaml").write_text(yaml.safe_dump(recipe))
    (work / "recipe-2.yaml").write_text(
        yaml.safe_dump({**recipe, "output_dir": str(work / "run-2")})
    )
    stages.prepare(load_recipe(work / "recipe-1.yaml"), progress=False)
    shutil.copytree(work / "run-1", work / "run-2")
    masked = ShardSet.existing(work / "run-1" / "masked" / "en" / "bert")
    tokens = sum(len(t.column("input_ids").combine_chunks().values) for t in masked.tables())
    return {
        "examples": masked.rows,
        "shards": len(masked.manifest["shards"]),
        "tokens": tokens,
        "masked_tokens": int(masked.manifest["masked_tokens"]),
        "shard_rows": shard_rows,
    }


# -- launching ----------------------------------------------------------------------------------
def launch(kind: str, work: Path, procs: int, idle_timeout: float) -> dict[str, Any]:
    """Run the workers under torchrun from scratch (no cached output); rank results plus the
    launch's wall time and the share of the CPUs other processes took meanwhile."""
    shutil.rmtree(work / f"cache-{procs}", ignore_errors=True)
    shutil.rmtree(work / f"run-{procs}" / "topk", ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, CORES // procs))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(procs), __file__, "--worker", kind, "--work", str(work)]
    wait_for_idle(timeout=idle_timeout)
    busy, children = _busy_seconds(), _children_cpu()
    clock = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - clock
    if done.returncode != 0:
        raise SystemExit(f"{kind} on {procs} processes failed:\n{done.stderr[-3000:]}")
    own = _children_cpu() - children
    others = max(0.0, _busy_seconds() - busy - own) / (wall * (os.cpu_count() or 1))
    ranks = [json.loads((work / f"{kind}-{procs}-rank{r}.json").read_text()) for r in range(procs)]
    return {"ranks": ranks, "launch_wall": wall, "others_share": others}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def compare_stats(work: Path) -> float:
    """Relative max difference of the covariance of one-process and two-process statistics."""
    import numpy as np

    from lmalgebra.stats.moments import SecondMoments

    one, two = (SecondMoments.load(work / f"stats-{p}.safetensors").covariance() for p in (1, 2))
    return float(np.abs(one - two).max() / np.abs(one).max())


def same_store(work: Path) -> bool:
    import filecmp

    a, b = work / "run-1" / "topk", work / "run-2" / "topk"
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        filecmp.cmp(a / f, b / f, shallow=False) for f in files
    )


# -- report -------------------------------------------------------------------------------------
def _row(label: str, unit: str, amount: float, runs: dict[int, dict[str, Any]]) -> str:
    one, two = (runs[p]["ranks"][0]["seconds"] for p in (1, 2))
    peaks = {p: [r["peak_rss_mib"] for r in runs[p]["ranks"]] for p in (1, 2)}
    return (
        f"| {label} | {amount / one:,.1f} {unit} ({one:.1f} s) | {amount / two:,.1f} {unit} "
        f"({two:.1f} s) | **{one / two:.2f}x** | {runs[1]['launch_wall']:.1f} s / "
        f"{runs[2]['launch_wall']:.1f} s | {peaks[1][0]:.0f} MiB | "
        f"{max(peaks[2]):.0f} MiB per rank, {sum(peaks[2]):.0f} MiB total | "
        f"{runs[1]['others_share']:.0%} / {runs[2]['others_share']:.0%} |"
    )


def report(sizes: dict[str, Any], runs: dict[str, dict[int, Any]], checks: dict[str, Any]) -> str:
    embed, teach = sizes["embed"], sizes["teach"]
    lines = [
        "## Scaling from one to two processes (`torchrun`, gloo, CPU)",
        "",
        f"- Date: {utc_date()}",
        f"- Machine: {machine()}",
        f"- Code: {code_version(MEASURED)}",
        f"- Baseline: 1 process x {CORES} torch threads. Ours: 2 processes x "
        f"{max(1, CORES // 2)} thread(s) each (threads = cores / processes, so both use every "
        "core). With 2 cores, one process already keeps both cores busy: the gain from a second "
        "process is what one-thread-per-process execution saves (less threading overhead, "
        "two batches in flight), not more hardware.",
        f"- Embedding + statistics: packaged MiniLM (all-MiniLM-L6-v2, float32, batch 32) on "
        f"{embed['spans']:,} spans of 64 tokens from packaged `wiki-en` "
        f"({embed['docs']:,} documents), `EmbeddingCache` shards of {embed['shard_rows']:,} rows "
        "(rank r computes shards i with i % 2 == r), then `SecondMoments` per rank and "
        "`reduce_moments`. Timed on rank 0 between barriers, after model loading and a warm-up.",
        f"- Teacher inference: `stages.teach` on {teach['examples']:,} `wiki-en` examples "
        f"({teach['tokens']:,} tokens, {teach['masked_tokens']:,} masked) in {teach['shards']} "
        f"shards of {teach['shard_rows']} examples; teacher: random small BERT (4 layers, hidden "
        "256, 30,522-token vocabulary), top-k 8. Timed on rank 0 between barriers around "
        "`teach` (model loading included).",
        "- Launch wall: the whole `torchrun` command, interpreter start-up and imports included.",
        "- Each run starts from an empty cache / store after waiting for an idle machine; a run "
        f"during which other processes took more than {CONTAMINATED:.0%} of the CPUs is repeated "
        "(once by default), keeping the faster.",
        "",
        "| workload | 1 process | 2 processes | speed-up | launch wall 1 / 2 | peak RSS, 1 process "
        "| peak RSS, 2 processes | other processes' CPU share 1 / 2 |",
        "|---|---|---|---|---|---|---|---|",
        _row("embedding + statistics", "spans/s", embed["spans"], runs["embed"]),
        _row("teacher inference", "tokens/s", teach["tokens"], runs["teach"]),
        "",
        f"- Agreement: covariance of the 2-process statistics vs 1 process, max relative "
        f"difference {checks['stats']:.1e}; teacher store of 2 processes byte-identical to 1 "
        f"process: {'yes' if checks['store'] else 'NO'}.",
        f"- Total benchmark wall time {checks['total'] / 60:.1f} min.",
    ]
    for kind, label in (("embed", "embedding + statistics"), ("teach", "teacher inference")):
        for procs in (1, 2):
            share = runs[kind][procs]["others_share"]
            if share > CONTAMINATED:
                lines.append(
                    f"- **Warning**: other processes took {share:.0%} of the CPUs during the "
                    f"{procs}-process {label} run, even after a repeat: its speed-up is "
                    f"{'overstated' if procs == 1 else 'understated'}."
                )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=3072, help="spans to embed")
    parser.add_argument("--embed-shard-rows", type=int, default=768)
    parser.add_argument("--examples", type=int, default=1024, help="teacher-inference examples")
    parser.add_argument("--teach-shard-rows", type=int, default=256)
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument("--idle-timeout", type=float, default=60.0, help="seconds per wait")
    parser.add_argument(
        "--retries", type=int, default=1, help="extra attempts when other processes interfere"
    )
    parser.add_argument("--worker", choices=["embed", "teach"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.work)
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        work = Path(tmp)
        sizes = {
            "embed": setup_embed(work, args.spans, args.embed_shard_rows),
            "teach": setup_teach(work, args.examples, args.teach_shard_rows),
        }
        runs: dict[str, dict[int, Any]] = {"embed": {}, "teach": {}}
        for kind in ("embed", "teach"):
            for procs in (1, 2):
                best = launch(kind, work, procs, args.idle_timeout)
                for _ in range(args.retries):
                    if best["others_share"] <= CONTAMINATED:
                        break
                    again = launch(kind, work, procs, args.idle_timeout)
                    if again["ranks"][0]["seconds"] < best["ranks"][0]["seconds"]:
                        best = again
                runs[kind][procs] = best
                seconds = best["ranks"][0]["seconds"]
                print(f"{kind}: {procs} process(es) {seconds:.1f} s", flush=True)
        checks = {
            "stats": compare_stats(work),
            "store": same_store(work),
            "total": time.perf_counter() - started,
        }
    body = report(sizes, runs, checks)
    print(body)
    if not args.no_write:
        write_section(SECTION, body)


if __name__ == "__main__":
    main()
