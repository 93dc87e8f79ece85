"""Set complementarity on synthetic models with a known answer, against direct computations."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.complementarity import normalised_quality, ranked, set_samples
from lmalgebra.stats.moments import layout
from lmalgebra.stats.solver import Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments

SPLITS = {"train": 1200, "validation": 200, "test": 400}


def models(seed: int = 0) -> dict[str, np.ndarray]:
    """``a``, ``b``, ``d`` independent; ``a2`` a noisy linear copy of ``a``; ``ab`` a linear
    function of ``a`` and ``b`` (all rows of every split, stacked)."""
    rng = np.random.default_rng(seed)
    n = sum(SPLITS.values())
    a, b, d = (rng.normal(size=(n, 6)) for _ in range(3))
    a2 = a @ rng.normal(size=(6, 5)) + 0.05 * rng.normal(size=(n, 5))
    ab = np.hstack([a, b]) @ rng.normal(size=(12, 8)) + 3.0
    return {"a": a, "a2": a2, "b": b, "d": d, "ab": ab}


def solver_of(arrays: dict[str, np.ndarray], order: list[str], parts: int = 8):
    blocks = layout(order, [arrays[n].shape[1] for n in order])
    z = np.hstack([arrays[n] for n in order])
    stats, start = {}, 0
    for split, rows in SPLITS.items():
        blocked = SpanBlockMoments.empty(blocks, rows, parts)
        blocked.add_rows(z[start : start + rows], 0)
        stats[split], start = blocked, start + rows
    splits = {s: SplitMoments.of(b.total()) for s, b in stats.items()}
    return Decomposer(blocks, splits, 1e-3, "relative"), stats


QUALITY = {"a": 0.5, "a2": 0.5, "b": 0.5, "d": 0.5, "ab": 0.5}


def test_duplicate_never_chosen_over_a_distinct_teacher() -> None:
    arrays = models()
    solver, stats = solver_of(arrays, ["a", "a2", "b"])
    rows = ranked(set_samples(solver, ["a", "a2", "b"], 2, QUALITY, stats["test"], replicates=200))
    assert {rows[0].members, rows[1].members} == {("a", "b"), ("a2", "b")}
    assert rows[-1].members == ("a", "a2")
    assert rows[-1].complementarity < 0.1 < 0.9 < rows[0].complementarity
    # the intervals hold their point values and are ordered
    for r in rows:
        assert r.complementarity_low <= r.complementarity <= r.complementarity_high


def test_a_linear_function_of_two_members_adds_nothing() -> None:
    arrays = models()
    names = ["a", "ab", "b", "d"]
    solver, _ = solver_of(arrays, names)
    rows = ranked(set_samples(solver, names, 3, QUALITY))
    best = rows[0]
    assert "ab" not in best.members or set(best.members) != {"a", "ab", "b"}
    worst = next(r for r in rows if set(r.members) == {"a", "ab", "b"})
    assert worst.unexplained["ab"] < 0.01  # ab is explained by a and b
    assert worst.score < best.score
    assert rows[-1] == worst


def test_unexplained_share_equals_an_independent_ridge() -> None:
    arrays = models(3)
    solver, _ = solver_of(arrays, ["a", "b", "ab"])
    samples = set_samples(solver, ["a", "b", "ab"], 2, QUALITY)
    fit = dict(zip(samples.sets, samples.unexplained, strict=True))[("a", "ab")]
    n_train = SPLITS["train"]
    test = slice(n_train + SPLITS["validation"], None)
    x, y = arrays["ab"], arrays["a"]
    penalty = 1e-3 * np.trace(np.cov(x[:n_train].T, bias=True)) / x.shape[1]
    ridge = Ridge(alpha=penalty * n_train).fit(x[:n_train], y[:n_train])
    residual = ((y[test] - ridge.predict(x[test])) ** 2).sum()
    r2 = 1 - residual / ((y[test] - y[test].mean(0)) ** 2).sum()
    assert fit["a"] == pytest.approx(min(1.0, max(0.0, 1 - r2)), abs=1e-8)


def test_stable_under_reordering_of_candidates() -> None:
    arrays = models(1)
    first, s1 = solver_of(arrays, ["a", "a2", "b", "d"])
    second, s2 = solver_of(arrays, ["d", "b", "a2", "a"])
    one = ranked(set_samples(first, ["a", "a2", "b", "d"], 2, QUALITY, s1["test"], replicates=50))
    two = ranked(set_samples(second, ["d", "b", "a2", "a"], 2, QUALITY, s2["test"], replicates=50))
    assert [r.members for r in one] == [r.members for r in two]
    for x, y in zip(one, two, strict=True):
        assert x.score == pytest.approx(y.score, abs=1e-9)


def test_quality_weighs_the_score() -> None:
    arrays = models()
    solver, _ = solver_of(arrays, ["a", "b", "d"])
    quality = {"a": 0.6, "b": 0.3, "d": 0.0}
    rows = ranked(set_samples(solver, ["a", "b", "d"], 2, quality))
    assert rows[0].members == ("a", "b")
    assert rows[0].quality == pytest.approx(0.75)
    assert normalised_quality({"x": 0.0, "y": 0.0}) == {"x": 1.0, "y": 1.0}


def test_single_members_and_bad_sizes() -> None:
    arrays = models()
    solver, _ = solver_of(arrays, ["a", "b"])
    rows = ranked(set_samples(solver, ["a", "b"], 1, {"a": 0.2, "b": 0.4}))
    assert [r.members for r in rows] == [("b",), ("a",)]
    assert rows[0].complementarity == 1.0
    with pytest.raises(UserInputError, match="a set of 3 cannot be drawn from 2 candidates"):
        set_samples(solver, ["a", "b"], 3, QUALITY)
    with pytest.raises(UserInputError, match="no quality given for candidate 'b'"):
        set_samples(solver, ["a", "b"], 2, {"a": 1.0})
    with pytest.raises(UserInputError, match="quality of 'a'"):
        normalised_quality({"a": float("nan")})
