"""Solver: all pairwise and leave-one-out fits from cached embeddings.

All M leave-one-out and M(M-1) pairwise fits of M synthetic models (default 12 x hidden 384,
D = 4,608), R^2 on train/validation/test, from embeddings first written as checksummed safetensors
shards by ``EmbeddingCache``. Baseline (after the LMD paper's code, centred with a bias so that both
compute the same R^2): every embedding in memory as float32 tensors, per fit the covariances
recomputed from the rows, ``torch.linalg.solve``, predictions of every row. Ours: shards streamed
into ``SecondMoments`` per split (float32 products of shift-centred rows, accumulated in float64,
as ``run_decomposition`` does), then ``Decomposer.pairwise`` and ``leave_one_out``; ours with
float64 products runs once for the agreement. Same absolute ridge alpha; R^2 must agree to 1e-4
with the baseline and to 1e-6 between ours' float32 and float64 products. Targets: >= 10x faster,
peak memory independent of the spans and <= 1/5 of the baseline's (adjusted: minus an
interpreter that only imports the same libraries).

    python bench/bench_solver.py [--sizes 8000,32000] [--models 12] [--dim 384] [--no-write]
"""

from __future__ import annotations

import argparse
import logging
import math
import shutil
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from harness import (
    Session,
    fastest,
    figure,
    goal,
    parse_args,
    peak_rss_mib,
    run_contender,
    table,
)
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.lmd.statistics.passes import accumulate
from lmalgebra.sources.embed import TokenReport
from lmalgebra.stats.moments import Products
from lmalgebra.stats.solver import Decomposer, SplitMoments
from synthetic import Synthetic, split_sizes
from utilisation import GRAM_FORMULA, gram_flops, measure_peak

NAME = "bench_solver"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/stats")
TOLERANCE = 1e-4
PRODUCTS_TOLERANCE = 1e-6  # ours' float32 products against float64 products
SPEED_TARGET = 10.0
MEMORY_TARGET = 1 / 5
BENCH_DIR = Path(__file__).resolve().parent


def open_caches(
    workdir: Path, synth: Synthetic, n_train: int
) -> dict[str, dict[str, EmbeddingCache]]:
    """The embedding caches (model -> split -> cache) of one size; rows are named by index."""
    caches: dict[str, dict[str, EmbeddingCache]] = {}
    for name in synth.names():
        caches[name] = {}
        for split, n in split_sizes(n_train).items():
            key = {
                "bench": NAME,
                "model": name,
                "split": split,
                "n_train": n_train,
                "synthetic": asdict(synth),
            }
            texts = [f"{split}:{i}" for i in range(n)]
            caches[name][split] = EmbeddingCache(workdir / "embeddings", key, texts)
    return caches


def write_embeddings(workdir: Path, synth: Synthetic, n_train: int) -> float:
    """Fill the caches of one size (no-op when already complete); returns MiB on disk."""
    caches = open_caches(workdir, synth, n_train)
    for m, name in enumerate(synth.names()):
        for split, cache in caches[name].items():

            def compute(
                texts: list[str], m: int = m, split: str = split
            ) -> tuple[np.ndarray, TokenReport]:
                start = int(texts[0].split(":")[1])
                return synth.rows(m, split, start, len(texts)), TokenReport(0.0, 0, len(texts))

            cache.ensure(compute)
    size = 0
    for by_split in caches.values():
        for cache in by_split.values():
            size += sum(p.stat().st_size for p in cache.dir.glob("shard-*.safetensors"))
    return size / 2**20


# -- the two contenders (each in a fresh interpreter) ---------------------------------------
def run_ours(
    workdir: Path, synth: Synthetic, n_train: int, alpha: float, products: Products
) -> dict[str, Any]:
    """Stream shards into second moments, then every fit in closed form (as the pipeline does)."""
    phases: dict[str, list[float]] = {}  # name -> [seconds, peak RSS so far (MiB)]
    clock = time.perf_counter()
    caches = open_caches(workdir, synth, n_train)
    names = synth.names()
    flat = [caches[name][split] for name in names for split in SPLITS]
    rows = {split: len(caches[names[0]][split].texts) for split in SPLITS}
    widths = [[caches[name]["train"].dim] for name in names]
    blocked = accumulate(flat, names, widths, rows, {}, products=products).stats  # type: ignore[arg-type]
    moments = {split: blocked[split].total() for split in SPLITS}
    phases["stream shards into moments"] = [time.perf_counter() - clock, peak_rss_mib()]

    clock = time.perf_counter()
    blocks = moments["train"].blocks
    # as run_decomposition does: each Gram buffer becomes its split's covariance in place
    solver = Decomposer(
        blocks,
        {s: SplitMoments.of(moments.pop(s), in_place=True) for s in SPLITS},
        alpha,
        "absolute",
    )
    phases["covariances"] = [time.perf_counter() - clock, peak_rss_mib()]
    clock = time.perf_counter()
    pairwise = solver.pairwise()
    phases["pairwise fits"] = [time.perf_counter() - clock, peak_rss_mib()]
    clock = time.perf_counter()
    group = solver.leave_one_out()
    phases["leave-one-out fits"] = [time.perf_counter() - clock, peak_rss_mib()]
    return {
        "phases": phases,
        "pairwise": {s: pairwise[s].tolist() for s in SPLITS},
        "group": {s: [fit.r2[s] for fit in group] for s in SPLITS},
    }


