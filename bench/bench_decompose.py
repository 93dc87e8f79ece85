"""Decompose end to end: a cached `decompose` run vs the authors' per-fit solver in memory.

M synthetic models (default 12 x hidden 384) given as precomputed `.npy` files of the run's spans
plus the packaged MiniLM, which cuts the spans (16 tokens of the packaged English, French and
Spanish Wikipedia leads, at most 64 per document); an untimed first run
caches its embeddings and the spans. Baseline: the LMD authors' per-fit approach of
`bench_solver.py` (per fit the covariances recomputed from the rows, `torch.linalg.solve`,
predictions of every row) on all M + 1 models' embeddings already in memory: every leave-one-out
and pairwise fit. Ours: `run_decomposition`, what `lmalgebra decompose` runs without writing
outputs (spans, statistics, pairwise and group fits, adjusted R^2, shuffled nulls, CKA and CCA),
in an interpreter that has imported lmalgebra; and the whole command, `lmalgebra decompose RECIPE
--out DIR` as a user types it (process start, imports, the run, every output written; no figure,
as by default), whose time over the run's own is the fixed cost. R^2 must agree to 1e-4. Targets:
the whole command at least 15x the baseline at 32,000 training spans and 20x at 128,000, idle and
with ``--loaded`` (every contender, baseline and ours, beside one process spinning on one core:
another job on a shared two-core host; its "load" size says which).

    python bench/bench_decompose.py [--sizes 8000] [--models 12] [--dim 384] [--loaded] [--no-write]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench_solver import _baseline_fit
from harness import (
    Session,
    competing_process,
    fastest,
    figure,
    goal,
    parse_args,
    run_command,
    run_contender,
    table,
)
from lmalgebra.core.fingerprint import order_digest
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.lmd.measure import ModelPool, draw_texts
from lmalgebra.lmd.run.pipeline import run_decomposition
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.sources.corpus import read_documents
from synthetic import Synthetic

NAME = "bench_decompose"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/stats", "src/lmalgebra/storage")
TOLERANCE = 1e-4
TARGETS = {32_000: 15.0, 128_000: 20.0}  # the whole command's speed-up, by training spans
BENCH_DIR = Path(__file__).resolve().parent
SPAN_TOKENS = 16
# the packaged Wikipedia leads in three languages, up to 64 spans of each: about 230,000 spans
# of 16 tokens (English alone at 16 per document gives 46,000, short of 128,000 + 25,600)
CORPORA = ("package:wiki-en", "package:wiki-fr", "package:wiki-es")
PER_DOC = 64


def config_of(workdir: Path, synth: Synthetic, n_train: int) -> DecomposeConfig:
    """MiniLM first (its tokenizer cuts the spans), then the precomputed files."""
    files = [
        {"name": n, "path": str(_file(workdir, n_train, n)), "kind": "precomputed"}
        for n in synth.names()
    ]
    held_out = max(1, n_train // 10)
    return DecomposeConfig.model_validate(
        {
            "models": [{"name": "minilm", "path": "package:minilm"}, *files],
            "corpus": {"paths": list(CORPORA), "text_column": "extract"},
            "spans": {
                "length": SPAN_TOKENS,
                "counts": [n_train, held_out, held_out],
                "per_doc": PER_DOC,
            },
            "alpha_mode": "absolute",  # as the baseline: alpha 0.01 on every model's scale
            "cache_dir": str(workdir / "cache"),
            "progress": False,
        }
    )


def _file(workdir: Path, n_train: int, name: str) -> Path:
    return workdir / f"n{n_train}" / f"{name}.npy"


def prepare(workdir: Path, synth: Synthetic, n_train: int) -> dict[str, int]:
    """Write the precomputed files (rows of the run's spans, with their order digest) and fill
    MiniLM's cache with one untimed run; returns the spans per split."""
    config = config_of(workdir, synth, n_train)
    pool = ModelPool(config.model_copy(update={"models": config.models[:1]}))  # no files yet
    texts, _ = draw_texts(pool, read_documents(config.corpus), config.spans)
    counts = {s: len(texts[s]) for s in SPLITS}
    digest = order_digest(texts)
    for m, name in enumerate(synth.names()):
        path = _file(workdir, n_train, name)
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [synth.rows(m, s, 0, counts[s]) for s in SPLITS]
        np.save(path, np.vstack(rows))
        path.with_name(f"{path.name}.spans.sha256").write_text(digest + "\n")
    run_decomposition(config)
    return counts


def minilm_rows(config: DecomposeConfig) -> dict[str, np.ndarray]:
    """MiniLM's cached embeddings per split, read from the entries the run wrote."""
    pool = ModelPool(config)
    texts, hashes = draw_texts(pool, read_documents(config.corpus), config.spans)
    base = config.embed_spec()
    out = {}
    for split in SPLITS:
        key = {
            "model": "minilm",
            "fingerprint": pool.prints["minilm"],
            "spans": hashes[f"spans_{split}"],
            "layer": base.layer,
            "pooling": base.pooling,
            "dtype": base.dtype,
            "exclude_special": base.exclude_special,
            "max_length": base.max_length,
        }
        cache = EmbeddingCache(config.cache_dir / "embeddings", key, texts[split])
        out[split] = np.vstack(list(cache.chunks()))
    return out


# -- the two contenders (each in a fresh interpreter) ---------------------------------------
def run_ours(config: DecomposeConfig) -> dict[str, Any]:
    result = run_decomposition(config)
    return {
        "phases": dict(result.timings),
        "names": result.names,
        "pairwise": {s: result.pairwise[s].tolist() for s in SPLITS},
        "group": {s: [fit.r2[s] for fit in result.group] for s in SPLITS},
    }


def run_baseline(emb: dict[str, dict[str, Any]], names: list[str]) -> dict[str, Any]:
    """Every leave-one-out and pairwise fit from the rows, the authors' way."""
    m, alpha = len(names), 1e-2
    clock = time.perf_counter()
    group: dict[str, list[float]] = {s: [] for s in SPLITS}
    pairwise = {s: [[math.nan] * m for _ in range(m)] for s in SPLITS}
    for i, target in enumerate(names):
        scores = _baseline_fit(emb, [b for b in names if b != target], target, alpha)
        for s in SPLITS:
            group[s].append(scores[s])
        for j, basis in enumerate(names):
            if i != j:
                scores = _baseline_fit(emb, [basis], target, alpha)
                for s in SPLITS:
                    pairwise[s][i][j] = scores[s]
    phases = {"fits": time.perf_counter() - clock}
    return {"phases": phases, "names": names, "pairwise": pairwise, "group": group}


def contender(which: str, workdir: str, models: int, dim: int, seed: int, n_train: int) -> Any:
    """Untimed: the configuration (ours) or every embedding loaded into memory (baseline; torch
    is imported for it alone: ours computes without it)."""
    synth = Synthetic(models, dim, seed)
    config = config_of(Path(workdir), synth, n_train)
    if which == "imports":
        return dict
    if which == "ours":
        return lambda: run_ours(config)
    import torch

    emb: dict[str, dict[str, Any]] = {s: {} for s in SPLITS}
    for split, rows in minilm_rows(config).items():
        emb[split]["minilm"] = torch.from_numpy(rows)
    for name in synth.names():
        full = np.load(_file(Path(workdir), n_train, name))
        start = 0
        for split in SPLITS:
            count = len(emb[split]["minilm"])
            emb[split][name] = torch.from_numpy(np.ascontiguousarray(full[start : start + count]))
            start += count
    names = ["minilm", *synth.names()]
    return lambda: run_baseline(emb, names)


def run_whole_command(workdir: Path, synth: Synthetic, n_train: int, *flags: str) -> dict[str, Any]:
    """``lmalgebra decompose RECIPE --out DIR [flags]`` in a new process, timed from its start to
    its exit; ``run_seconds``: the run's own time as its summary.json records it (measure and
    analyse), the rest being process start, imports and outputs."""
    config = config_of(workdir, synth, n_train)
    recipe = workdir / f"n{n_train}" / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude={"out"})))
    with tempfile.TemporaryDirectory(dir=workdir) as scratch:
        out = Path(scratch) / "run"
        command = [sys.executable, "-m", "lmalgebra", "decompose", str(recipe), "--out", str(out)]
        command += flags
        result = run_command(command)
        summary = json.loads((out / "summary.json").read_text())
    seconds = summary["seconds"]
    result["run_seconds"] = seconds["measure"] + seconds["analyse"] + seconds.get("sweeps", 0.0)
    return result


