"""LMD at the width of LLMs: exact and reduced decompositions of many 4,096-wide models.

Synthetic embeddings with realistic spectra (``wide_synthetic.py``: power-law latents shared by
all models, by families and private to each, seen through each model's own random map, a noise
floor and rogue columns; 99% of a model's variance in about 80% of its directions, as measured on
MiniLM) are written as precomputed ``.npy`` files of the spans of a synthetic corpus, and
``lmalgebra.decompose`` runs on them, each run in a fresh interpreter: peak RSS, wall time, own CPU
time. Parts: ``accuracy`` compares every pairwise and group R^2 of the reduced and sketch methods
at several k, and of float32 statistics, with the exact float64 method at a size where it fits;
``scaling`` times exact and reduced runs against D (models x width) and against the spans
(plotted log-log); ``full`` runs 12 and 24 models of width 4,096 at 100,000 training spans.
Every run uses relative alpha 1.0 (``--alpha``) and leaves CKA and CCA out
(``--no-similarity``; they cost an eigendecomposition per model and split): at the default
alpha 0.01 the exact group fits of 3 to 23 bases of 4,096 columns over-learn 100,000 training
spans, and a reduced basis, which regularises, scores higher on held-out spans than the exact one
(part ``regime``: 4 x 1,024 at 20,000 spans, alpha 0.01 and 1.0). Targets: 12 x 4,096 in at
most 16 GB and 30 minutes on 2 cores with every R^2 within 0.005 of exact; 24 x 4,096 runs to the
end. The dry run's predicted peak and time stand beside each measurement. Each invocation runs
its parts and keeps the others' last measurements (``bench/results/wide/*.json``); files live
under ``bench/_work/wide``.

    python bench/bench_wide.py [--parts accuracy,scaling,full] [--quick] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from harness import (
    BENCH,
    Session,
    code_version,
    fastest,
    measure_work,
    parse_args,
    run_contender,
)
from lmalgebra.core.fingerprint import plain  # NaN as null: strict JSON readers refuse NaN
from lmalgebra.core.splits import SPLITS
from wide_report import differences, label, record
from wide_synthetic import WideSpectra, corpus

NAME = "bench_wide"
MEASURED = ("src/lmalgebra/lmd", "src/lmalgebra/stats")
WORK = BENCH / "_work" / "wide"
DATA = BENCH / "results" / "wide"
SPAN_TOKENS = 16
PER_DOC = 40
WORDS = 400  # per document: about 30 spans of 16 tokens

SIZES: dict[str, dict[str, Any]] = {
    "full": {
        "accuracy": {
            "models": 4,
            "width": 4096,
            "train": 100_000,
            "ks": [1024, 2048, 3072],
            "float32": 2048,
            "sketch": [2048],
        },
        "scaling_d": {"width": 1024, "models": [2, 4, 8, 16], "train": 20_000, "k": 256},
        "scaling_n": {"width": 1024, "models": 4, "train": [10_000, 20_000, 40_000, 80_000]},
        "full": {"width": 4096, "models": [12, 24], "train": 100_000},
        "regime": {"width": 1024, "models": 4, "train": 20_000, "k": 512, "alphas": [0.01, 1.0]},
    },
    "quick": {
        "accuracy": {
            "models": 3,
            "width": 48,
            "train": 1500,
            "ks": [24, 48],
            "float32": None,
            "sketch": [48],
        },
        "scaling_d": {"width": 32, "models": [2, 3], "train": 1500, "k": 8},
        "scaling_n": {"width": 32, "models": 2, "train": [800, 1500]},
        "full": {"width": 48, "models": [3], "train": 1500},
        "regime": {"width": 32, "models": 3, "train": 1500, "k": 16, "alphas": [0.01, 1.0]},
    },
}


def counts(train: int) -> dict[str, int]:
    held_out = max(1, train // 10)
    return {"train": train, "validation": held_out, "test": held_out}


def prepared(work: Path, width: int, models: int, train: int) -> tuple[list[str], list[Path]]:
    """The corpus and the first ``models`` files of ``width`` at ``train`` spans (written once,
    under ``work``)."""
    import lmalgebra

    folder = work / f"w{width}-n{train}"
    texts = corpus(documents=train // 20 + 200, words=WORDS)
    marker = folder / "spans.json"
    if marker.is_file():
        found = json.loads(marker.read_text())
    else:
        table = lmalgebra.spans(
            {}, texts, **shape(train), reference_tokenizer="package:minilm", progress=False
        )
        found = {
            "digest": table.attrs["spans_sha256"],
            "counts": table["split"].value_counts().to_dict(),
        }
        folder.mkdir(parents=True, exist_ok=True)
        marker.write_text(json.dumps(found))
    generator = WideSpectra(max(models, 1), width)
    paths = []
    for m, name in enumerate(generator.names()[:models]):
        path = folder / f"{name}.npy"
        if not path.with_name(path.name + ".spans.sha256").is_file():
            clock = time.perf_counter()
            generator.write(m, path, found["counts"], found["digest"])
            print(f"  wrote {path} in {time.perf_counter() - clock:.0f} s", flush=True)
        paths.append(path)
    return texts, paths


def shape(train: int) -> dict[str, Any]:
    return {
        "spans": {
            "length": SPAN_TOKENS,
            "counts": tuple(counts(train)[s] for s in SPLITS),
            "per_doc": PER_DOC,
        }
    }


# -- the contender (a fresh interpreter per run) ------------------------------------------------
def contender(
    work: str,
    width: int,
    models: int,
    train: int,
    scale: dict[str, Any],
    similarity: bool,
    alpha: float,
) -> Any:
    """Untimed: the corpus and the files. The work: one ``lmalgebra.decompose`` call."""
    import lmalgebra

    texts, paths = prepared(Path(work), width, models, train)
    cache = str(Path(work) / "cache")
    named = {p.stem: f"precomputed:{p}" for p in paths}

    def work() -> dict[str, Any]:
        result = lmalgebra.decompose(
            named,
            texts,
            **shape(train),
            reference_tokenizer="package:minilm",
            cache_dir=cache,
            progress=False,
            study={"similarity": similarity},
            scale=scale,
            alpha=alpha,
        )
        return {
            "names": result.names,
            "pairwise": {s: result.pairwise(s, float("nan")).to_numpy().tolist() for s in SPLITS},
            "group": {s: result.group[s].tolist() for s in SPLITS},
            "method": result.method,
            "seconds": result.summary["seconds"],
        }

    return work


def measure(
    width: int,
    models: int,
    train: int,
    scale: dict[str, Any],
    args: argparse.Namespace,
    alpha: float | None = None,
) -> dict[str, Any]:
    """One decomposition in a fresh interpreter (after its files exist): its figures."""
    texts, paths = prepared(args.workdir, width, models, train)
    alpha = args.alpha if alpha is None else alpha
    kwargs = {"width": width, "models": models, "train": train, "scale": scale}
    kwargs |= {"work": str(args.workdir), "similarity": not args.no_similarity}
    kwargs |= {"alpha": alpha}
    label = f"{models} x {width}, {train:,} spans, {scale or 'exact'}"
    planned = {} if args.quick else predicted(texts, paths, train, scale, args)
    result = fastest(
        (lambda: in_process(kwargs))
        if args.quick
        else (lambda: run_contender("bench_wide:contender", kwargs)),
        args.attempts,
        label=label,
    )
    sizes = {"width": width, "models": models, "train": train, "scale": scale, "alpha": alpha}
    return {**sizes, **planned, **result, "code": code_version(MEASURED)}


def in_process(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The quick size's run: in this interpreter (a check of the figures, never a record of time
    or memory; a fresh interpreter per run would spend most of the test importing libraries)."""
    result = measure_work(contender(**kwargs))
    result["peak_rss_mib"] = result["life_peak_rss_mib"]
    return result


