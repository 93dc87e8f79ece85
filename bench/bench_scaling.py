"""Scaling: one vs two processes (`torchrun`, gloo, CPU).

Two workloads under ``torchrun --standalone`` with 1 process x all cores' torch threads (baseline)
and 2 processes x half as many each (ours), each run from an empty cache or store. Embedding +
statistics (``lmalgebra decompose``'s heavy stage): the packaged MiniLM embeds 3,072 spans of 64
tokens of ``wiki-en`` into ``EmbeddingCache`` shards of 768 rows (each rank its own shards), then
``SecondMoments`` per rank and ``reduce_moments``. Teacher inference (``lmalgebra merge teach``):
``pipeline.teach`` on 1,024 prepared ``wiki-en`` examples with a random small BERT (4 x 256, 30,522
tokens), top-8. Timed on rank 0 between barriers; the whole launch is also timed. On a machine with
few cores one process already keeps every core busy, so the gain is small.

    python bench/bench_scaling.py [--spans 3072] [--examples 1024] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from harness import Session, cores, fastest, figure, parse_args, peak_rss_mib, run_command, table

NAME = "bench_scaling"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/distill", "src/lmalgebra/distributed")
CORES = cores()


# -- workers (one per rank, under torchrun) -----------------------------------------------------
def _embed_worker(work: Path, threads: int) -> dict[str, Any]:
    import numpy as np
    import torch

    from lmalgebra.distributed import barrier, owned, world
    from lmalgebra.lmd.embeddings.cache import EmbeddingCache
    from lmalgebra.sources.embed import EmbedSpec, embed
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef
    from lmalgebra.sources.packaged import asset_path
    from lmalgebra.stats.moments import SecondMoments, layout
    from lmalgebra.stats.reduce import reduce_moments

    torch.set_num_threads(threads)
    rank, size = world()
    setup = json.loads((work / "embed.json").read_text())
    path = asset_path("minilm")
    ref = ModelRef(name="minilm", path=str(path))
    model, tokenizer = source_of(ref, path).load("float32"), source_of(ref, path).load_tokenizer()
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

    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.distributed import barrier, world

    torch.set_num_threads(threads)
    size = world()[1]
    recipe = load_recipe(work / f"recipe-{size}.yaml")
    barrier()
    clock = time.perf_counter()
    pipeline.teach(recipe, progress=False)
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
    from lmalgebra.lmd.settings.spans import SpanSpec, draw_spans, span_texts
    from lmalgebra.sources.corpus import CorpusSpec, read_documents
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef
    from lmalgebra.sources.packaged import asset_path

    wiki = asset_path("wiki-en")
    docs = read_documents(CorpusSpec(paths=[str(wiki)], text_column="extract"))
    path = asset_path("minilm")
    tokenizer = source_of(ModelRef(name="minilm", path=str(path)), path).load_tokenizer()
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

    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef
    from lmalgebra.sources.packaged import asset_path
    from lmalgebra.storage.shard_set import ShardSet

    path = asset_path("minilm")
    tokenizer = source_of(ModelRef(name="minilm", path=str(path)), path).load_tokenizer()
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
    pipeline.prepare(load_recipe(work / "recipe-1.yaml"), progress=False)
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
def launch(kind: str, work: Path, procs: int) -> dict[str, Any]:
    """Run the workers under torchrun from scratch (no cached output): the launch measured by the
    harness, with rank 0's timed seconds as ``seconds`` and every rank's result."""
    shutil.rmtree(work / f"cache-{procs}", ignore_errors=True)
    shutil.rmtree(work / f"run-{procs}" / "topk", ignore_errors=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, CORES // procs))}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node", str(procs), __file__, "--worker", kind, "--work", str(work)]
    result = run_command(command, env)
    ranks = [json.loads((work / f"{kind}-{procs}-rank{r}.json").read_text()) for r in range(procs)]
    return {**result, "launch_s": result["seconds"], "seconds": ranks[0]["seconds"], "ranks": ranks}


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


# -- the result ---------------------------------------------------------------------------------
def save(
    sizes: dict[str, Any], runs: dict[str, Any], checks: dict[str, Any], args: Any, session: Session
) -> None:
    figures, rows = [], []
    for kind, label, unit, amount in (
        ("embed", "embedding + statistics", "spans/s", sizes["embed"]["spans"]),
        ("teach", "teacher inference", "tokens/s", sizes["teach"]["tokens"]),
    ):
        one, two = runs[kind][1], runs[kind][2]
        peaks = [r["peak_rss_mib"] for r in two["ranks"]]
        figures.append(
            figure(
                label,
                unit,
                amount / one["seconds"],
                amount / two["seconds"],
                peak_mib=(one["ranks"][0]["peak_rss_mib"], sum(peaks)),
                others_share=(one["others_share"], two["others_share"]),
                higher_is_better=True,
            )
        )
        rows.append(
            [
                label,
                round(one["seconds"], 1),
                round(two["seconds"], 1),
                f"{one['launch_s']:.1f} / {two['launch_s']:.1f}",
                round(max(peaks)),
            ]
        )
    embed, teach = sizes["embed"], sizes["teach"]
    session.save(
        __doc__,
        {
            "cores": CORES,
            "spans": embed["spans"],
            "embedding shard rows": embed["shard_rows"],
            "teacher examples": teach["examples"],
            "teacher tokens": teach["tokens"],
            "teacher shards": teach["shards"],
        },
        figures,
        tables=[
            table(
                "Runs",
                [
                    "workload",
                    "1 process (s)",
                    "2 processes (s)",
                    "launch wall 1 / 2 (s)",
                    "peak RSS per rank, 2 processes (MiB)",
                ],
                rows,
            )
        ],
        notes=[
            "Peak RSS of 2 processes is the sum over the ranks.",
            "Agreement: covariance of 2-process vs 1-process statistics, max relative difference "
            f"{checks['stats']:.1e}; teacher store of 2 processes byte-identical to 1 process: "
            f"{'yes' if checks['store'] else 'no'}.",
        ],
        write=not args.no_write,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=3072, help="spans to embed")
    parser.add_argument("--embed-shard-rows", type=int, default=768)
    parser.add_argument("--examples", type=int, default=1024, help="teacher-inference examples")
    parser.add_argument("--teach-shard-rows", type=int, default=256)
    parser.add_argument("--worker", choices=["embed", "teach"], help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parse_args(parser, attempts=2)
    if args.worker:
        worker(args.worker, args.work)
        return
    session = Session(NAME, MEASURED)
    with tempfile.TemporaryDirectory(prefix="bench-scaling-") as tmp:
        work = Path(tmp)
        sizes = {
            "embed": setup_embed(work, args.spans, args.embed_shard_rows),
            "teach": setup_teach(work, args.examples, args.teach_shard_rows),
        }
        runs: dict[str, dict[int, Any]] = {"embed": {}, "teach": {}}
        for kind in ("embed", "teach"):
            for procs in (1, 2):
                runs[kind][procs] = fastest(
                    lambda k=kind, p=procs: launch(k, work, p),
                    args.attempts,
                    label=f"{kind}, {procs} process(es)",
                )
        checks = {"stats": compare_stats(work), "store": same_store(work)}
    save(sizes, runs, checks, args, session)


if __name__ == "__main__":
    main()
