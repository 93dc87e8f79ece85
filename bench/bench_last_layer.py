"""Last layer on the masked rows: teacher inference and student training, trimmed vs whole.

A masked LM's outputs at the masked positions need the last encoder layer's keys and values at
every position, but its queries, attention output and feed-forward block at the masked rows only
(``lmalgebra.train.last_layer``, used by ``masked_logits`` wherever the architecture allows it).
Baseline: the same code with the last layer run at every position (``trim_last_layer=False``; for
training, the loop's ``masked_logits`` bound to it). Ours: the default. Teacher inference:
``masked_topk`` on 128-token ``wiki-en`` examples (packaged MiniLM tokenizer, 15% masking, top-8,
batch 32) with random-initialised BERT-base (12 x 768) and small BERT (4 x 256) teachers of 30,522
tokens, float32 (and bfloat16 where the CPU has it natively); outputs of the two must agree within
float rounding (same top-k ids, largest log-probability difference recorded). Training: the
two-language store and 4 x 256 student of ``bench_training.py``, KD + MLM, 60 steps of batch 32,
tokens/s from each step's start over the steps after a warm-up, and the loss at the last step.
Each run is a fresh interpreter; the two alternate over the attempts and the fastest of each is
kept. The predicted speed-up is the ratio of matrix-product FLOPs (``bench/utilisation.py``).

    python bench/bench_last_layer.py [--examples 384,1280] [--steps 60] [--no-bf16] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

import bench_training
from harness import WORK, Session, fastest, figure, goal, parse_args, run_contender, table
from lmalgebra.core.precision import bf16_support
from student_runs import build_store, spec_of, step_rate, store_source
from teacher_topk import SHAPES, compare, load_outputs
from utilisation import encoder_flops, padded_lengths

NAME = "bench_last_layer"
MEASURED = ("src/lmalgebra/train", "src/lmalgebra/distill/masked/topk.py")
AGREE_IDS = 0.999  # share of masked tokens with the same top-k ids, in the same order


def training_contender(trim: bool, **options: Any) -> Any:
    """``bench_training``'s ``kd`` contender; with ``trim`` False the loop's ``masked_logits``
    runs the last layer at every position."""
    if not trim:
        import functools

        from lmalgebra.train import loop
        from lmalgebra.train.masked_head import masked_logits

        loop.masked_logits = functools.partial(masked_logits, trim_last_layer=False)
    return bench_training.contender("kd", **options)


def alternate(runs: dict[str, Any], attempts: int, key: str = "seconds") -> dict[str, Any]:
    """Each of ``runs`` (name -> no-argument run) once per round, ``attempts`` rounds; the best
    (lowest ``key``) of each by name, and under ``"rounds"`` each round's ``key`` by name."""
    best: dict[str, dict[str, Any]] = {}
    rounds: list[dict[str, float]] = []
    for _ in range(attempts):
        rounds.append({})
        for name, run in runs.items():
            result = fastest(run, 1, key=key, label=name)
            rounds[-1][name] = result[key]
            if name not in best or result[key] < best[name][key]:
                best[name] = result
    return {**best, "rounds": rounds}


def inference(args: argparse.Namespace, dtypes: list[str], workdir: Path) -> list[dict[str, Any]]:
    """Trimmed vs whole last layer for each teacher shape and dtype."""
    cases = []
    for shape, count in zip(SHAPES, (int(c) for c in args.examples.split(",")), strict=True):
        for dtype in dtypes:
            kwargs = {"which": "ours", "shape": shape, "count": count, "dtype": dtype}
            kwargs |= {"batch_size": 32, "length": 128, "k": 8, "threads": args.threads}
            kwargs |= {"seed": args.seed}

            def run(trim: bool, kw: dict[str, Any] = kwargs) -> dict[str, Any]:
                out = workdir / f"{kw['shape']}-{kw['dtype']}-{trim}.npz"
                return run_contender(
                    "teacher_topk:contender", kw | {"trim": trim, "out": str(out)}
                ) | {"out": str(out)}

            best = alternate(
                {"whole": lambda r=run: r(False), "trimmed": lambda r=run: r(True)}, args.attempts
            )
            output = best["trimmed"]["output"]
            lengths = padded_lengths(output["lengths"], 32)
            masked, vocab = output["masked"], output["vocab"]
            flops = [
                encoder_flops(SHAPES[shape], lengths, masked, vocab, rows)
                for rows in (None, masked)
            ]
            agree = compare(
                load_outputs(best["trimmed"]["out"]), load_outputs(best["whole"]["out"])
            )
            cases.append(
                {
                    "case": f"{shape}, {count} examples, {dtype}",
                    "unit": "examples/s",
                    "count": count,
                    "runs": best,
                    "predicted": flops[0] / flops[1],
                    "agree": agree,
                }
            )
    return cases


