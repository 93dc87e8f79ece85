"""Alpha-sweep benchmark: a 50-value ridge path against one fit at one alpha.

Target: choosing alpha (GCV and the validation R^2 curve over 50 alphas) costs < 10x one fit.

Workload: M models of hidden size d (default 12 x 384, synthetic embeddings made as in
``bench_solver.py``), one group fit: the first model on the other M - 1 (``d_B = (M-1) d``).
Statistics are accumulated once (train in blocks, for k-fold), untimed. Then, in this process,
in ``--rounds`` interleaved rounds that each start on an idle machine (fastest of each kept):

* one fit: ``Decomposer(..., alpha).fit(target, others)``, R^2 on train/validation/test,
* the sweep: ``select_alpha(..., method="gcv")`` over 50 alphas (GCV + validation curve),
* for the explanation, one Cholesky and one eigendecomposition of the same ``d_B x d_B`` system;

and once, k-fold: ``select_alpha(..., method="kfold", folds=5, criteria=["kfold"])``.

The sweep's validation R^2 at the chosen alpha must equal the direct fit's to 1e-6.

    python bench/bench_alpha_sweep.py [--models 12] [--dim 384] [--n-train 8000]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from benchlib import (
    CpuWatch,
    changed_sources,
    code_version,
    machine,
    peak_rss_mib,
    release_memory,
    reset_peak_rss,
    rss_mib,
    source_digest,
    utc_date,
    wait_for_idle,
    write_section,
)
from lmalgebra.stats.alpha_select import default_alpha_grid, penalty_scale, select_alpha
from lmalgebra.stats.moments import Block, SecondMoments, layout
from lmalgebra.stats.solver import Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import BlockedMoments
from synthetic import Synthetic, split_sizes

SECTION = "bench_alpha_sweep"
TARGET = 10.0
CONTAMINATED = 0.05
CHUNK = 2048
MEASURED_PHASES = ("fit", "sweep", "kfold")
IDLE_WAIT = 30.0  # seconds to wait for an idle machine before each measured phase


def statistics(
    synth: Synthetic, n_train: int, parts: int
) -> tuple[BlockedMoments, dict[str, SplitMoments]]:
    """Train block statistics and every split's moments of the synthetic embeddings."""
    blocks = layout(synth.names(), [synth.dim] * synth.models)
    splits: dict[str, SplitMoments] = {}
    train = BlockedMoments.empty(blocks, n_train, parts)
    for split, n in split_sizes(n_train).items():
        flat = SecondMoments(blocks)
        for start in range(0, n, CHUNK):
            chunk = synth.all_rows(split, start, min(CHUNK, n - start))
            if split == "train":
                train.add_rows(chunk, start)
            else:
                flat.update(chunk)
        splits[split] = SplitMoments.of(train.total() if split == "train" else flat, True)
    return train, splits


class Best:
    """Fastest of several measured runs of one phase: seconds, result, CPU use, extra peak RSS."""

    def __init__(self) -> None:
        self.seconds, self.result, self.cpu, self.extra_mib = float("inf"), None, {}, 0.0

    def run(self, work: Callable[[], Any]) -> None:
        release_memory()
        reset_peak_rss()
        floor = rss_mib()
        watch = CpuWatch()
        clock = time.perf_counter()
        out = work()
        seconds = time.perf_counter() - clock
        if seconds < self.seconds:
            self.seconds, self.result = seconds, out
            self.cpu, self.extra_mib = watch.stop(), peak_rss_mib() - floor


def interleaved(phases: dict[str, Callable[[], Any]], rounds: int) -> dict[str, Best]:
    """Each round waits for an idle machine, then runs every phase once; keeps each one's best.

    Interleaving gives every phase the same chances when other processes come and go."""
    best = {name: Best() for name in phases}
    for r in range(rounds):
        wait_for_idle(timeout=IDLE_WAIT)
        for name, work in phases.items():
            best[name].run(work)
        times = ", ".join(f"{n} {b.seconds:.2f} s" for n, b in best.items())
        print(f"round {r + 1}/{rounds}: best so far {times}", flush=True)
    return best


