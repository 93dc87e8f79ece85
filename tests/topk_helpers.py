"""A model's top-k as stored (batched, padded) against the same model's top-k on one input alone:
two sums of the same logits in other kernels, which may order a near-tie either way."""

from __future__ import annotations

import numpy as np

# Two kernels' log-probabilities of one position agree to about 1e-6 (the tests assert 1e-5): a
# gap wider than this between two candidates is one that no kernel's rounding reorders.
TIE_MARGIN = 1e-4


def assert_same_topk(
    ids: np.ndarray,
    values: np.ndarray,
    want_ids: np.ndarray,
    want_values: np.ndarray,
    atol: float,
    margin: float = TIE_MARGIN,
) -> int:
    """``ids``, ``values`` ``(n, k)``, most likely first, against the reference's top ``k + 1``
    (``want_ids``, ``want_values`` ``(n, k + 1)``). The values agree to ``atol`` at every rank; an
    id is the reference's at each rank whose value clears both neighbours by ``margin``, and
    elsewhere one the reference ranks within ``margin`` of that rank's value (or, at a tie that
    reaches past the reference's list, one beyond it). Returns how many ids were compared exactly.
    """
    k = ids.shape[1]
    assert want_ids.shape == want_values.shape == (len(ids), k + 1)
    np.testing.assert_allclose(values, want_values[:, :k], rtol=0, atol=atol)
    below = -np.diff(want_values, axis=1)  # (n, k): each rank's lead over the next
    above = np.concatenate([np.full((len(ids), 1), np.inf), below[:, :-1]], axis=1)
    clear = (below > margin) & (above > margin)
    np.testing.assert_array_equal(ids[clear], want_ids[:, :k][clear])
    for row, rank in zip(*np.nonzero(~clear), strict=True):
        value, listed = want_values[row, rank], list(want_ids[row])
        if ids[row, rank] in listed:
            other = want_values[row, listed.index(ids[row, rank])]
            assert abs(other - value) <= margin, (row, rank, ids[row], want_ids[row])
        else:  # a tie with a candidate below the reference's last
            assert value - want_values[row, -1] <= margin, (row, rank, ids[row], want_ids[row])
    assert all(len(set(row)) == k for row in ids.tolist())  # k distinct ids in every row
    return int(clear.sum())
