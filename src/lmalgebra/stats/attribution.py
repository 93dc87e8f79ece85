"""Which basis models explain a target: greedy forward selection, drop-one, Shapley values.

All three read one value function over sets of basis models,

    v(S) = held-out R^2 (one split) of the ridge fit of the target on S,    v({}) = 0,

evaluated by :class:`SubsetValue`, which fits each subset once (from second moments alone).
Exact Shapley values need all ``2^m`` subsets; above ``exact_max`` models they are estimated from
seeded random permutations, with the standard error of each estimate.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import combinations

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.choices import EXACT_SHAPLEY
from lmalgebra.stats.solver import Decomposer

ValueFunction = Callable[[frozenset[str]], float]


@dataclass(frozen=True)
class AttributionRow:
    """One model's share of a target under one method.

    ``method`` is ``greedy`` (``step`` = 1-based order of addition, ``value`` = v after adding the
    model), ``drop_one`` (``v(all) - v(all without model)``) or ``shapley``. ``stderr`` is the
    standard error of a sampled Shapley value, else None.
    """

    target: str
    method: str
    model: str
    step: int | None
    split: str
    value: float
    stderr: float | None = None


class SubsetValue:
    """``v(S)``: R^2 on ``split`` of ``target`` fitted on the models in ``S`` (in block order).

    ``v`` of the empty set is 0. Each subset is fitted once and cached; ``fits`` counts them.
    """

    def __init__(self, decomposer: Decomposer, target: str, split: str = "validation") -> None:
        if split not in decomposer.splits:
            known = ", ".join(decomposer.splits)
            raise UserInputError(f"split {split!r} is not among the splits ({known})")
        decomposer.block(target)
        self.decomposer, self.target, self.split = decomposer, target, split
        self._order = {b.name: i for i, b in enumerate(decomposer.blocks)}
        self._cache: dict[frozenset[str], float] = {frozenset(): 0.0}

    def __call__(self, subset: frozenset[str]) -> float:
        if subset not in self._cache:
            basis = sorted(subset, key=lambda name: self._order.get(name, -1))
            self._cache[subset] = self.decomposer.fit(self.target, basis).r2[self.split]
        return self._cache[subset]

    @property
    def fits(self) -> int:
        return len(self._cache) - 1


def greedy_forward(value: ValueFunction, players: Sequence[str]) -> list[tuple[str, float]]:
    """Add, at each step, the player that raises ``v`` most (ties: the earlier in ``players``).

    Returns ``(player, v after adding it)`` for every step, until all players are in.
    """
    chosen: frozenset[str] = frozenset()
    remaining = list(players)
    steps = []
    while remaining:
        best = max(remaining, key=lambda p: value(chosen | {p}))
        chosen |= {best}
        remaining.remove(best)
        steps.append((best, value(chosen)))
    return steps


def drop_one(value: ValueFunction, players: Sequence[str]) -> dict[str, float]:
    """``v(all) - v(all without p)`` for every player ``p``."""
    full = frozenset(players)
    return {p: value(full) - value(full - {p}) for p in players}


def shapley_exact(value: ValueFunction, players: Sequence[str]) -> dict[str, float]:
    """Exact Shapley values: ``sum_S |S|! (m-|S|-1)! / m! (v(S + p) - v(S))`` over all subsets."""
    m = len(players)
    weights = [math.factorial(s) * math.factorial(m - s - 1) / math.factorial(m) for s in range(m)]
    out = {}
    for p in players:
        others = [q for q in players if q != p]
        total = 0.0
        for size in range(m):
            for subset in combinations(others, size):
                base = frozenset(subset)
                total += weights[size] * (value(base | {p}) - value(base))
        out[p] = total
    return out


def shapley_sampled(
    value: ValueFunction, players: Sequence[str], permutations: int, seed: int = 0
) -> dict[str, tuple[float, float]]:
    """Shapley values estimated from ``permutations`` seeded random orders of the players.

    Returns ``player -> (estimate, standard error)``. Each order's marginal contributions add up
    to ``v(all) - v({})``, so the estimates do too, exactly.
    """
    if permutations < 2:
        raise UserInputError(
            f"sampled Shapley values need at least 2 permutations, got {permutations}"
        )
    rng = np.random.default_rng(seed)
    gains = np.zeros((permutations, len(players)))
    for row in range(permutations):
        coalition: frozenset[str] = frozenset()
        before = value(coalition)
        for k in rng.permutation(len(players)):
            coalition |= {players[k]}
            after = value(coalition)
            gains[row, k], before = after - before, after
    means, errors = gains.mean(0), gains.std(0, ddof=1) / math.sqrt(permutations)
    return {p: (float(means[k]), float(errors[k])) for k, p in enumerate(players)}


def attribute(
    decomposer: Decomposer,
    target: str,
    basis: Sequence[str] | None = None,
    split: str = "validation",
    exact_max: int = EXACT_SHAPLEY,
    permutations: int = 200,
    seed: int = 0,
) -> list[AttributionRow]:
    """Greedy, drop-one and Shapley attribution of ``target`` to each model of ``basis``.

    Args:
        decomposer: fits from second moments.
        target: the model explained.
        basis: the candidate models (default: every other model, in block order).
        split: where ``v`` is measured; held out (``validation``) keeps overfitting from paying.
        exact_max: up to this many basis models Shapley values are exact (``2^m`` fits).
        permutations, seed: the sampled Shapley estimate beyond ``exact_max``.

    Returns rows ordered greedy (by step), drop_one, shapley (both in basis order).
    """
    value = SubsetValue(decomposer, target, split)
    players = [b.name for b in decomposer.blocks if b.name != target] if basis is None else basis
    players = list(players)
    decomposer.check_fit(target, players, f"no basis models to attribute {target!r} to")
    if len(players) > exact_max and permutations < 2:
        raise UserInputError(
            f"sampled Shapley values need at least 2 permutations, got {permutations}"
        )

    def row(
        method: str, model: str, v: float, step: int | None = None, se: float | None = None
    ) -> AttributionRow:
        return AttributionRow(target, method, model, step, split, v, se)

    rows = [row("greedy", p, v, k) for k, (p, v) in enumerate(greedy_forward(value, players), 1)]
    rows += [row("drop_one", p, v) for p, v in drop_one(value, players).items()]
    if len(players) <= exact_max:
        rows += [row("shapley", p, v) for p, v in shapley_exact(value, players).items()]
    else:
        sampled = shapley_sampled(value, players, permutations, seed)
        rows += [row("shapley", p, v, se=se) for p, (v, se) in sampled.items()]
    return rows