def _baseline_load(
    workdir: Path, synth: Synthetic, n_train: int
) -> dict[str, dict[str, torch.Tensor]]:
    """Every model's embeddings of every split, in memory: split -> model -> (n, d) float32."""
    caches = open_caches(workdir, synth, n_train)
    out: dict[str, dict[str, torch.Tensor]] = {s: {} for s in SPLITS}
    for name, by_split in caches.items():
        for split, cache in by_split.items():
            full = torch.empty((len(cache.texts), synth.dim), dtype=torch.float32)
            row = 0
            for chunk in cache.chunks():
                full[row : row + chunk.shape[0]] = torch.from_numpy(chunk)
                row += chunk.shape[0]
            out[split][name] = full
    return out


def _baseline_fit(
    emb: dict[str, dict[str, torch.Tensor]], basis: list[str], target: str, alpha: float
) -> dict[str, float]:
    """One ridge fit recomputed from raw embeddings, scored on every split by prediction."""
    z = torch.cat([emb["train"][b] for b in basis], dim=1)  # (n, d_B), a fresh copy
    u = emb["train"][target]
    n = z.shape[0]
    z_mean, u_mean = z.mean(0), u.mean(0)
    z -= z_mean  # centred in place: the copy above is ours to change
    c_bb = z.T @ z / n
    c_bt = z.T @ (u - u_mean) / n
    c_bb.diagonal().add_(alpha)
    weight = torch.linalg.solve(c_bb, c_bt)  # (d_B, d_t)
    del z, c_bb, c_bt
    scores = {}
    for split in SPLITS:
        zs = torch.cat([emb[split][b] for b in basis], dim=1)
        us = emb[split][target]
        zs -= z_mean
        residual = us - (zs @ weight + u_mean)
        sse = float((residual**2).sum())
        sst = float(((us - us.mean(0)) ** 2).sum())
        scores[split] = 1 - sse / sst
    return scores


def run_baseline(workdir: Path, synth: Synthetic, n_train: int, alpha: float) -> dict[str, Any]:
    """All embeddings in memory; means, covariances, solve and predictions per fit."""
    phases: dict[str, list[float]] = {}  # name -> [seconds, peak RSS so far (MiB)]
    clock = time.perf_counter()
    emb = _baseline_load(workdir, synth, n_train)
    phases["load all embeddings"] = [time.perf_counter() - clock, peak_rss_mib()]
    names = synth.names()
    m = len(names)

    clock = time.perf_counter()
    group: dict[str, list[float]] = {s: [] for s in SPLITS}
    for target in names:
        scores = _baseline_fit(emb, [b for b in names if b != target], target, alpha)
        for s in SPLITS:
            group[s].append(scores[s])
    phases["leave-one-out fits"] = [time.perf_counter() - clock, peak_rss_mib()]

    clock = time.perf_counter()
    pairwise = {s: [[math.nan] * m for _ in range(m)] for s in SPLITS}
    for i, target in enumerate(names):
        for j, basis in enumerate(names):
            if i != j:
                scores = _baseline_fit(emb, [basis], target, alpha)
                for s in SPLITS:
                    pairwise[s][i][j] = scores[s]
    phases["pairwise fits"] = [time.perf_counter() - clock, peak_rss_mib()]
    return {"phases": phases, "pairwise": pairwise, "group": group}


def contender(
    which: str, workdir: str, models: int, dim: int, seed: int, n_train: int, alpha: float
) -> Any:
    """Untimed: check the cache (every shard's checksum; leaves the shards in the page cache).
    The work: ``imports`` (nothing: the memory floor), ``baseline``, ``ours`` or
    ``ours-float64`` (float64 products)."""
    synth = Synthetic(models, dim, seed)
    write_embeddings(Path(workdir), synth, n_train)
    if which == "imports":
        return dict
    if which == "baseline":
        return lambda: run_baseline(Path(workdir), synth, n_train, alpha)
    products = "float64" if which == "ours-float64" else "float32"
    return lambda: run_ours(Path(workdir), synth, n_train, alpha, products)


