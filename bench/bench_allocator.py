"""Freed memory reused: training steps with glibc's default thresholds vs `reuse_freed_memory`.

glibc maps every allocation above its mmap threshold (at most 32 MiB) afresh and faults its pages
in on first touch; `lmalgebra.core.allocator.reuse_freed_memory` (called by the training loop and
by teacher inference) keeps freed blocks up to 1 GiB in the heap. The setting is the process's,
so each contender runs in a fresh interpreter (the harness's child), the two alternated, on the
threads of a demo job process (one, by default). Cases: a copy of a 304 x 34,150 float32 tensor
(a demo union student's logits at the masked rows, 42 MB); training steps (forward on the masked
rows, KD + MLM loss, backward, AdamW; dropout 0.1 with lane masks, as the loop trains) of the
demo's BERT 2 x 128, batch 32 x 64, as a teacher over 3,000 tokens and as the union student over
34,150; and causal teacher inference (`causal_outputs`: top-8 and 8 draws, batches of 8, on two
threads) of the packaged GGUF teachers SmolLM2-135M (49,152 tokens) and Gemma-3-270M (262,144),
dequantised to float32, on 16 examples of 256 random token ids, where the contender without reuse
sets `LMALGEBRA_REUSE_FREED_MEMORY=0`. The arithmetic is the same both ways: the losses of the
steps, and the sums of the stored log-probabilities, must be equal.

    python bench/bench_allocator.py [--rounds 3] [--steps 30] [--threads 1] [--causal 16]
        [--causal-threads 2] [--only-causal] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import Session, figure, parse_args, run_contender

NAME = "bench_allocator"
MEASURED = ("src/lmalgebra/core/allocator.py", "src/lmalgebra/distill/causal/logprobs.py")
LOGITS = (304, 34150)


def copies(reuse: bool, threads: int, repeats: int) -> Callable[[], dict[str, Any]]:
    """Contender: the median seconds of ``repeats`` copies of a demo student's logits."""
    import torch

    from lmalgebra.core.allocator import reuse_freed_memory

    torch.set_num_threads(threads)
    applied = reuse_freed_memory() if reuse else False
    logits = torch.randn(LOGITS)

    def work() -> dict[str, Any]:
        logits.clone()
        times = []
        for _ in range(repeats):
            clock = time.perf_counter()
            logits.clone()
            times.append(time.perf_counter() - clock)
        return {"median": statistics.median(times), "applied": applied}

    return work


def steps(reuse: bool, threads: int, vocab: int, count: int) -> Callable[[], dict[str, Any]]:
    """Contender: the median seconds of ``count`` training steps, and the losses."""
    import torch

    from bench_dropout import training_step
    from lmalgebra.core.allocator import reuse_freed_memory

    torch.set_num_threads(threads)
    applied = reuse_freed_memory() if reuse else False
    step = training_step(vocab, with_loss=True)

    def work() -> dict[str, Any]:
        times, losses = [], []
        for _ in range(count + 3):
            seconds, loss = step(True)
            times.append(seconds)
            losses.append(loss)
        return {"median": statistics.median(times[3:]), "losses": losses, "applied": applied}

    return work


