"""How well a set of models complements itself: what of each member the others leave unexplained.

For a set ``S`` of ``k`` models (``k >= 2``) and a held-out split,

    U_i(S)  = clip(1 - R^2(i | S \\ {i}), 0, 1)          (what the other members miss of model i)
    C(S)    = (1 / k) * sum_{i in S} U_i(S)             (complementarity)
    Q(S)    = (1 / k) * sum_{i in S} q_i / max_j q_j    (quality, normalised over the candidates)
    score(S) = C(S) * Q(S)

where ``R^2(i | B)`` is the held-out R^2 of the ridge fit of model ``i`` on the models ``B``
(:class:`~lmalgebra.stats.solver.Decomposer`) and ``q_i >= 0`` is a quality signal of model ``i``
(for teachers: held-out masked-token accuracy). A lone model has ``C = 1``: nothing in its set
explains it. A duplicate scores ``U ~ 0`` for both copies; a model that is a linear function of
other members scores ``U = 0`` and makes theirs 0 as well, so it lowers the set's score.

Intervals are bootstrap percentile intervals over blocks of spans of the scored split, the fitted
predictors held fixed (as in :mod:`lmalgebra.stats.bootstrap`); qualities are held fixed too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from lmalgebra.core.errors import UserInputError, counted
from lmalgebra.stats.block_scores import FixedScorer
from lmalgebra.stats.bootstrap import draw_counts, percentile_interval, split_rng
from lmalgebra.stats.solver import Decomposer, Fit
from lmalgebra.stats.span_blocks import SpanBlockMoments


@dataclass(frozen=True)
class SetScore:
    """One candidate set: its members (sorted), C, Q and the score, with bootstrap intervals
    (NaN without block statistics), and ``unexplained`` ``U_i`` per member."""

    members: tuple[str, ...]
    complementarity: float
    complementarity_low: float
    complementarity_high: float
    quality: float
    score: float
    score_low: float
    score_high: float
    unexplained: dict[str, float]


@dataclass(frozen=True)
class SetSamples:
    """Scores of every set of one size: point values ``(S,)`` and bootstrap replicates
    ``(B, S)`` (``B = 0`` without block statistics), sets in :attr:`sets` order."""

    sets: list[tuple[str, ...]]
    complementarity: np.ndarray
    quality: np.ndarray
    unexplained: list[dict[str, float]]
    replicates: np.ndarray  # complementarity per replicate

    @property
    def score(self) -> np.ndarray:
        return self.complementarity * self.quality


def normalised_quality(quality: Mapping[str, float]) -> dict[str, float]:
    """``q_i / max_j q_j``; every model 1.0 when no quality is positive (no signal)."""
    values = {name: float(q) for name, q in quality.items()}
    bad = [n for n, q in values.items() if not np.isfinite(q) or q < 0]
    if bad:
        raise UserInputError(f"quality of {bad[0]!r} must be a finite number >= 0")
    top = max(values.values(), default=0.0)
    return {n: (q / top if top > 0 else 1.0) for n, q in values.items()}


def set_samples(
    solver: Decomposer | None,
    candidates: Sequence[str],
    size: int,
    quality: Mapping[str, float],
    blocked: SpanBlockMoments | None = None,
    split: str = "test",
    replicates: int = 1000,
    seed: int = 0,
) -> SetSamples:
    """C and Q of every ``size``-subset of ``candidates`` (members in name order), with
    bootstrap replicates of C from ``blocked`` (the block statistics of ``split``). Sets of one
    need no ``solver`` (nothing is fitted)."""
    names = sorted(set(candidates))
    if len(names) != len(candidates):
        raise UserInputError("the candidates contain a model twice")
    if not 1 <= size <= len(names):
        raise UserInputError(
            f"a set of {size} cannot be drawn from {counted(len(names), 'candidate')} "
            f"({', '.join(names)})"
        )
    missing = [n for n in names if n not in quality]
    if missing:
        raise UserInputError(f"no quality given for candidate {missing[0]!r}")
    q = normalised_quality({n: quality[n] for n in names})
    sets = list(combinations(names, size))
    quality_of_set = np.array([np.mean([q[m] for m in members]) for members in sets])
    if size == 1:  # nothing in the set explains its one member
        ones = np.ones((replicates if blocked is not None else 0, len(sets)))
        return SetSamples(
            sets, np.ones(len(sets)), quality_of_set, [{m[0]: 1.0} for m in sets], ones
        )
    if solver is None:
        raise UserInputError("sets of two or more models need a decomposer of their embeddings")
    if split not in solver.splits:
        raise UserInputError(
            f"split {split!r} is not among the splits ({', '.join(solver.splits)})"
        )
    order = {b.name: i for i, b in enumerate(solver.blocks)}

    def others(members: tuple[str, ...], target: str) -> tuple[str, ...]:
        return tuple(sorted((m for m in members if m != target), key=order.__getitem__))

    fits: dict[tuple[str, tuple[str, ...]], Fit] = {}
    for members in sets:
        for target in members:
            key = (target, others(members, target))
            if key not in fits:
                fits[key] = solver.fit(target, list(key[1]))
    column = {key: c for c, key in enumerate(fits)}
    point = np.array([fit.r2[split] for fit in fits.values()])
    sample = _replicates(solver, list(fits.values()), blocked, split, replicates, seed)
    comp, reps, unexplained = [], [], []
    for members in sets:
        cols = [column[(t, others(members, t))] for t in members]
        shares = np.clip(1 - point[cols], 0, 1)
        unexplained.append(dict(zip(members, shares.tolist(), strict=True)))
        comp.append(float(shares.mean()))
        reps.append(np.clip(1 - sample[:, cols], 0, 1).mean(axis=1))
    return SetSamples(sets, np.array(comp), quality_of_set, unexplained, np.stack(reps, axis=1))


def _replicates(
    solver: Decomposer,
    fits: list[Fit],
    blocked: SpanBlockMoments | None,
    split: str,
    replicates: int,
    seed: int,
) -> np.ndarray:
    """``(B, F)`` R^2 of the fixed ``fits`` on resampled blocks of ``split`` (``B = 0`` when
    there are no block statistics, no replicates or no fits)."""
    if blocked is None or replicates < 1 or not fits:
        return np.zeros((0, len(fits)))
    stats = FixedScorer(solver, fits).statistics(split, blocked)
    return stats.r2(draw_counts(split_rng(seed, split), stats.n.size, replicates))


def ranked(samples: SetSamples, level: float = 0.95) -> list[SetScore]:
    """Every set, best first: by score, then complementarity, then member names."""
    scores = samples.score
    if samples.replicates.shape[0]:
        c_low, c_high = percentile_interval(samples.replicates, level)
        s_low, s_high = percentile_interval(samples.replicates * samples.quality, level)
    else:
        c_low = c_high = s_low = s_high = np.full(len(samples.sets), np.nan)
    rows = [
        SetScore(
            members,
            float(samples.complementarity[s]),
            float(c_low[s]),
            float(c_high[s]),
            float(samples.quality[s]),
            float(scores[s]),
            float(s_low[s]),
            float(s_high[s]),
            samples.unexplained[s],
        )
        for s, members in enumerate(samples.sets)
    ]
    return sorted(
        rows, key=lambda r: (-round(r.score, 12), -round(r.complementarity, 12), r.members)
    )
