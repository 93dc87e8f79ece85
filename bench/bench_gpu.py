"""GPU: the heavy stages on one accelerator, float32 and bfloat16, against its measured peak.

One process on one GPU (``--device cuda``), each figure the best of ``--repeats`` timed runs after a
warm-up, timed with the device synchronised. The peak is the best rate of 8,192-wide square matrix
products in each dtype (float32 with TF32 off, so float32 means float32). Stages, all on the
packaged MiniLM tokenizer and ``wiki-en`` text, random-initialised models (throughput does not
depend on the weights): teacher inference (BERT-base, 30,522 tokens, top-8 at 15% masked positions
of 128-token examples): the full-logits float32 baseline against ``masked_topk`` in float32 and
bfloat16, with the share of masked tokens whose top-k set matches float32's and the largest
log-probability difference; embedding (MiniLM-L6 and BERT-base shapes, spans up to 128 tokens,
``sources.embed.embed``) in float32 and bfloat16, with the R^2 of one model's embeddings from
the other's in both dtypes; student training (``train.loop.train``, BERT 4 x 256 and BERT-base
students over a two-language store, KD + MLM) in float32 and bf16 mixed precision. FLOPs count
matrix products only (``bench/utilisation.py``): encoder forward 8Td^2 + 4Tdf + 4T^2d per layer and
sequence on padded lengths, the MLM head on the rows it runs on, training three times the forward.
``--quick`` runs tiny sizes (on the CPU too) to check the script.

    python bench/bench_gpu.py [--device cuda] [--quick] [--results-dir DIR] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from harness import RESULTS_DIR, WORK, Session, figure, goal, table
from utilisation import encoder_flops, padded_lengths, utilisation_rows, utilisation_table

NAME = "bench_gpu"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/distill", "src/lmalgebra/train")
SHAPES = {
    "MiniLM-L6": {"layers": 6, "hidden": 384, "heads": 12, "intermediate": 1536},
    "BERT-base": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072},
    "BERT 4 x 256": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024},
}
FULL = {"peak_n": 8192, "examples": 4096, "spans": 8192, "batch": 128, "steps": 60, "docs": 3000}
FULL |= {"sweep": (32, 512)}  # batch sizes of the bfloat16 sweeps: the stages' default, larger
QUICK = {"peak_n": 512, "examples": 64, "spans": 64, "batch": 16, "steps": 8, "docs": 200}
QUICK |= {"sweep": (8,)}
DTYPES = ("float32", "bfloat16")


def synced(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def best_time(call: Callable[[], Any], device: torch.device, repeats: int) -> tuple[float, Any]:
    """Fastest of ``repeats`` timed calls after one untimed call; the last call's result."""
    sync = synced(device)
    result = call()
    best = float("inf")
    for _ in range(repeats):
        sync()
        clock = time.perf_counter()
        result = call()
        sync()
        best = min(best, time.perf_counter() - clock)
    return best, result


