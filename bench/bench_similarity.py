"""Similarity table: CKA and CCA of every pair after the fits, idle and beside a competing process.

M synthetic models (default 13 x hidden 384, ``bench/synthetic.py``), statistics of ``--spans``
training spans and a tenth of that for validation and test (float32 products, as a run takes them;
32,000 by default, the size of the cached run whose similarity phase was measured at 50-97 s).
Baseline: the table as it was (``bench/similarity_reference.py``: NumPy's BLAS on its default
threads, one eigensolve per model, one split after another). Ours:
``lmalgebra.stats.similarity.similarity_tables`` (the three splits' work cut into one task per
model and split, shared out over the process's cores, each on one BLAS thread). All in this
process, in a run's order: the statistics pass (``SecondMoments.update`` of 2,048-row chunks of rows
generated beforehand), then per contender and repeat the fits phase (every pairwise and
leave-one-out fit, torch's and NumPy's default threads) followed by the three splits' tables. Each
figure is the median of ``--repeats``, idle (after waiting for idle CPUs) and with one competing
process spinning on one core (another job on a shared two-core host); CPU seconds count every thread
of this process, spinning ones included. Every CKA and mean CCA must agree with the baseline's to
1e-9. Target: the tables at most 10% of the statistics pass, idle and loaded.

    python bench/bench_similarity.py [--models 13] [--dim 384] [--spans 32000] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from harness import (
    CpuWatch,
    Session,
    competing_process,
    figure,
    goal,
    parse_args,
    table,
    wait_for_idle,
)
from lmalgebra.core.splits import SPLITS
from lmalgebra.stats.moments import ModelColumns, SecondMoments, layout
from lmalgebra.stats.similarity import similarity_tables
from lmalgebra.stats.solver import Decomposer, SplitMoments
from similarity_reference import similarity_table as reference_table
from synthetic import Synthetic, split_sizes

NAME = "bench_similarity"
MEASURED = ("src/lmalgebra/stats/similarity.py", "src/lmalgebra/stats/blas_threads.py")
TOLERANCE = 1e-9
CHUNK = 2048
ALPHA = 0.01  # absolute, as bench_decompose


def statistics_pass(blocks: list[ModelColumns], rows: dict[str, np.ndarray]) -> dict[str, Any]:
    """Every split's moments from its rows, in chunks, as the statistics pass streams them."""
    out = {}
    for split, x in rows.items():
        moments = SecondMoments(blocks, products="float32")
        for start in range(0, len(x), CHUNK):
            moments.update(x[start : start + CHUNK])
        out[split] = SplitMoments.of(moments)
    return out


def timed(run: Callable[[], object]) -> dict[str, Any]:
    """Wall and CPU seconds of one call (this process's threads, spinning ones included), other
    processes' share of the CPUs meanwhile, and its result."""
    watch, clock = CpuWatch(), time.perf_counter()
    result = run()
    seconds = time.perf_counter() - clock
    usage = watch.stop()
    return {
        "seconds": seconds,
        "cpu": usage["own_cpu_s"],
        "others": usage["others_share"],
        "result": result,
    }


def median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median wall and CPU seconds of ``runs``, the largest share of other processes."""
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "cpu": statistics.median(r["cpu"] for r in runs),
        "others": max(r["others"] for r in runs),
    }


def fits(blocks: list[ModelColumns], moments: dict[str, SplitMoments]) -> None:
    """The run's fits phase: every pairwise and every leave-one-out fit (a new solver, so no
    factor is reused from a previous call)."""
    solver = Decomposer(blocks, moments, ALPHA, "absolute")
    solver.pairwise()
    solver.leave_one_out()


def baseline_tables(blocks: list[ModelColumns], moments: dict[str, Any]) -> list[Any]:
    """The reference's rows, split after split."""
    return [r for s in SPLITS for r in reference_table(blocks, moments[s])]


def ours_tables(blocks: list[ModelColumns], moments: dict[str, Any]) -> list[Any]:
    """``similarity_tables``' rows (the splits side by side), in the same order."""
    tables = similarity_tables(blocks, {s: moments[s] for s in SPLITS})
    return [r for s in SPLITS for r in tables[s]]


