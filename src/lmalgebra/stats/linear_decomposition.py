"""``LinearDecomposition``: the decomposition's ridge fit as a scikit-learn style estimator.

One engine: ``fit`` and ``partial_fit`` stream rows into :class:`SecondMoments` (float64, around a
shift) and solve with :class:`Decomposer`, exactly as a decomposition run does, so a fit over
chunks equals one fit over all rows. The objective is the solver's:

    min_{W, b}  1/n sum_i ||y_i - W x_i - b||^2 + sum_j lam_j ||W_j||_F^2

with ``lam_j = alpha`` (``alpha_mode="absolute"``) or ``alpha`` times block ``j``'s mean
per-feature variance (``"relative"``, the default). ``penalty_`` holds ``lam`` per feature; with one
block, or in absolute mode, this is ``sklearn.linear_model.Ridge(alpha=n_samples_seen_ *
penalty_[0])``. ``score`` is LMD's pooled R^2 (all output dimensions together, the scored rows'
own mean in the denominator), not scikit-learn's average of per-output R^2.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import AlphaMode, Decomposer, SplitMoments

TARGET = "target"
ArrayLike = Any  # a 2-D array (rows, features), or a list of them (one per model)


class LinearDecomposition:
    """Ridge regression of ``y`` on one or several blocks of features, fitted from moments.

    Args:
        alpha: ridge strength, >= 0 (see ``alpha_mode``).
        alpha_mode: ``"relative"``: each block's penalty is ``alpha`` times its mean per-feature
            variance (ridge on blocks rescaled to unit variance); ``"absolute"``: ``alpha``.

    Attributes (after fitting):
        coef_: ``(n_targets, n_features) float64``, or ``(n_features,)`` for a 1-D ``y``.
        intercept_: ``(n_targets,) float64``, or a float for a 1-D ``y``.
        penalty_: ``(n_features,) float64``, the ridge penalty of each feature (``lam``).
        n_samples_seen_: rows seen by ``fit`` / ``partial_fit``.
        n_features_in_: total features over all blocks; ``block_sizes_``: features per block.
    """

    def __init__(self, alpha: float = 0.01, alpha_mode: AlphaMode = "relative") -> None:
        self.alpha = alpha
        self.alpha_mode = alpha_mode
        self._moments: SecondMoments | None = None

    # scikit-learn's estimator protocol (clone, grid search) without depending on it
    def get_params(self, deep: bool = True) -> dict[str, Any]:
        return {"alpha": self.alpha, "alpha_mode": self.alpha_mode}

    def set_params(self, **params: Any) -> LinearDecomposition:
        for key, value in params.items():
            if key not in ("alpha", "alpha_mode"):
                raise UserInputError(f"LinearDecomposition has no parameter {key!r}")
            setattr(self, key, value)
        return self

    def __repr__(self) -> str:
        return f"LinearDecomposition(alpha={self.alpha!r}, alpha_mode={self.alpha_mode!r})"

    def fit(self, X: ArrayLike, y: ArrayLike) -> LinearDecomposition:  # noqa: N803 (sklearn)
        """Fit on all rows at once (forgets earlier ``partial_fit`` calls)."""
        self._moments = None
        return self.partial_fit(X, y)

    def partial_fit(self, X: ArrayLike, y: ArrayLike) -> LinearDecomposition:  # noqa: N803
        """Add a chunk of rows and refit: chunk after chunk gives the fit of all of them."""
        self._check_params()
        blocks, target = self._arrays(X, y, fitted=self._moments is not None)
        if self._moments is None:
            self._one_dim = np.ndim(y) == 1
            names = [TARGET, *(f"x{k}" for k in range(len(blocks)))]
            self._layout = layout(names, [target.shape[1], *(b.shape[1] for b in blocks)])
            self._moments = SecondMoments(self._layout)
        self._moments.update(np.hstack([target, *blocks]))
        if self._moments.n < 2:
            raise UserInputError(f"need at least 2 rows to fit, got {self._moments.n}")
        self._solve()
        return self

    def predict(self, X: ArrayLike) -> np.ndarray:  # noqa: N803
        """``X @ coef_.T + intercept_``: ``(rows, n_targets)``, or ``(rows,)`` for a 1-D ``y``."""
        blocks = self._features(X)
        return np.hstack(blocks) @ self.coef_.T + self.intercept_

    def score(self, X: ArrayLike, y: ArrayLike) -> float:  # noqa: N803
        """Pooled R^2 on these rows: ``1 - sum ||y - y_hat||^2 / sum ||y - mean(y)||^2``."""
        blocks, target = self._arrays(X, y, fitted=True)
        scored = SecondMoments(self._layout)
        scored.update(np.hstack([target, *blocks]))
        solver = self._decomposer({"scored": SplitMoments.of(scored)})
        basis = self._layout[1:]
        cols = np.concatenate([np.arange(b.start, b.stop) for b in basis])
        weight = np.atleast_2d(self.coef_)
        return solver.r2(weight, self._layout[0], cols)["scored"]

    # -- internals ---------------------------------------------------------------------------------
    def _check_params(self) -> None:
        if self.alpha_mode not in ("relative", "absolute"):
            raise UserInputError(
                f"alpha_mode must be 'relative' or 'absolute', got {self.alpha_mode!r}"
            )

    def _decomposer(self, extra: dict[str, SplitMoments] | None = None) -> Decomposer:
        assert self._moments is not None
        splits = {"train": SplitMoments.of(self._moments), **(extra or {})}
        return Decomposer(self._layout, splits, self.alpha, self.alpha_mode)

    def _solve(self) -> None:
        solver = self._decomposer()
        fit = solver.fit(TARGET, [b.name for b in self._layout[1:]])
        self.penalty_ = solver.penalty[self._layout[1].start :].copy()
        self.n_samples_seen_ = solver.train.n
        self.block_sizes_ = [b.dim for b in self._layout[1:]]
        self.n_features_in_ = sum(self.block_sizes_)
        self.coef_ = fit.weight[0] if self._one_dim else fit.weight
        self.intercept_: float | np.ndarray = float(fit.bias[0]) if self._one_dim else fit.bias

    def _features(self, X: ArrayLike) -> list[np.ndarray]:  # noqa: N803
        if not hasattr(self, "coef_"):
            raise UserInputError("this LinearDecomposition is not fitted yet: call fit first")
        blocks = _blocks(X)
        sizes = [b.shape[1] for b in blocks]
        if sizes != self.block_sizes_:
            raise UserInputError(
                f"X has blocks of {sizes} features; the fit was made on {self.block_sizes_}"
            )
        return blocks

    def _arrays(
        self,
        X: ArrayLike,  # noqa: N803
        y: ArrayLike,
        fitted: bool,
    ) -> tuple[list[np.ndarray], np.ndarray]:
        blocks = self._features(X) if fitted else _blocks(X)
        target = np.asarray(y, dtype=np.float64)
        if target.ndim == 1:
            target = target[:, None]
        if target.ndim != 2 or target.shape[1] == 0:
            raise UserInputError(f"y must be 1-D or 2-D (rows, targets), got shape {target.shape}")
        if fitted and target.shape[1] != self._layout[0].dim:
            raise UserInputError(
                f"y has {target.shape[1]} targets; the fit was made on {self._layout[0].dim}"
            )
        if any(b.shape[0] != target.shape[0] for b in blocks):
            rows = [b.shape[0] for b in blocks]
            raise UserInputError(f"X has {rows} rows but y has {target.shape[0]}")
        if not np.isfinite(target).all():
            raise UserInputError("y holds NaN or infinite values")
        return blocks, target


def _blocks(X: ArrayLike) -> list[np.ndarray]:  # noqa: N803
    """One 2-D float64 array per block: ``X`` itself, or each array of a list of them."""
    parts: Sequence[Any] = X if isinstance(X, list | tuple) else [X]
    if not parts:
        raise UserInputError("X is an empty list: give one array per basis model")
    blocks = []
    for k, part in enumerate(parts):
        array = np.asarray(part, dtype=np.float64)
        if array.ndim == 1:
            array = array[:, None]
        if array.ndim != 2 or array.shape[1] == 0:
            raise UserInputError(f"X block {k} must be 2-D (rows, features), got {array.shape}")
        if not np.isfinite(array).all():
            raise UserInputError(f"X block {k} holds NaN or infinite values")
        blocks.append(array)
    return blocks