def predicted(
    texts: list[str], paths: list[Path], train: int, scale: dict[str, Any], args: argparse.Namespace
) -> dict[str, float]:
    """The plan's peak memory and time of the run's own method (``decompose_plan``)."""
    import lmalgebra

    frame = lmalgebra.decompose_plan(
        {p.stem: f"precomputed:{p}" for p in paths},
        texts,
        **shape(train),
        reference_tokenizer="package:minilm",
        study={"similarity": not args.no_similarity},
        scale={**scale, "memory_gib": 1e6},
        alpha=args.alpha,
    )
    chosen = frame[frame["chosen"].fillna(False).astype(bool)].iloc[0]
    return {"plan_peak_mib": float(chosen.peak_gib) * 1024, "plan_seconds": float(chosen.seconds)}


def accuracy(args: argparse.Namespace, size: dict[str, Any]) -> list[dict[str, Any]]:
    """Exact float64 first (the reference), then the reduced method at every k, float32
    statistics (exact, or the reduced method at one k), and the sketch."""
    base = (size["width"], size["models"], size["train"])
    runs = [measure(*base, {}, args)]
    runs += [measure(*base, {"method": "reduced", "components": k}, args) for k in size["ks"]]
    single: dict[str, Any] = {"precision": "float32"}
    if size["float32"] is not None:
        single |= {"method": "reduced", "components": size["float32"]}
    runs.append(measure(*base, single, args))
    runs += [measure(*base, {"method": "sketch", "components": k}, args) for k in size["sketch"]]
    return runs


def scaling(args: argparse.Namespace, d: dict[str, Any], n: dict[str, Any]) -> list[dict[str, Any]]:
    runs = []
    for models in d["models"]:
        for scale in ({}, {"method": "reduced", "components": d["k"]}):
            runs.append(measure(d["width"], models, d["train"], scale, args))
    for train in n["train"]:
        for scale in ({}, {"method": "reduced", "components": d["k"]}):
            runs.append(measure(n["width"], n["models"], train, scale, args))
    return runs


