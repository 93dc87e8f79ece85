"""The solver's dense kernels vs numpy: SPD inverse in place (LAPACK), quadratic forms, the
Gram updates (BLAS syrk, panels of products), the Cholesky solves."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from lmalgebra.stats import symmetric_kernels
from lmalgebra.stats.moments import add_gram
from lmalgebra.stats.symmetric_kernels import (
    cholesky,
    cholesky_solve,
    column_runs,
    row_quadratics,
    spd_inverse,
)


def spd(dim: int, seed: int) -> np.ndarray:
    a = np.random.default_rng(seed).normal(size=(dim, dim))
    return a @ a.T / dim + 0.1 * np.eye(dim)


def test_spd_inverse_overwrites_its_buffer() -> None:
    matrix = spd(1100, 0)  # more than two panels, so the mirroring crosses panels
    buffer = matrix.copy()
    inverse, diag = spd_inverse(buffer)
    assert inverse is not None and np.shares_memory(inverse, buffer)
    assert inverse.flags.c_contiguous
    np.testing.assert_allclose(inverse, np.linalg.inv(matrix), rtol=1e-9, atol=1e-10)
    np.testing.assert_array_equal(inverse, inverse.T)
    np.testing.assert_allclose(diag, np.diag(np.linalg.cholesky(matrix)), rtol=1e-12)


def test_spd_inverse_of_an_indefinite_matrix_is_none() -> None:
    matrix = spd(50, 1)
    matrix[7, 7] = -1.0
    inverse, _ = spd_inverse(matrix)
    assert inverse is None


def test_row_quadratics_over_column_runs_equal_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(symmetric_kernels, "PANEL", 64)  # several panels per run
    cov = spd(400, 2)
    cols = np.r_[np.arange(150, 300), np.arange(10, 40), np.arange(320, 400), [5]]
    assert column_runs(cols) == [(0, 150, 150), (150, 30, 10), (180, 80, 320), (260, 1, 5)]
    op = np.random.default_rng(3).normal(size=(9, cols.size))
    expected = np.einsum("ij,jk,ik->i", op, cov[np.ix_(cols, cols)], op)
    got = row_quadratics(op, cov, cols)
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # the panels on one thread: the same bits
    np.testing.assert_array_equal(row_quadratics(op, cov, cols), got)


def test_row_quadratics_of_a_float32_operator_on_a_float64_covariance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A float32 run's operators read a float64 covariance's panels in float32 (the input is left
    as it was); the quadratic forms are summed in float64, to float32 rounding."""
    monkeypatch.setattr(symmetric_kernels, "PANEL", 64)
    cov = spd(300, 6)
    before = cov.copy()
    cols = np.r_[np.arange(100, 300), np.arange(0, 50)]
    op = np.random.default_rng(7).normal(size=(20, cols.size))
    expected = np.einsum("ij,jk,ik->i", op, cov[np.ix_(cols, cols)], op)
    got = row_quadratics(op.astype(np.float32), cov, cols)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-4)
    np.testing.assert_array_equal(cov, before)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_float32_gram_is_symmetric_and_within_float32_rounding(
    threads: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Panels of float32 products added in float64: ``gram += rows^T rows`` to float32 accuracy,
    every entry, both triangles; added to what ``gram`` held; the same bits on one thread as on
    two (each panel is one product whichever thread takes it)."""
    rng = np.random.default_rng(4)
    rows = rng.normal(size=(300, 1100)).astype(np.float32)  # 1100 columns: several panels
    exact = rows.astype(np.float64).T @ rows.astype(np.float64)
    start = spd(1100, 5)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    alone = start.copy()
    add_gram(alone, rows)
    monkeypatch.setenv("OMP_NUM_THREADS", threads)
    gram = start.copy()
    add_gram(gram, rows)
    absolute = np.abs(rows.astype(np.float64)).T @ np.abs(rows.astype(np.float64))
    error = np.abs(gram - start - exact)
    assert (error <= 303 * 2.0**-24 * absolute + 1e-12).all()
    np.testing.assert_array_equal(gram, gram.T)
    np.testing.assert_array_equal(gram, alone)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gram_of_rows_in_the_grams_dtype_equals_numpy(dtype: Any) -> None:
    """Rows of the Gram's own dtype (float64 rows into a float64 Gram, as the float64 products
    do; float32 into float32, as the float32 precision does), the panels added in place."""
    rows = np.random.default_rng(8).normal(size=(200, 300)).astype(dtype)
    start = spd(300, 9).astype(dtype)
    gram = start.copy()
    add_gram(gram, rows)
    expected = start.astype(np.float64) + rows.astype(np.float64).T @ rows.astype(np.float64)
    tolerance = 1e-12 if dtype == np.float64 else 1e-4
    np.testing.assert_allclose(gram, expected, rtol=tolerance, atol=tolerance)
    np.testing.assert_array_equal(gram, gram.T)


def test_cholesky_solve_equals_numpy_and_refuses_an_indefinite_matrix() -> None:
    matrix = spd(120, 10)
    rhs = np.random.default_rng(11).normal(size=(120, 7))
    factor, ok = cholesky(matrix)
    assert ok
    np.testing.assert_array_equal(np.triu(factor, 1), 0)
    np.testing.assert_allclose(factor @ factor.T, matrix, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cholesky_solve(factor, rhs), np.linalg.solve(matrix, rhs), rtol=1e-9)
    matrix[3, 3] = -1.0
    assert not cholesky(matrix)[1]


def _spd(dim: int, dtype: Any = np.float64, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((dim, dim))
    a += a.T
    a[np.diag_indices(dim)] += 4 * np.sqrt(dim)  # diagonally dominant: SPD
    return a.astype(dtype)


def test_a_large_float64_inverse_runs_on_one_blas_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above the order where OpenBLAS's threaded dsyrk crashes, the factorisation runs on one
    BLAS thread (checked here with the order lowered), and gives the same inverse."""
    from threadpoolctl import threadpool_info

    seen: list[int] = []
    real = symmetric_kernels._sound_threads

    def watching(system: np.ndarray) -> Any:
        limit = real(system)
        with limit:
            seen.append(max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"))
        return real(system)

    monkeypatch.setattr(symmetric_kernels, "THREADED_FLOAT64_ORDER", 40)
    monkeypatch.setattr(symmetric_kernels, "_sound_threads", watching)
    small, large = _spd(40), _spd(41)
    expected = np.linalg.inv(large)
    inverse, _ = spd_inverse(large.copy())
    spd_inverse(small.copy())
    spd_inverse(_spd(41, np.float32))
    assert inverse is not None
    np.testing.assert_allclose(inverse, expected, rtol=1e-10, atol=1e-12)
    assert seen[0] == 1  # the order-41 float64 system: one thread
    as_set = max(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
    assert seen[1:] == [as_set, as_set]  # at the threshold, and float32: threads as they were


@pytest.mark.slow
def test_a_float64_inverse_of_order_16384_does_not_crash() -> None:
    """Order 16,384 in float64 crashed in OpenBLAS's threaded dsyrk on AVX-512 CPUs (a
    segmentation fault in a wide exact run); about a minute on 2 cores, 2 GiB."""
    system = _spd(16_384)
    probe = system[:, :3] @ np.ones(3)  # system @ e_0..2 summed, before it is overwritten
    inverse, _ = spd_inverse(system)
    assert inverse is not None
    np.testing.assert_allclose(inverse @ probe, np.r_[np.ones(3), np.zeros(16_381)], atol=1e-8)
