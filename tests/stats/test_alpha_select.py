"""Alpha paths, GCV, k-fold and degrees of freedom from moments vs references on raw rows."""

from __future__ import annotations

import csv

import numpy as np
import pytest
from sklearn.linear_model import Ridge
from sklearn.metrics import r2_score

from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.rundir.schema import ALPHA_CURVE, alpha_curve_rows
from lmalgebra.stats.alpha_select import (
    adjusted_r2,
    effective_df,
    group_effective_df,
    select_alpha,
)
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.ridge_path import RidgePath
from lmalgebra.stats.solver import Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from lmalgebra.storage.csv_tables import write_table
from tiny import correlated_models

NAMES = ["a", "b", "c", "d"]
DIMS = [5, 7, 3, 6]
BLOCKS = layout(NAMES, DIMS)
PARTS = 7
FITS = [("a", ["b", "d"]), ("c", ["a", "b", "d"]), ("d", ["c"])]


def embeddings(n: int, seed: int) -> np.ndarray:
    """Four correlated models of different widths, offsets and scales."""
    return correlated_models(n, seed, tuple(DIMS), latent=6, noise=1.0)


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    full = embeddings(600, seed=1)
    return {"train": full[:400], "validation": full[400:500], "test": full[500:]}


def moments(z: np.ndarray) -> SplitMoments:
    m = SecondMoments(BLOCKS)
    for chunk in np.array_split(z, 3):
        m.update(chunk)
    return SplitMoments.of(m)


@pytest.fixture(scope="module")
def splits(data: dict[str, np.ndarray]) -> dict[str, SplitMoments]:
    return {split: moments(z) for split, z in data.items()}


@pytest.fixture(scope="module")
def train_blocks(data: dict[str, np.ndarray]) -> SpanBlockMoments:
    blocked = SpanBlockMoments.empty(BLOCKS, len(data["train"]), PARTS)
    blocked.add_rows(data["train"], 0)
    return blocked


def cols(names: list[str]) -> np.ndarray:
    by = {b.name: b for b in BLOCKS}
    return np.concatenate([np.arange(by[n].start, by[n].stop) for n in names])


def scales(z: np.ndarray, mode: str) -> np.ndarray:
    """Per-column sqrt of the penalty scale, from raw rows (population variances)."""
    if mode == "absolute":
        return np.ones(z.shape[1])
    return np.concatenate(
        [
            np.full(d, np.sqrt(z[:, cols([n])].var(0).mean()))
            for n, d in zip(NAMES, DIMS, strict=True)
        ]
    )


def raw_ridge(z: np.ndarray, target: str, basis: list[str], alpha: float, mode: str) -> Ridge:
    """scikit-learn ridge on the rescaled basis (its objective is a sum: alpha * n)."""
    x = z[:, cols(basis)] / scales(z, mode)[cols(basis)]
    return Ridge(alpha=alpha * len(z), solver="cholesky").fit(x, z[:, cols([target])])


def hat_trace_and_rss(z: np.ndarray, target: str, basis: list[str], alpha: float, mode: str):
    """Trace of the n x n hat matrix (intercept included) and RSS, both from raw rows."""
    n = len(z)
    x = z[:, cols(basis)] / scales(z, mode)[cols(basis)]
    xc = x - x.mean(0)
    hat = np.ones((n, n)) / n + xc @ np.linalg.solve(
        xc.T @ xc + n * alpha * np.eye(x.shape[1]), xc.T
    )
    y = z[:, cols([target])]
    return np.trace(hat), float(((y - hat @ y) ** 2).sum())


def path_of(splits: dict[str, SplitMoments], target: str, basis: list[str], mode: str) -> RidgePath:
    scale = Decomposer(BLOCKS, splits, 1.0, mode).penalty  # type: ignore[arg-type]
    block = next(b for b in BLOCKS if b.name == target)
    return RidgePath(splits["train"], scale, block, cols(basis))


