"""Bootstrap benchmark: 1,000 replicates of every group and pairwise R^2 vs one fit.

Target: 1,000 bootstrap replicates of every R^2 cost well under 10x one fit.

Synthetic correlated embeddings (12 models x 384 dims: shared, family and private latents, noise,
offsets) are streamed into second moments per split, once whole (the decomposer's statistics,
saved untimed) and once per block of spans (``BlockedMoments``, 32 blocks per split). Each
contender runs in a fresh interpreter:

* ``baseline``: one fit from the saved statistics: the full solve (``Decomposer.pairwise`` then
  ``leave_one_out``) and, separately, one group fit (``Decomposer.fit`` of the first model on all
  the others),
* ``ours``: ``bootstrap_r2`` with 1,000 replicates per split over train/validation/test for the 12
  group fits and the 132 pairwise fits (``Decomposer.pairwise_fits``). Block statistics are built
  split by split when the bootstrap asks for them (a lazy mapping, so one split's blocks are in
  memory at a time); that building is timed separately and left out of ours,
* ``refit``: ``bootstrap_r2(..., refit=True)`` on a few replicates, for its cost per replicate,
* ``widths`` (small layout, 12 x 32 dims): fixed-predictor vs refit interval widths.

    python bench/bench_bootstrap.py [--n-train 8000] [--parts 32] [--replicates 1000]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from benchlib import (
    CpuWatch,
    code_version,
    machine,
    peak_rss_mib,
    reset_peak_rss,
    utc_date,
    wait_for_idle,
    write_section,
)
from lmalgebra.core.splits import SPLITS
from lmalgebra.stats import block_scores
from lmalgebra.stats.bootstrap import bootstrap_r2
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import BlockedMoments
from synthetic import Synthetic, split_sizes

SECTION = "bench_bootstrap"
TARGET = 10.0
CHUNK = 2048  # rows per generated chunk (Synthetic seeds each chunk by its first row)
BENCH_DIR = Path(__file__).resolve().parent


# -- statistics of the synthetic embeddings ------------------------------------------------------
def chunks(synth: Synthetic, split: str, rows: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, (count, D) float32)`` chunks of the concatenated embeddings of a split."""
    for start in range(0, rows, CHUNK):
        count = min(CHUNK, rows - start)
        yield start, synth.all_rows(split, start, count)


def whole(synth: Synthetic, split: str, rows: int) -> SecondMoments:
    blocks = layout(synth.names(), [synth.dim] * synth.models)
    moments = SecondMoments(blocks)
    for _, chunk in chunks(synth, split, rows):
        moments.update(chunk)
    return moments


def blocked(synth: Synthetic, split: str, rows: int, parts: int) -> BlockedMoments:
    out = BlockedMoments.empty(layout(synth.names(), [synth.dim] * synth.models), rows, parts)
    for start, chunk in chunks(synth, split, rows):
        out.add_rows(chunk, start)
    return out


class LazyBlocks(Mapping[str, BlockedMoments]):
    """Split -> block statistics, built on access; holds one split at a time, times the builds."""

    def __init__(self, synth: Synthetic, sizes: dict[str, int], parts: int) -> None:
        self.synth, self.sizes, self.parts = synth, sizes, parts
        self.seconds = np.zeros(2)  # wall, CPU
        self._held: tuple[str, BlockedMoments] | None = None

    def __getitem__(self, split: str) -> BlockedMoments:
        if self._held is None or self._held[0] != split:
            self._held = None  # let the previous split go before building the next
            watch = Stopwatch()
            self._held = (split, blocked(self.synth, split, self.sizes[split], self.parts))
            self.seconds += watch.read()
        return self._held[1]

    def __contains__(self, split: object) -> bool:
        return split in self.sizes

    def __iter__(self) -> Iterator[str]:
        return iter(self.sizes)

    def __len__(self) -> int:
        return len(self.sizes)


class Stopwatch:
    """Wall-clock and CPU seconds (every thread of this process) since it was made."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter(), time.process_time()

    def read(self) -> np.ndarray:
        return np.array([time.perf_counter() - self.wall, time.process_time() - self.cpu])


def save_whole(synth: Synthetic, n_train: int, workdir: Path) -> None:
    """The decomposer's statistics of every split (untimed input of every contender)."""
    workdir.mkdir(parents=True, exist_ok=True)
    for split, rows in split_sizes(n_train).items():
        whole(synth, split, rows).save(workdir / f"{split}.safetensors")


def load_solver(workdir: Path, alpha: float) -> Decomposer:
    moments = {s: SecondMoments.load(workdir / f"{s}.safetensors") for s in SPLITS}
    blocks = moments["train"].blocks
    splits = {s: SplitMoments.of(moments.pop(s), in_place=True) for s in SPLITS}
    return Decomposer(blocks, splits, alpha, "relative")


