"""Shuffled-pairing null vs permutations of raw rows; random-copy fits; Decomposer.subset."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.nulls import (
    random_null_fits,
    shuffled_from_r2,
    shuffled_pairwise,
    shuffled_r2,
)
from lmalgebra.stats.solver import Decomposer, Fit, SplitMoments

REAL = ["a", "b", "c"]
NAMES = [*REAL, "a~random", "b~random", "c~random"]
DIMS = [3, 4, 2, 3, 4, 2]


def make_data(n: int, seed: int) -> np.ndarray:
    """Real models share a latent (with offsets); the random copies see it only through tanh."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 4))
    real = [
        latent @ rng.normal(size=(4, d)) + rng.normal(size=(n, d)) + 3 * k
        for k, d in enumerate(DIMS[:3])
    ]
    copies = [np.tanh(latent @ rng.normal(size=(4, d))) + rng.normal(size=(n, d)) for d in DIMS[3:]]
    return np.hstack(real + copies)


def build(data: dict[str, np.ndarray], alpha: float = 0.1, mode: str = "relative") -> Decomposer:
    blocks = layout(NAMES, DIMS)
    splits = {}
    for split, z in data.items():
        m = SecondMoments(blocks)
        m.update(z)
        splits[split] = SplitMoments.of(m)
    return Decomposer(blocks, splits, alpha, mode)  # type: ignore[arg-type]


def columns(names: tuple[str, ...] | list[str]) -> np.ndarray:
    blocks = {b.name: b for b in layout(NAMES, DIMS)}
    return np.concatenate([np.arange(blocks[n].start, blocks[n].stop) for n in names])


def raw_r2(fit: Fit, rows: np.ndarray, order: np.ndarray) -> float:
    """R^2 with target row ``order[i]`` paired with basis row ``i`` (split's own target mean)."""
    target = rows[:, columns([fit.target])]
    prediction = rows[:, columns(fit.basis)] @ fit.weight.T + fit.bias
    residual = ((target[order] - prediction) ** 2).sum()
    return float(1 - residual / ((target - target.mean(0)) ** 2).sum())


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    full = make_data(705, seed=0)
    return {"train": full[:300], "tiny": full[300:305], "validation": full[305:]}


@pytest.fixture(scope="module")
def solver(data: dict[str, np.ndarray]) -> Decomposer:
    return build(data)


def test_shuffled_r2_is_the_average_over_all_permutations(
    data: dict[str, np.ndarray], solver: Decomposer
) -> None:
    rows = data["tiny"]
    for fit in (solver.fit("a", ["b"]), solver.fit("c", ["b~random", "a", "b"])):
        scores = [raw_r2(fit, rows, np.array(p)) for p in itertools.permutations(range(5))]
        assert len(scores) == 120
        assert shuffled_r2(solver, fit, "tiny") == pytest.approx(np.mean(scores), abs=1e-10)
        # the identity pairing is the ordinary R^2
        assert raw_r2(fit, rows, np.arange(5)) == pytest.approx(fit.r2["tiny"], abs=1e-10)


def test_shuffled_r2_agrees_with_monte_carlo(
    data: dict[str, np.ndarray], solver: Decomposer
) -> None:
    rng = np.random.default_rng(1)
    rows = data["validation"]
    fit = solver.fit("b", ["a", "c"])
    scores = np.array([raw_r2(fit, rows, rng.permutation(len(rows))) for _ in range(2000)])
    error = scores.std(ddof=1) / np.sqrt(len(scores))
    expected = shuffled_r2(solver, fit)
    assert abs(scores.mean() - expected) < 4 * error
    assert expected < 0 < 0.3 < fit.r2["validation"]


def test_shuffled_pairwise_equals_single_fits(solver: Decomposer) -> None:
    table = shuffled_pairwise(solver)
    assert set(table) == {"train", "tiny", "validation"}
    for i, target in enumerate(NAMES):
        for j, basis in enumerate(NAMES):
            if i == j:
                assert np.isnan(table["validation"][i, j])
                continue
            fit = solver.fit(target, [basis])
            for split in table:
                expected = shuffled_r2(solver, fit, split)
                assert table[split][i, j] == pytest.approx(expected, abs=1e-10)
                assert table[split][i, j] <= 0


def test_shuffled_r2_of_own_fits_from_their_r2(solver: Decomposer) -> None:
    fits = [*solver.leave_one_out(), solver.fit("c", ["b~random", "a"]), solver.fit("a", ["b"])]
    for fit in fits:
        for split in ("train", "tiny", "validation"):
            expected = shuffled_r2(solver, fit, split)
            assert shuffled_from_r2(solver, fit, split) == pytest.approx(expected, abs=1e-10)


def test_random_null_fits_use_the_other_models_copies(data: dict[str, np.ndarray]) -> None:
    solver = build(data, alpha=0.2, mode="absolute")
    null = random_null_fits(solver, REAL)
    assert [(f.target, f.basis) for f in null.group] == [
        ("a", ("b~random", "c~random")),
        ("b", ("a~random", "c~random")),
        ("c", ("a~random", "b~random")),
    ]
    assert [(f.target, f.basis) for f in null.pairwise] == [
        ("a", ("b~random",)),
        ("a", ("c~random",)),
        ("b", ("a~random",)),
        ("b", ("c~random",)),
        ("c", ("a~random",)),
        ("c", ("b~random",)),
    ]
    train, held = data["train"], data["validation"]
    for fit in null.group + null.pairwise:
        x, y = columns(fit.basis), columns([fit.target])
        ref = Ridge(alpha=0.2 * len(train)).fit(train[:, x], train[:, y])
        np.testing.assert_allclose(fit.weight, ref.coef_, atol=1e-9)
        value = r2_score(held[:, y], ref.predict(held[:, x]), multioutput="variance_weighted")
        assert fit.r2["validation"] == pytest.approx(value, abs=1e-9)


def test_random_null_refuses_missing_copies(data: dict[str, np.ndarray]) -> None:
    solver = build(data).subset(["a", "b", "c", "a~random", "b~random"])
    with pytest.raises(UserInputError, match="'c' has no random-initialised copy 'c~random'"):
        random_null_fits(solver, REAL)
    with pytest.raises(UserInputError, match="'a~random' is a random-initialised copy"):
        random_null_fits(solver, ["a", "a~random"])
    with pytest.raises(UserInputError, match="at least 2 real models"):
        random_null_fits(solver, ["a"])
    with pytest.raises(UserInputError, match="split 'dev' is not among"):
        shuffled_r2(solver, solver.fit("a", ["b"]), "dev")


def test_subset_keeps_every_fit(solver: Decomposer) -> None:
    real = solver.subset(["c", "a", "b"])
    assert [(b.name, b.start, b.stop) for b in real.blocks] == [
        ("c", 0, 2),
        ("a", 2, 5),
        ("b", 5, 9),
    ]
    assert real.alpha == solver.alpha and real.alpha_mode == "relative"
    for group in real.leave_one_out():
        direct = solver.fit(group.target, list(group.basis))
        np.testing.assert_allclose(group.weight, direct.weight, atol=1e-9)
        np.testing.assert_allclose(group.bias, direct.bias, atol=1e-9)
        for split, value in direct.r2.items():
            assert group.r2[split] == pytest.approx(value, abs=1e-10)
    with pytest.raises(UserInputError, match="'zz' is not among the models"):
        solver.subset(["a", "zz"])
    with pytest.raises(UserInputError, match="names a model twice"):
        solver.subset(["a", "a"])
    with pytest.raises(UserInputError, match="empty"):
        solver.subset([])