@pytest.mark.parametrize("mode", ["relative", "absolute"])
@pytest.mark.parametrize("spec", [*FITS, ("b", ["a", "c", "d"])])
def test_eigen_path_equals_direct_fits(splits, mode: str, spec) -> None:
    target, basis = spec
    path = path_of(splits, target, basis, mode)
    alphas = np.array([1e-4, 3e-2, 0.5, 20.0])
    held = {s: path.held_out(splits[s]) for s in ("validation", "test")}
    train_r2 = path.train_r2(alphas)
    held_r2 = {s: path.r2(h, alphas) for s, h in held.items()}
    for k, alpha in enumerate(alphas):
        fit = Decomposer(BLOCKS, splits, float(alpha), mode).fit(target, basis)  # type: ignore[arg-type]
        np.testing.assert_allclose(path.weight(alpha), fit.weight, rtol=0, atol=1e-8)
        np.testing.assert_allclose(path.bias(alpha), fit.bias, rtol=0, atol=1e-8)
        assert train_r2[k] == pytest.approx(fit.r2["train"], abs=1e-8)
        for s in held:
            assert held_r2[s][k] == pytest.approx(fit.r2[s], abs=1e-8)


@pytest.mark.parametrize("mode", ["relative", "absolute"])
def test_gcv_equals_raw_hat_matrix_gcv(splits, data, mode: str) -> None:
    grid = [1e-3, 0.05, 2.0]
    sel = select_alpha(BLOCKS, splits, alpha_mode=mode, grid=grid, fits=FITS)  # type: ignore[arg-type]
    z, n = data["train"], len(data["train"])
    relative = np.empty((len(FITS), len(grid)))
    for i, (target, basis) in enumerate(FITS):
        for k, alpha in enumerate(grid):
            trace, rss = hat_trace_and_rss(z, target, basis, alpha, mode)
            model = raw_ridge(z, target, basis, alpha, mode)
            pred = model.predict(z[:, cols(basis)] / scales(z, mode)[cols(basis)])
            assert ((z[:, cols([target])] - pred) ** 2).sum() == pytest.approx(rss, rel=1e-9)
            reference = (rss / n) / (1 - trace / n) ** 2
            assert sel.curves["gcv"][i, k] == pytest.approx(reference, rel=1e-8)
            relative[i, k] = reference / z[:, cols([target])].var(0).sum()
    # chosen by the mean over fits of GCV relative to each target's variance
    assert sel.alpha == grid[int(np.argmin(relative.mean(axis=0)))]


def test_gcv_with_more_slopes_than_rows_equals_raw_gcv() -> None:
    rng = np.random.default_rng(2)
    blocks = layout(["x", "y"], [40, 3])
    x = rng.normal(size=(30, 40)) * rng.uniform(0.5, 3, size=40)
    y = x[:, :3] + rng.normal(size=(30, 3))
    m = SecondMoments(blocks)
    m.update(np.hstack([x, y]))
    grid = [1e-2, 0.1, 1.0]
    sel = select_alpha(blocks, {"train": SplitMoments.of(m)}, grid=grid, fits=[("y", ["x"])])
    xs = x / np.sqrt(x.var(0).mean())  # relative mode: one model, one scale
    xc = xs - xs.mean(0)
    for k, alpha in enumerate(grid):
        hat = np.ones((30, 30)) / 30 + xc @ np.linalg.solve(
            xc.T @ xc + 30 * alpha * np.eye(40), xc.T
        )
        rss = ((y - hat @ y) ** 2).sum()
        reference = (rss / 30) / (1 - np.trace(hat) / 30) ** 2
        assert sel.curves["gcv"][0, k] == pytest.approx(reference, rel=1e-7)


