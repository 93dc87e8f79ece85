"""CKA and mean canonical correlation from covariances vs references computed on raw data."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.cross_decomposition import CCA

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.similarity import (
    canonical_correlations,
    linear_cka,
    similarity_table,
    similarity_tables,
)
from lmalgebra.stats.solver import SplitMoments

NAMES = ["a", "b", "c"]
DIMS = [4, 6, 5]


def make_models(n: int, seed: int) -> list[np.ndarray]:
    """Three correlated models of different widths, offsets and scales; ``c`` has low-variance
    directions so that ``keep < 1`` drops some of them."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 3))
    out = []
    for k, dim in enumerate(DIMS):
        mix = rng.normal(size=(3, dim)) * (k + 1)
        noise = rng.normal(size=(n, dim)) * np.geomspace(1, 0.01 if k == 2 else 0.5, dim)
        out.append(latent @ mix + noise + 5 * k)
    return out


def moments_of(parts: list[np.ndarray]) -> SplitMoments:
    m = SecondMoments(layout([f"m{i}" for i in range(len(parts))], [p.shape[1] for p in parts]))
    for chunk in np.array_split(np.hstack(parts), 3):
        m.update(chunk)
    return SplitMoments.of(m)


def table_for(x: np.ndarray, y: np.ndarray, **kwargs: float) -> tuple[float, float]:
    row = similarity_table(
        layout(["x", "y"], [x.shape[1], y.shape[1]]), moments_of([x, y]), **kwargs
    )
    return row[0].cka, row[0].mean_cca


def hsic_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Kornblith et al.: HSIC of centred n x n linear Gram matrices."""
    n = len(x)
    h = np.eye(n) - 1 / n
    k, l_ = h @ x @ x.T @ h, h @ y @ y.T @ h
    return float((k * l_).sum() / np.sqrt((k * k).sum() * (l_ * l_).sum()))


def svcca_reference(x: np.ndarray, y: np.ndarray, keep: float) -> np.ndarray:
    """SVD of each centred model, top directions explaining ``keep``, then CCA by QR + SVD."""
    reduced = []
    for z in (x, y):
        centred = z - z.mean(0)
        _, s, vt = np.linalg.svd(centred, full_matrices=False)
        share = np.cumsum(s**2) / (s**2).sum()
        k = int(np.argmax(share >= keep - 1e-12)) + 1
        reduced.append(np.linalg.qr(centred @ vt[:k].T)[0])
    return np.linalg.svd(reduced[0].T @ reduced[1], compute_uv=False)


@pytest.fixture(scope="module")
def models() -> list[np.ndarray]:
    return make_models(300, seed=0)


def test_table_matches_hsic_cka_and_svcca_on_raw_data(models: list[np.ndarray]) -> None:
    for keep in (0.9, 0.99, 1.0):
        rows = similarity_table(layout(NAMES, DIMS), moments_of(models), keep=keep, ridge=0.0)
        assert [(r.model_a, r.model_b) for r in rows] == [("a", "b"), ("a", "c"), ("b", "c")]
        for row in rows:
            x, y = models[NAMES.index(row.model_a)], models[NAMES.index(row.model_b)]
            assert row.cka == pytest.approx(hsic_cka(x, y), abs=1e-10)
            reference = svcca_reference(x, y, keep)
            assert row.cca_dims == len(reference)
            assert row.mean_cca == pytest.approx(reference.mean(), abs=1e-9)
    # keep < 1 really drops directions of the low-variance model
    rows = similarity_table(layout(NAMES, DIMS), moments_of(models), keep=0.9)
    assert rows[1].cca_dims < min(DIMS[0], DIMS[2])


def test_canonical_correlations_match_scikit_learn_cca(models: list[np.ndarray]) -> None:
    x, y = models[0], models[1]
    m = moments_of([x, y])
    cov = m.cov
    ours = canonical_correlations(cov[:4, :4], cov[4:, 4:], cov[:4, 4:], keep=1.0, ridge=0.0)
    cca = CCA(n_components=4, max_iter=5000, tol=1e-12).fit(x, y)
    u, v = cca.transform(x, y)
    theirs = [np.corrcoef(u[:, k], v[:, k])[0, 1] for k in range(4)]
    np.testing.assert_allclose(ours, theirs, atol=1e-6)


def test_cka_invariances(models: list[np.ndarray]) -> None:
    rng = np.random.default_rng(1)
    x, y = models[0], models[2]
    cka, _ = table_for(x, y)
    rotation = np.linalg.qr(rng.normal(size=(4, 4)))[0]
    assert table_for(3.7 * x @ rotation + 2.0, y)[0] == pytest.approx(cka, abs=1e-10)
    assert table_for(x, 0.01 * y)[0] == pytest.approx(cka, abs=1e-10)
    # not invariant to a general invertible map (this is what tells CKA from CCA)
    stretch = np.diag([1.0, 10.0, 0.1, 1.0])
    assert abs(table_for(x @ stretch, y)[0] - cka) > 1e-3


def test_cca_invariant_to_invertible_linear_maps(models: list[np.ndarray]) -> None:
    rng = np.random.default_rng(2)
    x, y = models[0], models[1]
    _, cca = table_for(x, y, keep=1.0, ridge=0.0)
    mix_x = rng.normal(size=(4, 4)) + 3 * np.eye(4)
    mix_y = rng.normal(size=(6, 6)) + 3 * np.eye(6)
    moved = table_for(x @ mix_x - 4.0, 50 * y @ mix_y, keep=1.0, ridge=0.0)[1]
    assert moved == pytest.approx(cca, abs=1e-9)


def test_identical_and_independent_models() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(2000, 3))
    cka, cca = table_for(x, x @ rng.normal(size=(3, 3)), keep=1.0)
    assert cca == pytest.approx(1.0, abs=1e-6)
    assert 0 < cka < 1
    cka, cca = table_for(x, rng.normal(size=(2000, 3)), keep=1.0)
    assert cka < 0.01 and cca < 0.1


def test_constant_model_gives_nan_and_bad_settings_are_refused(models: list[np.ndarray]) -> None:
    flat = np.full((300, 2), 4.0)
    cka, cca = table_for(models[0], flat)
    assert np.isnan(cka) and np.isnan(cca)
    assert np.isnan(linear_cka(np.zeros((2, 2)), np.eye(2), np.zeros((2, 2))))
    split = moments_of(models)
    with pytest.raises(UserInputError, match="keep must be in"):
        similarity_table(layout(NAMES, DIMS), split, keep=0.0)
    with pytest.raises(UserInputError, match="CCA ridge"):
        similarity_table(layout(NAMES, DIMS), split, ridge=-1.0)


def test_the_splits_side_by_side_give_each_split_s_own_table() -> None:
    """``similarity_tables`` shares the splits' models out over threads; each split's rows are
    those of ``similarity_table`` on it alone (the same one-thread kernels: the same bits)."""
    splits = {s: moments_of(make_models(300, seed)) for seed, s in enumerate(("tr", "va", "te"))}
    blocks = layout(NAMES, DIMS)
    together = similarity_tables(blocks, splits, keep=0.9)
    assert list(together) == ["tr", "va", "te"]
    for name, moments in splits.items():
        assert together[name] == similarity_table(blocks, moments, keep=0.9)
    assert together["tr"] != together["va"]
    with pytest.raises(ValueError, match="va: covariance of size"):
        similarity_tables(blocks, {**splits, "va": moments_of(make_models(50, 9)[:2])})
