"""Embedding: length-sorted batching vs padding to the maximum length; float32 and bfloat16.

The packaged all-MiniLM-L6-v2 (2 threads, batch 32) embeds spans of English Wikipedia summaries
(packaged ``wiki-en``, document leads cut after 1..256 tokens). Baseline: corpus-order batches
padded to the model's maximum length (512, as the LMD paper's code does), masked mean pooling, in
float32. Ours: ``lmalgebra.sources.embed.embed`` (length-sorted batches, each padded to its
longest span) in float32, and in bfloat16 (autocast, float32 weights and pooling) on the same spans.
For information, corpus-order batches padded to their own longest span isolate what sorting adds.
Tokenisation is included in all; each runs in a fresh interpreter after a warm-up; float32
embeddings must agree to 1e-4, bfloat16's lowest cosine with float32's is recorded. Utilisation:
matrix-product FLOPs (encoder on each method's padded lengths) over time against the matrix-product
peak of the same dtype, measured in this run with the same thread count. The LMD check:
``lmalgebra.decompose`` on the packaged MiniLM and MiniLM-SRE (1,000/200/200 spans of 64 tokens of
``wiki-en``, an empty cache each) in float32 and bfloat16, every pairwise and group R^2 compared.
Targets: >= 2x spans/s; ours >= 50% of the peak of its dtype; group R^2 in bfloat16 within 0.005 of
float32.

    python bench/bench_embedding.py [--spans 1500] [--batch-size 32] [--no-bf16] [--no-lmd]
        [--lmd-spans 1000,200,200] [--no-write]
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

import lmd_precision
from harness import WORK, Session, fastest, figure, goal, parse_args, run_contender, table
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.embed import EmbedSpec, embed, max_tokens
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.packaged import asset_path
from utilisation import (
    encoder_flops,
    measure_peak,
    padded_lengths,
    require_bf16,
    utilisation_rows,
    utilisation_table,
)

NAME = "bench_embedding"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/stats", "src/lmalgebra/api")
TOLERANCE = 1e-4
SPEED_TARGET = 2.0
PEAK_TARGET = 0.5
Embedder = Callable[[list[str]], np.ndarray]
METHODS = {
    "baseline": "baseline: corpus order, padded to the maximum length",
    "dynamic": "(info) corpus order, padded to each batch's longest",
    "ours": "ours: `embed`, length-sorted batches",
    "ours-bf16": "ours: `embed` in bfloat16",
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


def row_widths(lengths: list[int], batch_size: int, width: int | None, sort: bool) -> list[int]:
    """The length each span is padded to: ``width``, else its batch's longest (batches of the
    length-sorted spans with ``sort``, else in corpus order)."""
    if width is not None:
        return [width] * len(lengths)
    if sort:
        return padded_lengths(lengths, batch_size)
    batches = [lengths[s : s + batch_size] for s in range(0, len(lengths), batch_size)]
    return [max(batch) for batch in batches for _ in batch]


def setup(spans: int, longest: int, seed: int) -> tuple[Any, Any, list[str], list[str], int]:
    """Model, tokenizer, the texts, other texts for warm-up, and the number of documents."""
    model_dir = asset_path("minilm")
    ref = ModelRef(name="all-MiniLM-L6-v2", path=str(model_dir))
    model, tokenizer = source_of(ref, model_dir).load(), source_of(ref, model_dir).load_tokenizer()
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
    if method.startswith("ours"):
        spec = EmbedSpec(batch_size=batch_size, dtype="bfloat16" if "bf16" in method else "float32")
        run: Embedder = lambda t: embed(t, model, tokenizer, spec)[0]  # noqa: E731
    else:
        padding = "max_length" if method == "baseline" else "longest"
        run = padded_embedder(model, tokenizer, batch_size, padding)
    run(warmup)

    def work() -> dict[str, Any]:
        np.save(out, run(texts))
        return {}

    return work


def measure_methods(
    methods: list[str], args: argparse.Namespace
) -> tuple[dict[str, dict[str, Any]], dict[str, np.ndarray]]:
    """Each method's fastest run (fresh interpreters) and its embeddings."""
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
    return runs, vectors


