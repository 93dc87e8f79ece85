"""Teacher inference: masked-positions-only head vs full logits + top-k.

Top-k (k = 8) teacher log-probabilities at the masked positions of 128-token ``wiki-en`` examples
(packaged MiniLM tokenizer, ``TeacherMasker`` 15%, 80/10/10), random-initialised
``BertForMaskedLM`` with a 30,522-token vocabulary in two shapes: BERT-base (12 x 768) and a small
BERT (4 x 256), batch 32, the same length-sorted batches for both. Baseline: logits at every
position ``(batch, seq, vocab)``, ``log_softmax``, ``topk``, then the masked positions gathered.
Ours: ``lmalgebra.distill.topk.masked_topk`` (the MLM head on the masked rows only, log-probs =
logits - logsumexp). Top-k must agree within fp16 precision. Bytes per masked token come from a
store written by ``stages.prepare`` + ``stages.teach`` (3,000 documents, the small BERT as
teacher). Targets: >= 3x faster; <= 40 bytes per masked token (naive int32 ids + fp16 values: 48;
FuseLLM-style storage: ~100).

    python bench/bench_teacher_inference.py [--examples 384,1280] [--docs 3000] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from harness import (
    WORK,
    Session,
    fastest,
    figure,
    goal,
    parse_args,
    run_contender,
    table,
)
from lmalgebra.distill.examples import example_id
from lmalgebra.distill.masking import MaskedCopy, TeacherMasker, pad_batch
from lmalgebra.distill.recipe import LanguageSpec, MaskingSpec, MergeRecipe, TeacherSpec
from lmalgebra.distill.topk import TeacherOutput, masked_topk
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.models import ModelRef, load_tokenizer
from lmalgebra.sources.packaged import asset_path
from lmalgebra.storage.arrow_columns import id_dtype

NAME = "bench_teacher_inference"
MEASURED = ("src/lmalgebra/distill", "src/lmalgebra/train")
SPEED_TARGET = 3.0
BYTES_TARGET = 40.0
NAIVE_BYTES = 48  # int32 id + fp16 value per entry, k = 8
FUSELLM_BYTES = 100  # per token per teacher, as quoted in the target
FP16_HALF_ULP = 2.0**-11  # relative rounding error of float16
SHAPES = {
    "BERT-base": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072},
    "small BERT": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024},
}


def build_model(shape: dict[str, int], vocab_size: int, seed: int = 0) -> Any:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate"],
        max_position_embeddings=512,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return BertForMaskedLM(config).eval()


def length_batches(copies: Sequence[MaskedCopy], batch_size: int) -> list[list[int]]:
    """Indices of each batch, longest copies first: the order ``masked_topk`` uses."""
    order = sorted(range(len(copies)), key=lambda i: -len(copies[i].input_ids))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


@torch.inference_mode()
def full_logits_topk(
    model: Any, copies: Sequence[MaskedCopy], k: int, pad_id: int, batch_size: int
) -> list[TeacherOutput]:
    """Baseline: full ``(batch, seq, vocab)`` logits, log_softmax and top-k everywhere, then the
    masked positions gathered. Same batches as ``masked_topk``; outputs in input order."""
    out: list[TeacherOutput | None] = [None] * len(copies)
    for chosen in length_batches(copies, batch_size):
        batch = [copies[i] for i in chosen]
        padded = pad_batch(batch, pad_id)
        logits = model(
            input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]
        ).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        values, indices = logprobs.topk(k, dim=-1)
        rows, cols = padded["rows"], padded["cols"]
        top_lp, top_ids = values[rows, cols].numpy(), indices[rows, cols].numpy()
        labels = torch.from_numpy(np.concatenate([c.labels for c in batch]))
        gold = logprobs[rows, cols].gather(1, labels.unsqueeze(1)).squeeze(1).numpy()
        start = 0
        for i, c in zip(chosen, batch, strict=True):
            stop = start + len(c.positions)
            loss = float(-gold[start:stop].mean()) if stop > start else float("nan")
            out[i] = TeacherOutput(top_ids[start:stop], top_lp[start:stop], loss)
            start = stop
    return [o for o in out if o is not None]


def compare(ours: list[TeacherOutput], base: list[TeacherOutput]) -> dict[str, float]:
    """Top-k id agreement and log-prob differences, rank by rank."""
    ids_o = np.concatenate([o.topk_ids for o in ours])
    ids_b = np.concatenate([o.topk_ids for o in base])
    lp_o = np.concatenate([o.topk_logprobs for o in ours]).astype(np.float64)
    lp_b = np.concatenate([o.topk_logprobs for o in base]).astype(np.float64)
    diff = np.abs(lp_o - lp_b)
    allowed = FP16_HALF_ULP * np.maximum(np.abs(lp_o), 2.0**-14)
    loss_o = np.array([o.loss for o in ours])
    loss_b = np.array([o.loss for o in base])
    return {
        "tokens": float(len(ids_o)),
        "ids_same_share": float(np.mean(np.all(ids_o == ids_b, axis=1))),
        "ids_same_set_share": float(
            np.mean(np.all(np.sort(ids_o, axis=1) == np.sort(ids_b, axis=1), axis=1))
        ),
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float((diff / np.maximum(np.abs(lp_o), 2.0**-14)).max()),
        "within_fp16": float(np.all(diff <= allowed)),
        "loss_max_abs_diff": float(np.nanmax(np.abs(loss_o - loss_b))),
    }


@torch.inference_mode()
def head_only(
    model: Any, copies: Sequence[MaskedCopy], k: int, pad_id: int, batch_size: int, count: int
) -> dict[str, float]:
    """Seconds per batch of the encoder, and of each contender's head given the hidden states
    (projection, then normalisation + top-k + gather), on ``count`` batches spread over the
    length-sorted order."""
    batches = length_batches(copies, batch_size)
    picks = sorted({round(i * (len(batches) - 1) / max(count - 1, 1)) for i in range(count)})
    times = dict.fromkeys(
        ("encoder", "ours_proj", "ours_post", "base_proj", "base_post", "tokens", "masked"), 0.0
    )
    for index in picks:
        batch = [copies[i] for i in batches[index]]
        padded = pad_batch(batch, pad_id)
        rows, cols = padded["rows"], padded["cols"]
        labels = torch.from_numpy(np.concatenate([c.labels for c in batch]))
        clock = time.perf_counter()
        hidden = model.base_model(
            input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]
        ).last_hidden_state
        times["encoder"] += time.perf_counter() - clock
        times["tokens"] += float(padded["input_ids"].numel())
        times["masked"] += float(rows.numel())
        # ours: the head on the gathered rows, exact log-probs from logsumexp
        clock = time.perf_counter()
        logits = model.cls(hidden[rows, cols].unsqueeze(0))[0].float()
        mid = time.perf_counter()
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        values, _ = logits.topk(k, dim=-1)
        _ = values - lse, logits.gather(1, labels.unsqueeze(1)) - lse
        times["ours_post"] += time.perf_counter() - mid
        times["ours_proj"] += mid - clock
        del logits
        # baseline: the head at every position, log_softmax and top-k everywhere, then gather
        clock = time.perf_counter()
        logits = model.cls(hidden).float()
        mid = time.perf_counter()
        logprobs = torch.log_softmax(logits, dim=-1)
        values, indices = logprobs.topk(k, dim=-1)
        _ = values[rows, cols], indices[rows, cols]
        _ = logprobs[rows, cols].gather(1, labels.unsqueeze(1))
        times["base_post"] += time.perf_counter() - mid
        times["base_proj"] += mid - clock
        del logits, logprobs
    n = len(picks)
    return {key: value / n for key, value in times.items()} | {"batches": float(n)}


# -- bytes per masked token ---------------------------------------------------------------------
def store_bytes(workdir: Path, tokenizer: Any, wiki: Path, docs: int, seed: int) -> dict[str, Any]:
    """Build a real store with the stages; bytes per masked token of its parts."""
    from lmalgebra.distill import stages
    from lmalgebra.storage.shard_set import ShardSet

    teacher_dir = workdir / "teacher"
    model = build_model(SHAPES["small BERT"], len(tokenizer), seed)
    model.save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)
    del model
    recipe = MergeRecipe(
        languages={
            "en": LanguageSpec(
                corpus=CorpusSpec(paths=[str(wiki)], text_column="extract"),
                teachers=["bert"],
                max_examples=docs,
            )
        },
        teachers={"bert": TeacherSpec(path=str(teacher_dir))},
        output_dir=workdir / "run",
    )
    clock = time.perf_counter()
    stages.prepare(recipe, progress=False)
    prepare_s = time.perf_counter() - clock
    clock = time.perf_counter()
    stages.teach(recipe, progress=False)
    teach_s = time.perf_counter() - clock
    run = recipe.output_dir
    examples = ShardSet.existing(run / "examples" / "en")
    masked = ShardSet.existing(run / "masked" / "en" / "bert")
    topk = ShardSet.existing(run / "topk" / "en" / "bert")
    tokens = int(masked.manifest["masked_tokens"])
    tables = topk.tables()
    payload = sum(
        t.column(c).combine_chunks().values.nbytes
        for t in tables
        for c in ("topk_ids", "topk_logprobs")
    )
    input_tokens = sum(
        len(t.column("input_ids").combine_chunks().values) for t in masked.tables(verify=False)
    )

    def on_disk(shards: ShardSet) -> int:
        return sum(p.stat().st_size for p in shards.directory.glob("shard-*.arrow"))

    return {
        "examples": examples.rows,
        "heldout": int(examples.manifest.get("heldout", 0)),
        "shards": len(topk.manifest["shards"]),
        "masked_tokens": tokens,
        "input_tokens": input_tokens,
        "k": int(topk.manifest["top_k"]),
        "id_bytes": id_dtype(len(tokenizer)).itemsize,
        "payload": payload,
        "topk_file": on_disk(topk),
        "masked_file": on_disk(masked),
        "examples_file": on_disk(examples),
        "prepare_s": prepare_s,
        "teach_s": teach_s,
    }


# -- the contenders (each in a fresh interpreter) -----------------------------------------------
def examples(
    count: int, batch_size: int, length: int, seed: int
) -> tuple[Any, list[MaskedCopy], list[MaskedCopy]]:
    """The tokenizer, ``batch_size`` masked copies for warm-up and ``count`` to time."""
    tok_dir = asset_path("minilm")
    tokenizer = load_tokenizer(ModelRef(name="minilm", path=str(tok_dir)), tok_dir)
    wiki = asset_path("wiki-en")
    docs = [d.strip() for d in read_documents(CorpusSpec(paths=[str(wiki)], text_column="extract"))]
    order = random.Random(seed).sample(range(len(docs)), count + batch_size)
    masker = TeacherMasker("bert", tokenizer, MaskingSpec(seed=seed), length)
    copies = [masker(example_id("en", docs[i]), docs[i]) for i in order]
    return tokenizer, copies[:batch_size], copies[batch_size:]


def contender(
    which: str,
    shape: str,
    count: int,
    batch_size: int,
    length: int,
    k: int,
    threads: int,
    seed: int,
    out: str,
) -> Callable[[], dict[str, Any]]:
    """Untimed: the model, the examples, a warm-up batch. The work: ``baseline`` or ``ours`` on
    the examples (outputs saved to ``out``), or ``head``: seconds per batch of each part."""
    torch.set_num_threads(threads)
    tokenizer, warmup, copies = examples(count, batch_size, length, seed)
    pad_id = tokenizer.pad_token_id or 0
    model = build_model(SHAPES[shape], len(tokenizer), seed)
    if which == "head":
        return lambda: head_only(model, copies, k, pad_id, batch_size, 4)
    topk = full_logits_topk if which == "baseline" else masked_topk
    topk(model, warmup, k, pad_id, batch_size)

    def work() -> dict[str, Any]:
        outputs = topk(model, copies, k, pad_id, batch_size)
        np.savez(
            out,
            ids=np.concatenate([o.topk_ids for o in outputs]).astype(np.int64),
            logprobs=np.concatenate([o.topk_logprobs for o in outputs]).astype(np.float32),
            loss=np.array([o.loss for o in outputs]),
            counts=np.array([len(o.topk_ids) for o in outputs]),
        )
        return {
            "params": sum(p.numel() for p in model.parameters()),
            "tokens": sum(len(c.input_ids) for c in copies),
            "masked": sum(len(c.positions) for c in copies),
        }

    return work


def load_outputs(path: str) -> list[TeacherOutput]:
    with np.load(path) as data:
        cuts = np.cumsum(data["counts"])[:-1]
        ids, lps = np.split(data["ids"], cuts), np.split(data["logprobs"], cuts)
        return [
            TeacherOutput(i, lp, float(x)) for i, lp, x in zip(ids, lps, data["loss"], strict=True)
        ]


def measure_shape(shape: str, count: int, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    options = {"shape": shape, "count": count, "batch_size": args.batch_size}
    options |= {"length": args.length, "k": args.k, "threads": args.threads, "seed": args.seed}
    runs = {}
    for which in ("baseline", "ours", "head"):
        kwargs = {"which": which, "out": str(tmp / f"{which}.npz"), **options}
        runs[which] = fastest(
            lambda k=kwargs: run_contender("bench_teacher_inference:contender", k),
            args.attempts if which != "head" else 1,
            label=f"{shape} {which}",
        )
    check = compare(load_outputs(str(tmp / "ours.npz")), load_outputs(str(tmp / "baseline.npz")))
    if not check["within_fp16"] or check["ids_same_set_share"] < 0.99:
        sys.exit(f"FAILED: {shape}: outputs disagree beyond fp16 precision: {check}")
    return {
        **runs["ours"]["output"],
        "count": count,
        "runs": runs,
        "check": check,
        "head": runs["head"]["output"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="384,1280", help="BERT-base,small BERT")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=128, help="example length in tokens")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--docs", type=int, default=3000, help="documents in the byte-count store")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default="", help="comma-separated shapes to run (default all)")
    parser.add_argument("--no-store", action="store_true", help="skip the byte counts")
    args = parse_args(parser, attempts=3)
    torch.set_num_threads(args.threads)
    session = Session(NAME, MEASURED)
    counts = dict(zip(SHAPES, (int(c) for c in args.examples.split(",")), strict=True))
    shapes = [s for s in SHAPES if not args.only or s in args.only.split(",")]
    WORK.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    store: dict[str, Any] | None = None
    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        for shape in shapes:
            results[shape] = measure_shape(shape, counts[shape], args, Path(tmp))
        if not args.no_store:
            tok_dir = asset_path("minilm")
            tokenizer = load_tokenizer(ModelRef(name="minilm", path=str(tok_dir)), tok_dir)
            store = store_bytes(Path(tmp), tokenizer, asset_path("wiki-en"), args.docs, args.seed)
    save(args, results, store, session)


def save(
    args: argparse.Namespace,
    results: dict[str, dict[str, Any]],
    store: dict[str, Any] | None,
    session: Session,
) -> None:
    figures, runs_rows, agree_rows, head_rows, targets, notes = [], [], [], [], [], []
    for name, res in results.items():
        b, o = res["runs"]["baseline"], res["runs"]["ours"]
        n = res["count"]
        figures.append(
            figure(
                f"{name}, {n:,} examples",
                "examples/s",
                n / b["seconds"],
                n / o["seconds"],
                peak_mib=(b["peak_rss_mib"], o["peak_rss_mib"]),
                others_share=(b["others_share"], o["others_share"]),
                higher_is_better=True,
            )
        )
        ratio = b["seconds"] / o["seconds"]
        targets.append(
            goal(f"speed-up >= {SPEED_TARGET:.0f}x, {name}", ratio >= SPEED_TARGET, f"{ratio:.2f}x")
        )
        for key, r in (("baseline", b), ("ours", o)):
            runs_rows.append(
                [
                    name,
                    f"{n:,} ({res['tokens']:,}, {res['masked']:,})",
                    key,
                    round(res["masked"] / r["seconds"]),
                    round(r["seconds"], 1),
                    round(r["peak_rss_mib"]),
                    round(r["work_peak_rss_mib"] - r["start_rss_mib"]),
                ]
            )
        c = res["check"]
        agree_rows.append(
            [
                name,
                f"{c['ids_same_share']:.2%}",
                f"{c['ids_same_set_share']:.2%}",
                f"{c['max_abs_diff']:.1e}",
                f"{c['loss_max_abs_diff']:.1e}",
            ]
        )
        h = res["head"]
        base = h["encoder"] + h["base_proj"] + h["base_post"]
        ours = h["encoder"] + h["ours_proj"] + h["ours_post"]
        head_rows.append(
            [
                name,
                *(
                    round(h[key], 4)
                    for key in ("encoder", "ours_proj", "ours_post", "base_proj", "base_post")
                ),
                f"{1 - h['encoder'] / base:.0%}",
                f"{base / ours:.2f}x",
            ]
        )
        if ratio < SPEED_TARGET:
            notes.append(
                f"{name} misses {SPEED_TARGET:.0f}x because only the head gets cheaper: its "
                f"encoder is {h['encoder'] / base:.0%} of the baseline's time, so even a free head "
                f"gives at most {base / h['encoder']:.2f}x."
            )
    tables = [
        table(
            "Runs",
            [
                "model",
                "examples (tokens, masked)",
                "contender",
                "masked tokens/s",
                "time (s)",
                "peak RSS (MiB)",
                "increase (MiB)",
            ],
            runs_rows,
        ),
        table(
            "Agreement",
            [
                "model",
                "top-k ids, same order",
                "same set",
                "log-prob max abs diff",
                "gold NLL max abs diff",
            ],
            agree_rows,
        ),
        table(
            "Seconds per batch, 4 batches (post = normalisation, top-k, gathers)",
            [
                "model",
                "encoder",
                "ours: head on masked rows",
                "ours: post",
                "baseline: head everywhere",
                "baseline: post",
                "head share of baseline",
                "predicted speed-up",
            ],
            head_rows,
        ),
    ]
    if store is not None:
        per, rows = store_table(store)
        tables.append(table("Bytes per masked token", ["what", "bytes"], rows))
        targets.append(
            goal(
                f"<= {BYTES_TARGET:.0f} bytes per masked token in the top-k store",
                per <= BYTES_TARGET,
                f"{per:.1f}",
            )
        )
        notes.append(
            f"Store: {store['examples']:,} documents ({store['heldout']} held out), "
            f"{store['shards']} shards, {store['masked_tokens']:,} masked tokens in "
            f"{store['input_tokens']:,} input tokens; `prepare` {store['prepare_s']:.1f} s, "
            f"`teach` {store['teach_s']:.1f} s."
        )
    sizes: dict[str, Any] = {
        name: f"{SHAPES[name]['layers']} layers x {SHAPES[name]['hidden']}, "
        f"{res['params'] / 1e6:.1f}M parameters"
        for name, res in results.items()
    }
    sizes |= {"example length": args.length, "k": args.k, "batch": args.batch_size}
    if store is not None:
        sizes["store documents"] = args.docs
    session.save(
        __doc__,
        sizes,
        figures,
        targets=targets,
        tables=tables,
        notes=notes,
        write=not args.no_write,
    )


def store_table(s: dict[str, Any]) -> tuple[float, list[list[Any]]]:
    """Bytes per masked token of the top-k files, and the table's rows."""
    n = s["masked_tokens"]
    topk = s["topk_file"] / n
    nominal = s["k"] * (s["id_bytes"] + 2)
    return topk, [
        [
            f"top-k payload (uint{8 * s['id_bytes']} ids + fp16 log-probs, k = {s['k']}; nominal "
            f"{nominal})",
            round(s["payload"] / n, 1),
        ],
        ["top-k Arrow files on disk (`topk/`)", round(topk, 1)],
        ["masked inputs on disk (`masked/`)", round(s["masked_file"] / n, 1)],
        ["whole store (`masked/` + `topk/`)", round((s["topk_file"] + s["masked_file"]) / n, 1)],
        ["(info) example text (`examples/`)", round(s["examples_file"] / n, 1)],
        [f"naive: int32 ids + fp16 values, k = {s['k']}", NAIVE_BYTES],
        ["FuseLLM-style storage (per token per teacher)", f"~{FUSELLM_BYTES}"],
    ]


if __name__ == "__main__":
    main()