def flop_ratio(models: int, dim: int, counts: dict[str, int]) -> float:
    """The baseline's floating-point operations over ours' (float64 ones counted twice: they run
    at half the float32 rate), from the sizes alone: the speed-up of a run that did nothing
    but its arithmetic, at the baseline's rate. Baseline, per fit: the basis covariance and
    cross-covariance from the training rows, an LU solve, predictions of every row. Ours: the
    Gram matrix of every split's rows (one triangle), the inverse, the held-out quadratic forms
    of the group fits, and per basis model one solve and its quadratic forms per split."""
    m, n, rows = models + 1, counts["train"], sum(counts.values())
    held_out = len(counts) - 1

    def fit(basis: int) -> float:
        return 2 * n * basis * (basis + dim) + 2 / 3 * basis**3 + 2 * rows * basis * dim

    baseline = m * fit((m - 1) * dim) + m * (m - 1) * fit(dim)
    big = m * dim
    float32 = rows * big * big
    float64 = big**3 * (1 + held_out) + m * (dim**3 / 3 + 2 * dim * dim * big * (1 + 3))
    return baseline / (float32 + 2 * float64)


def agreement(ours: dict[str, Any], base: dict[str, Any]) -> tuple[float, float]:
    """Max |difference| of pairwise and of group R^2 over all splits."""
    assert ours["names"] == base["names"], (ours["names"], base["names"])
    p = [np.array(x["pairwise"][s], dtype=float) for s in SPLITS for x in (ours, base)]
    g = [np.array(x["group"][s], dtype=float) for s in SPLITS for x in (ours, base)]
    pairwise = max(float(np.nanmax(np.abs(a - b))) for a, b in zip(p[::2], p[1::2], strict=True))
    group = max(float(np.max(np.abs(a - b))) for a, b in zip(g[::2], g[1::2], strict=True))
    return pairwise, group


