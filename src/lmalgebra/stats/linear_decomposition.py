"""``LinearDecomposition``: the decomposition's ridge fit as a scikit-learn estimator.

One engine: ``fit`` and ``partial_fit`` stream rows into :class:`SecondMoments` (float64, around a
shift) and solve with :class:`Decomposer`, exactly as a decomposition run does, so a fit over
chunks equals one fit over all rows. The objective is the solver's:

    min_{W, b}  1/n sum_i ||y_i - W x_i - b||^2 + sum_j lam_j ||W_j||_F^2

with ``lam_j = alpha`` (``alpha_mode="absolute"``) or ``alpha`` times block ``j``'s mean
per-feature variance (``"relative"``, the default). ``penalty_`` holds ``lam`` per feature; with one
block, or in absolute mode, this is ``sklearn.linear_model.Ridge(alpha=n_samples_seen_ *
penalty_[0])``. ``score`` is LMD's pooled R^2 (all output dimensions together, the scored rows'
own mean in the denominator), not scikit-learn's average of per-output R^2.

It is a scikit-learn estimator (``BaseEstimator``, ``RegressorMixin``, ``MultiOutputMixin``; it
passes ``check_estimator``): ``clone``, ``Pipeline``, ``GridSearchCV`` and ``cross_val_score``
take it. Bad input raises :class:`UserValueError` / :class:`UserTypeError`, which are both the
toolkit's ``UserInputError`` and the ``ValueError`` / ``TypeError`` scikit-learn expects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, MultiOutputMixin, RegressorMixin
from sklearn.exceptions import NotFittedError as SklearnNotFittedError
from sklearn.utils.validation import check_array, validate_data

from lmalgebra.core.errors import UserInputError, UserTypeError, UserValueError
from lmalgebra.core.settings import is_boolean
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import AlphaMode, Decomposer, SplitMoments

TARGET = "target"
ArrayLike = Any  # a 2-D array (rows, features), or a list of them (one per model)
_FITTED = ("coef_", "intercept_", "penalty_", "n_samples_seen_", "block_sizes_")
_SEEN = ("n_features_in_", "feature_names_in_", "_moments", "_layout", "_one_dim")


class NotFittedError(UserInputError, SklearnNotFittedError):
    """``predict`` or ``score`` before ``fit``: a ``UserInputError`` and scikit-learn's own
    ``NotFittedError`` (so also a ``ValueError`` and an ``AttributeError``)."""


class LinearDecomposition(MultiOutputMixin, RegressorMixin, BaseEstimator):
    """Ridge regression of ``y`` on one or several blocks of features, fitted from moments.

    ``X`` is one 2-D array ``(rows, features)`` (a scikit-learn input: arrays, lists of rows,
    DataFrames) or a list of 2-D arrays, one block per basis model, each penalised as a
    decomposition run penalises a basis model (or one array cut by ``blocks``); ``y`` is
    ``(rows,)`` or ``(rows, targets)``.

    Args:
        alpha: ridge strength, >= 0 (see ``alpha_mode``).
        alpha_mode: ``"relative"``: each block's penalty is ``alpha`` times its mean per-feature
            variance (ridge on blocks rescaled to unit variance); ``"absolute"``: ``alpha``.
        blocks: features per basis model when ``X`` is one array holding the models' features
            side by side (what ``Pipeline`` and ``GridSearchCV`` pass on): its columns are cut
            into these blocks, the same fit as the list of blocks. None: a list of arrays gives
            the blocks; one array is one block.

    Attributes (after fitting):
        coef_: ``(n_targets, n_features) float64``, or ``(n_features,)`` for a 1-D ``y``.
        intercept_: ``(n_targets,) float64``, or a float for a 1-D ``y``.
        penalty_: ``(n_features,) float64``, the ridge penalty of each feature (``lam``).
        n_samples_seen_: rows seen by ``fit`` / ``partial_fit``.
        n_features_in_: total features over all blocks; ``block_sizes_``: features per block.
        feature_names_in_: column names of a DataFrame ``X`` (one block only).
    """

    def __init__(
        self,
        alpha: float = 0.01,
        alpha_mode: AlphaMode = "relative",
        blocks: Sequence[int] | None = None,
    ) -> None:
        self.alpha = alpha
        self.alpha_mode = alpha_mode
        self.blocks = blocks

    def set_params(self, **params: Any) -> LinearDecomposition:
        try:
            super().set_params(**params)
        except ValueError as err:  # scikit-learn's message names the parameter and the valid ones
            raise UserValueError(str(err)) from None
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "coef_")

    def fit(self, X: ArrayLike, y: ArrayLike) -> LinearDecomposition:  # noqa: N803 (sklearn)
        """Fit on all rows at once (forgets earlier ``fit`` and ``partial_fit`` calls)."""
        for name in (*_FITTED, *_SEEN):
            self.__dict__.pop(name, None)
        return self.partial_fit(X, y)

    def partial_fit(self, X: ArrayLike, y: ArrayLike) -> LinearDecomposition:  # noqa: N803
        """Add a chunk of rows and refit: chunk after chunk gives the fit of all of them."""
        self._check_params()
        moments: SecondMoments | None = getattr(self, "_moments", None)
        first = moments is None
        blocks = self._blocks(X, reset=first)
        target, one_dim = self._target(y, blocks[0].shape[0], reset=first)
        seen = len(target) + (0 if moments is None else moments.n)
        if seen < 2:
            raise UserValueError(f"need at least 2 samples to fit, got {seen} sample")
        if moments is None:
            self._one_dim = one_dim
            names = [TARGET, *(f"x{k}" for k in range(len(blocks)))]
            self._layout = layout(names, [target.shape[1], *(b.shape[1] for b in blocks)])
            moments = self._moments = SecondMoments(self._layout)
        moments.update(np.hstack([target, *blocks]))
        self._solve()
        return self

    def predict(self, X: ArrayLike) -> np.ndarray:  # noqa: N803
        """``X @ coef_.T + intercept_``: ``(rows, n_targets) float64``, or ``(rows,)`` for a
        1-D ``y``."""
        self._check_fitted()
        blocks = self._blocks(X, reset=False)
        return np.hstack(blocks) @ self.coef_.T + self.intercept_

    def score(self, X: ArrayLike, y: ArrayLike) -> float:  # noqa: N803
        """Pooled R^2 on these rows, the decomposition runs' score:
        ``1 - sum ||y - y_hat||^2 / sum ||y - mean(y)||^2``, sums over rows and targets,
        ``mean(y)`` the scored rows' own.

        For a 1-D ``y`` this is ``sklearn.metrics.r2_score(y, predict(X))``. With several
        targets, ``r2_score``'s default (``multioutput="uniform_average"``) averages each
        target's R^2 with equal weight; the pooled R^2 weighs each target by its variance,
        i.e. ``r2_score(y, predict(X), multioutput="variance_weighted")``: a target of small
        variance cannot dominate, as in LMD where one embedding is one target. ``GridSearchCV``
        and ``cross_val_score`` use this score unless given ``scoring=``.
        """
        self._check_fitted()
        blocks = self._blocks(X, reset=False)
        target, _ = self._target(y, blocks[0].shape[0], reset=False)
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
            raise UserValueError(
                f"alpha_mode must be 'relative' or 'absolute', got {self.alpha_mode!r}"
            )
        alpha = self.alpha
        if isinstance(alpha, bool) or not isinstance(alpha, int | float | np.number):
            raise UserTypeError(f"alpha must be a number, got {type(alpha).__name__}")
        if not np.isfinite(alpha) or alpha < 0:
            raise UserValueError(f"alpha must be a finite number >= 0, got {alpha}")

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise NotFittedError(
                f"this {type(self).__name__} is not fitted yet: call fit (or partial_fit) first"
            )

    def _decomposer(self, extra: dict[str, SplitMoments] | None = None) -> Decomposer:
        splits = {"train": SplitMoments.of(self._moments), **(extra or {})}
        return Decomposer(self._layout, splits, float(self.alpha), self.alpha_mode)

    def _solve(self) -> None:
        try:
            solver = self._decomposer()
            fit = solver.fit(TARGET, [b.name for b in self._layout[1:]])
        except UserInputError as err:  # in the run's words (its models, its flags): in ours
            raise UserValueError(self._unfit(err)) from None
        self.penalty_ = solver.penalty[self._layout[1].start :].copy()
        self.n_samples_seen_ = solver.train.n
        self.coef_ = fit.weight[0] if self._one_dim else fit.weight
        self.intercept_: float | np.ndarray = float(fit.bias[0]) if self._one_dim else fit.bias

    def _unfit(self, err: UserInputError) -> str:
        """Why the rows seen cannot be fitted, naming ``y`` or the block of ``X``: one that does
        not vary over them, or a basis whose covariance is singular at this ``alpha``."""
        variance = np.diag(self._moments.covariance())
        several = len(self._layout) > 2
        for k, block in enumerate(self._layout):
            if not variance[block.start : block.stop].sum() > 0:
                name = "y" if k == 0 else f"X block {k - 1}" if several else "X"
                return f"{name} does not vary over the rows fitted: nothing fits it or from it"
        if "singular" in str(err):
            return "X is singular (its covariance is not positive definite): use a larger alpha"
        return str(err)

    def _blocks(self, X: ArrayLike, reset: bool) -> list[np.ndarray]:  # noqa: N803
        """``X`` as 2-D float64 blocks, validated as scikit-learn validates; ``reset``: the first
        chunk (it sets ``n_features_in_`` and ``block_sizes_``), else checked against them."""
        parts = _block_list(X)
        if parts is None:  # one array: scikit-learn's validation, feature names included
            array = _validated("X", validate_data, self, X, reset=reset, dtype="numeric")
            array = array.astype(np.float64, copy=False)
            blocks = _cut(array, self.blocks)
        else:
            names = [f"X block {k}" for k in range(len(parts))]
            blocks = [_validated(n, _checked, p, n) for n, p in zip(names, parts, strict=True)]
            if reset:
                self.__dict__.pop("feature_names_in_", None)
                self.n_features_in_ = sum(b.shape[1] for b in blocks)
        sizes = [b.shape[1] for b in blocks]
        if self.blocks is not None and sizes != list(self.blocks):
            raise UserValueError(f"X has blocks of {sizes} features but blocks={self.blocks!r}")
        if reset:
            self.block_sizes_ = sizes
        elif sizes != self.block_sizes_:
            raise UserValueError(
                f"X has blocks of {sizes} features; the fit was made on {self.block_sizes_}"
            )
        rows = [b.shape[0] for b in blocks]
        if len(set(rows)) > 1:
            raise UserValueError(f"the blocks of X have different row counts: {rows}")
        return blocks

    def _target(self, y: ArrayLike, rows: int, reset: bool) -> tuple[np.ndarray, bool]:
        """``y`` as ``(rows, targets) float64``, and whether it was 1-D."""
        if y is None:
            raise UserValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None"
            )
        target = _validated("y", _checked, y, "y", ensure_2d=False)
        one_dim = target.ndim == 1
        if one_dim:
            target = target[:, None]
        if target.shape[0] != rows:
            raise UserValueError(f"X has {rows} rows but y has {target.shape[0]}")
        if not reset and target.shape[1] != self._layout[0].dim:
            raise UserValueError(
                f"y has {target.shape[1]} targets; the fit was made on {self._layout[0].dim}"
            )
        return target, one_dim


def _checked(value: ArrayLike, name: str, ensure_2d: bool = True) -> np.ndarray:
    # "numeric" refuses strings (float64 would parse "1.5"), then the statistics' float64
    result = check_array(value, dtype="numeric", ensure_2d=ensure_2d, input_name=name)
    return np.asarray(result, dtype=np.float64)


def _cut(array: np.ndarray, sizes: Sequence[int] | None) -> list[np.ndarray]:
    """``array (rows, sum(sizes))`` cut into column blocks of ``sizes``; itself when None."""
    if sizes is None:
        return [array]
    if (
        isinstance(sizes, str)
        or not isinstance(sizes, Sequence)
        or not sizes
        or not all(isinstance(n, int | np.integer) and not is_boolean(n) and n > 0 for n in sizes)
    ):
        raise UserValueError(f"blocks must be a list of feature counts > 0, got {sizes!r}")
    if sum(sizes) != array.shape[1]:
        raise UserValueError(
            f"blocks={list(sizes)} add up to {sum(sizes)} features but X has {array.shape[1]}"
        )
    return np.split(array, np.cumsum(sizes)[:-1], axis=1)


def _block_list(X: ArrayLike) -> Sequence[Any] | None:  # noqa: N803
    """The blocks of ``X`` when it is a list of 2-D arrays; None when it is one array (a list
    of rows is one array, as in scikit-learn)."""
    if not isinstance(X, list | tuple):
        return None
    if not X:
        raise UserValueError("X is an empty list: give one array, or one 2-D array per model")
    try:
        dims = [np.ndim(part) for part in X]
    except (ValueError, TypeError):  # ragged rows: scikit-learn's validation names the problem
        return None
    if all(d == 2 for d in dims):
        return X
    if 2 in dims:
        raise UserValueError(
            f"X is a list mixing 2-D blocks with arrays of {sorted(set(dims) - {2})} dimensions: "
            "give one 2-D array (rows, features) per model"
        )
    return None


def _validated(name: str, check: Callable[..., Any], *args: Any, **kwargs: Any) -> np.ndarray:
    """``check(*args, **kwargs)``, its ValueError or TypeError re-raised as a ``UserInputError``
    naming ``name`` (scikit-learn's own messages usually name it already)."""
    try:
        result: np.ndarray = check(*args, **kwargs)
    except (ValueError, TypeError) as err:
        message = _one_line(str(err))
        if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", message):
            message = f"{name}: {message}"
        kind = UserTypeError if isinstance(err, TypeError) else UserValueError
        raise kind(message) from err
    return result


def _one_line(message: str) -> str:
    """scikit-learn's message on one line (its lines joined: the advice it gives, such as
    "Reshape your data ...", is part of the estimator contract)."""
    return " ".join(line.strip() for line in message.splitlines() if line.strip()) or message
