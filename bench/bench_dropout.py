"""Dropout masks on the CPU: torch's per-element Bernoulli draws vs lanes of 64-bit draws.

Both ways in one process, alternately, on the threads of a demo job process (one, by default).
Layer: dropout 0.1 forward and backward on one demo activation (32 x 64 x 128 float32), torch's
`nn.functional.dropout` against `lane_dropout_function`. Steps: training steps (forward on the
masked rows, KD + MLM loss, backward, AdamW) of the demo's models, BERT 2 x 128 with dropout 0.1,
batch 32 x 64: a teacher over a 3,000-token vocabulary and a student over the union run's
34,150 tokens, with the model's `nn.Dropout` modules as they are against swapped for lanes
(`lane_dropout`, what the training loop does); the attention probabilities' dropout, a function
call in BERT, is torch's both ways. The masks differ, so the numbers differ; each way's keep rate
is checked against the binomial (5 standard errors).

    python bench/bench_dropout.py [--rounds 3] [--steps 30] [--threads 1] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import Session, figure, parse_args, peak_rss_mib

NAME = "bench_dropout"
MEASURED = ("src/lmalgebra/train/dropout.py",)
LAYER = (32, 64, 128)


def layer_pass(lanes: bool) -> Callable[[], float]:
    """``run() -> seconds`` of dropout 0.1 forward and backward on one demo activation."""
    import torch

    from lmalgebra.train.dropout import lane_dropout_function

    x = torch.randn(LAYER, requires_grad=True)
    grad = torch.randn(LAYER)

    def run() -> float:
        clock = time.perf_counter()
        out = lane_dropout_function(x, 0.1) if lanes else torch.nn.functional.dropout(x, 0.1)
        out.backward(grad)
        return time.perf_counter() - clock

    return run


def keep_rates() -> dict[str, float]:
    """Each way's kept share of 2^22 elements at p = 0.1."""
    import torch

    from lmalgebra.train.dropout import lane_dropout_function

    ones = torch.ones(1 << 22)
    return {
        "torch": float((torch.nn.functional.dropout(ones, 0.1) != 0).double().mean()),
        "lanes": float((lane_dropout_function(ones, 0.1) != 0).double().mean()),
    }


def training_step(vocab: int, with_loss: bool = False) -> Callable[[bool], Any]:
    """``step(lanes) -> seconds`` (with ``with_loss``: ``(seconds, loss)``): one training step
    of a demo BERT over ``vocab`` tokens."""
    import torch

    from demo_step import demo_bert_batch
    from lmalgebra.train.dropout import lane_dropout
    from lmalgebra.train.losses import combined_loss
    from lmalgebra.train.masked_head import masked_logits

    made = demo_bert_batch(vocab, 0.1)
    model, batch, labels = made["model"], made["inputs"], made["labels"]
    topk, teacher = made["topk"], made["teacher"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step(lanes: bool) -> Any:
        clock = time.perf_counter()
        with lane_dropout(model) if lanes else contextlib.nullcontext(0):
            loss = combined_loss(masked_logits(model, batch), labels, 0.5, topk, teacher).total
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        seconds = time.perf_counter() - clock
        return (seconds, float(loss.detach())) if with_loss else seconds

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two ways")
    parser.add_argument("--steps", type=int, default=30, help="training steps per way and round")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (demo jobs: 1)")
    args = parse_args(parser, attempts=1)
    import torch

    torch.set_num_threads(args.threads)
    session = Session(NAME, MEASURED)

    passes = {lanes: layer_pass(lanes) for lanes in (False, True)}
    layer: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(args.rounds):
        for lanes, run in passes.items():
            run()
            layer[lanes].append(sum(run() for _ in range(100)) / 100)
    rates = keep_rates()
    keep, sd = 0.9, 5 * math.sqrt(0.9 * 0.1 / (1 << 22))
    rates_ok = all(abs(r - keep) <= sd + 1e-5 for r in rates.values())

    figures = [figure("dropout 0.1, one layer, forward + backward", "ms",
                      min(layer[False]) * 1e3, min(layer[True]) * 1e3)]  # fmt: skip
    notes = [
        "Kept share of 2^22 ones at p = 0.1 (expected 0.9, 5 standard errors "
        f"{sd:.1e}): torch {rates['torch']:.5f}, lanes {rates['lanes']:.5f}.",
    ]
    for label, vocab in (("teacher", 3000), ("student", 34150)):
        step = training_step(vocab)
        for lanes in (False, True):  # warm-up
            step(lanes)
        times: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(args.rounds):
            for lanes in (False, True):
                times[lanes].append(sum(step(lanes) for _ in range(args.steps)) / args.steps)
        figures.append(
            figure(f"demo {label} step, {vocab:,} tokens", "ms",
                   min(times[False]) * 1e3, min(times[True]) * 1e3)
        )  # fmt: skip
        notes.append(
            f"{label.capitalize()}: every round's mean step (torch / lanes): "
            + ", ".join(
                f"{a * 1e3:.1f} / {b * 1e3:.1f} ms"
                for a, b in zip(times[False], times[True], strict=True)
            )
        )
    notes.append(
        "Fastest round of each way; both ways in one process, alternated; peak RSS of the "
        f"process {peak_rss_mib():.0f} MiB (the two ways share it)."
    )
    sizes = {"activation": " x ".join(map(str, LAYER)), "p": 0.1, "batch": "32 x 64",
             "steps": args.steps, "rounds": args.rounds, "threads": args.threads}  # fmt: skip
    session.save(__doc__, sizes, figures, notes=notes, write=not args.no_write)
    if not rates_ok:
        raise SystemExit(f"a keep rate is off the binomial: {rates}")


if __name__ == "__main__":
    main()
