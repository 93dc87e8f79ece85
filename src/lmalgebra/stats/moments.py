"""Streaming, mergeable second moments of the concatenated embeddings of all models.

For one split, ``Z`` is the ``(n, D)`` concatenation of every model's pooled embedding of each span.
Every ridge fit and every R^2 of the decomposition is a function of ``n``, the column sums and
``Z^T Z`` alone, so this is the only pass over embeddings the solver needs.

Sums are kept around a fixed ``shift`` (the first chunk's mean) in float64, which keeps
``Z^T Z / n - mean mean^T`` accurate when a coordinate's mean dwarfs its spread; statistics with
different shifts are converted exactly before they are added.

The Gram products may be taken in float32 (``products="float32"``, what a decomposition run uses):
the shift-centred rows are rounded to float32 once, their products summed in float32 over at most
``FLOAT32_ROWS`` rows, and those partial Grams accumulated in float64. Centring first is what makes
this accurate: the rounding is relative to each row's distance from the shift, not to its offset.
Column sums are always exact float64 sums of the rows as given.

``precision="float32"`` keeps the Gram matrix itself in float32 (half the memory of a wide run:
``D x D x 4`` bytes), each float32 partial Gram added into it in place; sums stay float64. No
update allocates a ``D x D`` temporary (``add_gram``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from lmalgebra.core.errors import UserInputError, UserTypeError
from lmalgebra.core.text_files import require_file
from lmalgebra.stats.choices import Precision, Products
from lmalgebra.stats.symmetric_kernels import in_parallel, mirror_upper, row_panels
from lmalgebra.storage.safetensors_stream import write_safetensors

# Rows whose float32 products are summed in float32 before the partial Gram is added in float64:
# the float32 rounding of one entry is at most (FLOAT32_ROWS + 2) * 2^-24 times the sum of the
# absolute products it adds (typically far less), and large chunks still run at full BLAS speed.
FLOAT32_ROWS = 2048


@dataclass(frozen=True)
class ModelColumns:
    """One model's columns ``[start, stop)`` in the concatenated embedding.

    ``tail``: the block's last ``tail`` columns stand for the model's variance outside its other
    columns (a reduced model's tail probes, :mod:`lmalgebra.stats.principal`). They are the
    model's when it is a target, never when it is in a basis: its basis columns are
    ``[start, basis_stop)``.
    """

    name: str
    start: int
    stop: int
    tail: int = 0

    @property
    def dim(self) -> int:
        return self.stop - self.start

    @property
    def basis_stop(self) -> int:
        return self.stop - self.tail

    @property
    def basis_dim(self) -> int:
        return self.dim - self.tail

    def basis_columns(self) -> np.ndarray:
        return np.arange(self.start, self.basis_stop)


class ConstantModelError(UserInputError):
    """A model whose embeddings do not vary over the training spans: nothing fits it or from it
    (an evaluation leaves the language out of its LMD coverage, as for too little text).
    ``model``: its name."""

    model: str = ""


def refuse_constant(name: str, variance: float) -> None:
    """Refuse model ``name`` whose training embeddings hold ``variance`` (their mean, or summed,
    per-dimension variance) of zero: every span's vector the same, it explains nothing and
    nothing explains it (its R^2 is 0/0, its relative ridge penalty 0); and one whose variance
    is not finite (its values too large to square)."""
    if not np.isfinite(variance):  # the embeddings are checked finite: their squares overflowed
        raise UserInputError(
            f"model {name!r}: its variance over the training spans overflows (values too large "
            "to square: the statistics sum them in float32 products); scale its embeddings down"
        )
    if not variance > 0:
        error = ConstantModelError(
            f"model {name!r} does not vary over the training spans (every embedding is the "
            "same): nothing can be fitted to it or from it; check its embeddings"
        )
        error.model = name
        raise error


def block_entry(block: ModelColumns) -> list[str | int]:
    """``[name, start, stop]`` (and ``tail`` when there is one): a block as files record it."""
    return [block.name, block.start, block.stop, *([block.tail] if block.tail else [])]


def layout(names: list[str], dims: list[int], tails: list[int] | None = None) -> list[ModelColumns]:
    """Blocks for models concatenated in the given (deterministic) order (``tails``: see
    :class:`ModelColumns`; none by default)."""
    blocks, start = [], 0
    for name, dim, tail in zip(names, dims, tails or [0] * len(names), strict=True):
        blocks.append(ModelColumns(name, start, start + dim, tail))
        start += dim
    return blocks


def add_gram(gram: np.ndarray, rows: np.ndarray, mirror: bool = True) -> None:
    """``gram += rows^T rows`` in place, computing the upper triangle only: panels of ``PANEL``
    of its rows, each one product ``rows[:, a:b]^T rows[:, a:]`` (in the rows' dtype) added in
    ``gram``'s, shared out over the threads by ``in_parallel``. No ``D x D`` temporary.

    ``gram``: ``(D, D)`` float64 (or float32, for float32 rows); ``rows``: ``(n, D)`` float64,
    or float32 (products summed in float32). ``mirror=False`` leaves ``gram``'s lower triangle
    behind (a caller adding many chunks mirrors once, with ``mirror_upper``, after the last).
    """

    def panel(a: int, b: int) -> None:
        with np.errstate(over="ignore"):  # values whose squares overflow: refused by the solver
            product = rows[:, a:b].T @ rows[:, a:]
        diagonal = gram[a:b, a:b]
        np.add(diagonal, np.triu(product[:, : b - a]), out=diagonal)
        right = gram[a:b, b:]
        np.add(right, product[:, b - a :], out=right)

    in_parallel(panel, row_panels(gram.shape[0]))
    if mirror:
        mirror_upper(gram)


@dataclass
class SecondMoments:
    """``n``, column sums and Gram matrix of ``Z - shift``, accumulated in float64.

    Attributes:
        blocks: which columns belong to which model.
        n: number of rows seen.
        shift: ``(D,) float64``, subtracted from every row before accumulating.
        sums: ``(D,) float64``, sum of ``z - shift``.
        gram: ``(D, D)`` float64 (float32 with ``precision="float32"``), sum of
            ``(z - shift)(z - shift)^T``.
        products: precision of the products ``update`` adds to ``gram`` (see the module).
        precision: dtype of ``gram`` and of the covariance made from it.
    """

    blocks: list[ModelColumns]
    n: int = 0
    shift: np.ndarray = field(default_factory=lambda: np.zeros(0))
    sums: np.ndarray = field(default_factory=lambda: np.zeros(0))
    gram: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    products: Products = "float64"
    precision: Precision = "float64"

    def __post_init__(self) -> None:
        dim = self.dim
        if self.precision == "float32":
            self.products = "float32"  # float64 products would be rounded at once
        if self.shift.size == 0:
            self.shift = np.zeros(dim)
            self.sums = np.zeros(dim)
            self.gram = np.zeros((dim, dim), dtype=self.precision)

    @property
    def dim(self) -> int:
        return self.blocks[-1].stop if self.blocks else 0

    def update(self, chunk: np.ndarray) -> None:
        """Add rows. ``chunk``: ``(rows, D)``, any float dtype."""
        self._check_unspent()
        if chunk.ndim != 2 or chunk.shape[1] != self.dim:
            raise ValueError(f"chunk of shape {chunk.shape} does not match dimension {self.dim}")
        if chunk.shape[0] == 0:
            return
        if self.products == "float32":
            self._update_float32(chunk)
            return
        rows = np.array(chunk, dtype=np.float64)  # a copy: never touch the input
        if self.n == 0:
            self.shift = rows.mean(axis=0)
        rows -= self.shift
        self.n += rows.shape[0]
        self.sums += rows.sum(axis=0)
        add_gram(self.gram, rows)

    def _update_float32(self, chunk: np.ndarray) -> None:
        """``update`` with float32 products of the centred rows (see the module docstring)."""
        data = np.asarray(chunk)
        single = data.dtype == np.float32
        column_sums = np.add.reduce(data, axis=0, dtype=np.float64)
        if self.n == 0:  # the first FLOAT32_ROWS rows' mean: one shard's, however chunks are cut
            head = data[:FLOAT32_ROWS]
            whole = len(head) == len(data)
            first = (column_sums if whole else np.add.reduce(head, 0, np.float64)) / len(head)
            # float32 rows minus a float32 shift: the exact difference, rounded once
            self.shift = first.astype(np.float32).astype(np.float64) if single else first
        shift = self.shift
        self.n += data.shape[0]
        self.sums += column_sums - data.shape[0] * shift
        exact = shift.astype(np.float32)
        in_float32 = single and bool((exact.astype(np.float64) == shift).all())
        # one scratch buffer for every FLOAT32_ROWS rows: the input is left alone, and a large
        # chunk does not allocate (and fault in) a centred copy of itself
        scratch = np.empty((min(len(data), FLOAT32_ROWS), data.shape[1]), dtype=np.float32)
        for start in range(0, data.shape[0], FLOAT32_ROWS):
            rows = data[start : start + FLOAT32_ROWS]
            centred = scratch[: len(rows)]
            if in_float32:  # float32 rows minus a float32 shift: the exact difference, rounded
                np.subtract(rows, exact, out=centred)
            else:  # centred in float64, then rounded
                np.subtract(rows, shift, out=centred, casting="same_kind")
            add_gram(self.gram, centred, mirror=False)
        mirror_upper(self.gram)  # once per update: a large chunk spares the transposed adds

    def shifted_to(self, shift: np.ndarray) -> SecondMoments:
        """The same statistics expressed around another shift (exact algebra, no data needed)."""
        delta = self.shift - shift  # z - new = (z - old) + delta
        sums = self.sums + self.n * delta
        outer = np.outer(self.sums, delta)
        gram = self.gram + outer + outer.T + self.n * np.outer(delta, delta)
        return SecondMoments(
            self.blocks,
            self.n,
            shift.copy(),
            sums,
            gram.astype(self.gram.dtype, copy=False),
            self.products,
            self.precision,
        )

    def __add__(self, other: SecondMoments) -> SecondMoments:
        """Statistics of the union of the rows of ``self`` and ``other``."""
        if [(b.name, b.dim) for b in self.blocks] != [(b.name, b.dim) for b in other.blocks]:
            raise ValueError("cannot merge statistics over different models")
        if other.n == 0:
            return SecondMoments(
                self.blocks,
                self.n,
                self.shift,
                self.sums.copy(),
                self.gram.copy(),
                self.products,
                self.precision,
            )
        if self.n == 0:
            return other.__add__(self)
        moved = other.shifted_to(self.shift)
        return SecondMoments(
            self.blocks,
            self.n + moved.n,
            self.shift,
            self.sums + moved.sums,
            self.gram + moved.gram,
            self.products,
            self.precision,
        )

    def mean(self) -> np.ndarray:
        """``(D,) float64`` column means."""
        self._check_unspent()
        return self.shift + self.sums / self.n

    def covariance(self, in_place: bool = False) -> np.ndarray:
        """``(D, D)`` population covariance ``E[(z - E z)(z - E z)^T]``, in the Gram's dtype.

        ``in_place`` reuses the Gram buffer (no second ``D x D`` array); the statistics are then
        spent and must not be used again.
        """
        self._check_unspent()
        centred = (self.sums / self.n).astype(self.gram.dtype)
        cov = self.gram if in_place else np.empty_like(self.gram)
        n = self.n

        def panel(a: int, b: int) -> None:  # no D x D temporary
            np.divide(self.gram[a:b], n, out=cov[a:b])
            cov[a:b] -= centred[a:b, None] * centred

        in_parallel(panel, row_panels(cov.shape[0]))
        if in_place:
            self.gram = np.zeros((0, 0))  # spent: the buffer now belongs to the covariance
            self.n = -1
        return cov

    def _check_unspent(self) -> None:
        if self.n < 0:
            raise RuntimeError("these statistics were spent by covariance(in_place=True)")

    def save(self, path: Path) -> None:
        """Write as safetensors; block layout in the metadata."""
        self._check_unspent()
        save_moments(path, self.blocks, self.n, self.shift, self.sums, self.gram)

    @classmethod
    def load(cls, path: str | Path) -> SecondMoments:
        """Read statistics ``save`` wrote (a run's ``stats/{split}.safetensors``); a file that
        is none (no regular file, damaged, or of arrays that do not fit its block layout, or
        holding NaN or inf) is one ``UserInputError`` naming it."""
        if not isinstance(path, str | Path):
            raise UserTypeError(f"SecondMoments.load(): path must be str | Path, got {path!r}")
        path = require_file(Path(path), "statistics file")  # a FIFO is never opened
        try:
            meta, tensors = _read_moments(path)
            blocks = [ModelColumns(*entry) for entry in json.loads(meta["blocks"])]
            n = int(meta["n"])
            gram, shift, sums = tensors["gram"], tensors["shift"], tensors["sums"]
        except Exception as err:  # safetensors raises its own error type for damaged files
            raise UserInputError(f"statistics file {path} is unreadable or corrupt: {err}") from err
        _check_moments(path, blocks, n, gram, shift, sums)
        precision: Precision = "float32" if gram.dtype == np.float32 else "float64"
        return cls(
            blocks,
            n,
            shift,
            sums,
            gram,
            products="float32" if precision == "float32" else "float64",
            precision=precision,
        )


def _read_moments(path: Path) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as handle:
        meta = handle.metadata()
    if meta is None or "blocks" not in meta or "n" not in meta:
        raise ValueError("no block layout in its metadata (not a file of second moments)")
    tensors = load_file(str(path))
    missing = [name for name in ("gram", "shift", "sums") if name not in tensors]
    if missing:
        raise ValueError(f"no tensor {', '.join(missing)} (not a file of second moments)")
    return meta, tensors


def _check_moments(
    path: Path,
    blocks: list[ModelColumns],
    n: int,
    gram: np.ndarray,
    shift: np.ndarray,
    sums: np.ndarray,
) -> None:
    """Arrays that fit the layout: ``gram (D, D)``, ``shift`` and ``sums (D,)`` for the ``D``
    columns of ``blocks``, ``n >= 0``, every value finite."""
    dim = blocks[-1].stop if blocks else 0
    wanted = {"gram": (dim, dim), "shift": (dim,), "sums": (dim,)}
    for name, array in (("gram", gram), ("shift", shift), ("sums", sums)):
        if array.shape != wanted[name]:
            raise UserInputError(
                f"statistics file {path} is corrupt: '{name}' is {list(array.shape)}, but its "
                f"block layout has {dim} columns ({list(wanted[name])})"
            )
        if not np.isfinite(array).all():
            raise UserInputError(f"statistics file {path} is corrupt: '{name}' holds NaN or inf")
    if n < 0:
        raise UserInputError(f"statistics file {path} is corrupt: n is {n}")


def save_moments(
    path: Path,
    blocks: list[ModelColumns],
    n: int,
    shift: np.ndarray,
    sums: np.ndarray,
    gram: np.ndarray,
    gram_scale: float | None = None,
) -> None:
    """Write second moments as ``SecondMoments.load`` reads them, streamed (no copy of ``gram``).

    ``gram_scale``: the Gram is ``gram_scale * gram`` (a covariance around the mean is written as
    the statistics ``n, shift = mean, sums = 0, gram = n * cov``).
    """
    meta = {"n": str(n), "blocks": json.dumps([block_entry(b) for b in blocks])}
    tensors = {"shift": shift, "sums": sums, "gram": gram}
    scales = {} if gram_scale is None else {"gram": gram_scale}
    write_safetensors(path, tensors, meta, scales)
