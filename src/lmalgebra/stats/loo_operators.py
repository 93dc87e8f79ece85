"""The leave-one-model-out operators of a group fit, from the one inverse ``P = (C + Lam)^-1``.

Every model ``t`` fitted on all the others has the operator ``R_t = P_tt^-1 P_t`` (its weights are
``-R_tB`` and its bias follows from ``R_t`` applied to the means); its train residual and effective
degrees of freedom follow from ``P`` alone (:class:`~lmalgebra.stats.solver.Decomposer`).
"""

from __future__ import annotations

import itertools

import numpy as np
import torch


def leave_one_out_operators(
    inverse: torch.Tensor, edges: np.ndarray, penalty_values: np.ndarray
) -> tuple[list[float], list[float]]:
    """Turn ``P``'s rows into the operators ``R_t``; each fit's train residual and df.

    ``edges``: each block's rows ``[edges[k], edges[k + 1])`` of ``P``; ``penalty_values``:
    the penalty of every row. On train, ``C = P^-1 - Lam`` gives ``tr(R C R^T) =
    tr(P_tt^-1) - sum(Lam * R^2)``; with ``(C_BB + Lam_B)^-1 = P_BB - R_tB^T P_tt R_tB`` the
    effective degrees of freedom are ``d_B - sum_B Lam * diag(P_BB - R_tB^T P_tt R_tB)``,
    and ``P_tt R_t = P_t``.
    """
    penalty = torch.from_numpy(penalty_values)
    p_diag = torch.diagonal(inverse).clone()
    residuals, dfs = [], []
    for a, b in itertools.pairwise(int(e) for e in edges):
        rows = inverse[a:b]
        p_tt = rows[:, a:b].clone()
        factor = torch.linalg.cholesky(p_tt)  # a principal block of an SPD inverse
        operator = torch.cholesky_solve(rows, factor)  # (d_t, D)
        # diag(R_tB^T P_tt R_tB), as P_tt R_t = P_t
        reduced = penalty * (p_diag - (rows * operator).sum(dim=0))
        basis_dim = len(penalty) - (b - a)
        dfs.append(basis_dim - float(reduced.sum() - reduced[a:b].sum()))
        residual = (
            torch.cholesky_inverse(factor).double().trace()
            - (penalty * operator.double() ** 2).sum()
        )
        residuals.append(float(residual))
        rows.copy_(operator)
    return residuals, dfs