# -- the contenders (each in a fresh interpreter) -----------------------------------------------
def run_baseline(args: argparse.Namespace) -> dict[str, Any]:
    solver = load_solver(args.workdir, args.alpha)
    names = [b.name for b in solver.blocks]
    reset_peak_rss()
    watch = Stopwatch()
    solver.pairwise()
    solver.leave_one_out()
    full = watch.read()
    watch = Stopwatch()
    solver.fit(names[0], names[1:])
    single = watch.read()
    return {"full_solve": full.tolist(), "group_fit": single.tolist()}


def run_ours(args: argparse.Namespace) -> dict[str, Any]:
    solver = load_solver(args.workdir, args.alpha)
    clock = time.perf_counter()
    table = solver.pairwise()
    fits = {"group": solver.leave_one_out(), "pairwise": solver.pairwise_fits(table)}
    fits_s = time.perf_counter() - clock
    phases: dict[str, float] = {"pieces": 0.0, "statistics": 0.0, "replicates": 0.0}
    pieces = block_scores.FixedScorer._pieces_by_pair
    statistics = block_scores.FixedScorer.statistics
    r2 = block_scores.BlockStatistics.r2
    cache: list[Any] = []

    def timed_pieces(self: Any) -> Any:  # the first call builds the pieces, later ones reuse
        started = time.perf_counter()
        out = pieces(self)
        phases["pieces"] += time.perf_counter() - started
        cache.append(out)
        return out

    def timed_statistics(self: Any, split: str, stats: BlockedMoments) -> Any:
        started = time.perf_counter()
        out = statistics(self, split, stats)
        phases["statistics"] += time.perf_counter() - started
        return out

    def timed_r2(self: Any, counts: np.ndarray) -> Any:
        started = time.perf_counter()
        out = r2(self, counts)
        phases["replicates"] += time.perf_counter() - started
        return out

    block_scores.FixedScorer._pieces_by_pair = timed_pieces  # type: ignore[method-assign]
    block_scores.FixedScorer.statistics = timed_statistics  # type: ignore[method-assign]
    block_scores.BlockStatistics.r2 = timed_r2  # type: ignore[method-assign]
    synth = Synthetic(args.models, args.dim, args.seed)
    lazy = LazyBlocks(synth, split_sizes(args.n_train), args.parts)
    reset_peak_rss()
    watch = Stopwatch()
    result = bootstrap_r2(solver, lazy, fits, replicates=args.replicates, seed=args.seed)
    total = watch.read()
    piece_mib = sum(p.nbytes for _, p in cache[0].values()) / 2**20 if cache else 0.0
    group_test = [i for i in result.intervals if i.kind == "group" and i.split == "test"]
    pair_test = [i.r2 for i in result.intervals if i.kind == "pairwise" and i.split == "test"]
    return {
        "fits_s": fits_s,
        "bootstrap": (total - lazy.seconds).tolist(),
        "build_blocks_s": float(lazy.seconds[0]),
        "phases": {**phases, "statistics": phases["statistics"] - phases["pieces"]},
        "pieces_mib": piece_mib,
        "split_blocks_mib": args.parts * (args.models * args.dim) ** 2 * 8 / 2**20,
        "intervals": len(result.intervals),
        "group_test_width": float(np.mean([i.high - i.low for i in group_test])),
        "group_test_r2": float(np.mean([i.r2 for i in group_test])),
        "pairwise_test_r2": [float(min(pair_test)), float(max(pair_test))],
    }


def run_refit(args: argparse.Namespace) -> dict[str, Any]:
    solver = load_solver(args.workdir, args.alpha)
    fits = {"group": solver.leave_one_out()}
    synth = Synthetic(args.models, args.dim, args.seed)
    lazy = LazyBlocks(synth, split_sizes(args.n_train), args.parts)
    lazy["train"]  # built untimed: the pipeline holds it already
    reset_peak_rss()
    watch = Stopwatch()
    bootstrap_r2(solver, lazy, fits, replicates=args.refit_replicates, seed=args.seed, refit=True)
    return {"per_replicate_s": float(watch.read()[0]) / args.refit_replicates}


