"""One measurement: documents -> spans of T tokens -> cached embeddings -> block statistics.

The main decomposition and every sweep (span length, layers, languages) are measurements that
differ only in their documents, span length and sources; the fits that follow read statistics only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.progress import progress_bar
from lmalgebra.core.splits import SPLITS
from lmalgebra.distributed import owned
from lmalgebra.lmd.config import DecomposeConfig
from lmalgebra.lmd.embed import EmbedSpec, TokenReport, embed
from lmalgebra.lmd.embedding_cache import EmbeddingCache
from lmalgebra.lmd.given_models import GivenArrays, GivenModel, in_memory_split
from lmalgebra.lmd.span_cache import remembered_plan, span_key
from lmalgebra.lmd.span_plan import RunSpans, plan_spans, reference_model, span_tokenizer
from lmalgebra.lmd.spans import SpanSpec
from lmalgebra.sources.model_fingerprints import fingerprint
from lmalgebra.sources.models import (
    ModelRef,
    check_layer,
    load_model,
    load_tokenizer,
    model_depth,
    resolve_directory,
)
from lmalgebra.sources.precomputed import PrecomputedSplit, load_precomputed
from lmalgebra.stats.moments import ModelColumns, Products, layout
from lmalgebra.stats.nulls import RANDOM_SUFFIX, random_copy
from lmalgebra.stats.reduce import reduce_blocked
from lmalgebra.stats.span_blocks import SpanBlockMoments

log = logging.getLogger(__name__)
# Rows of consecutive shards streamed into the statistics at once (float32: 4 shards of 2048 rows
# of a 5,000-wide concatenation are 160 MB)
GROUP_ROWS = 8192


@dataclass(frozen=True)
class ModelLayers:
    """One model's layers in the concatenated embedding: one layer, or several.

    With ``layers`` the model yields one block per layer, named ``MODEL@LAYER``.
    """

    model: str
    layers: tuple[int, ...] | None = None

    @property
    def column_names(self) -> list[str]:
        if self.layers is None:
            return [self.model]
        return [f"{self.model}@{layer}" for layer in self.layers]


class ModelPool:
    """The run's models (and their random-initialised copies when nulls are asked for).

    Directories and fingerprints are resolved once; weights load on first use, so models whose
    embeddings are all cached are never loaded. ``given``: models handed over as Python objects
    (``ModelRef`` of kind ``memory`` in the config), by name.
    """

    def __init__(self, config: DecomposeConfig, given: Mapping[str, GivenModel] | None = None):
        self.config = config
        self.given = dict(given or {})
        unmatched = {r.name for r in config.models if r.kind == "memory"} ^ set(self.given)
        if unmatched:
            raise UserInputError(
                f"model {sorted(unmatched)[0]!r}: a Python object must be given for each model "
                "of kind memory, and only for those"
            )
        refs = list(config.models)
        if config.study.nulls:
            refs += [
                r.model_copy(
                    update={
                        "name": random_copy(r.name),
                        "random_init": True,
                        "seed": config.study.null_seed,
                    }
                )
                for r in config.models
                if not r.random_init and r.kind == "transformers"  # ONNX/vectors: no architecture
            ]
        self.refs: dict[str, ModelRef] = {r.name: r for r in refs}
        self.dirs = {n: resolve_directory(r) for n, r in self.refs.items() if n not in self.given}
        self._loaded: dict[str, tuple[Any, Any]] = {}
        # resolved once per run: ``auto`` is reported once, a bad device refused before any work
        self.spec = config.embed_spec()

    @cached_property
    def prints(self) -> dict[str, dict[str, str]]:
        """Fingerprint of every model (hashes of weights, tokenizer and config)."""
        memo = self.config.cache_dir / "hashes"
        given = {n: m.fingerprint() for n, m in self.given.items()}
        return {
            n: given[n] if n in given else fingerprint(r, self.dirs[n], memo)
            for n, r in self.refs.items()
        }

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.config.models]

    @property
    def null_names(self) -> list[str]:
        return [n for n in self.refs if n.endswith(RANDOM_SUFFIX)]

    def tokenizer(self, name: str) -> Any:
        if name in self.given:
            return self.given[name].tokenizer
        return load_tokenizer(self.refs[name], self.dirs[name])

    def has_tokenizer(self, ref: ModelRef) -> bool:
        if ref.name in self.given:
            return self.given[ref.name].tokenizer is not None
        return ref.kind != "precomputed"

    @cached_property
    def span_tokenizer(self) -> tuple[str, Any]:
        """The tokenizer that cuts the spans, and its name (a model's, or the reference's)."""
        return span_tokenizer(
            self.config.models,
            self.config.reference_tokenizer,
            lambda ref: self.tokenizer(ref.name),
            self.has_tokenizer,
        )

    def depth(self, name: str) -> int:
        """Number of hidden layers (the embedding output is layer 0)."""
        if name in self.given:
            return self.given[name].depth()
        return model_depth(self.refs[name], self.dirs[name])

    def embedder(self, name: str, spec: EmbedSpec) -> Any:
        if name in self.given:
            given = self.given[name]
            return lambda texts: given.embed(texts, spec)

        def compute(texts: list[str]) -> tuple[np.ndarray, TokenReport]:
            if name not in self._loaded:
                ref = self.refs[name]
                if ref.kind == "onnx" and spec.dtype != "float32":
                    log.warning("model %r: an ONNX graph runs in its own precision", name)
                model = load_model(ref, self.dirs[name], spec.device)
                for layer in spec.layers or (spec.layer,):
                    check_layer(name, model, layer)
                self._loaded[name] = (model, self.tokenizer(name))
            model, tokenizer = self._loaded[name]
            return embed(texts, model, tokenizer, spec)

        return compute

    def release(self) -> None:
        """Drop loaded weights (a sweep over many settings would otherwise keep them all)."""
        self._loaded.clear()


@dataclass
class Measured:
    """Statistics of one measurement, per split, over the blocks of its sources."""

    blocks: list[ModelColumns]
    stats: dict[str, SpanBlockMoments]
    spans: dict[str, int]
    tokens: dict[str, TokenReport]
    hashes: dict[str, str]
    train_curve: SpanBlockMoments | None = None


def draw_texts(
    pool: ModelPool, docs: list[str], spec: SpanSpec
) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Span texts per split, drawn with the reference tokenizer, and their hashes.

    The spans a model's tokenizer cuts are remembered under the cache directory (``span_cache``),
    so a later run on the same corpus neither loads nor runs the tokenizer.
    """

    def draw() -> RunSpans:
        reference, tokenizer = pool.span_tokenizer
        return plan_spans(docs, tokenizer, spec, reference, corpus)  # as `lmalgebra spans`

    config = pool.config
    corpus = sha256_texts(docs)
    ref = reference_model(config.models, config.reference_tokenizer, pool.has_tokenizer)
    if ref is None or ref.trust_remote_code:  # a tokenizer of no model, or code no hash pins
        plan = draw()
    else:
        key = span_key(corpus, pool.prints[ref.name], spec)
        plan = remembered_plan(config.cache_dir / "spans", key, docs, ref.name, draw)
    return plan.texts, plan.hashes


