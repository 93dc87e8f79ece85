"""LinearDecomposition: equal to scikit-learn's Ridge, streaming equals one fit, pooled R^2; a
scikit-learn estimator (its own checks, clone, Pipeline, GridSearchCV, cross_val_score)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

from lmalgebra import LinearDecomposition
from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.linear_decomposition import NotFittedError


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


def test_score_is_r2_score_variance_weighted_and_r2_score_for_one_target() -> None:
    (a, b), y = _data(rows=400, seed=5)
    y[:, 0] *= 20.0  # a well explained target of large variance, and one of noise alone:
    y[:, 1] = np.random.default_rng(5).normal(size=len(y)) * 0.1  # the two averages differ
    model = LinearDecomposition(alpha=0.01).fit([a[:300], b[:300]], y[:300])
    held, target = [a[300:], b[300:]], y[300:]
    predicted = model.predict(held)
    pooled = r2_score(target, predicted, multioutput="variance_weighted")
    assert model.score(held, target) == pytest.approx(pooled, abs=1e-10)
    assert abs(pooled - r2_score(target, predicted)) > 0.01  # not the uniform average
    single = LinearDecomposition(alpha=0.01).fit(a[:300], y[:300, 1])
    expected = r2_score(y[300:, 1], single.predict(a[300:]))
    assert single.score(a[300:], y[300:, 1]) == pytest.approx(expected, abs=1e-10)


@parametrize_with_checks([LinearDecomposition()])
def test_passes_scikit_learns_estimator_checks(estimator, check) -> None:
    check(estimator)


def test_clone_copies_the_parameters_and_not_the_fit() -> None:
    (a, b), y = _data(rows=60)
    model = LinearDecomposition(alpha=0.5, alpha_mode="absolute", blocks=[5, 3])
    model.fit(np.hstack([a, b]), y)
    copy = clone(model)
    assert copy.get_params() == {"alpha": 0.5, "alpha_mode": "absolute", "blocks": [5, 3]}
    assert not hasattr(copy, "coef_") and hasattr(model, "coef_")
    assert copy.set_params(alpha=0.1).alpha == 0.1 and model.alpha == 0.5


def test_blocks_cut_one_array_as_the_list_of_blocks_does() -> None:
    (a, b), y = _data(seed=6)
    listed = LinearDecomposition(alpha=0.2).fit([a, b], y)
    cut = LinearDecomposition(alpha=0.2, blocks=[5, 3]).fit(np.hstack([a, b]), y)
    np.testing.assert_array_equal(cut.coef_, listed.coef_)
    np.testing.assert_array_equal(cut.penalty_, listed.penalty_)
    assert cut.block_sizes_ == [5, 3]
    np.testing.assert_array_equal(cut.predict(np.hstack([a, b])), cut.predict([a, b]))
    # one block of 8 features is another penalty (relative to the variance of all 8)
    whole = LinearDecomposition(alpha=0.2).fit(np.hstack([a, b]), y)
    assert not np.allclose(whole.penalty_, listed.penalty_)


def _manual_fold_scores(model: LinearDecomposition, x, y, folds: KFold) -> list[float]:
    scores = []
    for train, test in folds.split(x):
        fitted = clone(model).fit(x[train], y[train])
        residual = ((y[test] - fitted.predict(x[test])) ** 2).sum()
        scores.append(1 - residual / ((y[test] - y[test].mean(axis=0)) ** 2).sum())
    return scores


def test_grid_search_picks_alpha_by_the_pooled_r2_of_each_fold() -> None:
    (a, b), y = _data(rows=200, seed=7)
    x = np.hstack([a, b])
    folds = KFold(3, shuffle=True, random_state=0)
    grid = {"alpha": [1e-3, 10.0, 1000.0]}
    search = GridSearchCV(LinearDecomposition(blocks=[5, 3]), grid, cv=folds).fit(x, y)
    expected = [
        np.mean(_manual_fold_scores(LinearDecomposition(alpha=g, blocks=[5, 3]), x, y, folds))
        for g in grid["alpha"]
    ]
    np.testing.assert_allclose(search.cv_results_["mean_test_score"], expected, atol=1e-10)
    assert search.best_params_ == {"alpha": grid["alpha"][int(np.argmax(expected))]}
    assert expected[-1] < expected[0]  # a huge ridge strength explains less
    np.testing.assert_array_equal(
        search.best_estimator_.coef_,
        LinearDecomposition(blocks=[5, 3], **search.best_params_).fit(x, y).coef_,
    )


def test_cross_val_score_is_the_pooled_r2_of_each_fold() -> None:
    (a, _), y = _data(rows=150, seed=8)
    folds = KFold(5)
    model = LinearDecomposition(alpha=0.05)
    scores = cross_val_score(model, a, y, cv=folds)
    np.testing.assert_allclose(scores, _manual_fold_scores(model, a, y, folds), atol=1e-10)
    one = cross_val_score(model, a, y[:, 0], cv=folds, scoring="r2")  # scikit-learn's scorer
    np.testing.assert_allclose(one, cross_val_score(model, a, y[:, 0], cv=folds), atol=1e-10)


def test_pipeline_with_a_scaler_equals_ridge_on_the_scaled_features() -> None:
    (a, b), y = _data(seed=9)
    x = np.hstack([a, b])
    pipeline = make_pipeline(StandardScaler(), LinearDecomposition(alpha=0.01, blocks=[5, 3]))
    pipeline.fit(x, y)
    fitted = pipeline[-1]
    scaled = StandardScaler().fit_transform(x)
    # unit-variance blocks: the relative penalty is alpha itself
    np.testing.assert_allclose(fitted.penalty_, 0.01, rtol=1e-12)
    ridge = Ridge(alpha=0.01 * len(x), solver="cholesky").fit(scaled, y)
    np.testing.assert_allclose(fitted.coef_, ridge.coef_, rtol=0, atol=1e-8)
    np.testing.assert_allclose(pipeline.predict(x), ridge.predict(scaled), rtol=0, atol=1e-8)
    assert pipeline.score(x, y) == pytest.approx(
        r2_score(y, ridge.predict(scaled), multioutput="variance_weighted"), abs=1e-10
    )


def test_a_dataframe_keeps_its_column_names() -> None:
    import pandas as pd

    (a, _), y = _data(rows=40)
    frame = pd.DataFrame(a, columns=[f"f{i}" for i in range(5)])
    model = LinearDecomposition().fit(frame, y)
    assert list(model.feature_names_in_) == list(frame.columns)
    np.testing.assert_array_equal(model.predict(frame), model.predict(a))


def _escaped(message: str) -> str:
    return message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")


@pytest.mark.parametrize(
    ("call", "kind", "message"),
    [
        (lambda m, a, y: m.fit(a, y[:-1]), ValueError, "X has 50 rows but y has 49"),
        (lambda m, a, y: m.fit([], y), ValueError, "X is an empty list"),
        (lambda m, a, y: m.fit(np.where(a > 2, np.nan, a), y), ValueError, "Input X contains NaN"),
        (lambda m, a, y: m.fit(a, np.full_like(y, np.inf)), ValueError, "Input y contains inf"),
        (lambda m, a, y: m.fit([a, a[:, 0]], y), ValueError, "mixing 2-D blocks"),
        (lambda m, a, y: m.fit([a, a[:-1]], y), ValueError, "different row counts: [50, 49]"),
        (lambda m, a, y: m.fit(a[:, 0], y), ValueError, "X: Expected 2D array, got 1D array"),
        (lambda m, a, y: m.fit(a[:1], y[:1]), ValueError, "at least 2 samples to fit, got 1"),
        (lambda m, a, y: m.fit(a, None), ValueError, "requires y to be passed"),
        (lambda m, a, y: m.fit(a.astype(str), y), ValueError, "X: dtype='numeric' is not"),
        (lambda m, a, y: m.fit([a, a.astype(str)], y), ValueError, "X block 1: dtype='numeric'"),
        (lambda m, a, y: m.fit(a, y.astype(str)), ValueError, "y: dtype='numeric' is not"),
        (lambda m, a, y: m.fit(np.array([[{}]] * 50), y), TypeError, "X: float() argument"),
        (lambda m, a, y: m.predict(a), NotFittedError, "not fitted yet"),
        (lambda m, a, y: m.fit(a, y).predict(a[:, :2]), ValueError, "X has 2 features, but"),
        (lambda m, a, y: m.fit([a, a], y).predict(a), ValueError, "X has 5 features, but"),
        (lambda m, a, y: m.fit([a, a], y).predict(np.hstack([a, a])), ValueError, "[10]"),
        (lambda m, a, y: m.fit(a, y).score(a, y[:, :2]), ValueError, "y has 2 targets"),
        (lambda m, a, y: m.set_params(beta=1), ValueError, "Invalid parameter 'beta'"),
        (lambda m, a, y: m.set_params(alpha=-1.0).fit(a, y), ValueError, "alpha must be"),
        (lambda m, a, y: m.set_params(alpha="big").fit(a, y), TypeError, "alpha must be a number"),
        (lambda m, a, y: m.set_params(alpha_mode="other").fit(a, y), ValueError, "alpha_mode"),
        (lambda m, a, y: m.set_params(blocks=[2, 2]).fit(a, y), ValueError, "add up to 4"),
        (lambda m, a, y: m.set_params(blocks=[0, 5]).fit(a, y), ValueError, "counts > 0"),
        (lambda m, a, y: m.set_params(blocks=[3]).fit([a], y), ValueError, "blocks=[3]"),
    ],
)
def test_bad_input_is_one_user_input_error_of_the_kind_scikit_learn_expects(
    call, kind: type[Exception], message: str
) -> None:
    (a, _), y = _data(rows=50)
    with pytest.raises(UserInputError, match=_escaped(message)) as caught:
        call(LinearDecomposition(), a, y)
    assert isinstance(caught.value, kind)
