"""Embedding: length-sorted batching vs padding to the maximum length.

The packaged all-MiniLM-L6-v2 (float32, 2 threads, batch 32) embeds spans of English Wikipedia
summaries (packaged ``wiki-en``, document leads cut after 1..256 tokens). Baseline: corpus-order
batches padded to the model's maximum length (512, as the LMD paper's code does), masked mean
pooling. Ours: ``lmalgebra.lmd.embed.embed`` (length-sorted batches, each padded to its longest
span). For information, corpus-order batches padded to their own longest span isolate what sorting
adds. Tokenisation is included in all; each runs in a fresh interpreter after a warm-up;
embeddings must agree to 1e-4. Target: >= 2x spans/s.

    python bench/bench_embedding.py [--spans 1500] [--batch-size 32] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from harness import WORK, Session, fastest, figure, goal, parse_args, run_contender, table
from lmalgebra.lmd.embed import EmbedSpec, embed, max_tokens
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.models import ModelRef, load_model, load_tokenizer
from lmalgebra.sources.packaged import asset_path

NAME = "bench_embedding"
MEASURED = ("src/lmalgebra/lmd/embed.py",)
TOLERANCE = 1e-4
SPEED_TARGET = 2.0
Embedder = Callable[[list[str]], np.ndarray]
METHODS = {
    "baseline": "baseline: corpus order, padded to the maximum length",
    "dynamic": "(info) corpus order, padded to each batch's longest",
    "ours": "ours: `embed`, length-sorted batches",
}


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


def padded_tokens(lengths: list[int], batch_size: int, width: int | None, sort: bool) -> int:
    """Token positions a method pushes through the model (including padding)."""
    order = sorted(lengths, reverse=True) if sort else lengths
    total = 0
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        total += len(batch) * (width if width is not None else max(batch))
    return total


def setup(spans: int, longest: int, seed: int) -> tuple[Any, Any, list[str], list[str], int]:
    """Model, tokenizer, the texts, other texts for warm-up, and the number of documents."""
    model_dir = asset_path("minilm")
    ref = ModelRef(name="all-MiniLM-L6-v2", path=str(model_dir))
    model, tokenizer = load_model(ref, model_dir), load_tokenizer(ref, model_dir)
    docs = read_documents(CorpusSpec(paths=[str(asset_path("wiki-en"))], text_column="extract"))
    texts = span_texts(docs, tokenizer, spans, longest, seed)
    warmup = span_texts(docs, tokenizer, 64, longest, seed + 1)
    return model, tokenizer, texts, warmup, len(docs)


def contender(
    method: str, spans: int, longest: int, batch_size: int, threads: int, seed: int, out: str
) -> Callable[[], dict[str, Any]]:
    """Untimed: load the model and texts, warm up. The work: embed the texts (saved to ``out``)."""
    torch.set_num_threads(threads)
    model, tokenizer, texts, warmup, _ = setup(spans, longest, seed)
    if method == "ours":
        spec = EmbedSpec(batch_size=batch_size)
        run: Embedder = lambda t: embed(t, model, tokenizer, spec)[0]  # noqa: E731
    else:
        padding = "max_length" if method == "baseline" else "longest"
        run = padded_embedder(model, tokenizer, batch_size, padding)
    run(warmup)

    def work() -> dict[str, Any]:
        np.save(out, run(texts))
        return {}

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1500, help="number of text spans")
    parser.add_argument("--longest", type=int, default=256, help="longest span, in tokens")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dynamic", action="store_true", help="skip the padding=longest run")
    args = parse_args(parser, attempts=5)
    session = Session(NAME, MEASURED)
    model, tokenizer, texts, _, docs = setup(args.spans, args.longest, args.seed)
    limit = max_tokens(model, tokenizer, None)
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    del model
    methods = [m for m in METHODS if not (args.no_dynamic and m == "dynamic")]
    runs, vectors = {}, {}
    WORK.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        for method in methods:
            out = str(Path(tmp) / f"{method}.npy")
            kwargs = {"method": method, "out": out, "spans": args.spans, "longest": args.longest}
            kwargs |= {"batch_size": args.batch_size, "threads": args.threads, "seed": args.seed}
            runs[method] = fastest(
                lambda k=kwargs: run_contender("bench_embedding:contender", k),
                args.attempts,
                label=method,
            )
            vectors[method] = np.load(out)
    diffs = {k: float(np.abs(v - vectors["ours"]).max()) for k, v in vectors.items() if k != "ours"}
    if max(diffs.values()) > TOLERANCE:
        sys.exit(f"FAILED: embeddings disagree by more than {TOLERANCE:g}: {diffs}")
    width = {"baseline": limit, "dynamic": None, "ours": None}
    rows = []
    for key, r in runs.items():
        tokens = padded_tokens(lengths, args.batch_size, width[key], sort=key == "ours")
        rows.append(
            [
                METHODS[key],
                round(args.spans / r["seconds"], 1),
                round(r["seconds"], 1),
                tokens,
                round(r["peak_rss_mib"]),
                round(r["work_peak_rss_mib"] - r["start_rss_mib"]),
                f"{diffs[key]:.1e}" if key in diffs else "-",
            ]
        )
    base, ours = runs["baseline"], runs["ours"]
    rate = {k: args.spans / r["seconds"] for k, r in runs.items()}
    ratio = rate["ours"] / rate["baseline"]
    notes = [
        "Peak RSS is the contender process's; increase = the peak while embedding over the RSS "
        "before it."
    ]
    if "dynamic" in rate:
        notes.append(
            "Sorting alone (over corpus-order batches padded to their own longest span) adds "
            f"{rate['ours'] / rate['dynamic']:.2f}x."
        )
    session.save(
        __doc__,
        {
            "spans": args.spans,
            "tokens per span": f"{np.mean(lengths):.0f} mean, {min(lengths)}..{max(lengths)}",
            "documents": docs,
            "batch": args.batch_size,
            "max length": limit,
            "threads": args.threads,
        },
        [
            figure(
                f"{args.spans:,} spans",
                "spans/s",
                rate["baseline"],
                rate["ours"],
                peak_mib=(base["peak_rss_mib"], ours["peak_rss_mib"]),
                others_share=(base["others_share"], ours["others_share"]),
                higher_is_better=True,
            )
        ],
        targets=[goal(f"speed-up >= {SPEED_TARGET:.0f}x", ratio >= SPEED_TARGET, f"{ratio:.1f}x")],
        tables=[
            table(
                "Methods",
                [
                    "method",
                    "spans/s",
                    "time (s)",
                    "token positions run (incl. padding)",
                    "peak RSS (MiB)",
                    "increase (MiB)",
                    "max abs diff vs ours",
                ],
                rows,
            )
        ],
        notes=notes,
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