def measure(
    pool: ModelPool,
    docs: list[str],
    spec: SpanSpec,
    sources: list[ModelLayers],
    parts: dict[str, int],
    train_sizes: Sequence[int] | None = None,
    label: str = "",
) -> Measured:
    """Embed ``docs``' spans with every source (cached) and keep their statistics per block.

    ``parts``: blocks of spans per split (1 = plain statistics). ``train_sizes``: training-set
    sizes whose prefixes of the training spans form a learning curve (capped at the split's size).
    """
    config = pool.config
    texts, hashes = draw_texts(pool, docs, spec)
    base = pool.spec
    caches: list[EmbeddingCache | PrecomputedSplit] = []
    tokens: dict[str, TokenReport] = {}
    total = sum(len(t) for t in texts.values())
    for source in sources:
        ref = pool.refs[source.model]
        if source.model in pool.given:  # a Python object: embedded in memory, not cached
            caches += _in_memory(pool, source, texts, base, tokens)
            continue
        if ref.kind == "precomputed":  # a file of vectors, checked against these spans
            given = load_precomputed(
                ref.name, pool.dirs[ref.name], texts, ref.unchecked_order, hashes["spans_order"]
            )
            caches += [given.splits[split] for split in SPLITS]
            tokens[source.model] = TokenReport(0.0, 0, given.rows)
            continue
        embed_spec = EmbedSpec(**{**base.__dict__, "layers": source.layers})
        compute = pool.embedder(source.model, embed_spec)
        reports = []
        tag = f"embed {source.model}" + (f" ({label})" if label else "")
        with progress_bar(tag, total, config.progress) as advance:
            for split in SPLITS:
                key = {
                    "model": source.model,
                    "fingerprint": pool.prints[source.model],
                    "spans": hashes[f"spans_{split}"],
                    "layer": list(source.layers) if source.layers else base.layer,
                    "pooling": base.pooling,
                    "dtype": base.dtype,
                    "exclude_special": base.exclude_special,
                    "max_length": base.max_length,
                }
                cache = EmbeddingCache(config.cache_dir / "embeddings", key, texts[split])
                reports.append(cache.ensure(compute, advance))
                caches.append(cache)
        tokens[source.model] = merge_reports(reports)
    edges = train_edges(train_sizes, len(texts["train"])) if train_sizes else None
    rows = {split: len(t) for split, t in texts.items()}
    stats, curve = accumulate(caches, sources, rows, parts, edges, config.products)
    return Measured(
        stats["train"].blocks,
        stats,
        {s: len(t) for s, t in texts.items()},
        tokens,
        hashes,
        curve,
    )


