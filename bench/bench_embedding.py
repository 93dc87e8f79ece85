"""Embedding benchmark: length-sorted batching vs padding every batch to the maximum length.

Target: >= 2x spans/s on a real packaged encoder (all-MiniLM-L6-v2) and real text (English
Wikipedia summaries), with spans of varied length.

* ours: ``lmalgebra.lmd.embed.embed`` (tokenise once, sort by length, pad each batch to its own
  longest span, masked mean pooling, back to input order);
* baseline: the same model, batches in corpus order, every span padded to the model's maximum
  input length (``padding="max_length"``, as the LMD paper's code does), same masked mean pooling
  and batch size;
* for information, a second baseline pads each corpus-order batch to its own longest span
  (``padding="longest"``), which isolates what sorting adds over dynamic padding.

All run in one process, one after the other, each after a warm-up, on 2 threads. Embeddings
must agree to 1e-4 (max abs difference) or the script exits with an error.

    python bench/bench_embedding.py [--spans 1500] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from benchlib import (
    changed_sources,
    code_version,
    fastest_attempt,
    machine,
    source_digest,
    utc_date,
    write_section,
)
from lmalgebra.lmd.embed import EmbedSpec, embed, max_tokens
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.models import ModelRef, load_model, load_tokenizer
from lmalgebra.sources.packaged import asset_path

SECTION = "bench_embedding"
TOLERANCE = 1e-4
SPEED_TARGET = 2.0
CONTAMINATED = 0.05  # share of all CPUs used by other processes above which a run is repeated
Embedder = Callable[[list[str]], np.ndarray]


def span_texts(docs: list[str], tokenizer: Any, count: int, longest: int, seed: int) -> list[str]:
    """``count`` leads of random documents, each cut after a random 1..``longest`` tokens.

    A lead is the document's original text up to the end of its L-th token (whole document when
    shorter), so lengths vary the way sentences and paragraph leads do.
    """
    rng = random.Random(seed)
    picked = rng.sample(range(len(docs)), count)
    texts = []
    for index in picked:
        doc = docs[index]
        offsets = tokenizer(doc, add_special_tokens=False, return_offsets_mapping=True)[
            "offset_mapping"
        ]
        length = rng.randint(1, longest)
        texts.append(doc[: offsets[length - 1][1]] if len(offsets) > length else doc)
    return texts


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)


def padded_embedder(model: Any, tokenizer: Any, batch_size: int, padding: str) -> Embedder:
    """Corpus-order batches padded to ``max_length`` (the model's limit) or to ``longest``."""
    limit = max_tokens(model, tokenizer, None)

    @torch.inference_mode()
    def run(texts: list[str]) -> np.ndarray:
        out = []
        for start in range(0, len(texts), batch_size):
            enc = tokenizer(
                texts[start : start + batch_size],
                padding=padding,
                max_length=limit,
                truncation=True,
                return_tensors="pt",
            )
            hidden = model(**enc).last_hidden_state
            out.append(masked_mean(hidden.float(), enc["attention_mask"]).numpy())
        return np.concatenate(out)

    return run


def measure(
    name: str, run: Embedder, texts: list[str], warmup: list[str], retries: int
) -> dict[str, Any]:
    """Warm up, then time ``run(texts)`` on an idle machine; repeat when other processes took
    a noticeable share of the CPUs meanwhile, keeping the fastest attempt."""
    run(warmup)

    def report(r: dict[str, Any]) -> None:
        print(
            f"{name}: {len(texts) / r['seconds']:.1f} spans/s ({r['seconds']:.1f} s), peak RSS "
            f"{r['peak_rss']:.0f} MiB, other processes {100 * r['cpu']['others_share']:.0f}% "
            "of the CPUs",
            flush=True,
        )

    best = fastest_attempt(lambda: run(texts), retries, report, CONTAMINATED)
    return {**best, "vectors": best["output"], "rate": len(texts) / best["seconds"]}


def padded_tokens(lengths: list[int], batch_size: int, width: int | None, sort: bool) -> int:
    """Token positions a method pushes through the model (including padding)."""
    order = sorted(lengths, reverse=True) if sort else lengths
    total = 0
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        total += len(batch) * (width if width is not None else max(batch))
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1500, help="number of text spans")
    parser.add_argument("--longest", type=int, default=256, help="longest span, in tokens")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dynamic", action="store_true", help="skip the padding=longest run")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument(
        "--retries", type=int, default=4, help="extra attempts when other processes interfere"
    )
    args = parser.parse_args()
    version, digest = code_version(), source_digest()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()

    model_dir = asset_path("minilm")
    ref = ModelRef(name="all-MiniLM-L6-v2", path=str(model_dir))
    model = load_model(ref, model_dir)
    tokenizer = load_tokenizer(ref, model_dir)
    limit = max_tokens(model, tokenizer, None)
    docs = read_documents(CorpusSpec(paths=[str(asset_path("wiki-en"))], text_column="extract"))
    texts = span_texts(docs, tokenizer, args.spans, args.longest, args.seed)
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    warmup = span_texts(docs, tokenizer, 2 * args.batch_size, args.longest, args.seed + 1)
    spec = EmbedSpec(batch_size=args.batch_size)

    runs: dict[str, dict[str, Any]] = {}
    runs["baseline"] = measure(
        f"baseline (corpus order, padding=max_length {limit})",
        padded_embedder(model, tokenizer, args.batch_size, "max_length"),
        texts,
        warmup,
        args.retries,
    )
    if not args.no_dynamic:
        runs["dynamic"] = measure(
            "corpus order, padding=longest per batch",
            padded_embedder(model, tokenizer, args.batch_size, "longest"),
            texts,
            warmup,
            args.retries,
        )
    runs["ours"] = measure(
        "ours (lmalgebra.lmd.embed.embed, length-sorted)",
        lambda t: embed(t, model, tokenizer, spec)[0],
        texts,
        warmup,
        args.retries,
    )

    diffs = {
        k: float(np.abs(r["vectors"] - runs["ours"]["vectors"]).max())
        for k, r in runs.items()
        if k != "ours"
    }
    print("max abs difference from ours: " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items()))
    if max(diffs.values()) > TOLERANCE:
        sys.exit(f"FAILED: embeddings disagree by more than {TOLERANCE:g}: {diffs}")

    base, ours = runs["baseline"], runs["ours"]
    ratio = ours["rate"] / base["rate"]
    tokens = {
        "baseline": padded_tokens(lengths, args.batch_size, limit, sort=False),
        "dynamic": padded_tokens(lengths, args.batch_size, None, sort=False),
        "ours": padded_tokens(lengths, args.batch_size, None, sort=True),
    }
    labels = {
        "baseline": f"baseline: corpus order, padded to max length {limit}",
        "dynamic": "(info) corpus order, padded to each batch's longest",
        "ours": "ours: `embed`, length-sorted batches",
    }
    exact = all(r["exact_peak"] for r in runs.values())
    lines = [
        "## Embedding: length-sorted batching vs padding to the maximum length",
        "",
        f"- Date: {utc_date()}",
        f"- Machine: {machine()}",
        f"- Code: {version}",
        f"- Model: packaged all-MiniLM-L6-v2 (6 layers, hidden 384, max input {limit} tokens), "
        f"float32, `torch.set_num_threads({args.threads})`, batch size {args.batch_size}.",
        f"- Text: {len(texts)} spans from {len(docs)} English Wikipedia summaries (packaged "
        f"`wiki-en`), each a document's lead cut after a random 1..{args.longest} tokens: "
        f"{np.mean(lengths):.0f} tokens on average (median {np.median(lengths):.0f}, "
        f"min {min(lengths)}, max {max(lengths)}, with special tokens). Same texts for all.",
        "- Baseline: batches in corpus order, `tokenizer(..., padding='max_length', "
        "max_length=limit, truncation=True)`, masked mean pooling (as `embed` pools). Ours: "
        "`lmalgebra.lmd.embed.embed(texts, model, tokenizer, EmbedSpec(batch_size=...))`, "
        "tokenisation included in both.",
        "- One process, methods one after the other, each after a warm-up of "
        f"{len(warmup)} other spans. Peak RSS is the process's `VmHWM` "
        + (
            "reset (`/proc/self/clear_refs`) just before each method"
            if exact
            else "(could not be reset between methods: later rows are upper bounds)"
        )
        + "; *increase* is that peak minus the RSS when the method started.",
        "",
        "| method | spans/s | time | token positions run (incl. padding) | peak RSS "
        "| increase | max abs diff vs ours | other processes' CPU share |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key, r in runs.items():
        diff = f"{diffs[key]:.1e}" if key in diffs else "-"
        lines.append(
            f"| {labels[key]} | {r['rate']:.1f} | {r['seconds']:.1f} s | {tokens[key]:,} "
            f"| {r['peak_rss']:.0f} MiB | {r['peak_rss'] - r['start_rss']:.0f} MiB | {diff} "
            f"| {100 * r['cpu']['others_share']:.0f}% |"
        )
    lines += [
        "",
        f"- Speed-up, ours over the baseline: **{ratio:.1f}x** spans/s "
        f"(target >= {SPEED_TARGET:.0f}x: **{'met' if ratio >= SPEED_TARGET else 'NOT met'}**).",
    ]
    if "dynamic" in runs:
        lines.append(
            f"- Over corpus-order batches padded to their own longest span (not the target's "
            f"baseline): {ours['rate'] / runs['dynamic']['rate']:.2f}x: what sorting alone adds."
        )
    worst = max(r["cpu"]["others_share"] for r in runs.values())
    if worst > CONTAMINATED:
        lines.append(
            f"- **Warning**: other processes used up to {100 * worst:.0f}% of the CPUs during a "
            "measured run (after retries); its time is inflated accordingly."
        )
    changed = changed_sources(digest)
    if changed:
        lines.append(
            "- **Warning**: source files changed while the benchmark ran (later measurements "
            f"may use the new code): {', '.join(changed)}."
        )
    lines.append(f"- Total benchmark wall time {(time.perf_counter() - started) / 60:.1f} min.")
    text = "\n".join(lines)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