def training(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Trimmed vs whole last layer in the student's KD + MLM training."""
    store_args = argparse.Namespace(teacher_vocab=12000, examples=1500, length=128, seed=args.seed)
    recipe, _ = build_store(workdir, store_args)
    teachers = {lang: spec.teachers for lang, spec in recipe.languages.items()}
    options = {"steps": args.steps, "batch_size": 32, "lr": 5e-4}
    options |= {"seed": args.seed, "threads": args.threads}
    source, vocab = store_source(recipe.output_dir, teachers, spec_of(options))
    batches = [source.batch(i) for i in range(args.steps)]
    tokens = [int(b.tokens.sum()) for b in batches]
    options |= {"run_dir": str(recipe.output_dir), "teachers": teachers}

    def run(trim: bool) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(dir=WORK) as out:
            result = run_contender(
                "bench_last_layer:training_contender", {"trim": trim, "out": out, **options}
            )
        starts = {int(step): t for step, t in result["output"]["starts"]}
        rate = step_rate(starts, tokens, args.warmup)
        log = result["output"]["log"]
        return {**result, **rate, "slowness": -rate["rate"], "loss": float(log[-1]["loss"])}

    best = alternate(
        {"whole": lambda: run(False), "trimmed": lambda: run(True)}, args.attempts, "slowness"
    )
    steps = range(args.warmup, args.warmup + best["trimmed"]["steps"])
    shape = {"layers": 4, "hidden": 256, "intermediate": 1024}
    flops = [
        sum(
            encoder_flops(
                shape,
                [batches[i].input_ids.shape[1]] * batches[i].input_ids.shape[0],
                int(batches[i].labels.numel()),
                vocab,
                int(batches[i].labels.numel()) if trim else None,
            )
            for i in steps
        )
        for trim in (False, True)
    ]
    return {"runs": best, "predicted": flops[0] / flops[1], "vocab": vocab}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", default="384,1280", help="BERT-base,small BERT")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the rates")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-bf16", action="store_true", help="leave bfloat16 out")
    args = parse_args(parser, attempts=3)
    torch.set_num_threads(args.threads)
    native, why = bf16_support("cpu")
    dtypes = ["float32"] + (["bfloat16"] if native and not args.no_bf16 else [])
    session = Session(NAME, MEASURED)
    WORK.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="last-layer-", dir=WORK))
    try:
        cases = inference(args, dtypes, workdir)
        train = training(args, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    save(args, cases, train, why, session)


def per_round(runs: dict[str, Any]) -> str:
    """Each round's speed-up of trimmed over whole, from times (whole / trimmed) or from rates
    kept negated as ``slowness`` (trimmed / whole)."""
    return ", ".join(
        f"{(r['trimmed'] / r['whole'] if r['whole'] < 0 else r['whole'] / r['trimmed']):.2f}x"
        for r in runs["rounds"]
    )


def save(
    args: argparse.Namespace,
    cases: list[dict[str, Any]],
    train: dict[str, Any],
    bf16_why: str,
    session: Session,
) -> None:
    figures, rows, targets = [], [], []
    for c in cases:
        whole, trimmed = c["runs"]["whole"], c["runs"]["trimmed"]
        rates = [c["count"] / r["seconds"] for r in (whole, trimmed)]
        figures.append(
            figure(
                c["case"],
                c["unit"],
                *rates,
                peak_mib=(whole["peak_rss_mib"], trimmed["peak_rss_mib"]),
                others_share=(whole["others_share"], trimmed["others_share"]),
                higher_is_better=True,
            )
        )
        a = c["agree"]
        rows.append(
            [
                c["case"],
                f"{rates[1] / rates[0]:.3f}x (rounds: {per_round(c['runs'])})",
                f"{c['predicted']:.3f}x",
                f"{a['ids_same_share']:.2%}",
                f"{a['max_abs_diff']:.1e}",
            ]
        )
        targets.append(
            goal(
                f"{c['case']}: same top-k ids as the whole layer for >= {AGREE_IDS:.1%}",
                a["ids_same_share"] >= AGREE_IDS,
                f"{a['ids_same_share']:.2%}",
            )
        )
    whole, trimmed = train["runs"]["whole"], train["runs"]["trimmed"]
    figures.append(
        figure(
            "training, 4 x 256 student, KD + MLM",
            "tokens/s",
            whole["rate"],
            trimmed["rate"],
            peak_mib=(whole["peak_rss_mib"], trimmed["peak_rss_mib"]),
            others_share=(whole["others_share"], trimmed["others_share"]),
            higher_is_better=True,
        )
    )
    rows.append(
        [
            "training, 4 x 256 student, KD + MLM",
            f"{trimmed['rate'] / whole['rate']:.3f}x (rounds: {per_round(train['runs'])})",
            f"{train['predicted']:.3f}x",
            "-",
            f"loss at the last step {whole['loss']:.4f} vs {trimmed['loss']:.4f}",
        ]
    )
    session.save(
        __doc__,
        {
            "teacher examples": args.examples,
            "example length": 128,
            "batch": 32,
            "training steps": args.steps,
            "union vocabulary": train["vocab"],
            "threads": args.threads,
            "attempts": args.attempts,
        },
        figures,
        targets=targets,
        tables=[
            table(
                "Measured against predicted (matrix-product FLOPs, whole over trimmed)",
                ["case", "speed-up", "predicted", "same top-k ids, same order", "difference"],
                rows,
            )
        ],
        notes=[
            f"bfloat16: {'measured' if 'bfloat16' in str(rows) else 'not run'} ({bf16_why}).",
            "Training runs alternate whole/trimmed; dropout (0.1) draws different masks in the "
            "trimmed layer, so the two losses differ by training noise, not by the objective.",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
