"""Ridge weights and R^2 from second moments vs independent references on raw embeddings."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import Decomposer, SplitMoments
from tiny import correlated_models

NAMES = ["a", "b", "c", "d"]
DIMS = [5, 7, 3, 6]


def make_embeddings(n: int, seed: int) -> np.ndarray:
    """Four correlated 'models' of different widths, with offsets and unequal scales."""
    return correlated_models(n, seed, tuple(DIMS))


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    # one generator, so the splits share a distribution but not rows
    full = make_embeddings(700, seed=0)
    return {"train": full[:500], "validation": full[500:600], "test": full[600:]}


def decomposer(data: dict[str, np.ndarray], alpha: float, mode: str = "absolute") -> Decomposer:
    blocks = layout(NAMES, DIMS)
    splits = {}
    for split, z in data.items():
        m = SecondMoments(blocks)
        for chunk in np.array_split(z, 3):
            m.update(chunk)
        splits[split] = SplitMoments.of(m)
    return Decomposer(blocks, splits, alpha, mode)  # type: ignore[arg-type]


def cols(names: list[str]) -> np.ndarray:
    blocks = {b.name: b for b in layout(NAMES, DIMS)}
    return np.concatenate([np.arange(blocks[n].start, blocks[n].stop) for n in names])


def reference_r2(model: Ridge, data: dict[str, np.ndarray], target: str, basis: list[str]) -> dict:
    out = {}
    for split, z in data.items():
        truth, pred = z[:, cols([target])], model.predict(z[:, cols(basis)])
        out[split] = r2_score(truth, pred, multioutput="variance_weighted")
    return out


@pytest.mark.parametrize("basis", [["b"], ["b", "d"], ["d", "c", "b"]])
def test_fit_matches_scikit_learn_ridge(data: dict[str, np.ndarray], basis: list[str]) -> None:
    alpha = 0.3
    fit = decomposer(data, alpha).fit("a", basis)
    train = data["train"]
    # our objective is a mean over rows; scikit-learn's is a sum, hence alpha * n
    ref = Ridge(alpha=alpha * len(train), fit_intercept=True, solver="cholesky")
    ref.fit(train[:, cols(basis)], train[:, cols(["a"])])
    np.testing.assert_allclose(fit.weight, ref.coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(fit.bias, ref.intercept_, rtol=0, atol=1e-8)
    for split, value in reference_r2(ref, data, "a", basis).items():
        assert fit.r2[split] == pytest.approx(value, abs=1e-8)


def test_unregularised_fit_matches_lstsq(data: dict[str, np.ndarray]) -> None:
    fit = decomposer(data, 0.0).fit("d", ["a", "c"])
    train = data["train"]
    design = np.hstack([train[:, cols(["a", "c"])], np.ones((len(train), 1))])
    solution, *_ = np.linalg.lstsq(design, train[:, cols(["d"])], rcond=None)
    np.testing.assert_allclose(fit.weight, solution[:-1].T, atol=1e-8)
    np.testing.assert_allclose(fit.bias, solution[-1], atol=1e-8)
    residual = train[:, cols(["d"])] - design @ solution
    centred = train[:, cols(["d"])] - train[:, cols(["d"])].mean(0)
    assert fit.r2["train"] == pytest.approx(1 - (residual**2).sum() / (centred**2).sum(), abs=1e-10)


def test_relative_alpha_is_ridge_on_rescaled_models(data: dict[str, np.ndarray]) -> None:
    """Relative mode = plain ridge after scaling each model to unit mean variance."""
    alpha = 0.05
    fit = decomposer(data, alpha, "relative").fit("b", ["a", "c"])
    train = data["train"]
    scales = np.concatenate(
        [
            np.full(d, np.sqrt(train[:, cols([n])].var(0).mean()))
            for n, d in zip(NAMES, DIMS, strict=True)
        ]
    )
    basis_cols = cols(["a", "c"])
    ref = Ridge(alpha=alpha * len(train), solver="cholesky")
    ref.fit(train[:, basis_cols] / scales[basis_cols], train[:, cols(["b"])])
    np.testing.assert_allclose(fit.weight, ref.coef_ / scales[basis_cols], atol=1e-8)


def test_leave_one_out_from_one_inverse_equals_direct_fits(data: dict[str, np.ndarray]) -> None:
    solver = decomposer(data, 0.1, "relative")
    for group in solver.leave_one_out():
        direct = solver.fit(group.target, list(group.basis))
        np.testing.assert_allclose(group.weight, direct.weight, atol=1e-9)
        np.testing.assert_allclose(group.bias, direct.bias, atol=1e-9)
        for split in data:
            assert group.r2[split] == pytest.approx(direct.r2[split], abs=1e-10)


@pytest.mark.parametrize("alpha", [1e8, 1e100, 1e300])
def test_group_fits_under_an_overwhelming_penalty_match_direct_fits(
    data: dict[str, np.ndarray], alpha: float
) -> None:
    """A penalty that dwarfs the variance leaves every fit the training mean (train R^2 0): the
    shortcut to a group fit's train residual, a difference of two numbers of the penalty's
    size, had written a train R^2 of 1e84 (alpha 1e100) or exactly 1 (1e300)."""
    solver = decomposer(data, alpha, "relative")
    for group in solver.leave_one_out():
        direct = solver.fit(group.target, list(group.basis))
        for split in data:
            assert group.r2[split] == pytest.approx(direct.r2[split], abs=1e-9)
        assert group.r2["train"] == pytest.approx(0, abs=1e-6)


@pytest.mark.filterwarnings("error")  # the refusal alone: no RuntimeWarning of the overflow
def test_a_penalty_beyond_float64_is_refused(data: dict[str, np.ndarray]) -> None:
    """alpha times a model's variance above float64's range had made the penalty infinite."""
    wide = {split: 100 * z for split, z in data.items()}
    with pytest.raises(UserInputError, match=r"^alpha 1e\+308 times a basis model's variance"):
        decomposer(wide, 1e308, "relative")


def test_pairwise_equals_single_basis_fits(data: dict[str, np.ndarray]) -> None:
    solver = decomposer(data, 0.2)
    table = solver.pairwise()
    for i, target in enumerate(NAMES):
        for j, basis in enumerate(NAMES):
            if i == j:
                assert np.isnan(table["test"][i, j])
                continue
            direct = solver.fit(target, [basis])
            for split in data:
                assert table[split][i, j] == pytest.approx(direct.r2[split], abs=1e-10)


def test_scalar_pairwise_r2_is_pearson_squared() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=400)
    y = 2 * x + rng.normal(size=400)
    blocks = layout(["x", "y"], [1, 1])
    m = SecondMoments(blocks)
    m.update(np.stack([x, y], 1))
    split = SplitMoments.of(m)
    r2 = Decomposer(blocks, {"train": split}, 0.0, "absolute").pairwise()["train"]
    pearson = np.corrcoef(x, y)[0, 1] ** 2
    assert r2[0, 1] == pytest.approx(pearson, abs=1e-12)
    assert r2[1, 0] == pytest.approx(pearson, abs=1e-12)


def test_bad_fits_name_the_culprit(data: dict[str, np.ndarray]) -> None:
    solver = decomposer(data, 0.1)
    with pytest.raises(UserInputError, match="contains the target 'a'"):
        solver.fit("a", ["a", "b"])
    with pytest.raises(UserInputError, match="'zz' is not among the models"):
        solver.fit("zz", ["b"])
    with pytest.raises(UserInputError, match="empty"):
        solver.fit("a", [])


def test_singular_basis_is_refused_and_small_samples_warn(caplog: pytest.LogCaptureFixture) -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    z = np.hstack([x, rng.normal(size=(20, 2)), np.full((20, 1), 3.0)])  # "b" has a constant
    blocks = layout(["a", "b"], [3, 3])
    m = SecondMoments(blocks)
    m.update(z)
    solver = Decomposer(blocks, {"train": SplitMoments.of(m)}, 0.0, "absolute")
    with pytest.raises(UserInputError, match=r"basis \[b\] is singular"):
        solver.fit("a", ["b"])
    small = SecondMoments(blocks)
    small.update(rng.normal(size=(2, 6)))
    Decomposer(blocks, {"train": SplitMoments.of(small)}, 1.0).fit("a", ["b"])
    assert "only 2 training spans" in caplog.text
    near = np.hstack([x, x[:, :1], x[:, :1] + 1e-7 * rng.normal(size=(20, 1)), x[:, 1:2]])
    m = SecondMoments(blocks)
    m.update(near)
    Decomposer(blocks, {"train": SplitMoments.of(m)}, 0.0, "absolute").fit("a", ["b"])
    assert "basis [b] is ill-conditioned" in caplog.text
    # named for a Python caller (LinearDecomposition's alpha) as for the command line's
    assert "consider a larger alpha (--alpha on the command line)" in caplog.text


def test_the_interpolation_warning_counts_the_widest_basis_a_group_fit_uses(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The group fits share one inverse over every model's columns, but each fit's basis is the
    others: 8 spans of widths 2, 3 and 4 (9 columns) interpolate no fit (the widest basis, b+c,
    has 7), and 6 spans do, named by that basis (the whole system had been named)."""
    blocks = layout(["a", "b", "c"], [2, 3, 4])
    rng = np.random.default_rng(0)
    for n, warned in ((8, False), (6, True)):
        m = SecondMoments(blocks)
        m.update(rng.normal(size=(n, 9)))
        caplog.clear()
        Decomposer(blocks, {"train": SplitMoments.of(m)}, 1.0).leave_one_out()
        assert ("basis [b+c] has dimension 7 but only 6 training spans" in caplog.text) is warned
        assert "a+b+c" not in caplog.text