def _in_memory(
    pool: ModelPool,
    source: ModelLayers,
    texts: dict[str, list[str]],
    base: EmbedSpec,
    tokens: dict[str, TokenReport],
) -> list[PrecomputedSplit]:
    """One split after another: the rows of a model given as a Python object (arrays as given)."""
    given = pool.given[source.model]
    if isinstance(given, GivenArrays):
        tokens[source.model] = TokenReport(0.0, 0, sum(len(t) for t in texts.values()))
        arrays = given.splits({s: len(t) for s, t in texts.items()})
        return [arrays[split] for split in SPLITS]
    compute = pool.embedder(source.model, EmbedSpec(**{**base.__dict__, "layers": source.layers}))
    splits, reports = [], []
    for split in SPLITS:
        vectors, report = compute(texts[split])
        if not np.isfinite(vectors).all():
            raise UserInputError(
                f"non-finite (NaN/inf) embeddings of {split} spans by {given.name!r}"
            )
        splits.append(in_memory_split(vectors))
        reports.append(report)
    tokens[source.model] = merge_reports(reports)
    return splits


def accumulate(
    caches: list[EmbeddingCache | PrecomputedSplit],
    sources: list[ModelLayers],
    rows: dict[str, int],
    parts: dict[str, int],
    train_edges: list[int] | None = None,
    products: Products = "float32",
) -> tuple[dict[str, SpanBlockMoments], SpanBlockMoments | None]:
    """Stream every source's shards split by split into block statistics.

    ``caches`` holds, source by source, one cache per split in ``SPLITS`` order; ``rows`` is each
    split's row count, ``parts`` its number of row blocks (default 1); ``products``: precision of
    the Gram products (``SecondMoments``; accumulated in float64 either way).

    Under several processes each rank reads only the shards it owns, then every row block's
    statistics are summed over ranks (``reduce_blocked``): all ranks return the same.
    """
    names = [n for s in sources for n in s.column_names]
    stats: dict[str, SpanBlockMoments] = {}
    curve: SpanBlockMoments | None = None
    for k, split in enumerate(SPLITS):
        split_caches = caches[k :: len(SPLITS)]  # caches were made source by source, split by split
        dims = [_width(c.dim, s) for c, s in zip(split_caches, sources, strict=True)]
        blocks = layout(names, [d for group in dims for d in group])
        blocked = SpanBlockMoments.empty(blocks, rows[split], parts.get(split, 1), products)
        if split == "train" and train_edges:
            curve = SpanBlockMoments.with_edges(blocks, [0, *train_edges], products)
        for row, chunk in _row_groups(split_caches, owned(len(split_caches[0].ranges))):
            blocked.add_rows(chunk, row)
            if split == "train" and curve is not None:
                upto = curve.rows
                if row < upto:
                    curve.add_rows(chunk[: upto - row], row)
        stats[split] = reduce_blocked(blocked)
    return stats, None if curve is None else reduce_blocked(curve)


