"""Per-model principal coordinates, their sketch, tail probes, and fits on reduced statistics.

References: numpy's symmetric eigendecomposition, direct products on the rows, and
scikit-learn's Ridge on the projected rows themselves.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.settings.scale import ScaleSpec
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.principal import (
    components_for,
    leading_subspace,
    nystrom_subspace,
    project,
    reduce_covariance,
    tail_probes,
)
from lmalgebra.stats.sketch import ColumnMoments, CovarianceSketch
from lmalgebra.stats.solver import Decomposer, SplitMoments


def spectrum_covariance(d: int, decay: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A ``(d, d)`` covariance with eigenvalues ``i^-decay`` in a random basis, and them."""
    rotation, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    values = (1.0 + np.arange(d)) ** -decay
    return (rotation * values) @ rotation.T, values


def test_leading_subspace_with_every_direction_is_the_eigendecomposition() -> None:
    cov, values = spectrum_covariance(24, 1.0, 0)
    basis, variances = leading_subspace(cov, 24)
    np.testing.assert_allclose(variances, values, rtol=1e-10)
    np.testing.assert_allclose(basis.T @ basis, np.eye(24), atol=1e-12)
    np.testing.assert_allclose(basis.T @ cov @ basis, np.diag(values), atol=1e-12)


def test_leading_subspace_keeps_the_top_directions_of_a_decaying_spectrum() -> None:
    cov, values = spectrum_covariance(300, 1.5, 1)
    basis, variances = leading_subspace(cov, 20)
    # the variance it keeps is within a hair of the best possible (the top 20 eigenvalues)
    kept = np.trace(basis.T @ cov @ basis)
    assert kept == pytest.approx(values[:20].sum(), rel=1e-4)
    np.testing.assert_allclose(variances, np.diag(basis.T @ cov @ basis), rtol=1e-10)


@pytest.mark.parametrize("retained", [0.5, 0.9, 0.99])
def test_retained_variance_chooses_the_fewest_directions_that_hold_it(retained: float) -> None:
    cov, values = spectrum_covariance(400, 1.2, 2)
    expected = components_for(values, values.sum(), retained)
    basis, variances = leading_subspace(cov, retained=retained)
    assert basis.shape[1] == expected
    assert variances.sum() >= retained * values.sum() * (1 - 1e-9)
    capped, _ = leading_subspace(cov, 5, retained=0.99)
    assert capped.shape[1] == 5


def test_nystrom_sketch_of_every_direction_is_exact() -> None:
    cov, values = spectrum_covariance(30, 1.0, 3)
    test = np.random.default_rng(4).normal(size=(30, 30))
    basis, variances = nystrom_subspace(cov @ test, test, 30)
    np.testing.assert_allclose(variances, values, rtol=1e-8)
    np.testing.assert_allclose(basis.T @ cov @ basis, np.diag(values), atol=1e-10)


def test_nystrom_sketch_finds_the_top_of_a_fast_decaying_spectrum() -> None:
    cov, values = spectrum_covariance(200, 3.0, 5)
    test = np.random.default_rng(6).normal(size=(200, 40))
    basis, _ = nystrom_subspace(cov @ test, test, 10)
    assert np.trace(basis.T @ cov @ basis) == pytest.approx(values[:10].sum(), rel=1e-4)


def rows(n: int, d: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(n, d)) * (1 + np.arange(d)) ** -0.5 + 30.0).astype(np.float32)


def test_streamed_sketch_equals_the_product_of_the_rows_and_merges_exactly() -> None:
    x = rows(900, 12, 7)
    whole = CovarianceSketch.empty(12, 5, seed=3)
    for part in np.array_split(x, 4):
        whole.update(part)
    cov = np.cov(x.astype(np.float64), rowvar=False, bias=True)
    np.testing.assert_allclose(whole.sketch(), cov @ whole.test.astype(np.float64), atol=1e-5)
    assert whole.columns.total_variance() == pytest.approx(np.trace(cov), rel=1e-6)
    first, second = CovarianceSketch.empty(12, 5, seed=3), CovarianceSketch.empty(12, 5, seed=3)
    first.update(x[:200])
    second.update(x[200:] + 0)  # another shard: another shift
    merged = first + second
    np.testing.assert_allclose(merged.sketch(), whole.sketch(), atol=1e-5)
    np.testing.assert_allclose(merged.columns.mean(), x.astype(np.float64).mean(0), rtol=1e-9)