def beside_load(run: Callable[[], dict[str, Any]], loaded: bool) -> Callable[[], dict[str, Any]]:
    """``run``, with ``loaded`` beside one process spinning on one core while it runs (started
    after ``fastest``'s wait for an idle machine)."""

    def measured() -> dict[str, Any]:
        with competing_process() if loaded else contextlib.nullcontext():
            return run()

    return measured


def measure_size(n: int, args: argparse.Namespace) -> dict[str, Any]:
    clock = time.perf_counter()
    synth = Synthetic(args.models, args.dim, args.seed)
    row: dict[str, Any] = {"n": n, "counts": prepare(args.workdir, synth, n)}
    print(f"[n_train={n}] prepared in {time.perf_counter() - clock:.0f} s", flush=True)
    kwargs = {"workdir": str(args.workdir), "models": args.models, "dim": args.dim}
    kwargs |= {"seed": args.seed, "n_train": n}
    for which in ("imports", "baseline", "ours"):
        call = lambda w=which: run_contender("bench_decompose:contender", {"which": w, **kwargs})  # noqa: E731
        attempts = 1 if which == "imports" else args.attempts
        row[which] = fastest(beside_load(call, args.loaded), attempts, label=f"n_train={n} {which}")
    whole = lambda: run_whole_command(args.workdir, synth, n)  # noqa: E731
    row["command"] = fastest(
        beside_load(whole, args.loaded), args.attempts, label=f"n_train={n} command"
    )
    kept = lambda: run_whole_command(args.workdir, synth, n, "--save_statistics")  # noqa: E731
    row["command_statistics"] = fastest(
        beside_load(kept, args.loaded), args.attempts, label=f"n_train={n} command + statistics"
    )
    row["diff_pairwise"], row["diff_group"] = agreement(
        row["ours"]["output"], row["baseline"]["output"]
    )
    if max(row["diff_pairwise"], row["diff_group"]) > TOLERANCE:
        raise SystemExit(f"FAILED: ours and the baseline disagree on R^2 ({row['diff_group']:.2e})")
    return row