def regime(args: argparse.Namespace, size: dict[str, Any]) -> list[dict[str, Any]]:
    """Exact and reduced at a small and a large alpha: how far a reduced basis moves held-out
    R^2 when the exact fits over-learn, and when they do not."""
    base = (size["width"], size["models"], size["train"])
    reduced = {"method": "reduced", "components": size["k"]}
    return [
        measure(*base, scale, args, alpha) for alpha in size["alphas"] for scale in ({}, reduced)
    ]


def full(args: argparse.Namespace, size: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        measure(size["width"], models, size["train"], json.loads(args.full_scale), args)
        for models in (args.full_models or size["models"])
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="regime,accuracy,scaling,full", help="comma separated")
    parser.add_argument("--quick", action="store_true", help="toy sizes (the test suite's)")
    parser.add_argument(
        "--full-scale",
        default='{"method": "reduced", "components": 2048, "precision": "float32"}',
        help="the scale block (JSON) of the full-size runs",
    )
    parser.add_argument(
        "--no-similarity", action="store_true", help="leave CKA and CCA out of every run"
    )
    parser.add_argument(
        "--full-models",
        type=lambda text: [int(n) for n in text.split(",")],
        default=None,
        help="model counts of the full part, comma separated (default 12,24; 24 x 4,096 at "
        "100,000 spans writes 47 GB of embeddings)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the embedding files")
    parser.add_argument("--workdir", type=Path, default=None, help="default bench/_work/wide")
    parser.add_argument(
        "--alpha",
        type=float,
        default=1.0,
        help="relative ridge alpha of every run (at the default 0.01 the exact group fits of "
        "these sizes over-learn their training spans: see the module)",
    )
    args = parse_args(parser, attempts=1)
    if args.workdir is None:
        args.workdir = (
            Path(tempfile.mkdtemp(prefix="wide-", dir=WORK.parent)) if args.quick else WORK
        )
    logging.basicConfig(level=logging.WARNING)
    session = Session(NAME, MEASURED)
    sizes = SIZES["quick" if args.quick else "full"]
    data = DATA / ("quick" if args.quick else "full")
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    for part in parts:
        if part == "accuracy":
            runs = accuracy(args, sizes["accuracy"])
            if args.quick:
                check_quick(runs)
        elif part == "scaling":
            runs = scaling(args, sizes["scaling_d"], sizes["scaling_n"])
        elif part == "full":
            runs = full(args, sizes["full"])
        elif part == "regime":
            runs = regime(args, sizes["regime"])
        else:
            raise SystemExit(f"unknown part {part!r} (accuracy, scaling, full, regime)")
        if not args.no_write:
            data.mkdir(parents=True, exist_ok=True)
            path = data / f"{part}.json"
            if part == "full" and path.is_file():  # --full-models 24 keeps the 12-model run
                runs = _kept_beside(json.loads(path.read_text()), runs)
            path.write_text(json.dumps(plain(runs), indent=1, allow_nan=False) + "\n")
        else:
            print(json.dumps({part: [_brief(r) for r in runs]}, indent=1))
    if not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    if not args.no_write and not args.quick:  # the quick size is a check, never a record
        stored = {p.stem: json.loads(p.read_text()) for p in sorted(data.glob("*.json"))}
        figures, targets, tables, notes, sizes_row = record(stored, BENCH)
        session.save(__doc__, sizes_row, figures, targets=targets, tables=tables, notes=notes)


def _kept_beside(stored: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The stored full-size runs of other model counts, then the new ones, by model count."""
    counts = {run["models"] for run in new}
    kept = [run for run in stored if run["models"] not in counts]
    return sorted([*kept, *new], key=lambda run: run["models"])


def check_quick(runs: list[dict[str, Any]]) -> None:
    """At the toy size: with every component kept the reduced and sketch fits are the exact
    ones (to float32 rounding of the projected rows), and float32 statistics within 1e-4."""
    for run in runs[1:]:
        scale = run["scale"]
        exact = scale.get("components") == run["width"] or scale.get("precision") == "float32"
        worst = max(differences(run, runs[0]).values())
        if exact and worst > 1e-4:
            raise SystemExit(f"FAILED: {label(run)} differs from exact by {worst:.1e}")
        print(f"  {label(run)}: largest |R^2 difference| from exact {worst:.1e}", flush=True)


def _brief(run: dict[str, Any]) -> dict[str, Any]:
    output = run["output"]
    return {
        "size": f"{run['models']} x {run['width']} at {run['train']}",
        "scale": run["scale"],
        "seconds": round(run["seconds"], 2),
        "peak_mib": round(run["peak_rss_mib"]),
        "group_test": np.round(output["group"]["test"], 4).tolist(),
    }


if __name__ == "__main__":
    main()
