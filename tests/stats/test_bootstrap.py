"""Bootstrap R^2 from block statistics vs independent computations on the raw rows."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.block_scores import FixedScorer
from lmalgebra.stats.bootstrap import bootstrap_r2, draw_counts, refit_r2, split_rng
from lmalgebra.stats.moments import ModelColumns, layout
from lmalgebra.stats.solver import Decomposer, Fit, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from tiny import correlated_models

NAMES = ["a", "b", "c", "d"]
DIMS = [5, 7, 3, 6]
PARTS = {"train": 7, "validation": 5, "test": 6}


def make_embeddings(n: int, seed: int) -> np.ndarray:
    """Four correlated 'models' of different widths, with offsets and unequal scales."""
    return correlated_models(n, seed, tuple(DIMS))


def blocked_of(blocks: list[ModelColumns], z: np.ndarray, parts: int) -> SpanBlockMoments:
    out = SpanBlockMoments.empty(blocks, len(z), parts)
    for start in range(0, len(z), 13):  # chunks straddle block edges
        out.add_rows(z[start : start + 13], start)
    return out


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    full = make_embeddings(650, seed=1)
    return {"train": full[:400], "validation": full[400:520], "test": full[520:]}


@pytest.fixture(scope="module")
def stats(data: dict[str, np.ndarray]) -> dict[str, SpanBlockMoments]:
    blocks = layout(NAMES, DIMS)
    return {s: blocked_of(blocks, z, PARTS[s]) for s, z in data.items()}


def make_solver(stats: dict[str, SpanBlockMoments], alpha: float = 0.05, mode: str = "relative"):
    splits = {s: SplitMoments.of(b.total()) for s, b in stats.items()}
    return Decomposer(layout(NAMES, DIMS), splits, alpha, mode)  # type: ignore[arg-type]


def cols(names: list[str] | tuple[str, ...]) -> np.ndarray:
    blocks = {b.name: b for b in layout(NAMES, DIMS)}
    return np.concatenate([np.arange(blocks[n].start, blocks[n].stop) for n in names])


def repeated(z: np.ndarray, edges: list[int], counts: np.ndarray) -> np.ndarray:
    """The rows of each block repeated as often as the block is counted."""
    pieces = [np.repeat(z[edges[p] : edges[p + 1]], c, axis=0) for p, c in enumerate(counts)]
    return np.concatenate(pieces, axis=0)


def raw_r2(fit: Fit, rows: np.ndarray) -> float:
    """R^2 of the fixed predictor on raw rows, each split's own mean in the denominator."""
    truth = rows[:, cols([fit.target])]
    residual = truth - rows[:, cols(fit.basis)] @ fit.weight.T - fit.bias
    centred = truth - truth.mean(axis=0)
    return 1 - (residual**2).sum() / (centred**2).sum()


def all_kinds(solver: Decomposer) -> dict[str, list[Fit]]:
    return {
        "group": solver.leave_one_out(),
        "single": [solver.fit("c", ["d", "a"])],
        "pairwise": solver.pairwise_fits(),
    }


def test_pairwise_fits_equal_single_basis_fits(stats: dict[str, SpanBlockMoments]) -> None:
    solver = make_solver(stats, 0.2, "absolute")
    fits = solver.pairwise_fits()
    assert [(f.target, f.basis) for f in fits] == [
        (t, (j,)) for t in NAMES for j in NAMES if t != j
    ]
    table = solver.pairwise()
    for fit in fits:
        direct = solver.fit(fit.target, list(fit.basis))
        np.testing.assert_allclose(fit.weight, direct.weight, atol=1e-10)
        np.testing.assert_allclose(fit.bias, direct.bias, atol=1e-9)
        i, j = NAMES.index(fit.target), NAMES.index(fit.basis[0])
        for split in stats:
            assert fit.r2[split] == pytest.approx(direct.r2[split], abs=1e-10)
            assert fit.r2[split] == table[split][i, j]


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_replicate_r2_equals_r2_on_repeated_raw_rows(
    data: dict[str, np.ndarray], stats: dict[str, SpanBlockMoments], split: str
) -> None:
    solver = make_solver(stats)
    kinds = all_kinds(solver)
    fits = [fit for group in kinds.values() for fit in group]
    block_stats = FixedScorer(solver, fits).statistics(split, stats[split])
    parts = len(stats[split].parts)
    counts = draw_counts(np.random.default_rng(5), parts, 4)
    counts[0] = 1  # the full sample: the fits' own R^2
    counts[1] = 0
    counts[1, 2] = 3  # one block, three times
    got = block_stats.r2(counts)
    assert got.shape == (4, len(fits))
    for f, fit in enumerate(fits):
        assert got[0, f] == pytest.approx(fit.r2[split], abs=1e-10)
        for b in range(1, 4):
            rows = repeated(data[split], stats[split].edges, counts[b])
            assert got[b, f] == pytest.approx(raw_r2(fit, rows), abs=1e-9)


