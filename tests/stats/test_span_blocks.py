import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.span_blocks import SpanBlockMoments, block_edges


def _data(n=103, dims=(3, 4), seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(5.0, 2.0, size=(n, sum(dims))), layout(["a", "b"], list(dims))


def test_edges_cover_rows_contiguously():
    assert block_edges(10, 3) == [0, 3, 7, 10]
    assert block_edges(2, 5) == [0, 1, 2]


def test_parts_sum_to_one_pass_statistics_whatever_the_chunking():
    z, blocks = _data()
    blocked = SpanBlockMoments.empty(blocks, len(z), 7)
    for start in range(0, len(z), 10):  # chunks straddle block edges
        blocked.add_rows(z[start : start + 10], start)
    total = blocked.total()
    direct = z - z.mean(0)
    assert total.n == len(z)
    np.testing.assert_allclose(total.mean(), z.mean(0), rtol=1e-12)
    np.testing.assert_allclose(total.covariance(), direct.T @ direct / len(z), rtol=1e-10)


def test_combine_counts_blocks_with_multiplicity():
    z, blocks = _data(n=60)
    blocked = SpanBlockMoments.empty(blocks, len(z), 6)
    blocked.add_rows(z, 0)
    counts = np.array([2, 0, 1, 0, 3, 0])
    edges = blocked.edges
    pieces = [np.repeat(z[edges[p] : edges[p + 1]], c, axis=0) for p, c in enumerate(counts)]
    rows = np.concatenate(pieces, axis=0)
    ref = SecondMoments(blocks)
    ref.update(rows)
    got = blocked.combine(counts)
    assert got.n == len(rows)
    np.testing.assert_allclose(got.mean(), rows.mean(0), rtol=1e-12)
    np.testing.assert_allclose(got.covariance(), ref.covariance(), rtol=1e-10, atol=1e-12)
    prefix = blocked.prefix(2)
    np.testing.assert_allclose(prefix.mean(), z[: blocked.edges[2]].mean(0), rtol=1e-12)


def test_save_load_round_trip(tmp_path):
    z, blocks = _data(n=20)
    blocked = SpanBlockMoments.empty(blocks, len(z), 3)
    blocked.add_rows(z, 0)
    blocked.save(tmp_path / "train")
    back = SpanBlockMoments.load(tmp_path / "train")
    assert back.edges == blocked.edges
    np.testing.assert_array_equal(back.total().gram, blocked.total().gram)


def test_rows_outside_the_split_are_refused():
    z, blocks = _data(n=10)
    blocked = SpanBlockMoments.empty(blocks, 10, 2)
    with pytest.raises(ValueError):
        blocked.add_rows(z, 5)


def test_subset_keeps_the_chosen_models_columns():
    z, blocks = _data(n=30)
    blocked = SpanBlockMoments.empty(blocks, len(z), 3)
    blocked.add_rows(z, 0)
    only_b = blocked.subset(["b"]).total()
    assert [b.name for b in only_b.blocks] == ["b"]
    np.testing.assert_allclose(only_b.mean(), z[:, 3:].mean(0), rtol=1e-12)
    with pytest.raises(UserInputError):
        blocked.subset(["c"])
