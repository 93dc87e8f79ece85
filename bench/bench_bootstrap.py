"""Bootstrap: 1,000 replicates of every R^2 from block statistics vs one fit.

Bootstrap replicates of every group (leave-one-out) and pairwise R^2 on train/validation/test of
M synthetic models (default 12 x hidden 384, D = 4,608; 8,000 / 800 / 800 spans in 32 blocks per
split; relative alpha 0.01). Baseline: one fit from the statistics in memory (the full solve,
``Decomposer.pairwise`` + ``leave_one_out``, and one group fit). Ours: ``bootstrap_r2`` with fixed
predictors over 1,000 replicates (block statistics are built split by split on access; that
building is timed apart and not counted). For information: ``refit=True`` per replicate, and
fixed-predictor vs refit interval widths at a small layout (12 x 32 dims). Target: 1,000
replicates cost under 10x one fit.

    python bench/bench_bootstrap.py [--n-train 8000] [--parts 32] [--replicates 1000] [--no-write]
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from harness import Session, fastest, figure, goal, parse_args, reset_peak_rss, run_contender
from lmalgebra.core.splits import SPLITS
from lmalgebra.stats import block_scores
from lmalgebra.stats.bootstrap import bootstrap_r2
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from synthetic import Synthetic, split_sizes

NAME = "bench_bootstrap"
MEASURED = ("src/lmalgebra/stats",)
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


def blocked(synth: Synthetic, split: str, rows: int, parts: int) -> SpanBlockMoments:
    out = SpanBlockMoments.empty(layout(synth.names(), [synth.dim] * synth.models), rows, parts)
    for start, chunk in chunks(synth, split, rows):
        out.add_rows(chunk, start)
    return out


class LazyBlocks(Mapping[str, SpanBlockMoments]):
    """Split -> block statistics, built on access; holds one split at a time, times the builds."""

    def __init__(self, synth: Synthetic, sizes: dict[str, int], parts: int) -> None:
        self.synth, self.sizes, self.parts = synth, sizes, parts
        self.seconds = np.zeros(2)  # wall, CPU
        self._held: tuple[str, SpanBlockMoments] | None = None

    def __getitem__(self, split: str) -> SpanBlockMoments:
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

    def timed_statistics(self: Any, split: str, stats: SpanBlockMoments) -> Any:
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


def contender(which: str, **options: Any) -> Any:
    """The work of contender ``which``; ``options`` are the script's (JSON) options."""
    args = argparse.Namespace(**options)
    args.workdir = Path(args.workdir)
    return lambda: CONTENDERS[which](args)


def save(res: dict[str, dict[str, Any]], args: argparse.Namespace, session: Session) -> None:
    base, ours, refit, widths = res["baseline"], res["ours"], res["refit"], res["widths"]
    out = {k: v["output"] for k, v in res.items()}
    boot, full, group = (
        np.array(x)
        for x in (
            out["ours"]["bootstrap"],
            out["baseline"]["full_solve"],
            out["baseline"]["group_fit"],
        )
    )
    o, ph = out["ours"], out["ours"]["phases"]
    peaks = (base["peak_rss_mib"], ours["peak_rss_mib"])
    shares = (base["others_share"], ours["others_share"])
    figures = [
        figure(
            "vs the full solve (pairwise + leave-one-out)",
            "s",
            full[0],
            boot[0],
            peak_mib=peaks,
            others_share=shares,
            cost=True,
        ),
        figure(
            "vs one group fit",
            "s",
            group[0],
            boot[0],
            peak_mib=peaks,
            others_share=shares,
            cost=True,
        ),
    ]
    vs_full, vs_group = boot[0] / full[0], boot[0] / group[0]
    refit_s = out["refit"]["per_replicate_s"]
    w = out["widths"]
    notes = [
        f"CPU time: full solve {full[1]:.1f} CPU-s, one group fit {group[1]:.1f}, ours "
        f"{boot[1]:.1f}.",
        f"Ours by phase: pieces R_r^T R_m of every fit {ph['pieces']:.1f} s (kept: "
        f"{o['pieces_mib']:,.0f} MiB); per-block statistics {ph['statistics']:.1f} s; the "
        f"{args.replicates:,} replicates' R^2 {ph['replicates']:.2f} s; the rest "
        f"{boot[0] - sum(ph.values()):.2f} s. Not counted: setting up the fits "
        f"{o['fits_s']:.1f} s, building the block statistics {o['build_blocks_s']:.1f} s.",
        f"Ours' peak RSS holds one split's {args.parts} D x D float64 block Grams "
        f"({o['split_blocks_mib']:,.0f} MiB) and the kept pieces.",
        f"Test R^2: group mean {o['group_test_r2']:.3f} (mean 95% interval width "
        f"{o['group_test_width']:.4f}); pairwise {o['pairwise_test_r2'][0]:.2f} to "
        f"{o['pairwise_test_r2'][1]:.2f}.",
        f"Refit (`refit=True`): {refit_s:.1f} s per replicate for the {args.models} group fits "
        f"({args.refit_replicates} timed, with other processes at {refit['others_share']:.0%} of "
        f"the CPUs), so {args.replicates:,} replicates ~{refit_s * args.replicates / 60:.0f} min; "
        f"peak RSS {refit['peak_rss_mib']:,.0f} MiB.",
        f"Interval widths at {args.models} x 32 dims, {args.replicates:,} fixed vs "
        f"{args.width_replicates} refit replicates: validation {w['validation']['fixed']:.4f} vs "
        f"{w['validation']['refit']:.4f}, test {w['test']['fixed']:.4f} vs "
        f"{w['test']['refit']:.4f} (refit {1e3 * w['refit_per_replicate_s']:.0f} ms per "
        "replicate, others took "
        f"{widths['others_share']:.0%} of the CPUs). Fixed predictors resample the spans scored "
        "on; refit, the training spans.",
    ]
    session.save(
        __doc__,
        {
            "models": args.models,
            "hidden size": args.dim,
            "spans": " / ".join(f"{n:,}" for n in split_sizes(args.n_train).values()),
            "blocks per split": args.parts,
            "replicates": args.replicates,
        },
        figures,
        targets=[
            goal(
                f"{args.replicates:,} replicates < {TARGET:.0f}x one fit",
                vs_full < TARGET and vs_group < TARGET,
                f"{vs_full:.2f}x the full solve, {vs_group:.2f}x one group fit",
            )
        ],
        notes=notes,
        write=not args.no_write,
    )


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
    args = parse_args(parser, attempts=1)
    logging.basicConfig(level=logging.WARNING)
    session = Session(NAME, MEASURED)
    synth = Synthetic(args.models, args.dim, args.seed)
    clock = time.perf_counter()
    save_whole(synth, args.n_train, args.workdir)
    print(f"statistics saved in {time.perf_counter() - clock:.0f} s", flush=True)
    options = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    results = {
        which: fastest(
            lambda w=which: run_contender("bench_bootstrap:contender", {"which": w, **options}),
            args.attempts,
            label=which,
        )
        for which in CONTENDERS
    }
    for split in SPLITS:
        (args.workdir / f"{split}.safetensors").unlink(missing_ok=True)
    save(results, args, session)


if __name__ == "__main__":
    main()