def test_statistics_holding_further_models_serve_a_subset_solver(
    data: dict[str, np.ndarray], stats: dict[str, SpanBlockMoments]
) -> None:
    solver = make_solver(stats).subset(["d", "b", "a"])
    fits = [*solver.leave_one_out(), *solver.pairwise_fits()]
    counts = np.array([[2, 0, 1, 1, 0, 2], [1, 1, 1, 1, 1, 1]])
    got = FixedScorer(solver, fits).statistics("test", stats["test"]).r2(counts)
    for f, fit in enumerate(fits):
        rows = repeated(data["test"], stats["test"].edges, counts[0])
        assert got[0, f] == pytest.approx(raw_r2(fit, rows), abs=1e-9)
        assert got[1, f] == pytest.approx(fit.r2["test"], abs=1e-10)
    refitted = refit_r2(solver, stats["train"], fits[:1], np.ones((1, PARTS["train"])))
    assert refitted["validation"][0, 0] == pytest.approx(fits[0].r2["validation"], abs=1e-10)


def test_intervals_are_reproducible_per_split_and_bracket_the_estimate(
    stats: dict[str, SpanBlockMoments],
) -> None:
    solver = make_solver(stats)
    kinds = all_kinds(solver)
    first = bootstrap_r2(solver, stats, kinds, replicates=300, seed=3)
    again = bootstrap_r2(solver, stats, kinds, replicates=300, seed=3)
    assert first.to_records() == again.to_records()
    other = bootstrap_r2(solver, stats, kinds, replicates=300, seed=4)
    assert first.to_records() != other.to_records()
    # a split's counts do not depend on which other splits are bootstrapped
    alone = bootstrap_r2(solver, {"test": stats["test"]}, kinds, replicates=300, seed=3)
    assert alone.intervals == [i for i in first.intervals if i.split == "test"]
    n_fits = sum(len(v) for v in kinds.values())
    assert len(first.intervals) == 3 * n_fits
    for i in first.intervals:
        assert i.low <= i.high
        assert i.low - 0.05 <= i.r2 <= i.high + 0.05
    group_a = first.get("group", "a", ("b", "c", "d"), "validation")
    assert group_a.r2 == kinds["group"][0].r2["validation"]
    record = first.to_records()[0]
    assert record["basis"] == "b+c+d" and record["ci_low"] == first.intervals[0].low


def test_counts_are_shared_across_fits_of_a_split(stats: dict[str, SpanBlockMoments]) -> None:
    """Two copies of one fit under different kinds get identical intervals."""
    solver = make_solver(stats)
    fit = solver.fit("b", ["a"])
    result = bootstrap_r2(solver, stats, {"x": [fit], "y": [fit]}, replicates=50)
    by_split: dict[str, list] = {}
    for i in result.intervals:
        by_split.setdefault(i.split, []).append((i.low, i.high))
    for pair in by_split.values():
        assert pair[0] == pair[1]


def population_r2(fit: Fit, mean: np.ndarray, cov: np.ndarray, train_mean: np.ndarray) -> float:
    """R^2 of the fixed predictor on the population with this mean and covariance."""
    t, b = cols_of(fit.target), cols_of(fit.basis[0])
    operator = np.zeros((t.size, mean.size))
    operator[:, t] = np.eye(t.size)
    operator[:, b] = -fit.weight
    shift = operator @ (mean - train_mean)
    residual = np.trace(operator @ cov @ operator.T) + shift @ shift
    return 1 - residual / np.trace(cov[np.ix_(t, t)])


def cols_of(name: str) -> np.ndarray:
    return np.arange(0, 3) if name == "x" else np.arange(3, 5)