def agreement(vectors: dict[str, np.ndarray]) -> dict[str, tuple[float, float]]:
    """Largest absolute difference and lowest cosine of each method's embeddings against ours
    (float32); float32 methods must agree to :data:`TOLERANCE`, bfloat16 is recorded."""
    ours = vectors["ours"]
    found = {}
    for key, v in vectors.items():
        if key != "ours":
            cos = (v * ours).sum(1) / np.linalg.norm(v, axis=1) / np.linalg.norm(ours, axis=1)
            found[key] = (float(np.abs(v - ours).max()), float(cos.min()))
    worst = max((d for k, (d, _) in found.items() if k != "ours-bf16"), default=0.0)
    if worst > TOLERANCE:
        sys.exit(f"FAILED: float32 embeddings disagree by more than {TOLERANCE:g}: {found}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--spans", type=int, default=1500, help="number of text spans")
    parser.add_argument("--longest", type=int, default=256, help="longest span, in tokens")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-dynamic", action="store_true", help="skip the padding=longest run")
    parser.add_argument("--no-bf16", action="store_true", help="leave bfloat16 (and LMD) out")
    parser.add_argument("--no-lmd", action="store_true", help="skip the LMD check")
    parser.add_argument("--lmd-spans", default="1000,200,200", help="LMD check: spans per split")
    parser.add_argument("--lmd-length", type=int, default=64, help="LMD check: span length")
    args = parse_args(parser, attempts=5)
    try:
        lmd_spans = [int(n) for n in args.lmd_spans.split(",")]
    except ValueError:
        lmd_spans = []
    if len(lmd_spans) != 3 or min(lmd_spans) < 1:
        parser.error(f"--lmd-spans {args.lmd_spans!r}: three positive counts, e.g. 1000,200,200")
    if not args.no_bf16:
        require_bf16(NAME, "pass --no-bf16")
    session = Session(NAME, MEASURED)
    model, tokenizer, texts, _, docs = setup(args.spans, args.longest, args.seed)
    limit = max_tokens(model, tokenizer, None)
    lengths = [len(ids) for ids in tokenizer(texts)["input_ids"]]
    config = model.config
    shape = {"layers": config.num_hidden_layers, "hidden": config.hidden_size}
    shape["intermediate"] = config.intermediate_size
    del model
    methods = [m for m in METHODS if not (args.no_dynamic and m == "dynamic")]
    methods = [m for m in methods if not (args.no_bf16 and m == "ours-bf16")]
    runs, vectors = measure_methods(methods, args)
    found = agreement(vectors)
    lmd = None
    if not (args.no_bf16 or args.no_lmd):
        lmd = lmd_precision.measure(lmd_spans, args.lmd_length, args.threads)
    peak = measure_peak(["float32"] if args.no_bf16 else ["float32", "bfloat16"], args.threads)
    res = {"runs": runs, "agree": found, "shape": shape, "peak": peak, "lmd": lmd}
    res |= {"docs": docs, "limit": limit, "lengths": lengths, "lmd_spans": lmd_spans}
    save(args, res, session)


def methods_table(args: argparse.Namespace, res: dict[str, Any]) -> dict[str, Any]:
    rows = []
    for key, r in res["runs"].items():
        tokens = sum(widths(key, res, args.batch_size))
        diff, cos = res["agree"].get(key, (None, None))
        rows.append(
            [
                METHODS[key],
                round(args.spans / r["seconds"], 1),
                round(r["seconds"], 1),
                tokens,
                round(r["peak_rss_mib"]),
                round(r["work_peak_rss_mib"] - r["start_rss_mib"]),
                "-" if diff is None else f"{diff:.1e}",
                "-" if cos is None else f"{cos:.6f}",
            ]
        )
    columns = ["method", "spans/s", "time (s)", "token positions run (incl. padding)"]
    columns += ["peak RSS (MiB)", "increase (MiB)", "max abs diff vs ours", "lowest cosine vs ours"]
    return table("Methods", columns, rows)