def test_column_moments_give_each_columns_variance() -> None:
    x = rows(500, 6, 8)
    columns = ColumnMoments(6)
    for part in np.array_split(x, 3):
        columns.update(part)
    expected = x.astype(np.float64).var(axis=0).sum()
    assert columns.total_variance() == pytest.approx(expected, rel=1e-9)


def test_tail_probes_are_orthogonal_to_the_basis_and_carry_the_tail_variance() -> None:
    cov, values = spectrum_covariance(50, 1.0, 9)
    basis, _ = leading_subspace(cov, 10)
    probes = tail_probes(basis, 8, seed=1, cov=cov, tail=values[10:].sum())
    np.testing.assert_allclose(basis.T @ probes, 0, atol=1e-12)
    assert np.trace(probes.T @ cov @ probes) == pytest.approx(values[10:].sum(), rel=1e-10)
    assert tail_probes(np.eye(5), 8, seed=1).shape == (5, 0)  # nothing left out: no probes


# -- fits on reduced statistics -------------------------------------------------------------


def models(n: int, seed: int, dims: tuple[int, ...] = (9, 7, 8)) -> list[np.ndarray]:
    """Correlated models: a shared latent with a decaying spectrum, private parts, offsets."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=(n, 6)) * (1 + np.arange(6)) ** -0.7
    out = []
    for k, d in enumerate(dims):
        private = rng.normal(size=(n, d)) * (1 + np.arange(d)) ** -0.8
        mix = np.random.default_rng([seed, k]).normal(size=(6, d))
        out.append((shared @ mix + 0.5 * private + 5 * k).astype(np.float32))
    return out


def split_rows(seed: int) -> dict[str, list[np.ndarray]]:
    return {
        s: models(n, seed + i) for i, (s, n) in enumerate(zip(SPLITS, (600, 200, 200), strict=True))
    }


SPLITS = ("train", "validation", "test")


def decomposer(per_split: dict[str, np.ndarray], dims: list[int], tails: list[int], scales=None):
    blocks = layout(["a", "b", "c"], dims, tails)
    splits = {}
    for split, z in per_split.items():
        moments = SecondMoments(blocks)
        moments.update(z)
        splits[split] = SplitMoments.of(moments)
    return Decomposer(blocks, splits, 0.05, "relative", scales)


def reduced(data: dict[str, list[np.ndarray]], k: int | None, probes: int):
    reductions = []
    for m, x in enumerate(data["train"]):
        x64 = x.astype(np.float64)
        cov = np.cov(x64, rowvar=False, bias=True)
        reductions.append(reduce_covariance(f"m{m}", x64.mean(0), cov, k, None, probes, seed=m))
    per_split = {
        s: np.hstack([project(x, r.projector()) for x, r in zip(xs, reductions, strict=True)])
        for s, xs in data.items()
    }
    dims = [r.k + r.tail for r in reductions]
    scales = [r.total / r.width for r in reductions]
    return per_split, dims, [r.tail for r in reductions], scales, reductions


def test_reduced_fits_with_every_component_equal_the_exact_fits() -> None:
    data = split_rows(0)
    exact = decomposer({s: np.hstack(x) for s, x in data.items()}, [9, 7, 8], [0, 0, 0])
    per_split, dims, tails, scales, _ = reduced(data, 9, probes=16)
    assert tails == [0, 0, 0]  # nothing left out, so no probes
    full = decomposer(per_split, dims, tails, scales)
    # the rows were projected in float32: equal to that rounding
    for split in SPLITS:
        np.testing.assert_allclose(full.pairwise()[split], exact.pairwise()[split], atol=2e-6)
    for ours, theirs in zip(full.leave_one_out(), exact.leave_one_out(), strict=True):
        for split in SPLITS:
            assert ours.r2[split] == pytest.approx(theirs.r2[split], abs=2e-6)
    single_ours, single_exact = full.fit("a", ["c"]), exact.fit("a", ["c"])
    assert single_ours.r2["test"] == pytest.approx(single_exact.r2["test"], abs=2e-6)


def test_tail_columns_are_fitted_as_targets_and_left_out_of_every_basis() -> None:
    data = split_rows(1)
    per_split, dims, tails, scales, _ = reduced(data, 3, probes=4)
    solver = decomposer(per_split, dims, tails, scales)
    blocks = solver.blocks
    group = {f.target: f for f in solver.leave_one_out()}
    for target in ("a", "b", "c"):
        fit = solver.fit(target, [n for n in ("a", "b", "c") if n != target])
        # the one-inverse leave-one-out fit with tails is the direct fit
        np.testing.assert_allclose(group[target].weight, fit.weight, atol=1e-8)
        for split in SPLITS:
            assert group[target].r2[split] == pytest.approx(fit.r2[split], abs=1e-9)
    # the direct fit against scikit-learn: the whole target block from the basis coordinates
    b = {x.name: x for x in blocks}
    cols = np.r_[b["b"].start : b["b"].basis_stop, b["c"].start : b["c"].basis_stop]
    scale = np.concatenate([np.full(3, scales[1]), np.full(3, scales[2])])
    train = per_split["train"].astype(np.float64)
    # per-column penalty lam_j: scale the basis so that one sklearn alpha serves every column
    ridge = Ridge(alpha=0.05 * len(train), solver="cholesky")
    ridge.fit(train[:, cols] / np.sqrt(scale), train[:, b["a"].start : b["a"].stop])
    for split in SPLITS:
        z = per_split[split].astype(np.float64)
        predicted = ridge.predict(z[:, cols] / np.sqrt(scale))
        truth = z[:, b["a"].start : b["a"].stop]
        expected = r2_score(truth, predicted, multioutput="variance_weighted")
        assert group["a"].r2[split] == pytest.approx(expected, abs=1e-8)
    pairwise = solver.pairwise()
    for i, target in enumerate("abc"):
        for j, basis in enumerate("abc"):
            if i != j:
                fit = solver.fit(target, [basis])
                assert pairwise["test"][i, j] == pytest.approx(fit.r2["test"], abs=1e-9)


def test_with_basis_moves_left_out_coordinates_into_the_targets_tail() -> None:
    data = split_rows(2)
    per_split, dims, tails, scales, _ = reduced(data, 6, probes=4)
    solver = decomposer(per_split, dims, tails, scales)
    half = solver.with_basis({"a": 3, "b": 3, "c": 3})
    assert [x.basis_dim for x in half.blocks] == [3, 3, 3]
    assert [x.dim for x in half.blocks] == [x.dim for x in solver.blocks]
    fit = half.fit("a", ["b", "c"])
    assert fit.weight.shape == (solver.block("a").dim, 6)
    group = {f.target: f for f in half.leave_one_out()}
    assert group["a"].r2["test"] == pytest.approx(fit.r2["test"], abs=1e-9)


def test_reduced_targets_keep_their_tail_variance() -> None:
    data = split_rows(3)
    per_split, dims, tails, scales, reductions = reduced(data, 3, probes=8)
    solver = decomposer(per_split, dims, tails, scales)
    for block, r in zip(solver.blocks, reductions, strict=True):
        kept = np.trace(solver.train.cov[block.start : block.stop, block.start : block.stop])
        assert kept == pytest.approx(r.total, rel=1e-5)  # probes scaled to the tail on train


def test_scale_settings_are_checked() -> None:
    with pytest.raises(UserInputError, match="retained"):
        ScaleSpec(method="reduced", retained=1.5)
    with pytest.raises(UserInputError, match="sketch method needs"):
        ScaleSpec(method="sketch")
    with pytest.raises(UserInputError, match="exact method keeps"):
        ScaleSpec(components=4)