def rescaled_system(blocks: list[Block], train: SplitMoments, alpha: float) -> torch.Tensor:
    """The group fit's ``d_B x d_B`` system in rescaled coordinates (what the sweep factorises)."""
    cols = np.arange(blocks[1].start, blocks[-1].stop)
    scale = penalty_scale(blocks, train, "relative")[cols]
    system = torch.from_numpy(train.cov[np.ix_(cols, cols)] / np.sqrt(np.outer(scale, scale)))
    system.diagonal().add_(alpha)
    return system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--n-train", type=int, default=8000)
    parser.add_argument("--parts", type=int, default=10, help="training blocks (for k-fold)")
    parser.add_argument("--folds", type=int, default=5)
    parser.add_argument("--alpha", type=float, default=1e-2, help="alpha of the single fit")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (best kept)")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    started, version, digest = time.perf_counter(), code_version(), source_digest()

    synth = Synthetic(args.models, args.dim)
    train_blocks, splits = statistics(synth, args.n_train, args.parts)
    blocks = train_blocks.blocks
    target, others = blocks[0].name, [b.name for b in blocks[1:]]
    fits = [(target, others)]
    grid = default_alpha_grid()
    print(f"statistics ready in {time.perf_counter() - started:.0f} s", flush=True)

    def one_fit(alpha: float) -> Any:
        return Decomposer(blocks, splits, alpha).fit(target, others)

    system = rescaled_system(blocks, splits["train"], args.alpha)
    best = interleaved(
        {
            "fit": lambda: one_fit(args.alpha),
            "sweep": lambda: select_alpha(blocks, splits, method="gcv", grid=grid, fits=fits),
            "cholesky": lambda: torch.linalg.cholesky(system),
            "eigh": lambda: torch.linalg.eigh(system),
        },
        args.rounds,
    )
    sweep = best["sweep"].result
    # parity: the curve at the chosen alpha against a direct fit there
    k = int(np.argmin(np.abs(np.asarray(grid) - sweep.alpha)))
    direct = one_fit(sweep.alpha).r2["validation"]
    diff = abs(float(sweep.curves["validation"][0, k]) - direct)
    if diff > 1e-6:
        raise SystemExit(f"FAILED: sweep and direct fit disagree on validation R^2 by {diff:.2e}")

    wait_for_idle(timeout=IDLE_WAIT)
    best["kfold"] = Best()
    best["kfold"].run(
        lambda: select_alpha(
            blocks,
            splits,
            method="kfold",
            grid=grid,
            fits=fits,
            train_blocks=train_blocks,
            folds=args.folds,
            criteria=["kfold"],
        )
    )
    kfold = best["kfold"].result
    fit_s = best["fit"].seconds
    print(f"k-fold: {best['kfold'].seconds:.2f} s ({best['kfold'].seconds / fit_s:.1f}x)")

    measured = {n: (best[n].seconds, best[n].cpu, best[n].extra_mib) for n in MEASURED_PHASES}
    chol_s, eigh_s = best["cholesky"].seconds, best["eigh"].seconds
    text = report(args, measured, chol_s, eigh_s, sweep, kfold, diff, version, digest, started)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


