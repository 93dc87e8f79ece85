"""Solver benchmark: every pairwise and leave-one-out fit of M models, from cached embeddings.

Target: >= 20x faster end to end than recomputing covariances from raw embeddings for each fit
(the approach of the LMD paper's code), with peak memory independent of the number of spans and
<= 1/5 of the baseline's.

Synthetic embeddings with realistic structure (a shared latent, per-family latents, a private
latent and isotropic noise per model, large per-coordinate offsets including a few outlier
coordinates) are first written with ``lmalgebra``'s own embedding cache (checksummed safetensors
shards of 2048 rows), exactly as a decomposition run leaves them. Then, for each size, three
fresh interpreters run one after the other:

* ``imports``: imports the same libraries and stops (the memory floor),
* ``baseline``: loads every model's embeddings of every split into memory (float32 torch tensors,
  one per model and split, as the authors' code holds them) and, for each of the M leave-one-out
  group fits and the M(M-1) ordered pairs, concatenates the basis, recomputes means and
  covariances, solves the ridge normal equations and scores train/validation/test by predicting
  every row (pooled R^2 = 1 - SSE/SST, SST around each split's own mean),
* ``ours``: streams the shards into ``SecondMoments`` per split (``measure.accumulate``) and runs
  ``Decomposer.pairwise`` and ``Decomposer.leave_one_out``, as ``run_decomposition`` does.

Both use the same absolute ridge alpha; R^2 must agree to 1e-4 or the script exits with an error.

    python bench/bench_solver.py [--sizes 8000,32000] [--models 12] [--dim 384]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from benchlib import (
    CpuWatch,
    changed_sources,
    code_version,
    machine,
    peak_rss_mib,
    reset_peak_rss,
    rss_mib,
    source_digest,
    utc_date,
    wait_for_idle,
    write_section,
)
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.embed import TokenReport
from lmalgebra.lmd.embedding_cache import EmbeddingCache
from lmalgebra.lmd.measure import Source, accumulate
from lmalgebra.stats.solver import Decomposer, SplitMoments
from synthetic import Synthetic, split_sizes

SECTION = "bench_solver"
TOLERANCE = 1e-4
SPEED_TARGET = 20.0
MEMORY_TARGET = 1 / 5
CONTAMINATED = 0.05  # share of all CPUs used by other processes above which a run is repeated
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
                "bench": SECTION,
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


# -- the two contenders (run in child processes) ----------------------------------------------
def run_ours(workdir: Path, synth: Synthetic, n_train: int, alpha: float) -> dict[str, Any]:
    """Stream shards into second moments, then every fit in closed form (as the pipeline does)."""
    phases: dict[str, list[float]] = {}  # name -> [seconds, peak RSS so far (MiB)]
    clock = time.perf_counter()
    caches = open_caches(workdir, synth, n_train)
    names = synth.names()
    flat = [caches[name][split] for name in names for split in SPLITS]
    rows = {split: len(caches[names[0]][split].texts) for split in SPLITS}
    blocked, _ = accumulate(flat, [Source(n) for n in names], rows, {})  # type: ignore[arg-type]
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


def child(args: argparse.Namespace) -> None:
    """One measured run in this (fresh) interpreter; writes a JSON result."""
    synth = Synthetic(args.models, args.dim, args.seed)
    # Untimed: make sure the cache is complete for the code imported here (a no-op that checks
    # every shard's checksum, which also leaves every shard in the page cache), then start the
    # peak-RSS mark afresh.
    write_embeddings(args.workdir, synth, args.size)
    reset_peak_rss()
    rss_start = rss_mib()
    watch = CpuWatch()
    clock = time.perf_counter()
    if args.which == "imports":
        result: dict[str, Any] = {}
    elif args.which == "ours":
        result = run_ours(args.workdir, synth, args.size, args.alpha)
    else:
        result = run_baseline(args.workdir, synth, args.size, args.alpha)
    result["seconds"] = time.perf_counter() - clock
    result["cpu"] = watch.stop()
    result["rss_start_mib"] = rss_start
    result["peak_rss_mib"] = peak_rss_mib()
    args.result.write_text(json.dumps(result))


# -- the driver -------------------------------------------------------------------------------
def measure(which: str, n_train: int, args: argparse.Namespace) -> dict[str, Any]:
    """Run one contender in a fresh interpreter on an idle machine; retry when other processes
    took a noticeable share of the CPUs meanwhile, keeping the fastest attempt."""
    best: dict[str, Any] | None = None
    for attempt in range(1 + args.retries):
        wait_for_idle()
        result = _measure_once(which, n_train, args)
        result["attempts"] = attempt + 1
        if best is None or result["seconds"] < best["seconds"]:
            best = result
        cpu = result["cpu"]
        if which == "imports" or cpu["others_share"] <= CONTAMINATED or cpu["others_cpu_s"] < 1:
            break
        print(
            f"  other processes took {100 * result['cpu']['others_share']:.0f}% of the CPUs; "
            "measuring again",
            flush=True,
        )
    assert best is not None
    return best


def _measure_once(which: str, n_train: int, args: argparse.Namespace) -> dict[str, Any]:
    out = args.workdir / f"result-{which}-{n_train}.json"
    out.unlink(missing_ok=True)
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--which",
        which,
        "--size",
        str(n_train),
        "--models",
        str(args.models),
        "--dim",
        str(args.dim),
        "--alpha",
        repr(args.alpha),
        "--seed",
        str(args.seed),
        "--workdir",
        str(args.workdir),
        "--result",
        str(out),
    ]
    subprocess.run(command, check=True)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def agreement(ours: dict[str, Any], base: dict[str, Any]) -> tuple[float, float, float]:
    """Max |difference| of pairwise R^2, of group R^2 (all splits), and the R^2 range seen."""
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


def report(
    rows: list[dict[str, Any]],
    args: argparse.Namespace,
    seconds: float,
    version_start: str,
    digest_start: dict[str, str],
) -> str:
    d_total = args.models * args.dim
    fits = args.models + args.models * (args.models - 1)
    lines = [
        "## Solver: all pairwise and leave-one-out fits from cached embeddings",
        "",
        f"- Date: {utc_date()}",
        f"- Machine: {machine()}",
        f"- Code: {version_start}",
        f"- Workload: {args.models} models x hidden size {args.dim} (D = {d_total}), {fits} fits "
        f"({args.models} leave-one-out + {args.models * (args.models - 1)} ordered pairs), "
        f"R^2 on train/validation/test; ridge alpha = {args.alpha:g} (absolute) in both.",
        "- Data: synthetic float32 embeddings (shared + family + private latents, noise, large "
        "offsets with outlier coordinates), written first with `EmbeddingCache` (checksummed "
        "safetensors shards of 2048 rows); validation and test are 10% of train each. Both "
        "contenders read the same shards through `EmbeddingCache.chunks` (page cache warm).",
        "- Baseline (in this script, after the LMD paper's code): every embedding in memory as "
        "float32 torch tensors; per fit `torch.cat` of the basis, means, centred covariances "
        "recomputed from the rows, `torch.linalg.solve`, then predictions of every row of every "
        "split for SSE and SST. Unlike the paper's code it centres and fits a bias, so that it "
        "computes the same quantity as ours.",
        "- Ours: `measure.accumulate` (shards -> `SecondMoments` per split, float64), "
        "`SplitMoments.of(..., in_place=True)`, `Decomposer.pairwise()` and "
        "`Decomposer.leave_one_out()`, as `run_decomposition` does.",
        "- Each contender runs in a fresh interpreter, on an idle machine (the script waits for "
        "one and measures again, keeping the fastest attempt, when other processes took more "
        f"than {100 * CONTAMINATED:.0f}% of the CPUs during a run); time is wall-clock from "
        "after the imports and an untimed check of the cache to the last R^2. Peak memory is "
        "the process's peak RSS (`VmHWM`, reset after that check): *raw*, and *adjusted* = raw "
        "minus the same figure for an interpreter that only imports the same libraries.",
        "",
        "| train / val / test spans | cache on disk | baseline wall (CPU) | ours wall (CPU) "
        "| speed-up wall (CPU) | baseline peak RSS raw (adj.) | ours peak RSS raw (adj.) "
        "| memory ours/baseline raw (adj.) | max abs diff R^2 pairwise / group |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        sizes = split_sizes(r["n"])
        floor = r["imports"]["peak_rss_mib"]
        b, o = r["baseline"], r["ours"]
        b_adj, o_adj = b["peak_rss_mib"] - floor, o["peak_rss_mib"] - floor
        lines.append(
            f"| {sizes['train']} / {sizes['validation']} / {sizes['test']} "
            f"| {r['disk_mib']:.0f} MiB "
            f"| {b['seconds']:.1f} s ({b['cpu']['own_cpu_s']:.0f} CPU-s) "
            f"| {o['seconds']:.1f} s ({o['cpu']['own_cpu_s']:.0f} CPU-s) "
            f"| **{b['seconds'] / o['seconds']:.1f}x** "
            f"({b['cpu']['own_cpu_s'] / o['cpu']['own_cpu_s']:.1f}x) "
            f"| {b['peak_rss_mib']:.0f} MiB ({b_adj:.0f}) "
            f"| {o['peak_rss_mib']:.0f} MiB ({o_adj:.0f}) "
            f"| {o['peak_rss_mib'] / b['peak_rss_mib']:.2f} ({o_adj / b_adj:.2f}) "
            f"| {r['diff_pairwise']:.1e} / {r['diff_group']:.1e} |"
        )
    lines += ["", "Phases: seconds (peak RSS of the process so far):", ""]
    for r in rows:
        for who in ("baseline", "ours"):
            parts = ", ".join(
                f"{k} {sec:.1f} s ({peak:.0f} MiB)" for k, (sec, peak) in r[who]["phases"].items()
            )
            lines.append(f"- n_train = {r['n']}, {who}: {parts}")
    lines.append(
        f"- Import-only interpreter: peak RSS {rows[0]['imports']['peak_rss_mib']:.0f} MiB."
    )
    worst = 0.0
    for r in rows:
        for who in ("baseline", "ours"):
            cpu = r[who]["cpu"]
            worst = max(worst, cpu["others_share"])
            lines.append(
                f"- n_train = {r['n']}, {who}: {cpu['own_cpu_s']:.0f} CPU-s of its own "
                f"({cpu['own_cpu_s'] / r[who]['seconds']:.2f} cores busy on average); other "
                f"processes took {cpu['others_cpu_s']:.0f} CPU-s "
                f"({100 * cpu['others_share']:.0f}% of the machine) meanwhile."
            )
    if worst > CONTAMINATED:
        lines.append(
            f"- **Warning**: other processes used up to {100 * worst:.0f}% of the CPUs during a "
            "measured run; its time is inflated accordingly."
        )
    changed = changed_sources(digest_start)
    if changed:
        lines.append(
            "- **Warning**: source files changed while the benchmark ran (later measurements "
            f"may use the new code): {', '.join(changed)}."
        )
    lines.append(
        f"- Pairwise R^2 of the synthetic models ranges from {rows[0]['r2_min']:.2f} upwards "
        "(targets differ, so the fits are not trivial)."
    )

    # growth and verdicts
    lines += ["", "How cost grows with the number of spans:", ""]
    if len(rows) >= 2:
        a, z = rows[0], rows[-1]
        grow = z["n"] / a["n"]
        for who in ("baseline", "ours"):
            t = z[who]["seconds"] / a[who]["seconds"]
            mem_a = a[who]["peak_rss_mib"] - a["imports"]["peak_rss_mib"]
            mem_z = z[who]["peak_rss_mib"] - z["imports"]["peak_rss_mib"]
            lines.append(
                f"- {who}: {grow:.0f}x the spans -> {t:.2f}x the time, adjusted peak memory "
                f"{mem_a:.0f} -> {mem_z:.0f} MiB ({mem_z / mem_a:.2f}x)."
            )
    speed = [r["baseline"]["seconds"] / r["ours"]["seconds"] for r in rows]
    mem = [
        (r["ours"]["peak_rss_mib"] - r["imports"]["peak_rss_mib"])
        / (r["baseline"]["peak_rss_mib"] - r["imports"]["peak_rss_mib"])
        for r in rows
    ]
    ours_adj = [r["ours"]["peak_rss_mib"] - r["imports"]["peak_rss_mib"] for r in rows]
    speed_ok = min(speed) >= SPEED_TARGET
    mem_ok = max(mem) <= MEMORY_TARGET
    lines += [
        "",
        "Targets:",
        "",
        f"- Speed >= {SPEED_TARGET:.0f}x: **{'met' if speed_ok else 'NOT met'}** "
        f"({', '.join(f'{s:.1f}x' for s in speed)}).",
        "- Peak memory independent of the number of spans: ours adjusted "
        + ", ".join(f"{o:.0f}" for o in ours_adj)
        + " MiB.",
        f"- Peak memory <= 1/5 of the baseline's (adjusted): **{'met' if mem_ok else 'NOT met'}** "
        f"({', '.join(f'{x:.2f}' for x in mem)}).",
    ]
    if len(rows) >= 2 and not (speed_ok and mem_ok):
        lines += ["", "Why (extrapolated linearly from the two sizes):", ""]
        lines += explain(rows, args, speed_ok, mem_ok)
    lines += [
        "",
        f"Total benchmark wall time {seconds / 60:.1f} min (including writing the caches).",
    ]
    return "\n".join(lines)


def explain(
    rows: list[dict[str, Any]], args: argparse.Namespace, speed_ok: bool, mem_ok: bool
) -> list[str]:
    """Why a target is missed: fixed vs per-span cost, and where the memory goes."""
    a, z = rows[0], rows[-1]
    dn = z["n"] - a["n"]
    slope = {w: (z[w]["seconds"] - a[w]["seconds"]) / dn for w in ("baseline", "ours")}
    dim = args.models * args.dim
    lines = []
    if not speed_ok:
        phases = z["ours"]["phases"]
        stream = phases["stream shards into moments"][0]
        fixed = sum(sec for name, (sec, _) in phases.items() if "stream" not in name)
        rows_total = sum(split_sizes(z["n"]).values())
        gflops = rows_total * dim * (dim + 1) / stream / 1e9
        limit = slope["baseline"] / slope["ours"] if slope["ours"] > 0 else math.inf
        at = 128_000
        ratio_at = (a["baseline"]["seconds"] + slope["baseline"] * (at - a["n"])) / (
            a["ours"]["seconds"] + slope["ours"] * (at - a["n"])
        )
        lines += [
            f"- Ours has a fixed cost: at n_train = {z['n']} it spends {fixed:.1f} s of "
            f"{z['ours']['seconds']:.1f} s in covariances and fits, which depend on D = {dim} "
            "and the number of models but not on the number of spans; that cost is what limits "
            f"the speed-up at small sizes.",
            f"- Per training span (held-out splits included), ours costs "
            f"{1e3 * slope['ours']:.2f} ms (one float64 Gram update of the {dim}-wide "
            f"concatenation; streaming ran at ~{gflops:.0f} GFLOP/s counting D(D+1) flops per "
            f"row, about the float64 matrix-multiply rate of these cores) and the baseline "
            f"{1e3 * slope['baseline']:.2f} ms ({args.models} float32 Gram products of "
            f"{dim - args.dim} columns plus {args.models * (args.models - 1)} pair fits and "
            "their predictions). The speed-up therefore tends to "
            f"~{limit:.0f}x as the number of spans grows (~{ratio_at:.0f}x at {at:,} training "
            f"spans): below {SPEED_TARGET:.0f}x on this CPU at any size, unless the per-span "
            "Gram work gets cheaper (e.g. float32 products of shift-centred chunks accumulated "
            "in float64, or an accelerator).",
        ]
    if not mem_ok:
        floor = z["imports"]["peak_rss_mib"]
        ours = z["ours"]["peak_rss_mib"] - floor
        matrix = dim * dim * 8 / 2**20
        mem_slope = (
            (z["baseline"]["peak_rss_mib"] - a["baseline"]["peak_rss_mib"]) / dn if dn else math.nan
        )
        base_a = a["baseline"]["peak_rss_mib"] - a["imports"]["peak_rss_mib"]
        needed = a["n"] + (ours / MEMORY_TARGET - base_a) / mem_slope if mem_slope > 0 else math.nan
        lines += [
            f"- Ours' peak ({ours:.0f} MiB adjusted) is about {ours / matrix:.1f} D x D float64 "
            f"matrices ({matrix:.0f} MiB each at D = {dim}): one covariance per split (3) plus "
            "the solver's working set (Cholesky factor and inverse of the leave-one-out "
            "system); it does not grow with the spans. The baseline holds the raw float32 "
            f"embeddings and a concatenated copy of a basis, ~{1e3 * mem_slope:.0f} MiB per "
            f"1,000 training spans, so ours reaches 1/5 of it only from ~{needed:,.0f} training "
            f"spans at this D (or less if ours' working set shrinks, e.g. an in-place "
            "Cholesky inverse).",
        ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8000,32000", help="training spans, comma separated")
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--dim", type=int, default=384, help="hidden size of every model")
    parser.add_argument("--alpha", type=float, default=1e-2, help="absolute ridge alpha")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--workdir", type=Path, default=BENCH_DIR / "_work" / "solver", help="cache location"
    )
    parser.add_argument("--keep", action="store_true", help="keep the embedding caches")
    parser.add_argument(
        "--retries", type=int, default=4, help="extra attempts when other processes interfere"
    )
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    # internal: one measured run in a child process
    parser.add_argument("--which", choices=["imports", "baseline", "ours"], help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.which:
        child(args)
        return

    started = time.perf_counter()
    version, digest = code_version(), source_digest()
    synth = Synthetic(args.models, args.dim, args.seed)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    args.workdir.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for n in sizes:
            clock = time.perf_counter()
            disk = write_embeddings(args.workdir, synth, n)
            print(
                f"[n_train={n}] cache written: {disk:.0f} MiB in {time.perf_counter() - clock:.0f}"
                " s",
                flush=True,
            )
            row: dict[str, Any] = {"n": n, "disk_mib": disk}
            for which in ("imports", "baseline", "ours"):
                row[which] = measure(which, n, args)
                print(
                    f"[n_train={n}] {which}: {row[which]['seconds']:.1f} s, "
                    f"peak RSS {row[which]['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
            row["diff_pairwise"], row["diff_group"], row["r2_min"] = agreement(
                row["ours"], row["baseline"]
            )
            print(
                f"[n_train={n}] speed-up {row['baseline']['seconds'] / row['ours']['seconds']:.1f}x"
                f"; max abs R^2 difference pairwise {row['diff_pairwise']:.2e}, "
                f"group {row['diff_group']:.2e}",
                flush=True,
            )
            if max(row["diff_pairwise"], row["diff_group"]) > TOLERANCE:
                raise SystemExit(
                    f"FAILED: ours and the baseline disagree on R^2 by more than {TOLERANCE:g} "
                    f"(pairwise {row['diff_pairwise']:.2e}, group {row['diff_group']:.2e})"
                )
            rows.append(row)
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir / "embeddings", ignore_errors=True)
    (args.workdir / "results.json").write_text(json.dumps(rows, indent=1))
    text = report(rows, args, time.perf_counter() - started, version, digest)
    print(text)
    if not args.no_write:
        write_section(SECTION, text)


if __name__ == "__main__":
    main()
