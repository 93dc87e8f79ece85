"""Float32 products in the statistics pass against the float64 path.

The Gram bound: the float32 path rounds each shift-centred value once (relative error <= u, with
u = 2^-24 the unit roundoff of float32) and sums at most k = FLOAT32_ROWS products in float32
before adding them in float64. Each product then carries at most 2u + u^2 of relative error and
a float32 sum of k terms at most gamma_k = k u / (1 - k u) of the sum of their absolute values,
so entry (i, j) of the Gram matrix is off by at most

    (k + 3) u * sum_r |x_ri| |x_rj|          (x: the shift-centred rows; float64 sums ~ 1e-16)

The bound is relative to the *centred* rows: without centring, a common offset of 1e3 would make
the error a million times larger and the test fail.
"""

from __future__ import annotations

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import FLOAT32_ROWS, SecondMoments, layout
from lmalgebra.stats.solver import Decomposer, SplitMoments
from tiny import correlated_models

UNIT_ROUNDOFF = 2.0**-24


def streamed(z: np.ndarray, blocks: list, products: str, chunk: int) -> SecondMoments:
    moments = SecondMoments(blocks, products=products)  # type: ignore[arg-type]
    for start in range(0, len(z), chunk):
        moments.update(z[start : start + chunk])
    return moments


def collinear(n: int, seed: int, offset: float) -> np.ndarray:
    """``(n, 24) float32``: 3 models of 8 columns, nearly collinear (rank 4 plus 1e-4 noise),
    all far from the origin."""
    rng = np.random.default_rng(seed)
    latent = rng.normal(size=(n, 4))
    mixes = [rng.normal(size=(4, 8)) for _ in range(3)]
    z = np.hstack([latent @ mix + 1e-4 * rng.normal(size=(n, 8)) for mix in mixes])
    return (z + offset * (1 + rng.random(24))).astype(np.float32)


@pytest.mark.parametrize("chunk", [300, 5000])  # one chunk, cut at FLOAT32_ROWS inside
def test_float32_gram_error_is_within_the_float32_bound(chunk: int) -> None:
    z = collinear(5000, 0, offset=1e3)
    blocks = layout(["a", "b", "c"], [8, 8, 8])
    exact = streamed(z, blocks, "float64", chunk)
    fast = streamed(z, blocks, "float32", chunk).shifted_to(exact.shift)
    centred = np.abs(z.astype(np.float64) - exact.shift)
    k = min(chunk, FLOAT32_ROWS)
    bound = (k + 3) * UNIT_ROUNDOFF * (centred.T @ centred) + 1e-9
    error = np.abs(fast.gram - exact.gram)
    assert (error <= bound).all(), float((error / bound).max())
    assert error.max() > 0  # the float32 path did run
    np.testing.assert_allclose(fast.sums, exact.sums, rtol=1e-9, atol=1e-6)
    # the same bound on the covariance, whose scale is the centred rows' (not the offset's)
    cov_error = np.abs(fast.covariance() - exact.covariance())
    assert (cov_error <= bound / len(z) + 1e-9).all()


def test_float32_products_leave_the_input_and_merging_alone() -> None:
    z = collinear(700, 1, offset=50.0)
    blocks = layout(["a", "b", "c"], [8, 8, 8])
    before = z.copy()
    halves = streamed(z[:300], blocks, "float32", 100) + streamed(z[300:], blocks, "float32", 100)
    np.testing.assert_array_equal(z, before)
    whole = streamed(z, blocks, "float32", 100).shifted_to(halves.shift)
    assert halves.products == "float32" and halves.n == 700
    np.testing.assert_allclose(halves.gram, whole.gram, rtol=1e-5, atol=1e-6)


def fits(z: dict[str, np.ndarray], blocks: list, products: str, alpha: float, mode: str) -> dict:
    """Pairwise, leave-one-out and one two-model fit's R^2 of statistics with ``products``."""
    splits = {s: SplitMoments.of(streamed(x, blocks, products, 256)) for s, x in z.items()}
    solver = Decomposer(blocks, splits, alpha, mode)  # type: ignore[arg-type]
    names = [b.name for b in blocks]
    pairwise = solver.pairwise()
    out = {("pairwise", s): pairwise[s] for s in splits}
    for fit in [*solver.leave_one_out(), solver.fit(names[0], names[1:3])]:
        out |= {(fit.target, "+".join(fit.basis), s): fit.r2[s] for s in splits}
    return out


@pytest.mark.parametrize(
    ("case", "alpha", "mode"),
    [
        ("moderate", 1e-2, "relative"),
        ("moderate", 1e-6, "absolute"),
        ("collinear", 1e-6, "relative"),
    ],
)
def test_r2_of_float32_products_agree_with_float64_to_1e6(case: str, alpha: float, mode: str):
    if case == "moderate":
        full = correlated_models(3000, 2, (40, 56, 24, 48)).astype(np.float32)
        blocks = layout(["a", "b", "c", "d"], [40, 56, 24, 48])
    else:
        full = collinear(3000, 3, offset=1e3)
        blocks = layout(["a", "b", "c"], [8, 8, 8])
    z = {"train": full[:2000], "validation": full[2000:2500], "test": full[2500:]}
    exact, fast = (fits(z, blocks, p, alpha, mode) for p in ("float64", "float32"))
    for key, value in exact.items():
        np.testing.assert_allclose(fast[key], value, atol=1e-6, err_msg=str(key))


def test_a_basis_singular_at_float32_resolution_needs_float64_products() -> None:
    """Rank 4 in 8 columns plus 1e-4 noise: eigenvalues ~1e-8 of a spread of ~10, below what
    float32 products resolve; with a tiny absolute alpha only float64 products keep the basis
    positive definite, and the message says so."""
    z = collinear(4000, 4, offset=0.0)
    blocks = layout(["a", "b", "c"], [8, 8, 8])
    exact, fast = (SplitMoments.of(streamed(z, blocks, p, 1000)) for p in ("float64", "float32"))
    Decomposer(blocks, {"train": exact}, 1e-12, "absolute").fit("a", ["b"])
    with pytest.raises(UserInputError, match=r"basis \[b\] is singular.*--products float64"):
        Decomposer(blocks, {"train": fast}, 1e-12, "absolute").fit("a", ["b"])