def report(
    args: argparse.Namespace,
    measured: dict[str, tuple[float, dict[str, float], float]],
    chol_s: float,
    eigh_s: float,
    sweep: Any,
    kfold: Any,
    diff: float,
    version: str,
    digest: dict[str, str],
    started: float,
) -> str:
    sizes = split_sizes(args.n_train)
    d_b = (args.models - 1) * args.dim
    fit_s = measured["fit"][0]
    sweep_ratio, kfold_ratio = measured["sweep"][0] / fit_s, measured["kfold"][0] / fit_s
    lines = [
        "## Alpha sweep: 50-value ridge path vs one fit",
        "",
        f"- Date: {utc_date()}",
        f"- Machine: {machine()}",
        f"- Code: {version}",
        f"- Workload: {args.models} models x hidden size {args.dim}; one group fit of "
        f"`{sweep.labels[0]}` on the other {args.models - 1} (d_B = {d_b}, d_t = {args.dim}); "
        f"train / validation / test = {sizes['train']} / {sizes['validation']} / "
        f"{sizes['test']} spans of synthetic embeddings made as in `bench_solver.py` "
        f"(statistics accumulated once, untimed; {args.parts} training blocks).",
        f"- Baseline: one fit at one alpha, `Decomposer(..., alpha={args.alpha:g}).fit(target, "
        "others)` with R^2 on train/validation/test.",
        f"- Ours: `select_alpha` over the default grid ({len(sweep.grid)} relative alphas, "
        f"{sweep.grid[0]:g}..{sweep.grid[-1]:g}): method `gcv` (GCV and validation curves from "
        f"one eigendecomposition), and separately `kfold` with k = {args.folds} (one "
        "eigendecomposition per fold).",
        f"- Wall-clock in one process: fit, sweep, Cholesky and eigendecomposition in "
        f"{args.rounds} interleaved rounds, each started on an idle machine (waiting up to "
        f"{IDLE_WAIT:.0f} s for one), keeping each phase's fastest run; k-fold once, after. "
        "Peak memory = peak RSS during the phase minus RSS before it.",
        "",
        "| | wall | CPU | x one fit | extra peak RSS | chosen alpha |",
        "|---|---|---|---|---|---|",
    ]
    for name, label, chosen in (
        ("fit", "one fit (baseline)", ""),
        ("sweep", "sweep: GCV + validation, 50 alphas", f"{sweep.alpha:.3g}"),
        ("kfold", f"{args.folds}-fold CV, 50 alphas", f"{kfold.alpha:.3g}"),
    ):
        seconds, cpu, mem = measured[name]
        lines.append(
            f"| {label} | {seconds:.2f} s | {cpu['own_cpu_s']:.1f} CPU-s | "
            f"**{seconds / fit_s:.1f}x** | {mem:.0f} MiB | {chosen} |"
        )
    lines += [
        "",
        f"- Parity: validation R^2 of the sweep at its chosen alpha vs a direct fit there: "
        f"{diff:.1e}.",
        f"- Same {d_b} x {d_b} system: Cholesky {chol_s:.2f} s, eigendecomposition "
        f"(`torch.linalg.eigh`) {eigh_s:.2f} s = {eigh_s / chol_s:.0f}x a Cholesky, "
        f"{eigh_s / fit_s:.1f}x a whole fit.",
    ]
    worst = max(cpu["others_share"] for _, cpu, _ in measured.values())
    if worst > CONTAMINATED:
        lines.append(
            f"- **Warning**: other processes used up to {100 * worst:.0f}% of the CPUs during a "
            "measured phase; its time is inflated accordingly."
        )
    changed = changed_sources(digest)
    if changed:
        lines.append(
            f"- **Warning**: measured sources changed during the run: {', '.join(changed)}."
        )
    met = sweep_ratio < TARGET
    per_fold = measured["kfold"][0] / args.folds
    lines += [
        "",
        f"Target < {TARGET:.0f}x one fit for the sweep: **{'met' if met else 'NOT met'}** "
        f"({sweep_ratio:.1f}x); k-fold: {kfold_ratio:.1f}x.",
        "",
        f"- Where the sweep's time goes: one eigendecomposition (~{eigh_s:.1f} s alone), two "
        "d_B^3 products projecting the validation covariance on the eigenvectors, and "
        "O(d_B^2) per alpha for the 50 alphas (a fraction of a second in all).",
        f"- k-fold has no shortcut across folds: each fold's training set has its own "
        f"covariance, so it costs {args.folds} eigendecompositions and {args.folds} held-out "
        f"projections plus combining the fold's blocks ({per_fold:.1f} s per fold, "
        f"~{per_fold / measured['sweep'][0]:.1f}x the sweep).",
    ]
    if not met:
        held = measured["sweep"][0] - eigh_s
        lines += [
            "",
            f"- Why: the sweep's cost is one eigendecomposition ({eigh_s:.1f} s, "
            f"{eigh_s / chol_s:.0f}x the Cholesky a fit needs) plus ~{max(held, 0):.1f} s to "
            "project the validation covariance on the eigenvectors (two d_B^3 products); the "
            "50 alphas themselves cost O(d_B^2) each. LAPACK's symmetric eigensolver reduces "
            "to tridiagonal form with half its flops in matrix-vector (memory-bound) steps, so "
            "it runs far below the matrix-multiply rate a Cholesky reaches; its many "
            "synchronisation points also make it slow down much more than a Cholesky when "
            "other processes share the cores.",
            "- What would close the gap: a GPU eigensolver (`torch.linalg.eigh` on CUDA), or "
            "fewer fits instead of an eigendecomposition: a golden-section search on the "
            "validation or GCV curve needs ~8-10 Cholesky fits (GCV also needs the "
            "trace of an inverse per alpha).",
        ]
    lines.append(f"\nTotal benchmark wall time {(time.perf_counter() - started) / 60:.1f} min.")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