# -- the peak ------------------------------------------------------------------------------------
def peaks(device: torch.device, n: int, repeats: int) -> dict[str, float]:
    """GFLOP/s of ``n``-wide square products in float32 (TF32 off) and bfloat16."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
    out = {}
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        seconds, _ = best_time(lambda a=a, b=b: a @ b, device, repeats)
        out[name] = 2 * n**3 / seconds / 1e9
        del a, b
    return out


# -- teacher inference ---------------------------------------------------------------------------
def full_logits(
    model: Any, copies: list[Any], k: int, pad_id: int, batch: int, device: torch.device
) -> Any:
    """The baseline: float32 logits at every position, log_softmax and top-k, then the masked
    positions gathered (``teacher_topk.full_logits_topk`` with device placement)."""
    from lmalgebra.distill.masked.masking import pad_batch
    from lmalgebra.distill.masked.topk import TeacherOutput
    from teacher_topk import length_batches

    out: list[TeacherOutput | None] = [None] * len(copies)
    with torch.inference_mode():
        for chosen in length_batches(copies, batch):
            part = [copies[i] for i in chosen]
            padded = {key: v.to(device) for key, v in pad_batch(part, pad_id).items()}
            logits = model(
                input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]
            ).logits.float()
            values, indices = torch.log_softmax(logits, dim=-1).topk(k, dim=-1)
            rows, cols = padded["rows"], padded["cols"]
            top_lp, top_ids = values[rows, cols].cpu().numpy(), indices[rows, cols].cpu().numpy()
            start = 0
            for i, c in zip(chosen, part, strict=True):
                stop = start + len(c.positions)
                out[i] = TeacherOutput(top_ids[start:stop], top_lp[start:stop], float("nan"))
                start = stop
    return [o for o in out if o is not None]


def ours_topk(model: Any, copies: list[Any], pad_id: int, batch: int, dtype: str) -> Any:
    from lmalgebra.distill.masked.topk import masked_topk

    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    return lambda: masked_topk(model, copies, 8, pad_id, batch, dtype=torch_dtype)


def teacher_inference(
    device: torch.device, size: dict[str, Any], repeats: int, trained: Path | None
) -> dict[str, Any]:
    """BERT-base top-8 at the masked positions: full logits (float32) vs ``masked_topk`` in
    float32 and bfloat16, bfloat16 also at other batch sizes; with ``trained`` (a trained masked
    LM's directory) the bfloat16 agreement on that teacher too."""
    from teacher_topk import build_model, compare, examples

    batch, shape = size["batch"], SHAPES["BERT-base"]
    tokenizer, _, copies = examples(size["examples"], batch, 128, 0)
    pad_id, vocab = tokenizer.pad_token_id or 0, len(tokenizer)
    model = build_model(shape, vocab).to(device)
    masked = sum(len(c.positions) for c in copies)
    runs: dict[str, dict[str, Any]] = {}
    outputs = {}
    cases = [
        ("baseline float32", lambda: full_logits(model, copies, 8, pad_id, batch, device), None),
        ("ours float32", ours_topk(model, copies, pad_id, batch, "float32"), None),
        ("ours bfloat16", ours_topk(model, copies, pad_id, batch, "bfloat16"), None),
    ]
    cases += [
        (f"ours bfloat16, batch {b}", ours_topk(model, copies, pad_id, b, "bfloat16"), b)
        for b in size["sweep"]
    ]
    for name, call, other in cases:
        seconds, outputs[name] = best_time(call, device, repeats)
        lengths = padded_lengths([len(c.input_ids) for c in copies], other or batch)
        rows = sum(lengths) if name.startswith("baseline") else masked
        dtype = "bfloat16" if "bfloat16" in name else "float32"
        trimmed = None if name.startswith("baseline") else rows  # ours: last layer on the rows
        flops = encoder_flops(shape, lengths, rows, vocab, trimmed)
        runs[name] = {"seconds": seconds, "flops": flops, "dtype": dtype}
        print(f"teacher inference, {name}: {seconds:.3f} s", flush=True)
    agree = {
        f"random BERT-base, {name}": compare(outputs[name], outputs["baseline float32"])
        for name in ("ours float32", "ours bfloat16")
    }
    outputs.clear()
    if trained is not None:
        from transformers import AutoModelForMaskedLM

        teacher = AutoModelForMaskedLM.from_pretrained(trained).eval().to(device)
        base = full_logits(teacher, copies, 8, pad_id, batch, device)
        for dtype in ("float32", "bfloat16"):
            found = ours_topk(teacher, copies, pad_id, batch, dtype)()
            agree[f"trained {trained.name}, ours {dtype}"] = compare(found, base)
    tokens = sum(len(c.input_ids) for c in copies)
    return {"runs": runs, "agree": agree, "examples": len(copies), "tokens": tokens}


# -- embedding -----------------------------------------------------------------------------------
def embedding(device: torch.device, size: dict[str, Any], repeats: int) -> dict[str, Any]:
    """Mean-pooled spans (up to 128 tokens) in float32 and bfloat16, two shapes; the R^2 of the
    BERT-base embeddings from the MiniLM-shaped ones in each dtype."""
    from bench_embedding import span_texts
    from lmalgebra import LinearDecomposition
    from lmalgebra.sources.corpus import CorpusSpec, read_documents
    from lmalgebra.sources.embed import EmbedSpec, embed, tokenize
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef
    from lmalgebra.sources.packaged import asset_path
    from teacher_topk import build_model

    tok_dir = asset_path("minilm")
    tokenizer = source_of(ModelRef(name="minilm", path=str(tok_dir)), tok_dir).load_tokenizer()
    docs = read_documents(CorpusSpec(paths=[str(asset_path("wiki-en"))], text_column="extract"))
    texts = span_texts(docs, tokenizer, size["spans"], 128, 0)
    ids, _, _ = tokenize(texts, tokenizer, 512)
    runs: dict[str, dict[str, Any]] = {}
    vectors: dict[str, np.ndarray] = {}
    for shape_name in ("MiniLM-L6", "BERT-base"):
        shape = SHAPES[shape_name]
        model = build_model(shape, len(tokenizer)).bert.to(device)
        cases = [(dtype, size["batch"], f"{shape_name} {dtype}") for dtype in DTYPES]
        cases += [("bfloat16", b, f"{shape_name} bfloat16, batch {b}") for b in size["sweep"]]
        for dtype, batch, key in cases:
            spec = EmbedSpec(batch_size=batch, dtype=dtype, device=str(device.type))
            seconds, (out, _) = best_time(
                lambda s=spec, m=model: embed(texts, m, tokenizer, s), device, repeats
            )
            vectors.setdefault(key, out)
            lengths = padded_lengths([len(i) for i in ids], batch)
            flops = encoder_flops(shape, lengths, 0, 0)
            runs[key] = {"seconds": seconds, "flops": flops, "dtype": dtype}
            print(f"embedding, {key}: {seconds:.3f} s", flush=True)
        del model
    half = len(texts) // 2
    r2 = {}
    for dtype in ("float32", "bfloat16"):
        x, y = vectors[f"MiniLM-L6 {dtype}"], vectors[f"BERT-base {dtype}"]
        fit = LinearDecomposition().fit(x[:half], y[:half])
        r2[dtype] = float(fit.score(x[half:], y[half:]))
    cosine = {}
    for shape_name in ("MiniLM-L6", "BERT-base"):
        a, b = vectors[f"{shape_name} float32"], vectors[f"{shape_name} bfloat16"]
        cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
        cosine[shape_name] = float(cos.min())
    tokens = int(sum(len(i) for i in ids))
    return {"runs": runs, "r2": r2, "min_cosine": cosine, "spans": len(texts), "tokens": tokens}


# -- training ------------------------------------------------------------------------------------
def training(device: torch.device, size: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """KD + MLM student training through the one loop, float32 and bf16 mixed precision."""
    from accelerate.state import AcceleratorState

    from lmalgebra.distill.masked.student_model import build_masked_lm
    from lmalgebra.distill.student import MaskedStudentSpec
    from lmalgebra.train.loop import train
    from student_runs import TimedSource, build_store, spec_of, store_source

    args = argparse.Namespace(examples=size["docs"], length=128, teacher_vocab=12000, seed=0)
    recipe, _ = build_store(workdir, args)
    teachers = {lang: spec.teachers for lang, spec in recipe.languages.items()}
    options = {"steps": size["steps"], "batch_size": size["batch"] // 4, "lr": 5e-4, "seed": 0}
    spec = spec_of(options)
    source, vocab = store_source(recipe.output_dir, teachers, spec)
    batches = [source.batch(i) for i in range(spec.steps)]
    warmup = max(2, spec.steps // 6)
    runs: dict[str, dict[str, Any]] = {}
    for shape_name in ("BERT 4 x 256", "BERT-base"):
        shape = SHAPES[shape_name]
        student = MaskedStudentSpec(
            hidden_size=shape["hidden"],
            num_layers=shape["layers"],
            num_heads=shape["heads"],
            intermediate_size=shape["intermediate"],
        )
        for precision in ("no", "bf16"):
            # Accelerate keeps one mixed-precision setting per process: start each run afresh
            AcceleratorState._reset_state()
            model = build_masked_lm(student, vocab, pad_id=0, seed=0)
            timed = TimedSource(source)
            run_spec = spec.model_copy(update={"mixed_precision": precision})
            out = workdir / f"train-{shape_name.replace(' ', '')}-{precision}"
            train(model, timed, run_spec, out, progress=False)
            starts = timed.calls
            last = max(starts)
            seconds = starts[last] - starts[warmup]
            steps = range(warmup, last)
            real = sum(int(batches[i].tokens.sum()) for i in steps)
            lengths = [
                b.input_ids.shape[1]
                for i in steps
                for b in [batches[i]]
                for _ in range(b.input_ids.shape[0])
            ]
            rows = sum(int(batches[i].labels.numel()) for i in steps)
            flops = 3 * encoder_flops(shape, lengths, rows, vocab, rows)  # last layer on the rows
            log = [json.loads(x) for x in (out / "train_log.jsonl").read_text().splitlines()]
            key = f"{shape_name} {'bfloat16' if precision == 'bf16' else 'float32'}"
            runs[key] = {
                "seconds": seconds,
                "tokens": real,
                "flops": flops,
                "dtype": "bfloat16" if precision == "bf16" else "float32",
                "final_loss": float(log[-1]["loss"]),
            }
            print(f"training, {key}: {real / seconds:,.0f} tokens/s", flush=True)
            del model
    return {"runs": runs, "steps": spec.steps, "warmup": warmup, "batch": spec.batch_size}


# -- the record ----------------------------------------------------------------------------------
def save(
    res: dict[str, Any],
    device: torch.device,
    size: dict[str, Any],
    session: Session,
    results_dir: Path,
    write: bool,
) -> dict[str, Any]:
    peak, ti, em, tr = res["peak"], res["teacher"], res["embedding"], res["training"]
    t = ti["runs"]
    base = ti["examples"] / t["baseline float32"]["seconds"]
    rates = [  # (case, unit, baseline rate, ours' rate)
        (
            f"teacher inference, BERT-base, ours {d}",
            "examples/s",
            base,
            ti["examples"] / t[f"ours {d}"]["seconds"],
        )
        for d in DTYPES
    ]
    for name in ("MiniLM-L6", "BERT-base"):
        f32, bf16 = (em["runs"][f"{name} {d}"] for d in DTYPES)
        rates.append(
            (
                f"embedding, {name}, bfloat16 vs float32",
                "spans/s",
                em["spans"] / f32["seconds"],
                em["spans"] / bf16["seconds"],
            )
        )
    for name in ("BERT 4 x 256", "BERT-base"):
        f32, bf16 = (tr["runs"][f"{name} {d}"] for d in DTYPES)
        rates.append(
            (
                f"training, {name}, bf16 mixed vs float32",
                "tokens/s",
                f32["tokens"] / f32["seconds"],
                bf16["tokens"] / bf16["seconds"],
            )
        )
    figures = [figure(*r, higher_is_better=True) for r in rates]
    shares = {k: a["ids_same_set_share"] for k, a in ti["agree"].items() if "bfloat16" in k}
    speed = t["baseline float32"]["seconds"] / t["ours bfloat16"]["seconds"]
    r2_diff = abs(em["r2"]["bfloat16"] - em["r2"]["float32"])
    targets = [
        goal(
            "teacher inference, bfloat16 masked head >= 3x the float32 full-logits baseline",
            speed >= 3,
            f"{speed:.1f}x",
        ),
        goal(
            "same top-k set as float32 for >= 99% of masked tokens",
            min(shares.values()) >= 0.99,
            ", ".join(f"{v:.2%} ({k.split(',')[0]})" for k, v in shares.items()),
        ),
        goal("R^2 within 0.005 of float32", r2_diff <= 0.005, f"{r2_diff:.4f}"),
    ]
    util = utilisation_rows(
        "teacher inference", t, peak, lambda r: f"{ti['examples'] / r['seconds']:,.0f} examples/s"
    )
    util += utilisation_rows(
        "embedding", em["runs"], peak, lambda r: f"{em['spans'] / r['seconds']:,.0f} spans/s"
    )
    util += utilisation_rows(
        "training", tr["runs"], peak, lambda r: f"{r['tokens'] / r['seconds']:,.0f} tokens/s"
    )
    agree_rows = [
        [
            name,
            f"{a['ids_same_set_share']:.2%}",
            f"{a['ids_same_share']:.2%}",
            f"{a['max_abs_diff']:.3g}",
        ]
        for name, a in ti["agree"].items()
    ]
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "none (CPU run)"
    return session.save(
        __doc__,
        {
            "device": f"{device.type}: {gpu}",
            **size,
            "peak GFLOP/s": ", ".join(f"{k} {v:,.0f}" for k, v in peak.items()),
        },
        figures,
        targets=targets,
        tables=[
            utilisation_table(util, peak),
            table(
                "bfloat16 against float32: teacher top-8 at masked positions (vs the "
                "float32 full-logits baseline)",
                ["run", "same top-k set", "same top-k order", "largest log-prob difference"],
                agree_rows,
            ),
            table(
                "Embedding agreement",
                ["measure", "float32", "bfloat16"],
                [
                    [
                        "R^2 of BERT-base from MiniLM-L6 (held-out half)",
                        f"{em['r2']['float32']:.4f}",
                        f"{em['r2']['bfloat16']:.4f}",
                    ]
                ]
                + [
                    [f"lowest cosine, {k}, bfloat16 vs float32", "-", f"{v:.5f}"]
                    for k, v in em["min_cosine"].items()
                ],
            ),
            table(
                "Training: loss after the same steps",
                ["run", "final loss"],
                [[k, f"{r['final_loss']:.4f}"] for k, r in tr["runs"].items()],
            ),
        ],
        notes=[
            f"Training: {tr['steps']} steps of batch {tr['batch']}; rates over steps "
            f"{tr['warmup']}..{tr['steps'] - 1} (each step timed from its start to the next's)."
        ],
        write=write,
        results_dir=results_dir,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--only", default="", help="comma-separated: peak,teacher,embedding,training"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--raw", type=Path, default=WORK / "bench_gpu_raw.json", help="raw figures")
    parser.add_argument("--trained-teacher", type=Path, help="a trained masked LM's directory")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    device = torch.device(args.device)
    size = QUICK if args.quick else FULL
    session = Session(NAME, MEASURED)
    WORK.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="gpu-", dir=WORK))
    res: dict[str, Any] = {}
    try:
        res["peak"] = peaks(device, size["peak_n"], 10)
        print(f"peak GFLOP/s: {res['peak']}", flush=True)
        res["teacher"] = teacher_inference(device, size, args.repeats, args.trained_teacher)
        res["embedding"] = embedding(device, size, args.repeats)
        res["training"] = training(device, size, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        args.raw.write_text(json.dumps(res, default=str))
    save(res, device, size, session, args.results_dir, not args.no_write)


if __name__ == "__main__":
    main()
