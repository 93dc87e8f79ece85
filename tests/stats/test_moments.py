"""Streaming second moments: exact against one-pass numpy, and mergeable across shards."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import SecondMoments, layout

BLOCKS = layout(["p", "q"], [4, 2])


def rows(n: int, seed: int, offset: float = 0.0) -> np.ndarray:
    return np.random.default_rng(seed).normal(loc=offset, size=(n, 6)).astype(np.float32)


def stream(z: np.ndarray, chunks: int) -> SecondMoments:
    m = SecondMoments(BLOCKS)
    for part in np.array_split(z, chunks):
        m.update(part)
    return m


def test_streamed_moments_equal_numpy() -> None:
    z = rows(1000, 0, offset=50.0)  # large mean: the shift keeps covariance accurate
    m = stream(z, 7)
    z64 = z.astype(np.float64)
    np.testing.assert_allclose(m.mean(), z64.mean(0), rtol=1e-12)
    np.testing.assert_allclose(m.covariance(), np.cov(z64, rowvar=False, bias=True), atol=1e-11)
    assert m.n == 1000


def test_merged_shards_equal_one_pass() -> None:
    a, b = rows(300, 1, 5.0), rows(500, 2, -3.0)
    merged = stream(a, 2) + stream(b, 3)  # different shifts: converted exactly
    whole = stream(np.vstack([a, b]), 1).shifted_to(merged.shift)
    assert merged.n == whole.n
    np.testing.assert_allclose(merged.sums, whole.sums, rtol=1e-10, atol=1e-9)
    np.testing.assert_allclose(merged.gram, whole.gram, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(merged.covariance(), whole.covariance(), atol=1e-12)


def test_merge_with_empty_and_mismatched_layouts() -> None:
    m = stream(rows(10, 3), 1)
    assert (m + SecondMoments(BLOCKS)).n == 10
    assert (SecondMoments(BLOCKS) + m).n == 10
    with pytest.raises(ValueError, match="different models"):
        m + SecondMoments(layout(["p", "r"], [4, 2]))


def test_save_load_round_trip(tmp_path: Path) -> None:
    m = stream(rows(50, 4), 2)
    m.save(tmp_path / "s.safetensors")
    back = SecondMoments.load(tmp_path / "s.safetensors")
    assert back.blocks == m.blocks and back.n == m.n
    np.testing.assert_array_equal(back.gram, m.gram)
    (tmp_path / "bad.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(UserInputError, match=r"bad\.safetensors"):
        SecondMoments.load(tmp_path / "bad.safetensors")


def test_in_place_covariance_spends_the_statistics() -> None:
    m = stream(rows(40, 5), 2)
    expected = m.covariance()
    np.testing.assert_array_equal(m.covariance(in_place=True), expected)
    for use in (m.mean, m.covariance, lambda: m.update(rows(3, 6))):
        with pytest.raises(RuntimeError, match="spent"):
            use()
