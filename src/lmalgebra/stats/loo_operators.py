"""The leave-one-model-out operators of a group fit, from the one inverse ``P = (C + Lam)^-1``.

Every model ``t`` fitted on all the others has the operator ``R_t = P_tt^-1 P_t`` (its weights are
``-R_tB`` and its bias follows from ``R_t`` applied to the means); its train residual and effective
degrees of freedom follow from ``P`` alone (:class:`~lmalgebra.stats.solver.Decomposer`).
"""

from __future__ import annotations

import itertools

import numpy as np

from lmalgebra.stats.symmetric_kernels import in_parallel


def leave_one_out_operators(
    inverse: np.ndarray, edges: np.ndarray, penalty: np.ndarray
) -> tuple[list[float], list[float]]:
    """Turn ``P``'s rows into the operators ``R_t`` (in place); each fit's train residual and df.

    ``edges``: each block's rows ``[edges[k], edges[k + 1])`` of ``P``; ``penalty``: the penalty
    of every row. On train, ``C = P^-1 - Lam`` gives ``tr(R C R^T) = tr(P_tt^-1) - sum(Lam *
    R^2)``; with ``(C_BB + Lam_B)^-1 = P_BB - R_tB^T P_tt R_tB`` the effective degrees of
    freedom are ``d_B - sum_B Lam * diag(P_BB - R_tB^T P_tt R_tB)``, and ``P_tt R_t = P_t``.
    NumPy's LAPACK and products only, the blocks shared out by ``in_parallel`` (see
    ``Decomposer``'s ``_block_inverse``): ``P_tt``, a principal block of an SPD inverse, is
    inverted whole.
    """
    p_diag = np.diagonal(inverse).copy()

    def block(a: int, b: int) -> tuple[float, float]:  # its own rows of ``P``, read and written
        rows = inverse[a:b]
        block_inverse = np.linalg.inv(rows[:, a:b])
        operator = block_inverse @ rows  # (d_t, D)
        # diag(R_tB^T P_tt R_tB), as P_tt R_t = P_t
        reduced = penalty * (p_diag - np.einsum("ij,ij->j", rows, operator))
        df = len(penalty) - (b - a) - float(reduced.sum() - reduced[a:b].sum())
        wide = operator.astype(np.float64)
        residual = np.trace(block_inverse, dtype=np.float64) - (wide**2 @ penalty).sum()
        rows[...] = operator
        return float(residual), df

    done = in_parallel(block, list(itertools.pairwise(int(e) for e in edges)))
    return [r for r, _ in done], [df for _, df in done]