def widths(key: str, res: dict[str, Any], batch_size: int) -> list[int]:
    """The padded length of each span under method ``key``."""
    width = res["limit"] if key == "baseline" else None
    return row_widths(res["lengths"], batch_size, width, sort=key.startswith("ours"))


def utilisation(
    args: argparse.Namespace, res: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float]]:
    """The utilisation table, and the share of the peak of each of ours."""
    runs = {
        METHODS[key]: {
            "seconds": r["seconds"],
            "flops": encoder_flops(res["shape"], widths(key, res, args.batch_size)),
            "dtype": "bfloat16" if key == "ours-bf16" else "float32",
            "rate": f"{args.spans / r['seconds']:,.1f} spans/s",
        }
        for key, r in res["runs"].items()
    }
    rows = utilisation_rows("MiniLM-L6", runs, res["peak"], lambda r: r["rate"])
    shares = {
        run["dtype"]: run["flops"] / run["seconds"] / 1e9 / res["peak"][run["dtype"]]
        for key, run in runs.items()
        if key.startswith("ours")
    }
    return utilisation_table(rows, res["peak"], "model"), shares


def save(args: argparse.Namespace, res: dict[str, Any], session: Session) -> None:
    runs, lengths = res["runs"], res["lengths"]
    rate = {k: args.spans / r["seconds"] for k, r in runs.items()}
    ratio = rate["ours"] / rate["baseline"]
    pairs = [("baseline", "ours", f"{args.spans:,} spans")]
    if "ours-bf16" in runs:
        pairs.append(("ours", "ours-bf16", f"{args.spans:,} spans, ours bfloat16 vs ours float32"))
    figures = [
        figure(
            case,
            "spans/s",
            rate[b],
            rate[o],
            peak_mib=(runs[b]["peak_rss_mib"], runs[o]["peak_rss_mib"]),
            others_share=(runs[b]["others_share"], runs[o]["others_share"]),
            higher_is_better=True,
        )
        for b, o, case in pairs
    ]
    util, shares = utilisation(args, res)
    targets = [
        goal(f"speed-up >= {SPEED_TARGET:.0f}x", ratio >= SPEED_TARGET, f"{ratio:.1f}x"),
        goal(
            f"ours >= {PEAK_TARGET:.0%} of the peak of its dtype",
            min(shares.values()) >= PEAK_TARGET,
            ", ".join(f"{d} {v:.0%}" for d, v in shares.items()),
        ),
    ]
    tables = [methods_table(args, res), util]
    notes = [
        "Peak RSS is the contender process's; increase = the peak while embedding over the RSS "
        "before it. Utilisation counts the encoder's matrix products only; the time includes "
        "tokenisation and pooling."
    ]
    if "dynamic" in rate:
        notes.append(
            "Sorting alone (over corpus-order batches padded to their own longest span) adds "
            f"{rate['ours'] / rate['dynamic']:.2f}x."
        )
    if res["lmd"] is not None:
        target, lmd_table, note = lmd_precision.record(
            res["lmd"], res["lmd_spans"], args.lmd_length
        )
        targets.append(target)
        tables.append(lmd_table)
        notes.append(note)
    session.save(
        __doc__,
        {
            "spans": args.spans,
            "tokens per span": f"{np.mean(lengths):.0f} mean, {min(lengths)}..{max(lengths)}",
            "documents": res["docs"],
            "batch": args.batch_size,
            "max length": res["limit"],
            "threads": args.threads,
        },
        figures,
        targets=targets,
        tables=tables,
        notes=notes,
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
