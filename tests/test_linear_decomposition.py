"""LinearDecomposition: equal to scikit-learn's Ridge, streaming equals one fit, pooled R^2."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge

from lmalgebra import LinearDecomposition
from lmalgebra.core.errors import UserInputError


def _data(rows: int = 300, seed: int = 0) -> tuple[list[np.ndarray], np.ndarray]:
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(rows, 5)) * 3.0 + 1.0
    b = rng.normal(size=(rows, 3)) * 0.2 - 4.0
    y = a @ rng.normal(size=(5, 4)) + b @ rng.normal(size=(3, 4)) + rng.normal(size=(rows, 4))
    return [a, b], y + 10.0


def test_absolute_alpha_equals_sklearn_ridge_with_alpha_times_rows() -> None:
    (a, b), y = _data()
    ours = LinearDecomposition(alpha=0.05, alpha_mode="absolute").fit([a, b], y)
    x = np.hstack([a, b])
    ridge = Ridge(alpha=0.05 * len(x), fit_intercept=True, solver="cholesky").fit(x, y)
    np.testing.assert_allclose(ours.coef_, ridge.coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours.intercept_, ridge.intercept_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours.predict([a, b]), ridge.predict(x), rtol=0, atol=1e-8)
    assert ours.n_samples_seen_ == len(x)
    assert ours.n_features_in_ == 8 and ours.block_sizes_ == [5, 3]
    np.testing.assert_allclose(ours.penalty_, 0.05)


def test_relative_alpha_is_ridge_on_blocks_rescaled_to_unit_variance() -> None:
    (a, b), y = _data(seed=1)
    ours = LinearDecomposition(alpha=0.3).fit([a, b], y)
    scales = [a.var(axis=0).mean(), b.var(axis=0).mean()]  # population variance, per block
    expected = np.concatenate([np.full(5, 0.3 * scales[0]), np.full(3, 0.3 * scales[1])])
    np.testing.assert_allclose(ours.penalty_, expected, rtol=1e-12)
    # lam_j ||W_j||^2 with lam_j = alpha s_j is plain ridge (alpha) on x_j / sqrt(s_j)
    x = np.hstack([a / np.sqrt(scales[0]), b / np.sqrt(scales[1])])
    ridge = Ridge(alpha=0.3 * len(x), solver="cholesky").fit(x, y)
    unscaled = ridge.coef_ / np.sqrt(np.concatenate([np.full(5, scales[0]), np.full(3, scales[1])]))
    np.testing.assert_allclose(ours.coef_, unscaled, rtol=0, atol=1e-8)
    np.testing.assert_allclose(ours.intercept_, ridge.intercept_, rtol=0, atol=1e-8)


def test_one_array_and_one_dimensional_target_follow_sklearn_shapes() -> None:
    (a, _), y = _data(seed=2)
    target = y[:, 0]
    ours = LinearDecomposition(alpha=0.01).fit(a, target)
    ridge = Ridge(alpha=len(a) * ours.penalty_[0], solver="cholesky").fit(a, target)
    assert ours.coef_.shape == (5,) and isinstance(ours.intercept_, float)
    np.testing.assert_allclose(ours.coef_, ridge.coef_, rtol=0, atol=1e-8)
    assert ours.intercept_ == pytest.approx(ridge.intercept_, abs=1e-8)
    assert ours.predict(a).shape == (len(a),)


def test_partial_fit_over_chunks_equals_one_fit() -> None:
    (a, b), y = _data(rows=500, seed=3)
    whole = LinearDecomposition(alpha=0.02).fit([a, b], y)
    streamed = LinearDecomposition(alpha=0.02)
    for start in range(0, 500, 70):
        stop = start + 70
        streamed.partial_fit([a[start:stop], b[start:stop]], y[start:stop])
    np.testing.assert_allclose(streamed.coef_, whole.coef_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(streamed.intercept_, whole.intercept_, rtol=0, atol=1e-10)
    assert streamed.n_samples_seen_ == 500
    # fit forgets what partial_fit saw
    again = streamed.fit([a[:100], b[:100]], y[:100])
    assert again.n_samples_seen_ == 100


def test_score_is_pooled_r2_on_the_scored_rows() -> None:
    (a, b), y = _data(rows=400, seed=4)
    model = LinearDecomposition(alpha=0.01).fit([a[:300], b[:300]], y[:300])
    held, target = [a[300:], b[300:]], y[300:]
    residual = ((target - model.predict(held)) ** 2).sum()
    total = ((target - target.mean(axis=0)) ** 2).sum()
    assert model.score(held, target) == pytest.approx(1 - residual / total, abs=1e-10)


def test_get_and_set_params_follow_the_estimator_protocol() -> None:
    from sklearn.base import clone

    model = LinearDecomposition(alpha=0.5, alpha_mode="absolute")
    copy = clone(model)
    assert copy.get_params() == {"alpha": 0.5, "alpha_mode": "absolute"}
    assert copy.set_params(alpha=0.1).alpha == 0.1


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, a, y: m.fit(a, y[:-1]), "rows"),
        (lambda m, a, y: m.fit([], y), "empty list"),
        (lambda m, a, y: m.fit(np.where(a > 2, np.nan, a), y), "NaN"),
        (lambda m, a, y: m.predict(a), "not fitted"),
        (lambda m, a, y: m.fit(a, y).predict(a[:, :2]), "blocks of [2] features"),
        (lambda m, a, y: m.set_params(beta=1), "beta"),
        (lambda m, a, y: m.set_params(alpha=-1.0).fit(a, y), "alpha"),
        (lambda m, a, y: m.set_params(alpha_mode="other").fit(a, y), "alpha_mode"),
    ],
)
def test_bad_input_is_one_user_input_error(call, message: str) -> None:
    (a, _), y = _data(rows=50)
    with pytest.raises(UserInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
        call(LinearDecomposition(), a, y)