def agreement(ours: dict[str, Any], base: dict[str, Any]) -> tuple[float, float, float]:
    """Max |difference| of pairwise R^2, of group R^2 (all splits), and the lowest R^2 seen."""
    p_ours = np.array([ours["pairwise"][s] for s in SPLITS], dtype=float)
    p_base = np.array([base["pairwise"][s] for s in SPLITS], dtype=float)
    if not np.array_equal(np.isnan(p_ours), np.isnan(p_base)):
        raise SystemExit("FAILED: pairwise R^2 tables have NaNs in different places")
    g_ours = np.array([ours["group"][s] for s in SPLITS], dtype=float)
    g_base = np.array([base["group"][s] for s in SPLITS], dtype=float)
    return (
        float(np.nanmax(np.abs(p_ours - p_base))),
        float(np.max(np.abs(g_ours - g_base))),
        float(np.nanmin(p_ours)),
    )


def measure_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    clock = time.perf_counter()
    synth = Synthetic(args.models, args.dim, args.seed)
    row: dict[str, Any] = {"n": n, "disk_mib": write_embeddings(args.workdir, synth, n)}
    print(f"[n_train={n}] cache: {row['disk_mib']:.0f} MiB in {time.perf_counter() - clock:.0f} s")
    kwargs = {"workdir": str(args.workdir), "models": args.models, "dim": args.dim}
    kwargs |= {"seed": args.seed, "n_train": n, "alpha": args.alpha}
    for which in ("imports", "baseline", "ours", "ours-float64"):
        call = lambda w=which: run_contender("bench_solver:contender", {"which": w, **kwargs})  # noqa: E731
        attempts = args.attempts if which in ("baseline", "ours") else 1
        row[which] = fastest(call, attempts, label=f"n_train={n} {which}")
    diffs = agreement(row["ours"]["output"], row["baseline"]["output"])
    row["diff_pairwise"], row["diff_group"], row["r2_min"] = diffs
    if max(diffs[:2]) > TOLERANCE:
        raise SystemExit(f"FAILED: ours and the baseline disagree on R^2 by {max(diffs[:2]):.2e}")
    row["diff_products"] = max(agreement(row["ours"]["output"], row["ours-float64"]["output"])[:2])
    if row["diff_products"] > PRODUCTS_TOLERANCE:
        raise SystemExit(f"FAILED: float32 products move R^2 by {row['diff_products']:.2e}")
    return row


def phases_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    names = ["load all embeddings", "stream shards into moments", "covariances"]
    names += ["pairwise fits", "leave-one-out fits"]
    out = []
    for r in rows:
        for who in ("baseline", "ours", "ours-float64"):
            phases = r[who]["output"]["phases"]
            cells = [
                f"{phases[k][0]:.1f} ({phases[k][1]:.0f})" if k in phases else "-" for k in names
            ]
            out.append([r["n"], who, *cells])
    return table(
        "Phases, seconds (peak RSS so far, MiB)", ["train spans", "contender", *names], out
    )


def utilisation_table(rows: list[dict[str, Any]], width: int, peak: float) -> dict[str, Any]:
    """The statistics pass (shards streamed into float32 Gram products accumulated in float64)
    against the float32 matrix-product peak measured in the same run."""
    out = []
    for r in rows:
        spans = sum(split_sizes(r["n"]).values())
        seconds = r["ours"]["output"]["phases"]["stream shards into moments"][0]
        flops = gram_flops(spans, width)
        rate = flops / seconds / 1e9
        out.append([r["n"], f"{spans:,}", f"{flops / 1e12:.2f}", round(seconds, 1), round(rate)])
        out[-1].append(f"{rate / peak:.0%}")
    return table(
        f"Utilisation of the statistics pass (float32 peak {peak:.0f} GFLOP/s, measured in this "
        f"run; FLOPs = {GRAM_FORMULA.replace('rows', 'spans')}, D = {width:,})",
        ["train spans", "spans, all splits", "TFLOP", "seconds", "GFLOP/s", "share of peak"],
        out,
    )


