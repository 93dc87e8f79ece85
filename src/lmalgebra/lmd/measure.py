"""One measurement: documents -> spans of T tokens -> cached embeddings -> block statistics.

The main decomposition and every sweep (span length, layers, languages) are measurements that
differ only in their documents, span length and sources; the fits that follow read statistics only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.progress import progress_bar
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.settings.spans import SpanSpec
from lmalgebra.lmd.spans.cache import remembered_plan, span_key
from lmalgebra.lmd.spans.draw import RunSpans, plan_spans, reference_model, span_tokenizer
from lmalgebra.lmd.statistics.passes import Reductions, accumulate
from lmalgebra.sources.embed_spec import TokenReport
from lmalgebra.sources.kinds import bound_sources
from lmalgebra.sources.kinds.python_objects import in_memory_split
from lmalgebra.sources.model_source import ModelSource
from lmalgebra.sources.precomputed import PrecomputedSplit
from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.nulls import RANDOM_SUFFIX, random_copy
from lmalgebra.stats.solver import AlphaMode, Decomposer, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments


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

    def __init__(self, config: DecomposeConfig, given: Mapping[str, ModelSource] | None = None):
        self.config = config
        given = dict(given or {})
        unmatched = {r.name for r in config.models if r.source.python_object} ^ set(given)
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
                if r.source.pretrained  # ONNX/vectors: no architecture
            ]
        # found now: a missing model is refused before any work
        self.models = {n: m.locate() for n, m in bound_sources(refs, given).items()}
        # resolved once per run: ``auto`` is reported once, a bad device refused before any work
        self.spec = config.embed_spec()

    @cached_property
    def prints(self) -> dict[str, dict[str, str]]:
        """Fingerprint of every model (hashes of weights, tokenizer and config)."""
        memo = self.config.cache_dir / "hashes"
        return {n: m.fingerprint(memo) for n, m in self.models.items()}

    @property
    def names(self) -> list[str]:
        return [m.name for m in self.config.models]

    @property
    def null_names(self) -> list[str]:
        return [n for n in self.models if n.endswith(RANDOM_SUFFIX)]

    @cached_property
    def span_tokenizer(self) -> tuple[str, Any]:
        """The tokenizer that cuts the spans, and its name (a model's, or the reference's)."""
        return span_tokenizer(self.config.models, self.config.reference_tokenizer, self.models)

    def depth(self, name: str) -> int:
        """Number of hidden layers (the embedding output is layer 0)."""
        return self.models[name].depth()

    def embedder(self, source: ModelLayers) -> Any:
        """What embeds texts for ``source`` (one of its layers, or several)."""
        spec, model = replace(self.spec, layers=source.layers), self.models[source.model]
        return lambda texts: model.embed(texts, spec)

    def release(self) -> None:
        """Drop loaded weights (a sweep over many settings would otherwise keep them all)."""
        for model in self.models.values():
            model.release()


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
        self,
        alpha: float,
        alpha_mode: AlphaMode,
        train: SplitMoments | None = None,
        interpolation_named: bool = False,
    ) -> Decomposer:
        """A decomposer over every block of this measurement (``train``: another training
        split, e.g. a prefix of the training spans; ``interpolation_named``: as
        :class:`Decomposer`'s)."""
        splits = {**self.split_moments(), **({"train": train} if train is not None else {})}
        return Decomposer(
            self.blocks,
            splits,
            alpha,
            alpha_mode,
            self.scales(),
            interpolation_named=interpolation_named,
        )


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
    ref = reference_model(config.models, config.reference_tokenizer, pool.models)
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
    edges = train_edges(train_sizes, len(texts["train"])) if train_sizes else None
    caches: list[EmbeddingCache | PrecomputedSplit] = []
    tokens: dict[str, TokenReport] = {}
    for source in sources:
        model = pool.models[source.model]
        held = model.rows(texts, hashes["spans_order"])
        if held is not None:  # vectors of these spans (a file, an array), checked against them
            caches += [held[split] for split in SPLITS]  # tokenised by none: no TokenReport
        elif model.cached:
            caches += _cached(pool, source, texts, hashes, tokens, label)
        else:  # a Python object: embedded in memory, not cached
            caches += _in_memory(pool, source, texts, tokens)
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


def _cached(
    pool: ModelPool,
    source: ModelLayers,
    texts: dict[str, list[str]],
    hashes: dict[str, str],
    tokens: dict[str, TokenReport],
    label: str,
) -> list[EmbeddingCache]:
    """Every split's entry of the embedding cache for ``source``, embedded where missing."""
    config, base = pool.config, pool.spec
    compute = pool.embedder(source)
    caches, reports = [], []
    tag = f"embed {source.model}" + (f" ({label})" if label else "")
    with progress_bar(tag, sum(len(t) for t in texts.values()), config.progress) as advance:
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
                **({"weights": config.weights_dtype} if config.weights_dtype != "float32" else {}),
            }
            cache = EmbeddingCache(config.cache_dir / "embeddings", key, texts[split])
            reports.append(cache.ensure(compute, advance))
            caches.append(cache)
    tokens[source.model] = merge_reports(reports)
    return caches


def _in_memory(
    pool: ModelPool,
    source: ModelLayers,
    texts: dict[str, list[str]],
    tokens: dict[str, TokenReport],
) -> list[PrecomputedSplit]:
    """One split after another: the rows of a model given as a Python object."""
    compute = pool.embedder(source)
    splits, reports = [], []
    for split in SPLITS:
        vectors, report = compute(texts[split])
        if not np.isfinite(vectors).all():
            raise UserInputError(
                f"non-finite (NaN/inf) embeddings of {split} spans by {source.model!r}"
            )
        splits.append(in_memory_split(vectors))
        reports.append(report)
    tokens[source.model] = merge_reports(reports)
    return splits


def train_edges(requested: Sequence[int], available: int) -> list[int]:
    """Learning-curve sizes that fit in the training split: sorted, capped at its size (the
    spans drawn are known once drawn: ``spans.counts`` are maxima). Sizes that are all the
    whole split are refused, before any model embeds: the curve's one point is the main fit."""
    if min(int(s) for s in requested) >= available:
        sizes = list(requested)
        given = either(f"--study.train_sizes {sizes}", f"study={{'train_sizes': {sizes}}}")
        raise UserInputError(
            f"{given} would be ignored: the text gave "
            f"{available} training spans, so every size is the whole split (the main fit "
            f"again); give sizes below {available}"
        )
    return sorted({min(int(s), available) for s in requested})


def _widths(width: int, source: ModelLayers) -> list[int]:
    """The widths of a source's blocks: one per layer, equal."""
    count = len(source.layers) if source.layers else 1
    return [width // count] * count


def merge_reports(reports: list[TokenReport]) -> TokenReport:
    spans = sum(r.spans for r in reports)
    tokens = sum(r.mean_tokens * r.spans for r in reports)
    return TokenReport(tokens / spans if spans else 0.0, sum(r.truncated for r in reports), spans)
