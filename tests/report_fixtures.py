"""A synthetic decomposition run directory holding every file of the run-directory contract.

Four models in two families (``a1``/``a2`` and ``b1``/``b2``, listed interleaved so that only a
clustering puts each family together); every table is consistent with one pairwise R^2 matrix.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

MODELS = ["a1", "b1", "a2", "b2"]
SPLITS = ("train", "validation", "test")
FAMILY = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}


def pairwise_matrix(split: str = "test", across: float = 0.15) -> np.ndarray:
    """``(4, 4)`` R^2 (row = target, column = basis): high within a family, about ``across``
    across families; NaN diagonal; train a little higher than held-out."""
    lift = {"train": 0.08, "validation": 0.02, "test": 0.0}[split]
    r2 = np.full((len(MODELS), len(MODELS)), np.nan)
    for i, t in enumerate(MODELS):
        for j, b in enumerate(MODELS):
            if i != j:
                base = 0.8 if FAMILY[t] == FAMILY[b] else across
                r2[i, j] = base + 0.01 * (i - j) + lift
    return r2


def _write(path: Path, header: list[str], rows: list[list[Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(rows)


def _group(target: str, split: str) -> float:
    row = pairwise_matrix(split)[MODELS.index(target)]
    return float(np.nanmax(row) + 0.05)


def write_core(run: Path, across: float = 0.15) -> None:
    """The files every complete run has: summary, config, provenance, pairwise and group tables
    (``across``: the pairwise R^2 across families; below 0 makes negative cells)."""
    run.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        r2 = pairwise_matrix(split, across)
        rows = [
            [t, *("" if np.isnan(v) else f"{v:.6f}" for v in r2[i])] for i, t in enumerate(MODELS)
        ]
        _write(run / f"pairwise_r2_{split}.csv", ["target \\ basis", *MODELS], rows)
    group = [[t, *(f"{_group(t, s):.6f}" for s in SPLITS)] for t in MODELS]
    means = [f"{np.mean([_group(t, s) for t in MODELS]):.6f}" for s in SPLITS]
    _write(run / "group_r2.csv", ["target", *SPLITS], [*group, ["mean", *means]])
    config = {"models": [{"name": m, "path": f"/models/{m}"} for m in MODELS], "alpha": 0.01}
    config["note"] = "<script>alert('not run')</script> & friends"  # must be escaped
    (run / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    provenance = {"versions": {"lmalgebra": "0.1.0", "numpy": "2.0"}, "hashes": {}, "models": {}}
    (run / "provenance.json").write_text(json.dumps(provenance), encoding="utf-8")
    summary = {
        "status": "complete",
        "models": MODELS,
        "spans": {"train": 200, "validation": 50, "test": 50},
        "group_r2": {t: {s: _group(t, s) for s in SPLITS} for t in MODELS},
        "group_dependency": {s: float(np.mean([_group(t, s) for t in MODELS])) for s in SPLITS},
        "mean_pairwise_r2": {s: float(np.nanmean(pairwise_matrix(s))) for s in SPLITS},
        "seconds": {"embed": 1.5, "fit": 0.25},
        "alpha": {"value": 0.01, "mode": "relative", "selected_by": "gcv"},
    }
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


def write_study(run: Path, across: float = 0.15, intervals: bool = True, draws: int = 3) -> None:
    """Every optional study table of the contract; ``intervals=False``: a run without bootstrap
    (blank interval cells); ``draws``: null draws per target."""
    fits, nulls, similarity = [], [], []
    for split in SPLITS:
        r2 = pairwise_matrix(split, across)
        for i, t in enumerate(MODELS):
            others = "+".join(m for m in MODELS if m != t)
            g = _group(t, split)
            adjusted = f"{g - 0.03:.4f}" if split == "train" else ""
            ci = (g - 0.04, g + 0.03) if intervals else ("", "")
            fits.append(["group", t, others, split, g, *ci, adjusted])
            for j, b in enumerate(MODELS):
                if i != j:
                    ci = (r2[i, j] - 0.05, r2[i, j] + 0.05) if intervals else ("", "")
                    fits.append(["pairwise", t, b, split, r2[i, j], *ci, ""])
                    cka = 0.9 if FAMILY[t] == FAMILY[b] else 0.3
                    similarity.append([t, b, split, r2[i, j], cka, cka - 0.1])
            for draw in range(draws):
                nulls.append(["random_group", t, "random", split, 0.02 + 0.01 * draw])
                nulls.append(["shuffled_group", t, others, split, -0.01 * draw])
    _write(
        run / "fits.csv",
        ["kind", "target", "basis", "split", "r2", "ci_low", "ci_high", "adjusted_r2"],
        fits,
    )
    _write(run / "nulls.csv", ["kind", "target", "basis", "split", "r2"], nulls)
    _write(
        run / "similarity.csv",
        ["model_a", "model_b", "split", "lmd_r2", "cka", "mean_cca"],
        similarity,
    )
    alphas = [1e-4, 1e-3, 1e-2, 1e-1, 1.0]
    curve = [
        [
            t,
            a,
            c,
            (1 + (np.log10(a) + 2) ** 2) if c == "gcv" else 0.7 - 0.05 * (np.log10(a) + 2) ** 2,
        ]
        for t in MODELS
        for c in ("gcv", "kfold", "validation")
        for a in alphas
    ]
    _write(run / "alpha_curve.csv", ["target", "alpha", "criterion", "value"], curve)
    attribution = []
    for t in MODELS[:2]:
        others = [m for m in MODELS if m != t]
        for step, m in enumerate(others, start=1):
            attribution.append([t, "greedy", m, step, "test", 0.5 + 0.1 * step])
            attribution.append([t, "drop_one", m, "", "test", 0.05 * step])
            attribution.append([t, "shapley", m, "", "test", 0.3 / step])
    _write(
        run / "attribution.csv",
        ["target", "method", "model", "step", "split", "value"],
        attribution,
    )
    sweep = ["setting", "kind", "target", "basis", "split", "r2"]
    for name, settings in {
        "length": [8, 16, 32, 64],
        "layer": [0, 1, 2],
        "train_size": [50, 100, 200, 400],
        "language": ["en", "fr", "es"],
    }.items():
        rows = [
            [
                s,
                "group",
                t,
                "+".join(m for m in MODELS if m != t),
                split,
                _group(t, split) - 0.02 * k,
            ]
            for k, s in enumerate(settings)
            for t in MODELS
            for split in SPLITS
        ]
        rows += [
            [s, "pairwise", "a1", "a2", "test", 0.7 + 0.01 * k] for k, s in enumerate(settings)
        ]
        _write(run / "sweeps" / f"{name}.csv", sweep, rows)
    layer_map = [
        [a, la, b, lb, split, 0.5 + 0.1 * (la == lb) - 0.05 * abs(la - lb)]
        for a, b in (("a1", "a2"), ("a2", "a1"), ("a1", "b1"))
        for la in range(3)
        for lb in range(3)
        for split in ("validation", "test")
    ]
    _write(
        run / "sweeps" / "layer_map.csv",
        ["model_a", "layer_a", "model_b", "layer_b", "split", "r2"],
        layer_map,
    )


def build_run(
    run: Path,
    *,
    across: float = 0.15,
    intervals: bool = True,
    draws: int = 3,
    names: Mapping[str, str] | None = None,
) -> Path:
    """A complete synthetic run with every contract file, at ``run``: options as
    :func:`write_study`, and ``names`` renaming models (``{"a1": "a very long name"}``)."""
    write_core(run, across)
    write_study(run, across, intervals, draws)
    if names:
        rename(run, names)
    return run


def rename(run: Path, names: Mapping[str, str]) -> None:
    """Rename models in every table and file of ``run`` (whole names only)."""
    pattern = re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")
    for path in run.rglob("*"):
        if path.suffix in {".csv", ".json", ".yaml"}:
            text = path.read_text(encoding="utf-8")
            path.write_text(pattern.sub(lambda m: names[m.group(1)], text), encoding="utf-8")