def _row_groups(
    caches: list[EmbeddingCache | PrecomputedSplit], indices: Sequence[int]
) -> Iterator[tuple[int, np.ndarray]]:
    """``(first row, (rows, D) chunk)``: the shards ``indices`` of every source side by side,
    consecutive shards joined up to ``GROUP_ROWS`` rows (each update then mirrors its Gram once).

    Every chunk is a view of one buffer, overwritten by the next: it must not be kept (the
    statistics copy what they need), and a large buffer is not faulted in again per chunk.
    """
    ranges = caches[0].ranges
    group: list[tuple[int, tuple[np.ndarray, ...]]] = []
    buffer = np.empty((0, 0), np.float32)
    pieces_of = zip(*(c.chunks(indices) for c in caches), strict=True)
    for index, pieces in zip(indices, pieces_of, strict=True):
        if group and (index != group[-1][0] + 1 or _rows(group) >= GROUP_ROWS):
            buffer = _joined(group, buffer)
            yield ranges[group[0][0]][0], buffer[: _rows(group)]
            group = []
        group.append((index, pieces))
    if group:
        buffer = _joined(group, buffer)
        yield ranges[group[0][0]][0], buffer[: _rows(group)]


def _rows(group: list[tuple[int, tuple[np.ndarray, ...]]]) -> int:
    return sum(len(pieces[0]) for _, pieces in group)


def _joined(group: list[tuple[int, tuple[np.ndarray, ...]]], buffer: np.ndarray) -> np.ndarray:
    """The group's rows (shards stacked) and columns (sources side by side) at the top of
    ``buffer``, or of a new buffer where it is too small or of another dtype."""
    first = group[0][1]
    widths = np.cumsum([0, *(p.shape[1] for p in first)])
    shape, dtype = (_rows(group), int(widths[-1])), np.result_type(*first)
    if buffer.shape[0] < shape[0] or buffer.shape[1] != shape[1] or buffer.dtype != dtype:
        buffer = np.empty(shape, dtype)
    row = 0
    for _, pieces in group:
        for piece, a, b in zip(pieces, widths[:-1], widths[1:], strict=True):
            buffer[row : row + len(piece), a:b] = piece
        row += len(pieces[0])
    return buffer


def train_edges(requested: Sequence[int], available: int) -> list[int]:
    """Learning-curve sizes that fit in the training split: sorted, capped at its size."""
    return sorted({min(int(s), available) for s in requested})


def _width(width: int, source: ModelLayers) -> list[int]:
    count = len(source.layers) if source.layers else 1
    return [width // count] * count


def merge_reports(reports: list[TokenReport]) -> TokenReport:
    spans = sum(r.spans for r in reports)
    tokens = sum(r.mean_tokens * r.spans for r in reports)
    return TokenReport(tokens / spans if spans else 0.0, sum(r.truncated for r in reports), spans)