RATE_N = 4096


def product_rates() -> dict[str, float]:
    """GFLOP/s of one ``RATE_N``-square product, best of three, by torch and by NumPy."""
    import torch

    rates: dict[str, float] = {"threads": torch.get_num_threads()}
    for dtype in ("float32", "float64"):
        a = np.random.default_rng(0).standard_normal((RATE_N, RATE_N)).astype(dtype)
        for name, left in (("torch", torch.from_numpy(a)), ("numpy", a)):
            best = math.inf
            for _ in range(3):
                clock = time.perf_counter()
                left @ left
                best = min(best, time.perf_counter() - clock)
            rates[f"{name} {dtype}"] = 2 * RATE_N**3 / best / 1e9
    return rates


def save(rows: list[dict[str, Any]], args: argparse.Namespace, session: Session) -> None:
    rates = product_rates()
    figures, detail, targets = [], [], []
    for r in rows:
        b, o, w, c = r["baseline"], r["ours"], r["command"], r["counts"]
        case = f"{c['train']:,} / {c['validation']:,} / {c['test']:,} spans"
        mine_all = (
            ("run", o),
            ("whole command", w),
            ("whole command, --save_statistics", r["command_statistics"]),
        )
        for label, mine in mine_all:
            peak = mine.get("work_peak_rss_mib", mine.get("peak_rss_mib", math.nan))
            figures.append(
                figure(
                    f"{case}, {label}",
                    "s",
                    b["seconds"],
                    mine["seconds"],
                    peak_mib=(b["work_peak_rss_mib"], peak),
                    others_share=(b["others_share"], mine["others_share"]),
                )
            )
        ceiling = flop_ratio(args.models, args.dim, c)
        wanted = TARGETS.get(c["train"])
        ratio = b["seconds"] / w["seconds"]
        if wanted is not None:
            what = f"whole command >= {wanted:.0f}x the baseline at {c['train']:,} training spans"
            targets.append(goal(what, ratio >= wanted, f"{ratio:.1f}x"))
        phases = o["output"]["phases"]
        fixed = w["seconds"] - w["run_seconds"]
        detail.append(
            [
                f"{c['train']:,}",
                f"{b['own_cpu_s']:.0f} / {o['own_cpu_s']:.0f}",
                f"{phases['measure']:.1f}",
                f"{phases['analyse']:.1f}",
                " / ".join(
                    f"{phases.get(f'analyse: {part}', math.nan):.1f}"
                    for part in ("fits", "fit rows", "nulls", "similarity")
                ),
                f"{w['seconds']:.1f} / {w['run_seconds']:.1f} / {fixed:.1f}",
                f"{r['diff_pairwise']:.1e} / {r['diff_group']:.1e}",
                f"{ceiling:.1f}x",
            ]
        )
    session.save(
        __doc__,
        {
            "models": f"{args.models} precomputed + MiniLM",
            "hidden size": args.dim,
            "fits": (args.models + 1) ** 2,
            "train spans": ", ".join(f"{r['n']:,}" for r in rows),
            "span length": SPAN_TOKENS,
            "corpus": ", ".join(CORPORA) + f" (at most {PER_DOC} spans per document)",
            "alpha (absolute)": 0.01,
            "load": "one competing process" if args.loaded else "idle",
        },
        figures,
        targets=targets,
        tables=[
            table(
                "Detail",
                [
                    "train spans",
                    "CPU-s baseline / ours",
                    "ours: measure (s)",
                    "ours: analyse (s)",
                    "of which fits / fit rows / nulls / similarity (s)",
                    "whole command / its run / fixed cost (s)",
                    "max abs diff R^2 pairwise / group",
                    "FLOP ratio baseline / ours",
                ],
                detail,
            )
        ],
        notes=[
            "Ours' measure phase reads the corpus, reads the spans back from the span cache "
            "(sha256 of every span text checked; the tokenizer is neither loaded nor run), "
            "checks the precomputed files against them, reads MiniLM's cached shards (sha256 of "
            "each) and streams every split into statistics; analyse is every fit, the nulls and "
            "the similarities.",
            "The fits are every pairwise fit (one Cholesky per basis model) and every group fit "
            "(one D x D inverse, held-out residuals as quadratic forms of its rows: about D^3 "
            "float64 flops per held-out split); similarity is CKA and CCA of every pair per split "
            "(an eigendecomposition per model and split, then one per pair).",
            "The whole command's fixed cost is its time outside the run's measure and analyse "
            "phases: process start and imports (NumPy, SciPy, pandas; neither torch, transformers "
            "nor matplotlib, which a cached run without figures does not import), checking the "
            "output directory, and "
            "writing the outputs (the tables). With --save_statistics (not the default) the "
            "three splits' statistics are written too, as safetensors (D x D float64 each, "
            "190 MiB at D = 4,992, each file fsynced), by a thread during the analysis (its CPU "
            "time, mostly the kernel's, slows the fits): the third figure.",
            "The baseline's time counts the fits only: its embeddings are loaded untimed.",
            "FLOP ratio: the baseline's floating-point operations over ours' (float64 counted "
            "twice), from the sizes (`flop_ratio`): the speed-up of a run that spent nothing "
            "outside its arithmetic, at the baseline's rate. Where both sides' BLAS run at the "
            "same rate, a speed-up near it leaves little to cut but arithmetic.",
            f"Matrix product rates measured in this run (GFLOP/s, {rates['threads']} threads, "
            f"{RATE_N:,}-square products): float32 torch {rates['torch float32']:.0f} / NumPy "
            f"{rates['numpy float32']:.0f}, float64 torch {rates['torch float64']:.0f} / NumPy "
            f"{rates['numpy float64']:.0f}. The baseline's products are torch's (Intel MKL in "
            "its CPU wheels, which runs its AVX2 code on AMD CPUs); every product and "
            "factorisation of ours is NumPy's or SciPy's (OpenBLAS, the kernels the machine line "
            "names; two libraries, two thread pools: the statistics pass and the D x D inverse "
            "SciPy's, every loop over models NumPy's alone).",
        ],
        write=not args.no_write,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="8000", help="training spans, comma separated")
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--dim", type=int, default=384, help="hidden size of every model")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", type=Path, default=BENCH_DIR / "_work" / "decompose")
    parser.add_argument("--keep", action="store_true", help="keep the files and the cache")
    parser.add_argument(
        "--loaded", action="store_true", help="every contender beside one spinning process"
    )
    args = parse_args(parser, attempts=3)
    logging.basicConfig(level=logging.WARNING)
    session = Session(NAME, MEASURED)
    args.workdir.mkdir(parents=True, exist_ok=True)
    try:
        rows = [measure_size(int(n), args) for n in args.sizes.split(",") if n.strip()]
    finally:
        if not args.keep:
            shutil.rmtree(args.workdir, ignore_errors=True)
    save(rows, args, session)


if __name__ == "__main__":
    main()