def save(
    rows: list[dict[str, Any]], args: argparse.Namespace, session: Session, peak: float
) -> None:
    d_total = args.models * args.dim

    def adjusted(r: dict[str, Any], who: str) -> float:
        return float(r[who]["work_peak_rss_mib"] - r["imports"]["work_peak_rss_mib"])

    figures, detail = [], []
    for r in rows:
        b, o, sizes = r["baseline"], r["ours"], split_sizes(r["n"])
        case = f"{sizes['train']:,} / {sizes['validation']:,} / {sizes['test']:,} spans"
        figures.append(
            figure(
                case,
                "s",
                b["seconds"],
                o["seconds"],
                peak_mib=(b["work_peak_rss_mib"], o["work_peak_rss_mib"]),
                others_share=(b["others_share"], o["others_share"]),
            )
        )
        detail.append(
            [
                r["n"],
                round(r["disk_mib"]),
                f"{b['own_cpu_s']:.0f} / {o['own_cpu_s']:.0f}",
                f"{b['own_cpu_s'] / o['own_cpu_s']:.1f}x",
                f"{adjusted(r, 'baseline'):.0f} / {adjusted(r, 'ours'):.0f}",
                f"{r['diff_pairwise']:.1e} / {r['diff_group']:.1e}",
                f"{r['ours-float64']['seconds']:.1f} ({adjusted(r, 'ours-float64'):.0f})",
                f"{r['diff_products']:.1e}",
            ]
        )
    speed = [r["baseline"]["seconds"] / r["ours"]["seconds"] for r in rows]
    memory = [adjusted(r, "ours") / adjusted(r, "baseline") for r in rows]
    notes = [
        "Peak RSS is the contender's peak after the untimed cache check; adjusted = minus the "
        f"same for an interpreter that only imports the libraries "
        f"({rows[0]['imports']['work_peak_rss_mib']:.0f} MiB).",
        f"Pairwise R^2 of the synthetic models ranges from {rows[0]['r2_min']:.2f} upwards.",
    ]
    if len(rows) >= 2:
        a, z = rows[0], rows[-1]
        slope = {
            w: (z[w]["seconds"] - a[w]["seconds"]) / (z["n"] - a["n"]) for w in ("baseline", "ours")
        }
        growth = "; ".join(
            f"{w} {z[w]['seconds'] / a[w]['seconds']:.2f}x the time, adjusted peak "
            f"{adjusted(a, w):.0f} -> {adjusted(z, w):.0f} MiB"
            for w in ("baseline", "ours")
        )
        notes.append(f"{z['n'] / a['n']:.0f}x the spans: {growth}.")
        if min(slope.values()) > 0:
            notes.append(
                f"Per training span ours costs {1e3 * slope['ours']:.2f} ms (a Gram update of "
                f"the {d_total}-wide row, float32 products) and the baseline "
                f"{1e3 * slope['baseline']:.2f} ms, so the speed-up tends to "
                f"~{slope['baseline'] / slope['ours']:.0f}x as the spans grow."
            )
    session.save(
        __doc__,
        {
            "models": args.models,
            "hidden size": args.dim,
            "fits": args.models**2,
            "train spans": ", ".join(f"{r['n']:,}" for r in rows),
            "validation and test": "10% of train each",
            "alpha (absolute)": args.alpha,
        },
        figures,
        targets=[
            goal(
                f"speed-up >= {SPEED_TARGET:.0f}x",
                min(speed) >= SPEED_TARGET,
                ", ".join(f"{x:.1f}x" for x in speed),
            ),
            goal(
                "peak memory <= 1/5 of the baseline's (adjusted)",
                max(memory) <= MEMORY_TARGET,
                ", ".join(f"{x:.2f}" for x in memory),
            ),
            goal(
                f"R^2 of float32 products within {PRODUCTS_TOLERANCE:.0e} of float64 products",
                max(r["diff_products"] for r in rows) <= PRODUCTS_TOLERANCE,
                ", ".join(f"{r['diff_products']:.1e}" for r in rows),
            ),
        ],
        tables=[
            table(
                "Detail",
                [
                    "train spans",
                    "cache on disk (MiB)",
                    "CPU-s baseline / ours",
                    "speed-up in CPU time",
                    "adjusted peak RSS baseline / ours (MiB)",
                    "max abs diff R^2 pairwise / group",
                    "ours, float64 products: s (adjusted peak MiB)",
                    "max abs diff R^2 float32 vs float64 products",
                ],
                detail,
            ),
            phases_table(rows),
            utilisation_table(rows, d_total, peak),
        ],
        notes=notes,
        write=not args.no_write,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8000,32000", help="training spans, comma separated")
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--dim", type=int, default=384, help="hidden size of every model")
    parser.add_argument("--alpha", type=float, default=1e-2, help="absolute ridge alpha")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "_work" / "solver")
    parser.add_argument("--keep", action="store_true", help="keep the embedding caches")
    args = parse_args(parser, attempts=5)
    logging.basicConfig(level=logging.WARNING)
    session = Session(NAME, MEASURED)
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        rows = [measure_size(int(n), args) for n in args.sizes.split(",") if n.strip()]
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir / "embeddings", ignore_errors=True)
    peak = measure_peak(["float32"], torch.get_num_threads())["float32"]
    save(rows, args, session, peak)


if __name__ == "__main__":
    main()
