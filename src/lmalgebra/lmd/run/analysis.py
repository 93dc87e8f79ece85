"""The main fits of a run and everything said about them, from its statistics alone.

Alpha (fixed or chosen), pairwise / group / single fits with adjusted R^2 and bootstrap intervals,
null baselines (random-initialised copies, shuffled pairing), CKA and CCA next to LMD, and the
attribution of each group fit to its basis models. Results are tidy rows for the run's CSV files.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.measure import Measured
from lmalgebra.lmd.run.sweeps import Row, fit_row, pairwise_rows
from lmalgebra.lmd.rundir.reduction_record import exact_method, reduced_method
from lmalgebra.lmd.rundir.schema import AlphaCurveRow, TableRows, alpha_curve_rows, attribution_rows
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.stats.alpha_select import adjusted_r2, effective_df, select_alpha
from lmalgebra.stats.attribution import attribute
from lmalgebra.stats.bootstrap import bootstrap_r2
from lmalgebra.stats.nulls import random_copy, random_null_fits, shuffled_from_r2
from lmalgebra.stats.similarity import similarity_tables
from lmalgebra.stats.solver import Decomposer, Fit

HELD_OUT = ("validation", "test")


@dataclass
class Analysis:
    """The main fits and the tables written next to them (file stem -> tidy rows)."""

    alpha: float
    selected_by: str
    solver: Decomposer
    pairwise: dict[str, np.ndarray]
    group: list[Fit]
    single: Fit | None
    tables: dict[str, TableRows] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # the analysis' parts, timed
    method: dict[str, Any] = field(default_factory=dict)  # summary.json's ``method``


def analyse(config: DecomposeConfig, measured: Measured, names: Sequence[str]) -> Analysis:
    """Fit and describe the models ``names`` (the measurement may also hold their null copies)."""
    study = config.study
    names = list(names)
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    alpha, selected_by, curve = config.alpha, "fixed", list[AlphaCurveRow]()
    if study.alpha_select != "fixed":
        alpha, curve = _choose_alpha(config, measured, names)
        selected_by = study.alpha_select
        clock = _lap(seconds, "alpha", clock)
    # one caveat of the run names the widest basis that interpolates (lmd.run.caveats)
    everything = measured.decomposer(alpha, config.alpha_mode, interpolation_named=True)
    solver = everything.subset(names) if len(everything.blocks) > len(names) else everything
    pairwise = solver.pairwise()
    group = solver.leave_one_out()
    single = solver.fit(config.target, config.basis) if config.target and config.basis else None
    result = Analysis(alpha, selected_by, solver, pairwise, group, single, seconds=seconds)
    clock = _lap(seconds, "fits", clock)
    result.method = exact_method(config)
    if measured.reductions is not None:
        result.method, reduction = reduced_method(
            config, measured.reductions, solver, pairwise, group
        )
        result.tables["reduction"] = reduction
        clock = _lap(seconds, "fits at half k", clock)
    result.tables["fits"] = _fit_rows(result, measured, study.bootstrap, study.level, study.seed)
    clock = _lap(seconds, "fit rows", clock)
    result.tables["nulls"] = _null_rows(everything, solver, group, names, study.nulls)
    clock = _lap(seconds, "nulls", clock)
    if study.similarity:
        result.tables["similarity"] = _similarity_rows(solver, pairwise)
        clock = _lap(seconds, "similarity", clock)
    if curve:
        result.tables["alpha_curve"] = curve
    if study.attribution:
        result.tables["attribution"] = [
            row
            for f in group
            for row in attribution_rows(
                attribute(solver, f.target, split=study.attribution_split, seed=study.seed)
            )
        ]
        _lap(seconds, "attribution", clock)
    return result


def _lap(seconds: dict[str, float], name: str, clock: float) -> float:
    """Record the time since ``clock`` as ``seconds[name]``; returns the new clock."""
    now = time.perf_counter()
    seconds[name] = now - clock
    return now


def _fit_rows(
    result: Analysis, measured: Measured, replicates: int, level: float, seed: int
) -> list[Row]:
    solver, names = result.solver, [b.name for b in result.solver.blocks]
    # intervals (ci_low, ci_high) and adjusted R^2 are blank where they are not filled in
    rows = pairwise_rows(names, result.pairwise)
    n_train = solver.train.n
    singles = [("group", f) for f in result.group]
    singles += [("single", result.single)] if result.single is not None else []
    for kind, fit in singles:
        df = fit.df if fit.df is not None else effective_df(solver, fit.basis)
        for split in SPLITS:
            row = fit_row(kind, fit.target, fit.basis, split, fit.r2[split])
            if split == "train":
                row["adjusted_r2"] = adjusted_r2(fit.r2["train"], n_train, df)
            rows.append(row)
    if replicates > 0:
        _add_intervals(rows, result, measured, replicates, level, seed)
    return rows


def _null_rows(
    everything: Decomposer,
    solver: Decomposer,
    group: list[Fit],
    names: list[str],
    with_random: bool,
) -> list[Row]:
    rows: list[Row] = []
    for fit in group:
        for split in HELD_OUT:
            shuffled = shuffled_from_r2(solver, fit, split)
            rows.append(fit_row("shuffled_group", fit.target, fit.basis, split, shuffled))
    copied = [n for n in names if random_copy(n) in {b.name for b in everything.blocks}]
    if with_random and len(copied) >= 2:  # ONNX graphs and files of vectors have no copies
        null = random_null_fits(everything, copied)
        for kind, fits in (("random_group", null.group), ("random_pairwise", null.pairwise)):
            for fit in fits:
                for split in SPLITS:
                    rows.append(fit_row(kind, fit.target, fit.basis, split, fit.r2[split]))
    return rows


def _similarity_rows(solver: Decomposer, pairwise: dict[str, np.ndarray]) -> list[Row]:
    names = [b.name for b in solver.blocks]
    index = {n: k for k, n in enumerate(names)}
    rows: list[Row] = []
    tables = similarity_tables(solver.blocks, {split: solver.splits[split] for split in SPLITS})
    for split in SPLITS:
        for s in tables[split]:
            for a, b in ((s.model_a, s.model_b), (s.model_b, s.model_a)):
                rows.append(
                    {
                        "model_a": a,
                        "model_b": b,
                        "split": split,
                        "lmd_r2": float(pairwise[split][index[a], index[b]]),
                        "cka": s.cka,
                        "mean_cca": s.mean_cca,
                    }
                )
    return rows


def _choose_alpha(
    config: DecomposeConfig, measured: Measured, names: list[str]
) -> tuple[float, list[AlphaCurveRow]]:
    """Alpha over the study's grid by its criterion; the curves become ``alpha_curve.csv``."""
    study = config.study
    solver = measured.decomposer(config.alpha, config.alpha_mode, None, True).subset(names)
    train = measured.stats["train"].subset(names) if study.alpha_select == "kfold" else None
    selection = select_alpha(
        solver.blocks,
        solver.splits,
        alpha_mode=config.alpha_mode,
        method=study.alpha_select,  # type: ignore[arg-type]
        grid=study.alpha_grid,
        train_blocks=train,
        folds=study.folds,
        scales=solver.given_scales,
    )
    return selection.alpha, alpha_curve_rows(selection)


def _add_intervals(
    rows: list[Row], result: Analysis, measured: Measured, replicates: int, level: float, seed: int
) -> None:
    """Fill ``ci_low`` / ``ci_high`` of every fit row from block-resampled statistics."""
    solver, names = result.solver, [b.name for b in result.solver.blocks]
    fits = {"group": result.group, "pairwise": solver.pairwise_fits(result.pairwise)}
    if result.single is not None:
        fits["single"] = [result.single]
    blocked = {split: measured.stats[split].subset(names) for split in SPLITS}
    boot = bootstrap_r2(solver, blocked, fits, replicates, level, seed)
    found = {(i.kind, i.target, "+".join(i.basis), i.split): i for i in boot.intervals}
    for row in rows:
        interval = found.get((row["kind"], row["target"], row["basis"], row["split"]))
        if interval is not None:
            row["ci_low"], row["ci_high"] = interval.low, interval.high
