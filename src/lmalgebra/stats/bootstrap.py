"""Bootstrap confidence intervals for every R^2, by resampling blocks of spans.

Default (``refit=False``), the cheap and standard method: the fitted predictors (``W``, ``b`` from
the training split) are held fixed and the spans they are scored on are resampled. A replicate
draws a split's ``P`` blocks of consecutive spans with replacement (counts from a multinomial,
``P`` draws) and its R^2 is the split's R^2 of the fixed predictor on the drawn rows, computed from
the replicate's summed block statistics (see :mod:`lmalgebra.stats.block_scores`). The per-block
scalars are computed once per split, about one pass of matrix products over its block Grams;
every replicate of every fit is then one ``(replicates, P) @ (P, fits)`` product. The counts of a
split are shared by all fits, so intervals of different fits on one split are consistent.
Intervals are percentile intervals at ``level``.

On the training split this interval reflects scoring variability only, not refitting variability:
the predictor was estimated on those very spans. ``refit=True`` runs the full bootstrap instead:
each replicate resamples the TRAINING blocks, rebuilds the training moments from them, refits
every fit (one solve per replicate; one inverse serves all leave-one-out fits) and scores it on the
fixed held-out splits. It costs a refit per replicate, so it is meant for a few dozen replicates,
to see how much wider intervals get when the fit itself varies.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.block_scores import FixedScorer, placement
from lmalgebra.stats.solver import Decomposer, Fit, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments


@dataclass(frozen=True)
class Interval:
    """The R^2 of one fit on one split and its bootstrap interval ``[low, high]``."""

    kind: str  # "group", "single", "pairwise" (the key the fit was given under)
    target: str
    basis: tuple[str, ...]
    split: str
    r2: float
    low: float
    high: float


@dataclass(frozen=True)
class Bootstrap:
    """Intervals of every fit on every split scored, with how they were obtained."""

    intervals: list[Interval]
    level: float
    replicates: int
    seed: int
    refit: bool

    def to_records(self) -> list[dict[str, Any]]:
        """One flat record per interval (``basis`` joined with ``+``; ``ci_low``, ``ci_high``)."""
        return [
            {
                "kind": i.kind,
                "target": i.target,
                "basis": "+".join(i.basis),
                "split": i.split,
                "r2": i.r2,
                "ci_low": i.low,
                "ci_high": i.high,
            }
            for i in self.intervals
        ]

    def get(self, kind: str, target: str, basis: Sequence[str], split: str) -> Interval:
        key = (kind, target, tuple(basis), split)
        for i in self.intervals:
            if (i.kind, i.target, i.basis, i.split) == key:
                return i
        raise KeyError(key)


# the share of an R^2's replicates that must be finite for its interval to be given (a resample
# drawing one span of a split alone has no variance: NaN)
FINITE_SHARE = 0.9


def split_rng(seed: int, name: str) -> np.random.Generator:
    """The generator of one split's counts: reproducible, and independent of the other splits."""
    return np.random.default_rng([seed, zlib.crc32(name.encode())])


def draw_counts(rng: np.random.Generator, parts: int, replicates: int) -> np.ndarray:
    """``(replicates, parts) int64``: how often each block is drawn, ``parts`` draws each."""
    return rng.multinomial(parts, np.full(parts, 1.0 / parts), size=replicates)