def run_widths(args: argparse.Namespace) -> dict[str, Any]:
    synth = Synthetic(args.models, 32, args.seed, latent=10, family_latent=3, private=6)
    sizes = split_sizes(args.n_train)
    stats = {s: blocked(synth, s, sizes[s], args.parts) for s in SPLITS}
    splits = {s: SplitMoments.of(b.total()) for s, b in stats.items()}
    solver = Decomposer(stats["train"].blocks, splits, args.alpha, "relative")
    fits = {"group": solver.leave_one_out()}
    fixed = bootstrap_r2(solver, stats, fits, replicates=args.replicates, seed=args.seed)
    clock = time.perf_counter()
    refit = bootstrap_r2(solver, stats, fits, replicates=args.width_replicates, refit=True)
    per = (time.perf_counter() - clock) / args.width_replicates
    out: dict[str, Any] = {"refit_per_replicate_s": per}
    for split in ("validation", "test"):
        width = {
            name: float(np.mean([i.high - i.low for i in r.intervals if i.split == split]))
            for name, r in (("fixed", fixed), ("refit", refit))
        }
        out[split] = width
    return out


CONTENDERS = {"baseline": run_baseline, "ours": run_ours, "refit": run_refit, "widths": run_widths}


def child(args: argparse.Namespace) -> None:
    watch = CpuWatch()
    clock = time.perf_counter()
    result = CONTENDERS[args.which](args)
    result["wall_s"] = time.perf_counter() - clock
    result["cpu"] = watch.stop()
    result["peak_rss_mib"] = peak_rss_mib()
    args.result.write_text(json.dumps(result))


def measure(which: str, args: argparse.Namespace) -> dict[str, Any]:
    wait_for_idle(timeout=20)
    out = args.workdir / f"result-{which}.json"
    out.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).resolve()), "--which", which]
    for key in ("n_train", "parts", "replicates", "refit_replicates", "width_replicates"):
        command += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    command += ["--models", str(args.models), "--dim", str(args.dim), "--alpha", repr(args.alpha)]
    command += ["--seed", str(args.seed), "--workdir", str(args.workdir), "--result", str(out)]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    print(f"{which}: {json.dumps(result)}", flush=True)
    return result


