"""Precomputed span embeddings: a file of vectors, one row per span, checked against a run's spans.

Rows cover the train, validation and test spans in that order, the order ``lmalgebra spans``
exports. Three formats, each able to say which spans its rows belong to:

- ``.npy``: a 2-D float array; a sidecar ``PATH.spans.sha256`` (the order digest as text) or
  ``PATH.spans.json`` (``{"spans_sha256": ...}``) next to it vouches for the row order.
- ``.parquet``: a column ``embedding`` (list or fixed-size list of floats) and a column
  ``span_sha256`` (hex sha256 of each span's UTF-8 text) or ``text`` identifying each row's span.
- ``.safetensors``: a tensor ``embeddings`` and the metadata entry ``spans_sha256`` (the order
  digest).

The order digest is the hex sha256 of the UTF-8 lines ``f"{split}\\t{span_sha256}\\n"``, one per
span in row order. A file carrying no order at all is refused unless the model is marked
``unchecked_order``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lmalgebra.core.errors import UserInputError, counted, either
from lmalgebra.core.fingerprint import order_digest, span_sha256
from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import read_json_object, read_text

log = logging.getLogger(__name__)

SUFFIXES = (".npy", ".parquet", ".safetensors")
# EmbeddingCache's default shard size: the statistics pass zips every model's blocks row-aligned
SHARD_ROWS = 2048
_BLOCK = 8192  # rows per read while validating
Reader = Callable[[int, int], np.ndarray]
# how the spans of a run are exported, on the command line and from Python
EXPORT = either("`lmalgebra spans`", "lmalgebra.spans()")


@dataclass(frozen=True)
class PrecomputedSplit:
    """Rows ``(rows, dim) float32`` of one split, read like a complete embedding-cache entry:
    the same ``ranges`` of ``shard_rows``, so the statistics pass can zip it with cached models."""

    read: Reader
    rows: int
    dim: int
    shard_rows: int = SHARD_ROWS

    @property
    def ranges(self) -> list[tuple[int, int]]:
        step = self.shard_rows
        return [(a, min(a + step, self.rows)) for a in range(0, self.rows, step)]

    def chunks(self, indices: Iterable[int] | None = None) -> Iterator[np.ndarray]:
        """Blocks ``(<= shard_rows, dim) float32``: every range in order, or those ``indices``."""
        ranges = self.ranges
        for index in range(len(ranges)) if indices is None else indices:
            yield self.read(*ranges[index])


@dataclass(frozen=True)
class PrecomputedEmbeddings:
    """A validated file of span embeddings, split by split."""

    path: Path
    dim: int
    splits: dict[str, PrecomputedSplit]

    @property
    def rows(self) -> int:
        return sum(s.rows for s in self.splits.values())


SPLIT_WORDS = {"train": "training", "validation": "validation", "test": "test"}


class Float32Spread:
    """Whether embeddings that vary as given still vary in float32, in which they are kept and
    their products summed, a block of rows at a time: values far from 0 beside their spread
    (``1e8 + x`` rounds to one value) or too small to square (``1e-30 * x``) do not, and had been
    refused as a model whose every embedding is the same, which the embeddings given are not."""

    def __init__(self, dim: int) -> None:
        self.rows = 0
        self.low, self.high = np.full(dim, np.inf), np.full(dim, -np.inf)
        self.low32, self.high32 = np.full(dim, np.inf), np.full(dim, -np.inf)
        self.sums = np.zeros((2, dim))  # of the float32 values and their squares

    def add(self, given: np.ndarray, single: np.ndarray) -> None:
        """Rows ``given`` (any float type) and the same rows in float32 (``single``)."""
        if len(given):
            self.rows += len(given)
            low32, high32 = single.min(axis=0), single.max(axis=0)
            same = given.dtype == np.float32  # a float32 file's rows are the rows kept
            self.low = np.minimum(self.low, low32 if same else given.min(axis=0))
            self.high = np.maximum(self.high, high32 if same else given.max(axis=0))
            self.low32, self.high32 = np.minimum(self.low32, low32), np.maximum(self.high32, high32)
            squares = np.einsum("ij,ij->j", single, single, dtype=np.float64)
            self.sums += [single.sum(axis=0, dtype=np.float64), squares]

    def refuse(self, what: str) -> None:
        """Refuse ``what`` (``model 'x': its embeddings``) when it varies but not in float32."""
        spread = float((self.high - self.low).max()) if self.rows > 1 else 0.0
        mean, square = self.sums / max(self.rows, 1)
        kept = square - mean**2 > np.finfo(np.float32).eps * square
        with np.errstate(over="ignore", under="ignore"):  # a spread too small to square in it
            kept &= np.square((self.high32 - self.low32).astype(np.float32)) > 0
        if spread > 0 and not kept.any():
            raise UserInputError(
                f"{what} vary (by up to {spread:.3g}) but not in float32, in which they are kept "
                "(values far from 0 beside their spread, or too small to square); centre and "
                "scale them first (subtract each column's mean, divide by its standard deviation)"
            )


@dataclass(frozen=True)
class _Source:
    """What a file holds: its shape, a row reader (rows in the file's own float type), and
    whatever identifies its rows' spans."""

    rows: int
    dim: int
    read: Reader
    digest: str | None = None
    ids: list[str] | None = None
    texts: list[str] | None = None
    how: str = ""  # for messages: where the order information was expected


def load_precomputed(
    name: str,
    path: Path,
    texts: Mapping[str, Sequence[str]],
    unchecked_order: bool = False,
    digest: str | None = None,
) -> PrecomputedEmbeddings:
    """Open ``path`` and check it against the run's span ``texts`` (split -> texts, in order).

    ``digest``: ``order_digest(texts)`` when the caller has it already (a run with many files
    would otherwise hash every span once per file).

    Refuses (``UserInputError`` naming the model and the file) a wrong row count, rows that
    belong to other spans or another order, a file without order information (unless
    ``unchecked_order``), and non-finite values.
    """
    source = _open(name, path)
    counts = {s: len(texts.get(s, ())) for s in SPLITS}
    expected = sum(counts.values())
    if source.rows != expected:
        per_split = ", ".join(f"{s} {n}" for s, n in counts.items())
        raise UserInputError(
            f"model {name!r}: {path} has {source.rows} rows but the run has {expected} spans "
            f"({per_split}); export them with `lmalgebra spans` and embed exactly those"
        )
    _check_order(name, path, source, texts, unchecked_order, digest)
    _check_values(name, path, source, counts)
    splits, start = {}, 0
    for split in SPLITS:
        read = _offset(lambda a, b: _as_float32(source.read(a, b)), start)
        splits[split] = PrecomputedSplit(read, counts[split], source.dim)
        start += counts[split]
    log.info("model %s: %d precomputed rows of width %d from %s", name, expected, source.dim, path)
    return PrecomputedEmbeddings(path, source.dim, splits)


def file_shape(name: str, path: Path) -> tuple[int, int]:
    """``(rows, dim)`` of a file of embeddings, read from its header (a Parquet file: from its
    column), without checking its rows; a file that is none is refused as ``load_precomputed``
    refuses it."""
    source = _open(name, path)
    return source.rows, source.dim


def _open(name: str, path: Path) -> _Source:
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise UserInputError(
            f"model {name!r}: {path} is not a file of embeddings (.npy, .parquet or .safetensors)"
        )
    opener = {".npy": _open_npy, ".parquet": _open_parquet, ".safetensors": _open_safetensors}
    source = opener[suffix](name, path)
    if source.rows == 0:  # a Parquet file of no rows has no width either: named as empty
        raise UserInputError(f"model {name!r}: {path} holds no rows; expected one per span")
    if source.dim < 1:  # no column to fit: the statistics of a width-0 model have no scale
        raise UserInputError(
            f"model {name!r}: {path} holds embeddings of width 0 (no value per span); "
            "expected (spans, dim) with dim at least 1"
        )
    return source


def _reason(err: Exception) -> str:
    """A library's error on one line: its words, without the control bytes a damaged file's
    fields can bring into it."""
    printable = "".join(c if c.isprintable() else " " for c in str(err))
    return " ".join(printable.split())


def _offset(read: Reader, start: int) -> Reader:
    return lambda a, b: read(start + a, start + b)


def _where(row: int, counts: Mapping[str, int]) -> str:
    for split in SPLITS:
        if row < counts[split]:
            return f"{split} span {row}"
        row -= counts[split]
    return "past the last span"


def _refuse_other_rows(
    name: str, path: Path, rows: tuple[Sequence[str], list[str], str], counts: dict[str, int]
) -> None:
    """Refuse a file whose rows' span ids (or texts) are not the run's spans, row by row."""
    given, wanted, what = rows
    bad = [i for i, (g, w) in enumerate(zip(given, wanted, strict=True)) if g != w]
    if bad:
        how = (
            "the same spans in another order: sort the rows as `lmalgebra spans` lists them"
            if sorted(given) == sorted(wanted)
            else "rows belong to other spans: embed the spans `lmalgebra spans` exports"
        )
        raise UserInputError(
            f"model {name!r}: {path}: {counted(len(bad), 'row')} "
            f"{'does' if len(bad) == 1 else 'do'} not match the run's spans, first "
            f"row {bad[0]} (the run's {_where(bad[0], counts)}: span {what} differs); {how}"
        )


def _check_order(
    name: str,
    path: Path,
    source: _Source,
    texts: Mapping[str, Sequence[str]],
    unchecked: bool,
    digest: str | None,
) -> None:
    counts = {s: len(texts.get(s, ())) for s in SPLITS}
    if source.ids is not None or source.texts is not None:
        run_texts = [t for s in SPLITS for t in texts.get(s, ())]
        for given, wanted, what in (
            (source.ids, [span_sha256(t) for t in run_texts], "id"),
            (source.texts, run_texts, "text"),
        ):
            if given is not None:
                _refuse_other_rows(name, path, (given, wanted, what), counts)
        return
    if source.digest is not None:
        wanted_digest = digest or order_digest(texts)
        if source.digest != wanted_digest:
            raise UserInputError(
                f"model {name!r}: {path} was made for other spans (order digest "
                f"{source.digest[:12]}..., this run's {wanted_digest[:12]}...); export this "
                f"run's spans with {EXPORT} and embed them"
            )
        return
    if not unchecked:
        raise UserInputError(
            f"model {name!r}: {path} carries no span order ({source.how}); write the digest that "
            f"`lmalgebra spans --out spans.jsonl` saves in spans.sha256 "
            f"(lmalgebra.spans()'s attrs['spans_sha256']) to {path}.spans.sha256, "
            "or set unchecked_order: true on this model to accept the rows as they are"
        )
    log.warning("model %s: the row order of %s is not checked (unchecked_order)", name, path)


def _check_values(name: str, path: Path, source: _Source, counts: Mapping[str, int]) -> None:
    """Refuse non-finite values, and a split's rows that vary in the file but not in float32."""
    lost = {split: Float32Spread(source.dim) for split in SPLITS}
    for start in range(0, source.rows, _BLOCK):
        given = source.read(start, min(start + _BLOCK, source.rows))
        block = _as_float32(given)
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            row = start + int(np.argmin(finite))
            raise UserInputError(
                f"model {name!r}: {path} holds non-finite values (NaN/inf, or beyond float32's "
                f"range), first in row {row} (the run's {_where(row, counts)})"
            )
        first = 0  # splits in order: train, validation, test
        for split in SPLITS:
            rows = slice(max(first - start, 0), max(first + counts[split] - start, 0))
            lost[split].add(given[rows], block[rows])
            first += counts[split]
    for split, spread in lost.items():
        spread.refuse(f"model {name!r}: the {SPLIT_WORDS[split]} embeddings in {path}")


def _float_rows(name: str, path: Path, shape: tuple[int, ...], kind: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise UserInputError(
            f"model {name!r}: {path} holds a {len(shape)}-D array {list(shape)}; "
            "expected (spans, dim)"
        )
    if kind != "f":
        raise UserInputError(f"model {name!r}: {path} holds non-float values; expected floats")
    return int(shape[0]), int(shape[1])


def _as_float32(block: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # past float32's range is inf, refused by _check_finite
        return np.ascontiguousarray(block, dtype=np.float32)


def _open_npy(name: str, path: Path) -> _Source:
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except Exception as err:  # a damaged header: numpy's parser raises tokenize's, ast's errors
        raise UserInputError(
            f"model {name!r}: cannot read {path} as .npy: {_reason(err)}"
        ) from None
    rows, dim = _float_rows(name, path, array.shape, array.dtype.kind)
    read: Reader = lambda a, b: array[a:b]  # noqa: E731
    if array.flags.c_contiguous:  # rows read from the file, not through the mapping
        read = _row_reader(path, array.offset, array.dtype, dim)
    return _Source(
        rows,
        dim,
        read,
        digest=_sidecar_digest(name, path),
        how=f"no {path.name}.spans.sha256 next to it",
    )


def _row_reader(path: Path, offset: int, dtype: np.dtype, dim: int) -> Reader:
    """Rows ``[a, b)`` of a C-ordered array stored at ``offset`` in ``path``, read with one
    positioned read each: a wide file streamed this way leaves none of its pages mapped into
    the process (a mapping would count every page it touched as resident memory)."""
    row_bytes = dim * dtype.itemsize

    def read(a: int, b: int) -> np.ndarray:
        with path.open("rb") as handle:
            handle.seek(offset + a * row_bytes)
            block = np.fromfile(handle, dtype=dtype, count=(b - a) * dim)
        return block.reshape(b - a, dim)

    return read


def _sidecar_digest(name: str, path: Path) -> str | None:
    try:
        return _read_sidecar(name, path)
    except UserInputError as err:
        if str(err).startswith(f"model {name!r}"):
            raise
        raise UserInputError(f"model {name!r}: {err}") from None


def _read_sidecar(name: str, path: Path) -> str | None:
    text_form = path.with_name(f"{path.name}.spans.sha256")
    json_form = path.with_name(f"{path.name}.spans.json")
    # one that is there but no regular file (a FIFO, a directory, a link to nothing) is named
    # by the reader, not taken for no sidecar
    found = {}
    if text_form.exists() or text_form.is_symlink():
        words = read_text(text_form, "digest file").split()
        if not words:
            raise UserInputError(f"model {name!r}: {text_form} is empty; it must hold the digest")
        found[text_form] = words[0].lower()
    if json_form.exists() or json_form.is_symlink():
        digest = read_json_object(json_form, "digest file").get("spans_sha256")
        if not isinstance(digest, str):
            raise UserInputError(f"model {name!r}: {json_form} has no 'spans_sha256' string")
        found[json_form] = digest.lower()
    if len(set(found.values())) > 1:  # one of the two vouches for other spans
        raise UserInputError(
            f"model {name!r}: {text_form} and {json_form} give other order digests "
            f"({', '.join(d[:12] + '...' for d in found.values())}); keep the one of this "
            "file's spans"
        )
    return next(iter(found.values()), None)


def _open_safetensors(name: str, path: Path) -> _Source:
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="np") as handle:
            keys = list(handle.keys())
            metadata = handle.metadata() or {}
            if "embeddings" not in keys:
                raise UserInputError(
                    f"model {name!r}: {path} has no tensor 'embeddings' (it has: "
                    f"{', '.join(keys) or 'none'})"
                )
            tensor = handle.get_slice("embeddings")
            shape, dtype = tuple(tensor.get_shape()), tensor.get_dtype()
    except UserInputError:
        raise
    except Exception as err:  # safetensors raises its own error types for a damaged header
        raise UserInputError(
            f"model {name!r}: cannot read {path} as safetensors: {_reason(err)}"
        ) from None
    if dtype not in ("F16", "F32", "F64"):
        raise UserInputError(
            f"model {name!r}: {path}: 'embeddings' is {dtype}; store float16/32/64"
        )
    rows, dim = _float_rows(name, path, shape, "f")

    def read(a: int, b: int) -> np.ndarray:
        with safe_open(str(path), framework="np") as handle:
            return handle.get_slice("embeddings")[a:b]

    digest = metadata.get("spans_sha256")
    return _Source(
        rows,
        dim,
        read,
        digest=digest.lower() if digest is not None else None,
        how="no 'spans_sha256' metadata",
    )


def _open_parquet(name: str, path: Path) -> _Source:
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    try:
        columns = pq.ParquetFile(path).schema_arrow.names
    except (pa.ArrowException, OSError) as err:
        raise UserInputError(
            f"model {name!r}: cannot read {path} as Parquet: {_reason(err)}"
        ) from None
    if "embedding" not in columns:
        raise UserInputError(
            f"model {name!r}: {path} has no column 'embedding' (columns: {', '.join(columns)})"
        )
    id_columns = [c for c in ("span_sha256", "text") if c in columns]  # both: both checked
    try:  # a damaged page is found only when the rows are read
        table = pq.read_table(path, columns=["embedding", *id_columns])
    except (pa.ArrowException, OSError) as err:
        raise UserInputError(
            f"model {name!r}: cannot read {path} as Parquet: {_reason(err)}"
        ) from None
    column = table.column("embedding").combine_chunks()
    kind = column.type
    if not (
        pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)
    ) or not pa.types.is_floating(kind.value_type):
        raise UserInputError(
            f"model {name!r}: {path}: column 'embedding' is {kind}; expected a list of floats"
        )
    rows = len(column)
    lengths = pc.fill_null(pc.list_value_length(column), -1).to_numpy(zero_copy_only=False)
    dim = int(lengths[0]) if rows else 0
    flat = column.flatten()
    for bad, what in (
        (np.flatnonzero(lengths < 0), "is null"),
        (np.flatnonzero(lengths != dim), f"has a different length than row 0 ({dim})"),
    ):
        if bad.size:
            raise UserInputError(f"model {name!r}: {path}: 'embedding' of row {bad[0]} {what}")
    if flat.null_count:
        raise UserInputError(f"model {name!r}: {path}: 'embedding' holds null values")
    values = flat.to_numpy(zero_copy_only=False).reshape(rows, dim)
    ids, texts = (
        table.column(c).to_pylist() if c in id_columns else None for c in ("span_sha256", "text")
    )
    return _Source(
        rows,
        dim,
        lambda a, b: values[a:b],
        ids=None if ids is None else [str(i).lower() for i in ids],
        texts=None if texts is None else [str(t) for t in texts],
        how="no 'span_sha256' or 'text' column",
    )
