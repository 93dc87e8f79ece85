"""One measurement: documents -> spans of T tokens -> cached embeddings -> block statistics.

The main decomposition and every sweep (span length, layers, languages) are measurements that
differ only in their documents, span length and sources; the fits that follow read statistics only.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.progress import progress_bar
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.settings.spans import SpanSpec
from lmalgebra.lmd.spans.cache import remembered_plan, span_key
from lmalgebra.lmd.spans.draw import RunSpans, plan_spans, reference_model, span_tokenizer
from lmalgebra.lmd.statistics.passes import Reductions, accumulate
from lmalgebra.sources.embed import EmbedSpec, TokenReport, embed
from lmalgebra.sources.given_models import GivenArrays, GivenModel, in_memory_split
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
from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.nulls import RANDOM_SUFFIX, random_copy
from lmalgebra.stats.solver import AlphaMode, Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments

log = logging.getLogger(__name__)


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
                config = self.config
                model = load_model(
                    ref, self.dirs[name], spec.device, config.weights_dtype, config.device_map
                )
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
    reductions: Reductions | None = None  # what a reduced measurement kept of each model
    splits: dict[str, SplitMoments] = field(default_factory=dict)  # see split_moments

    def scales(self) -> list[float] | None:
        """Each block's mean variance over all its dimensions (reduced), else None (derived)."""
        return None if self.reductions is None else self.reductions.scales(self.blocks)

    def split_moments(self) -> dict[str, SplitMoments]:
        """Mean and covariance of every split, made once: a split kept as one block of spans
        gives its Gram buffer to its covariance (no second ``D x D`` array; its block statistics
        are then spent), one kept in several blocks sums them into a new one."""
        if not self.splits:
            self.splits = {
                split: SplitMoments.of(blocked.total(), in_place=True)
                for split, blocked in self.stats.items()
            }
        return self.splits

    def decomposer(
        self, alpha: float, alpha_mode: AlphaMode, train: SplitMoments | None = None
    ) -> Decomposer:
        """A decomposer over every block of this measurement (``train``: another training
        split, e.g. a prefix of the training spans)."""
        splits = {**self.split_moments(), **({"train": train} if train is not None else {})}
        return Decomposer(self.blocks, splits, alpha, alpha_mode, self.scales())


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
    spill: Path | None = None,
) -> Measured:
    """Embed ``docs``' spans with every source (cached) and keep their statistics per block.

    ``parts``: blocks of spans per split (1 = plain statistics). ``train_sizes``: training-set
    sizes whose prefixes of the training spans form a learning curve (capped at the split's size).
    ``spill``: where the splits' covariances go when their statistics do not fit in memory.
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
                    # only when it is not float32: caches made before the option keep their keys
                    **(
                        {"weights": config.weights_dtype}
                        if config.weights_dtype != "float32"
                        else {}
                    ),
                }
                cache = EmbeddingCache(config.cache_dir / "embeddings", key, texts[split])
                reports.append(cache.ensure(compute, advance))
                caches.append(cache)
        tokens[source.model] = merge_reports(reports)
    edges = train_edges(train_sizes, len(texts["train"])) if train_sizes else None
    rows = {split: len(t) for split, t in texts.items()}
    names = [n for s in sources for n in s.column_names]
    widths = [_widths(c.dim, s) for c, s in zip(caches[:: len(SPLITS)], sources, strict=True)]
    done = accumulate(
        caches, names, widths, rows, parts, edges, config.products, config.scale, spill
    )
    return Measured(
        done.stats["train"].blocks,
        done.stats,
        {s: len(t) for s, t in texts.items()},
        tokens,
        hashes,
        done.curve,
        done.reductions,
        done.spilled,
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


def train_edges(requested: Sequence[int], available: int) -> list[int]:
    """Learning-curve sizes that fit in the training split: sorted, capped at its size."""
    return sorted({min(int(s), available) for s in requested})


def _widths(width: int, source: ModelLayers) -> list[int]:
    """The widths of a source's blocks: one per layer, equal."""
    count = len(source.layers) if source.layers else 1
    return [width // count] * count


def merge_reports(reports: list[TokenReport]) -> TokenReport:
    spans = sum(r.spans for r in reports)
    tokens = sum(r.mean_tokens * r.spans for r in reports)
    return TokenReport(tokens / spans if spans else 0.0, sum(r.truncated for r in reports), spans)