def causal(reuse: bool, threads: int, teacher: str, count: int) -> Callable[[], dict[str, Any]]:
    """Contender: causal teacher inference (``causal_outputs``, top-8 and 8 draws) of packaged
    GGUF ``teacher`` on ``count`` examples of 256 token ids, batches of 8; without ``reuse`` the
    switch is off, so that ``causal_outputs`` leaves the allocator alone."""
    if not reuse:
        os.environ["LMALGEBRA_REUSE_FREED_MEMORY"] = "0"
    import numpy as np
    import torch

    from lmalgebra.core.allocator import reuse_freed_memory
    from lmalgebra.distill.causal.logprobs import causal_outputs
    from lmalgebra.distill.teachers import load_lm
    from lmalgebra.sources.models import ModelRef

    torch.set_num_threads(threads)
    ref = ModelRef.parse(f"package:{teacher}")
    model = load_lm(ref, ref.source.resolve(), "causal")
    vocab = model.get_output_embeddings().weight.shape[0]
    rng = np.random.default_rng(0)
    examples = [rng.integers(5, vocab, 256) for _ in range(count)]
    seeds = [(0, i) for i in range(count)]
    causal_outputs(model, examples[:8], 1, 8, 8, seeds[:8], batch_size=8)  # warm-up

    def work() -> dict[str, Any]:
        clock = time.perf_counter()
        found = causal_outputs(model, examples, 1, 8, 8, seeds, batch_size=8)
        seconds = time.perf_counter() - clock
        digest = float(sum(float(o.topk_logprobs.sum()) for o in found))
        return {"median": seconds, "losses": [digest], "applied": reuse_freed_memory()}

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two ways")
    parser.add_argument("--steps", type=int, default=30, help="training steps per contender")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (demo jobs: 1)")
    parser.add_argument("--causal", type=int, default=16, help="examples per GGUF teacher")
    parser.add_argument("--causal-threads", type=int, default=2, help="torch threads, GGUF")
    parser.add_argument("--only-causal", action="store_true", help="only the GGUF teachers")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)
    cases: list[tuple[str, str, dict[str, Any], float]] = [
        ("copy of a 304 x 34,150 float32 tensor (42 MB)", "bench_allocator:copies",
         {"repeats": 50}, 1e3),
        ("demo teacher step, 3,000 tokens", "bench_allocator:steps",
         {"vocab": 3000, "count": args.steps}, 1e3),
        ("demo student step, 34,150 tokens", "bench_allocator:steps",
         {"vocab": 34150, "count": args.steps}, 1e3),
    ]  # fmt: skip
    if args.only_causal:
        cases = []
    for teacher, vocab in (("smollm2-135m", 49152), ("gemma3-270m", 262144)):
        cases.append((f"causal teacher inference, {teacher} ({vocab:,} tokens), "
                      f"{args.causal} x 256 tokens", "bench_allocator:causal",
                      {"teacher": teacher, "count": args.causal,
                       "threads": args.causal_threads}, 1.0))  # fmt: skip
    figures, notes, same = [], [], True
    for label, call, kwargs, scale in cases:
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for _ in range(args.rounds):
            for reuse in (False, True):
                settings = {"reuse": reuse, "threads": args.threads, **kwargs}
                result = run_contender(call, settings)
                runs[reuse].append(result)
        best = {reuse: min(runs[reuse], key=lambda r: r["output"]["median"]) for reuse in runs}
        if not best[True]["output"]["applied"]:
            raise SystemExit("reuse_freed_memory was not applied (not glibc?)")
        if "losses" in best[False]["output"]:
            same &= all(
                r["output"]["losses"] == runs[False][0]["output"]["losses"]
                for r in runs[False] + runs[True]
            )
        figures.append(
            figure(
                label,
                "ms" if scale == 1e3 else "s",
                best[False]["output"]["median"] * scale,
                best[True]["output"]["median"] * scale,
                peak_mib=(best[False]["peak_rss_mib"], best[True]["peak_rss_mib"]),
                others_share=(best[False]["others_share"], best[True]["others_share"]),
            )
        )
        notes.append(
            f"{label}: every round's median (default / reused): "
            + ", ".join(
                f"{a['output']['median'] * scale:.1f} / {b['output']['median'] * scale:.1f}"
                for a, b in zip(runs[False], runs[True], strict=True)
            )
            + (" ms" if scale == 1e3 else " s")
        )
    notes.append(
        "The losses of every step (and the teachers' log-probabilities) are the same both ways: "
        f"{same}."
    )
    notes.append(
        "Fastest round of each way; each contender a fresh interpreter (the setting is the "
        "process's); peak RSS: the contender process's whole life."
    )
    sizes = {"logits": " x ".join(map(str, LOGITS)), "batch": "32 x 64", "steps": args.steps,
             "rounds": args.rounds, "threads": args.threads}  # fmt: skip
    session.save(__doc__, sizes, figures, notes=notes, write=not args.no_write)
    if not same:
        raise SystemExit("the losses differ between the two ways")


if __name__ == "__main__":
    main()