def measure(
    blocks: list[ModelColumns], rows: dict[str, np.ndarray], repeats: int, loaded: bool
) -> dict[str, Any]:
    """The statistics pass, then per contender and repeat the fits followed by the three
    tables (as a run computes them), idle or beside one competing process."""
    if not loaded:
        wait_for_idle()
    runs: dict[str, list[dict[str, Any]]] = {}
    with competing_process() if loaded else contextlib.nullcontext():
        first = timed(lambda: statistics_pass(blocks, rows))
        moments = first.pop("result")
        runs["statistics"] = [first]
        for _ in range(repeats):
            for name, table_of in (("baseline", baseline_tables), ("ours", ours_tables)):
                runs.setdefault(f"fits before {name}", []).append(
                    timed(lambda: fits(blocks, moments))
                )
                runs.setdefault(name, []).append(timed(lambda f=table_of: f(blocks, moments)))
                print(
                    f"    {name}: fits {runs[f'fits before {name}'][-1]['seconds']:.2f} s, "
                    f"tables {runs[name][-1]['seconds']:.2f} s",
                    flush=True,
                )
    pairs = zip(runs["baseline"][-1]["result"], runs["ours"][-1]["result"], strict=True)
    diff = max(max(abs(a.cka - b.cka), abs(a.mean_cca - b.mean_cca)) for a, b in pairs)
    found: dict[str, Any] = {name: median(r) for name, r in runs.items()}
    found["fits"] = median(runs["fits before baseline"] + runs["fits before ours"])
    base, ours = found["baseline"], found["ours"]
    print(
        f"  {'loaded' if loaded else 'idle'}: statistics {found['statistics']['seconds']:.2f} s, "
        f"fits {found['fits']['seconds']:.2f} s, tables {base['seconds']:.2f} -> "
        f"{ours['seconds']:.2f} s (CPU {base['cpu']:.2f} -> {ours['cpu']:.2f} s)",
        flush=True,
    )
    return {**found, "diff": diff}


def summarise(
    found: dict[bool, dict[str, Any]],
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Figures, targets and the phase table from the idle (False) and loaded (True) runs."""
    figures, detail = [], []
    for loaded, f in found.items():
        label = "one competing process" if loaded else "idle"
        base, ours, stats = f["baseline"], f["ours"], f["statistics"]
        figures.append(
            figure(
                f"3 splits' tables, {label}",
                "s",
                base["seconds"],
                ours["seconds"],
                others_share=(base["others"], ours["others"]),
            )
        )
        times = [f"{x['seconds']:.3g} / {x['cpu']:.3g}" for x in (stats, f["fits"], base, ours)]
        share = f"{ours['seconds'] / stats['seconds']:.1%}"
        detail.append([label, *times, share, f"{f['diff']:.1e}"])
    idle, busy = found[False], found[True]
    keys = ("statistics", "fits", "baseline", "ours")
    ratios = [f"{busy[k]['seconds'] / idle[k]['seconds']:.2f}" for k in keys]
    detail.append(["loaded / idle (wall)", *ratios, "", ""])
    share = max(f["ours"]["seconds"] / f["statistics"]["seconds"] for f in found.values())
    diff = max(f["diff"] for f in found.values())
    targets = [
        goal("the table at most 10% of the statistics pass", share <= 0.10, f"{share:.1%}"),
        goal(
            f"CKA and mean CCA agree with the baseline to {TOLERANCE:g}",
            diff <= TOLERANCE,
            f"{diff:.1e}",
        ),
    ]
    columns = ["condition", "statistics pass, wall / CPU (s)", "fits, wall / CPU (s)"]
    columns += ["tables baseline, wall / CPU (s)"]
    columns += ["tables ours, wall / CPU (s)", "ours / statistics", "max abs diff"]
    return figures, targets, [table("Phases", columns, detail)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=13)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--spans", type=int, default=32_000, help="training spans")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure (median)")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)
    synth = Synthetic(args.models, args.dim)
    counts = split_sizes(args.spans)
    rows = {s: synth.all_rows(s, 0, counts[s]) for s in SPLITS}
    blocks = layout(synth.names(), [args.dim] * args.models)
    found = {loaded: measure(blocks, rows, args.repeats, loaded) for loaded in (False, True)}
    figures, targets, tables = summarise(found)
    sizes = {
        "models": f"{args.models} x {args.dim}",
        "spans": f"{counts['train']:,} / {counts['validation']:,} / {counts['test']:,}",
        "pairs per split": args.models * (args.models - 1) // 2,
        "repeats": args.repeats,
    }
    session.save(
        __doc__,
        sizes,
        figures,
        targets=targets,
        tables=tables,
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
