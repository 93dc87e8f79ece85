"""What a run's statistics were and what that costs its R^2: ``summary.json``'s ``method`` and,
for a reduced run, the rows of ``reduction.csv``.

A reduced run keeps ``k`` principal coordinates per model (:mod:`lmalgebra.lmd.statistics.passes`).
Its targets keep all their variance (tail probes), so its error is the basis': what the
coordinates a basis model leaves out would have explained. The run measures how its R^2 move when
every basis model keeps only its first ``k / 2`` coordinates (the others join its target-only
tail): where halving the basis at least doubles that error, as it does for decaying spectra, the
error at ``k`` is at most this change, the run's stated error estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.rundir.schema import ReductionRow
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.statistics.passes import Reductions
from lmalgebra.stats.solver import Decomposer, Fit

STATEMENT = (
    "R^2 of each target (all its dimensions: principal coordinates and tail probes) from each "
    "basis model's k leading principal coordinates; the estimated error is the largest change "
    "of an R^2 when every basis model keeps k/2 of them"
)


def exact_method(config: DecomposeConfig) -> dict[str, Any]:
    """``summary.json``'s ``method`` for a run on the exact statistics."""
    return {"name": "exact", "precision": config.scale.precision}


def reduced_method(
    config: DecomposeConfig,
    reductions: Reductions,
    solver: Decomposer,
    pairwise: dict[str, np.ndarray],
    group: list[Fit],
) -> tuple[dict[str, Any], list[ReductionRow]]:
    """``method`` of a reduced run and its ``reduction.csv`` rows (one per model and split).

    Fits the models again with every basis model cut to its first ``k / 2`` coordinates: the
    pairwise and group R^2 changes are the run's error estimate (see the module).
    """
    half = solver.with_basis({b.name: max(1, b.basis_dim // 2) for b in solver.blocks})
    half_pairwise = half.pairwise()
    half_group = {f.target: f.r2 for f in half.leave_one_out()}
    names = [b.name for b in solver.blocks]
    rows = []
    for i, block in enumerate(solver.blocks):
        kept = reductions.models[block.name]
        for split in SPLITS:
            moments = solver.splits[split]
            columns = slice(block.start, block.basis_stop)
            variance = float(np.trace(moments.cov[columns, columns]))
            total = reductions.totals[split][block.name].total_variance()
            changes = np.abs(pairwise[split][i] - half_pairwise[split][i])
            rows.append(
                ReductionRow(
                    model=block.name,
                    width=kept.width,
                    components=kept.k,
                    probes=kept.tail,
                    split=split,
                    retained_variance=variance / total if total > 0 else float("nan"),
                    group_r2=group[i].r2[split],
                    group_r2_half=half_group[block.name][split],
                    pairwise_change_half=float(np.nanmax(changes)) if len(names) > 1 else 0.0,
                )
            )
    method = {
        "name": reductions.method,
        "precision": config.scale.precision,
        "components": {r.name: r.k for r in reductions.models.values()},
        "probes": config.scale.probes,
        "retained": config.scale.choice()[1],
        "retained_variance": {
            r.model: {s.split: s.retained_variance for s in rows if s.model == r.model}
            for r in rows
            if r.split == "train"
        },
        "error_estimate": {
            split: max(
                max(abs(r.group_r2 - r.group_r2_half) for r in rows if r.split == split),
                max(r.pairwise_change_half for r in rows if r.split == split),
            )
            for split in SPLITS
        },
        "statement": STATEMENT,
    }
    return method, rows