def test_interval_covers_the_population_r2_of_the_fixed_predictor() -> None:
    """x ~ N(m, I_3), u = A x + noise: the true R^2 of any fixed predictor is known."""
    rng = np.random.default_rng(11)
    mix = np.array([[1.0, -0.5, 0.2], [0.3, 0.8, -0.6]])
    m_x = np.array([2.0, -1.0, 0.5])
    mean = np.concatenate([m_x, mix @ m_x])
    cov = np.block([[np.eye(3), mix.T], [mix, mix @ mix.T + 1.5 * np.eye(2)]])
    blocks = layout(["x", "u"], [3, 2])
    covered, widths, trials = 0, [], 200
    for _ in range(trials):
        z = rng.multivariate_normal(mean, cov, size=500)
        train, test = z[:150], z[150:]
        fitted = SpanBlockMoments.empty(blocks, len(train), 1)
        fitted.add_rows(train, 0)
        held = SpanBlockMoments.empty(blocks, len(test), 25)
        held.add_rows(test, 0)
        splits = {"train": SplitMoments.of(fitted.total()), "test": SplitMoments.of(held.total())}
        solver = Decomposer(blocks, splits, 1e-6, "absolute")
        fits = {"pairwise": [solver.fit("x", ["u"]), solver.fit("u", ["x"])]}
        seed = int(rng.integers(1 << 30))
        result = bootstrap_r2(solver, {"test": held}, fits, replicates=400, seed=seed)
        for interval, fit in zip(result.intervals, fits["pairwise"], strict=True):
            truth = population_r2(fit, mean, cov, splits["train"].mean)
            covered += interval.low <= truth <= interval.high
            widths.append(interval.high - interval.low)
    coverage = covered / (2 * trials)
    assert 0.85 <= coverage <= 1.0, coverage
    assert np.mean(widths) < 0.2  # informative, not trivially wide


@pytest.mark.parametrize("mode", ["absolute", "relative"])
def test_refit_equals_ridge_on_resampled_raw_training_rows(
    data: dict[str, np.ndarray], stats: dict[str, SpanBlockMoments], mode: str
) -> None:
    alpha = 0.3
    solver = make_solver(stats, alpha, mode)
    fits = [solver.leave_one_out()[1], solver.fit("a", ["d", "c"])]
    counts = np.array([[0, 2, 1, 0, 3, 1, 0], [1, 1, 1, 1, 1, 1, 1]])
    got = refit_r2(solver, stats["train"], fits, counts)
    assert sorted(got) == ["test", "validation"]
    for b, k in enumerate(counts):
        train = repeated(data["train"], stats["train"].edges, k)
        for f, fit in enumerate(fits):
            basis = cols(fit.basis)
            scale = np.ones(basis.size)
            if mode == "relative":  # ridge on each model rescaled to unit mean variance
                spread = {n: np.sqrt(train[:, cols([n])].var(0).mean()) for n in fit.basis}
                scale = np.concatenate(
                    [np.full(DIMS[NAMES.index(n)], spread[n]) for n in fit.basis]
                )
            ref = Ridge(alpha=alpha * len(train), solver="cholesky")
            ref.fit(train[:, basis] / scale, train[:, cols([fit.target])])
            for split in ("validation", "test"):
                z = data[split]
                pred = ref.predict(z[:, basis] / scale)
                expected = r2_score(z[:, cols([fit.target])], pred, multioutput="variance_weighted")
                assert got[split][b, f] == pytest.approx(expected, abs=1e-8)
    # all blocks once: the fits themselves
    for f, fit in enumerate(fits):
        assert got["test"][1, f] == pytest.approx(fit.r2["test"], abs=1e-10)


def test_refit_bootstrap_gives_held_out_intervals(stats: dict[str, SpanBlockMoments]) -> None:
    solver = make_solver(stats)
    fits = {"group": solver.leave_one_out()}
    result = bootstrap_r2(solver, stats, fits, replicates=20, seed=2, refit=True)
    assert {i.split for i in result.intervals} == {"validation", "test"}
    assert result.refit and len(result.intervals) == 2 * len(NAMES)
    counts = draw_counts(split_rng(2, "refit"), PARTS["train"], 20)
    direct = refit_r2(solver, stats["train"], fits["group"], counts)["test"]
    low, high = np.quantile(direct, [0.025, 0.975], axis=0)
    test = [i for i in result.intervals if i.split == "test"]
    np.testing.assert_allclose([i.low for i in test], low, rtol=0, atol=0)
    np.testing.assert_allclose([i.high for i in test], high, rtol=0, atol=0)