# -- the report ----------------------------------------------------------------------------------
def report(res: dict[str, dict[str, Any]], args: argparse.Namespace, minutes: float) -> str:
    base, ours, refit, widths = res["baseline"], res["ours"], res["refit"], res["widths"]
    sizes = split_sizes(args.n_train)
    dim = args.models * args.dim
    fits = args.models + args.models * (args.models - 1)
    boot, full, group = (
        np.array(x) for x in (ours["bootstrap"], base["full_solve"], base["group_fit"])
    )
    vs_full, vs_group = boot / full, boot / group  # (wall, CPU) ratios
    met = "met" if vs_full[0] < TARGET and vs_group[0] < TARGET else "**NOT met**"
    ph = ours["phases"]
    refit_total = refit["per_replicate_s"] * args.replicates
    lines = [
        "## Bootstrap: 1,000 replicates of every R^2 from block statistics vs one fit",
        "",
        f"- Date: {utc_date()}",
        f"- Machine: {machine()}",
        f"- Code: {code_version()}",
        f"- Sizes: {args.models} models x hidden size {args.dim} (D = {dim}); "
        f"{sizes['train']} / {sizes['validation']} / {sizes['test']} train / validation / test "
        f"spans, {args.parts} blocks of consecutive spans per split; {fits} fits "
        f"({args.models} leave-one-out + {fits - args.models} ordered pairs); ridge alpha = "
        f"{args.alpha:g} (relative). Synthetic correlated embeddings (shared, family and "
        "private latents, noise, offsets).",
        "- Baseline = one fit from the split statistics already in memory: the full solve "
        "(`Decomposer.pairwise()` + `leave_one_out()`, every R^2 once), and one group fit "
        "(`Decomposer.fit` of model00 on the 11 others, scored on the three splits).",
        f"- Ours = `bootstrap_r2(solver, blocks, {{group, pairwise}}, replicates="
        f"{args.replicates})`: {args.replicates:,} replicates x 3 splits x {fits} fits, "
        "fixed predictors, percentile intervals. Block statistics are built split by split on "
        "access (one split in memory at a time); building them (streaming the rows, as the "
        "measurement does anyway) is excluded and shown separately.",
        "- Fresh interpreter per contender; wall-clock time and CPU time (all threads of the "
        "process); peak RSS (`VmHWM`) of the process.",
        "",
        "| | wall (CPU) | ours / this, wall (CPU) |",
        "|---|---|---|",
        f"| baseline: full solve (pairwise + leave-one-out) | {full[0]:.1f} s ({full[1]:.1f} "
        f"CPU-s) | **{vs_full[0]:.2f}x** ({vs_full[1]:.2f}x) |",
        f"| baseline: one group fit | {group[0]:.1f} s ({group[1]:.1f} CPU-s) "
        f"| **{vs_group[0]:.2f}x** ({vs_group[1]:.2f}x) |",
        f"| ours: {args.replicates:,} replicates of {3 * fits} R^2 | {boot[0]:.1f} s "
        f"({boot[1]:.1f} CPU-s) | 1 |",
        "",
        f"- Ours by phase: pieces `R_r^T R_m` of every fit {ph['pieces']:.1f} s (once, kept: "
        f"{ours['pieces_mib']:.0f} MiB); per-block statistics {ph['statistics']:.1f} s for the "
        f"three splits (one pass over each split's {args.parts} block Grams); "
        f"{args.replicates:,} replicates' R^2 {ph['replicates']:.2f} s; the rest (counts, "
        f"percentiles, checks) {boot[0] - sum(ph.values()):.2f} s. Setting up the fits "
        f"(`pairwise`, `leave_one_out`, `pairwise_fits`) took {ours['fits_s']:.1f} s, building "
        f"the block statistics {ours['build_blocks_s']:.1f} s; neither is counted.",
        f"- Peak RSS: baseline {base['peak_rss_mib']:.0f} MiB; ours {ours['peak_rss_mib']:.0f} "
        f"MiB, of which one split's block statistics ({args.parts} D x D float64 Grams) "
        f"{ours['split_blocks_mib']:.0f} MiB and the kept pieces {ours['pieces_mib']:.0f} MiB.",
        f"- Target (1,000 replicates under {TARGET:.0f}x one fit): {met} "
        f"(wall: {vs_full[0]:.2f}x the full solve, {vs_group[0]:.2f}x one group fit).",
        f"- Test R^2 of these models: group mean {ours['group_test_r2']:.3f} (mean 95% interval "
        f"width {ours['group_test_width']:.4f}); pairwise {ours['pairwise_test_r2'][0]:.2f} to "
        f"{ours['pairwise_test_r2'][1]:.2f}.",
        "",
        "Refit (`refit=True`: resample training blocks, `combine`, refit, score on the fixed "
        "held-out splits):",
        "",
        f"- At this size: {refit['per_replicate_s']:.1f} s per replicate for the 12 group fits "
        f"(`combine` of the training blocks and one `leave_one_out`; "
        f"{args.refit_replicates} replicate(s) timed), so "
        f"{args.replicates:,} replicates would take ~{refit_total / 60:.0f} min, "
        f"{refit_total / boot[0]:.0f}x the fixed-predictor bootstrap; peak RSS "
        f"{refit['peak_rss_mib']:.0f} MiB.",
        f"- Interval widths at a small layout ({args.models} models x 32 dims, latents scaled "
        "down alike, same spans and "
        f"blocks; {args.replicates:,} fixed-predictor vs {args.width_replicates} refit "
        "replicates; mean width of the 12 group R^2 intervals):",
    ]
    for split in ("validation", "test"):
        w = widths[split]
        lines.append(
            f"  - {split}: fixed {w['fixed']:.4f}, refit {w['refit']:.4f} "
            f"(refit / fixed {w['refit'] / w['fixed']:.2f})."
        )
    lines += [
        f"  Refit cost there: {widths['refit_per_replicate_s'] * 1e3:.0f} ms per replicate. The "
        "two resample different things: fixed predictors, the spans scored on (held-out "
        "sampling); refit, the training spans (fitting variability) with the held-out spans "
        "fixed.",
        "",
        "Contamination (other processes' share of all CPUs while each ran): "
        + ", ".join(f"{k} {100 * v['cpu']['others_share']:.0f}%" for k, v in res.items())
        + f". Total benchmark wall time {minutes:.1f} min.",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n-train", type=int, default=8000, help="training spans")
    parser.add_argument("--parts", type=int, default=32, help="blocks of spans per split")
    parser.add_argument("--replicates", type=int, default=1000)
    parser.add_argument("--refit-replicates", type=int, default=1, help="at the full size")
    parser.add_argument("--width-replicates", type=int, default=100, help="refit, small layout")
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--dim", type=int, default=384, help="hidden size of every model")
    parser.add_argument("--alpha", type=float, default=1e-2, help="relative ridge alpha")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "_work" / "bootstrap")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    parser.add_argument("--which", choices=list(CONTENDERS), help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.which:
        child(args)
        return
    started = time.perf_counter()
    synth = Synthetic(args.models, args.dim, args.seed)
    save_whole(synth, args.n_train, args.workdir)
    print(f"statistics saved in {time.perf_counter() - started:.0f} s", flush=True)
    results = {which: measure(which, args) for which in CONTENDERS}
    for split in SPLITS:
        (args.workdir / f"{split}.safetensors").unlink(missing_ok=True)
    text = report(results, args, (time.perf_counter() - started) / 60)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