@pytest.mark.parametrize("mode", ["relative", "absolute"])
def test_kfold_equals_refits_on_raw_rows(splits, data, train_blocks, mode: str) -> None:
    grid, k = [1e-3, 0.1, 5.0], 3
    sel = select_alpha(
        BLOCKS,
        splits,
        alpha_mode=mode,
        method="kfold",
        grid=grid,
        fits=FITS,  # type: ignore[arg-type]
        train_blocks=train_blocks,
        folds=k,
    )
    z, edges = data["train"], train_blocks.edges
    # folds: contiguous groups of blocks, the first ones one block larger when uneven
    sizes = [PARTS // k + (f < PARTS % k) for f in range(k)]
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    for i, (target, basis) in enumerate(FITS):
        for a, alpha in enumerate(grid):
            scores = []
            for f in range(k):
                rows = np.arange(edges[bounds[f]], edges[bounds[f + 1]])
                held, rest = z[rows], np.delete(z, rows, axis=0)
                model = raw_ridge(rest, target, basis, alpha, mode)
                pred = model.predict(held[:, cols(basis)] / scales(rest, mode)[cols(basis)])
                truth = held[:, cols([target])]
                scores.append(r2_score(truth, pred, multioutput="variance_weighted"))
            assert sel.curves["kfold"][i, a] == pytest.approx(np.mean(scores), abs=1e-8)


def test_validation_curve_and_group_fits_equal_decomposer(splits) -> None:
    grid = [1e-4, 0.01, 1.0]
    sel = select_alpha(BLOCKS, splits, grid=grid, method="validation")
    assert sel.labels == tuple(NAMES)
    assert set(sel.curves) == {"gcv", "validation"}
    for k, alpha in enumerate(grid):
        for i, fit in enumerate(Decomposer(BLOCKS, splits, alpha).leave_one_out()):
            assert sel.curves["validation"][i, k] == pytest.approx(fit.r2["validation"], abs=1e-8)
    best = int(np.argmax(sel.curves["validation"].mean(axis=0)))
    assert sel.alpha == grid[best]


@pytest.mark.parametrize("mode", ["relative", "absolute"])
def test_effective_df_is_the_hat_matrix_trace(splits, data, mode: str) -> None:
    for alpha in (1e-3, 0.2, 10.0):
        solver = Decomposer(BLOCKS, splits, alpha, mode)  # type: ignore[arg-type]
        groups = group_effective_df(solver)
        for target, basis in [*FITS, ("b", ["a", "c", "d"])]:
            trace, _ = hat_trace_and_rss(data["train"], target, basis, alpha, mode)
            df = effective_df(solver, basis)
            assert df == pytest.approx(trace - 1, abs=1e-8)  # the intercept is the 1
            assert path_of(splits, target, basis, mode).df(np.array([alpha]))[0] == pytest.approx(
                df, abs=1e-8
            )
        for target in NAMES:
            others = [n for n in NAMES if n != target]
            assert groups[target] == pytest.approx(effective_df(solver, others), abs=1e-8)


def test_adjusted_r2_at_zero_alpha_is_the_ols_adjusted_r2(splits, data) -> None:
    z, n = data["train"], len(data["train"])
    basis = ["a", "c", "d"]
    solver = Decomposer(BLOCKS, splits, 0.0, "absolute")
    fit = solver.fit("b", basis)
    df = effective_df(solver, basis)
    assert df == pytest.approx(sum(DIMS) - 7, abs=1e-9)
    design = np.hstack([z[:, cols(basis)], np.ones((n, 1))])
    y = z[:, cols(["b"])]
    solution, *_ = np.linalg.lstsq(design, y, rcond=None)
    sse = ((y - design @ solution) ** 2).sum()
    sst = ((y - y.mean(0)) ** 2).sum()
    p = design.shape[1] - 1
    reference = 1 - (sse / (n - p - 1)) / (sst / (n - 1))
    assert adjusted_r2(fit.r2["train"], n, df) == pytest.approx(reference, abs=1e-10)
    assert np.isnan(adjusted_r2(0.5, 10, 9.0))


def bayes_problem(
    seed: int, n: int, n_val: int
) -> tuple[list, dict[str, SplitMoments], SpanBlockMoments, float]:
    """y = x w + noise with w ~ N(0, tau^2) per output: the best mean-objective alpha is
    sigma^2 / (n tau^2) (the posterior mean), for unit-variance x."""
    rng = np.random.default_rng(seed)
    d_x, d_y, tau2, sigma2 = 30, 12, 0.04, 1.0
    w = rng.normal(scale=np.sqrt(tau2), size=(d_x, d_y))

    def draw(rows: int) -> np.ndarray:
        x = rng.normal(size=(rows, d_x))
        return np.hstack([x, x @ w + rng.normal(scale=np.sqrt(sigma2), size=(rows, d_y))])

    blocks = layout(["x", "y"], [d_x, d_y])
    train = SpanBlockMoments.empty(blocks, n, 10)
    train.add_rows(draw(n), 0)
    val = SecondMoments(blocks)
    val.update(draw(n_val))
    splits = {"train": SplitMoments.of(train.total()), "validation": SplitMoments.of(val)}
    return blocks, splits, train, sigma2 / (n * tau2)


@pytest.mark.parametrize("method", ["gcv", "kfold", "validation"])
def test_chosen_alpha_lands_near_the_known_best(method: str) -> None:
    blocks, splits, train, best = bayes_problem(seed=5, n=300, n_val=5000)
    grid = np.logspace(-4, 1, 50)
    sel = select_alpha(
        blocks,
        splits,
        alpha_mode="absolute",
        method=method,
        grid=grid,  # type: ignore[arg-type]
        fits=[("y", ["x"])],
        train_blocks=train,
        folds=5,
    )
    assert best / 2 < sel.alpha < best * 2, (sel.alpha, best)
    # and far from the ends of the grid, where a broken criterion would land
    assert grid[5] < sel.alpha < grid[-5]


def test_rows_and_csv_are_tidy(splits, train_blocks, tmp_path) -> None:
    fits = [("a", ["b"]), ("a", ["b", "c"]), ("d", ["c"])]
    grid = [0.01, 0.1]
    sel = select_alpha(
        BLOCKS, splits, grid=grid, fits=fits, method="kfold", train_blocks=train_blocks, folds=2
    )
    assert sel.labels == ("a~b", "a~b+c", "d")
    rows = sel.rows()
    assert len(rows) == 3 * len(fits) * len(grid)
    path = write_table(tmp_path, ALPHA_CURVE, alpha_curve_rows(sel))
    assert path == tmp_path / "alpha_curve.csv"
    with path.open() as handle:
        back = list(csv.DictReader(handle))
    assert list(back[0]) == ["target", "alpha", "criterion", "value"]
    assert {r["criterion"] for r in back} == {"gcv", "kfold", "validation"}
    got = {(r["target"], float(r["alpha"]), r["criterion"]): float(r["value"]) for r in back}
    assert got[("d", 0.1, "kfold")] == sel.curves["kfold"][2, 1]
    assert sel.summary() == {"value": sel.alpha, "mode": "relative", "selected_by": "kfold"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grid": []}, "alpha grid is empty"),
        ({"grid": [0.1, 0.0]}, r"alpha grid value 0\.0 must be > 0"),
        ({"grid": [-1.0]}, r"alpha grid value -1\.0 must be > 0"),
        ({"grid": [1.0, float("nan")]}, "alpha grid value nan is not a finite number"),
        ({"grid": [float("inf")]}, "alpha grid value inf is not a finite number"),
        ({"method": "kfold", "folds": 1}, "k >= 2 folds, got k=1"),
        ({"method": "kfold", "folds": PARTS + 1}, f"k={PARTS + 1} folds exceed the {PARTS} blocks"),
        ({"method": "loo"}, "method 'loo' is not one of"),
        ({"fits": [("a", ["zz"])]}, "'zz' is not among the models"),
        ({"fits": [("a", ["a", "b"])]}, "contains the target 'a'"),
        ({"fits": [("a", [])]}, "basis of target 'a' is empty"),
    ],
)
def test_bad_inputs_name_the_culprit(splits, train_blocks, kwargs, message) -> None:
    with pytest.raises(UserInputError, match=message):
        select_alpha(BLOCKS, splits, train_blocks=train_blocks, **kwargs)


def test_validation_method_needs_the_validation_split(splits) -> None:
    with pytest.raises(UserInputError, match="validation split"):
        select_alpha(BLOCKS, {"train": splits["train"]}, method="validation")