def test_bad_requests_name_the_culprit(
    data: dict[str, np.ndarray], stats: dict[str, SpanBlockMoments]
) -> None:
    solver = make_solver(stats)
    fits = {"single": [solver.fit("a", ["b"])]}
    with pytest.raises(UserInputError, match="level must lie strictly between 0 and 1"):
        bootstrap_r2(solver, stats, fits, level=1.0)
    with pytest.raises(UserInputError, match="replicates must be >= 1"):
        bootstrap_r2(solver, stats, fits, replicates=0)
    with pytest.raises(UserInputError, match="no fits"):
        bootstrap_r2(solver, stats, {"single": []})
    with pytest.raises(UserInputError, match="split 'extra', which the solver lacks"):
        bootstrap_r2(solver, {"extra": stats["test"]}, fits)
    with pytest.raises(
        UserInputError,
        match="split 'test' hold 120 of 120 rows, but the decomposer's 'test' has 130",
    ):
        bootstrap_r2(solver, {"test": stats["validation"]}, fits)
    shifted = blocked_of(layout(NAMES, DIMS), data["test"] + 1.0, 4)
    with pytest.raises(UserInputError, match="split 'test' do not match the decomposer's"):
        bootstrap_r2(solver, {"test": shifted}, fits)
    with pytest.raises(UserInputError, match="needs the block statistics of the training split"):
        bootstrap_r2(solver, {"test": stats["test"]}, fits, refit=True)


def test_blocks_with_tail_columns_are_scored_without_weight_on_the_tail(
    data: dict[str, np.ndarray],
) -> None:
    """A reduced run's models end in target-only tail columns (probes): the bootstrap of its
    fits had failed (``cannot reshape array of size 1156 into shape (34,2)``), the weights of a
    basis model read as spanning its whole block. The full sample's replicate is each fit's
    own R^2, and a replicate the R^2 on the repeated rows."""
    blocks = layout(NAMES, DIMS, [1, 2, 0, 1])
    stats = {s: blocked_of(blocks, z, PARTS[s]) for s, z in data.items()}
    splits = {s: SplitMoments.of(b.total()) for s, b in stats.items()}
    solver = Decomposer(blocks, splits, 0.05, "relative")
    fits = [fit for group in all_kinds(solver).values() for fit in group]
    for split in splits:
        counts = np.ones((2, len(stats[split].parts)))
        counts[1, 0] = 3
        got = FixedScorer(solver, fits).statistics(split, stats[split]).r2(counts)
        rows = repeated(data[split], stats[split].edges, counts[1].astype(int))
        for f, fit in enumerate(fits):
            assert got[0, f] == pytest.approx(fit.r2[split], abs=1e-10)
            basis = np.concatenate([solver.block(n).basis_columns() for n in fit.basis])
            target = rows[
                :, np.arange(solver.block(fit.target).start, solver.block(fit.target).stop)
            ]
            residual = target - rows[:, basis] @ fit.weight.T - fit.bias
            centred = target - target.mean(axis=0)
            assert got[1, f] == pytest.approx(1 - (residual**2).sum() / (centred**2).sum())


def test_a_split_of_two_single_spans_gives_no_interval(data: dict[str, np.ndarray]) -> None:
    """A held-out split of two spans, one a block: half the resamples draw one span twice (no
    variance, NaN) and the rest are the sample itself, so the interval had width 0 around the
    estimate, read as certainty. Too few finite replicates give no interval (NaN)."""
    blocks = layout(NAMES, DIMS)
    stats = {
        "train": blocked_of(blocks, data["train"], PARTS["train"]),
        "test": blocked_of(blocks, data["test"][:2], 2),
    }
    solver = make_solver(stats)
    found = bootstrap_r2(solver, stats, {"pairwise": solver.pairwise_fits()}, replicates=200)
    held_out = [i for i in found.intervals if i.split == "test"]
    assert held_out and all(np.isnan(i.low) and np.isnan(i.high) for i in held_out)
    assert all(np.isfinite(i.r2) for i in held_out)
    trained = [i for i in found.intervals if i.split == "train"]
    assert all(i.low < i.high for i in trained)