def percentile_interval(
    sample: np.ndarray, level: float, least: float = 0.0
) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper percentiles ``(F,)`` of ``sample`` ``(B, F)``, ignoring NaN replicates;
    NaN where fewer than ``least`` (a share of ``B``) are finite: the rest are the resamples that
    happened to be regular, and their spread is no interval of the whole (a split of two single
    spans: every finite replicate is the sample itself, an interval of width 0)."""
    low, high = np.full(sample.shape[1], np.nan), np.full(sample.shape[1], np.nan)
    tail = (1 - level) / 2
    for f in range(sample.shape[1]):
        values = sample[:, f][np.isfinite(sample[:, f])]
        if values.size and values.size >= least * sample.shape[0]:
            low[f], high[f] = np.quantile(values, [tail, 1 - tail])
    return low, high


def bootstrap_r2(
    solver: Decomposer,
    blocked: Mapping[str, SpanBlockMoments],
    fits: Mapping[str, Sequence[Fit]],
    replicates: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    refit: bool = False,
) -> Bootstrap:
    """Percentile intervals for the R^2 of every fit, by resampling blocks of spans.

    Args:
        solver: the decomposer the fits came from (its splits are the full-sample moments).
        blocked: split -> its block statistics, over the solver's layout and rows. Each split is
            read once, in the solver's split order, so a mapping that loads on access keeps one
            split in memory at a time.
        fits: kind (e.g. ``"group"``, ``"single"``, ``"pairwise"``) -> fits from ``solver``.
        replicates: bootstrap replicates per split.
        level: coverage of the interval, in (0, 1).
        seed: seeds every split's counts (see :func:`split_rng`).
        refit: resample training blocks and refit (see the module docstring); intervals are then
            given for the held-out splits only.
    """
    if not 0 < level < 1:
        raise UserInputError(f"the interval level must lie strictly between 0 and 1, got {level}")
    if replicates < 1:
        raise UserInputError(f"the number of bootstrap replicates must be >= 1, got {replicates}")
    labelled = [(kind, fit) for kind, group in fits.items() for fit in group]
    if not labelled:
        raise UserInputError("no fits to bootstrap: give at least one")
    available = list(blocked)  # keys only: a mapping that loads on access loads nothing yet
    unknown = [s for s in available if s not in solver.splits]
    if unknown:
        raise UserInputError(f"block statistics of split {unknown[0]!r}, which the solver lacks")
    flat = [fit for _, fit in labelled]
    if refit:
        if "train" not in available:
            raise UserInputError("refitting needs the block statistics of the training split")
        counts = draw_counts(split_rng(seed, "refit"), len(blocked["train"].parts), replicates)
        samples = refit_r2(solver, blocked["train"], flat, counts)
    else:
        scorer = FixedScorer(solver, flat)
        samples = {}
        for split in (s for s in solver.splits if s in available):
            stats = scorer.statistics(split, blocked[split])
            counts = draw_counts(split_rng(seed, split), stats.n.size, replicates)
            sample = stats.r2(counts)
            # a resample of one span (drawn again and again) has no variance: its R^2 is 0 / 0,
            # which rounding can leave finite and huge
            sample[(counts > 0) @ np.asarray(stats.n) < 2] = np.nan
            samples[split] = sample
    intervals = []
    for split, sample in samples.items():
        low, high = percentile_interval(sample, level, least=FINITE_SHARE)
        for f, (kind, fit) in enumerate(labelled):
            r2 = fit.r2.get(split, float("nan"))
            intervals.append(
                Interval(kind, fit.target, fit.basis, split, r2, float(low[f]), float(high[f]))
            )
    return Bootstrap(intervals, level, replicates, seed, refit)


def refit_r2(
    solver: Decomposer, train: SpanBlockMoments, fits: Sequence[Fit], counts: np.ndarray
) -> dict[str, np.ndarray]:
    """Held-out split -> ``(B, F) float64`` R^2 of every fit refitted on each resampled train.

    Replicate ``b`` refits on the training blocks counted ``counts[b]`` ``(B, P)`` times (same
    alpha and alpha mode, so in relative mode the penalty follows the resampled variances) and
    scores on the solver's other splits, unchanged. Fits whose basis is every other model come
    from one :meth:`Decomposer.leave_one_out` per replicate; others from :meth:`Decomposer.fit`.
    """
    if train.rows != solver.train.n:
        raise UserInputError(
            f"training block statistics hold {train.rows} rows, the solver's train split "
            f"{solver.train.n}"
        )
    held_out = [s for s in solver.splits if s != "train"]
    if not held_out:
        raise UserInputError("refitting scores on held-out splits, and the solver has none")
    names = [b.name for b in solver.blocks]
    placed = placement(solver.blocks, train, "train")
    same = placed == list(train.blocks)
    cols = np.concatenate([np.arange(b.start, b.stop) for b in placed])
    out = {s: np.full((len(counts), len(fits)), np.nan) for s in held_out}
    for b, k in enumerate(np.asarray(counts)):
        resampled = SplitMoments.of(train.combine(k), in_place=True)
        if not same:  # the statistics hold further models: keep the solver's
            cov = resampled.cov[np.ix_(cols, cols)]
            resampled = SplitMoments(resampled.n, resampled.mean[cols], cov)
        splits = {**solver.splits, "train": resampled}
        again = solver.like(solver.blocks, splits, solver.given_scales)
        group: dict[str, Fit] | None = None
        for f, fit in enumerate(fits):
            if sorted((fit.target, *fit.basis)) == sorted(names):
                if group is None:
                    group = {g.target: g for g in again.leave_one_out()}
                refitted = group[fit.target]
            else:
                refitted = again.fit(fit.target, list(fit.basis))
            for s in held_out:
                out[s][b, f] = refitted.r2[s]
    return out
