"""One decomposition run: corpus -> spans -> cached embeddings -> second moments -> fits."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.fingerprint import sha256_texts
from lmalgebra.lmd.config import DecomposeConfig
from lmalgebra.lmd.embed import TokenReport, embed
from lmalgebra.lmd.embedding_cache import EmbeddingCache
from lmalgebra.lmd.moments import SecondMoments, layout
from lmalgebra.lmd.solver import Decomposer, Fit, SplitMoments
from lmalgebra.lmd.spans import SPLITS, draw_spans, span_texts
from lmalgebra.progress import progress_bar
from lmalgebra.sources.corpus import read_documents
from lmalgebra.sources.models import (
    ModelRef,
    check_layer,
    fingerprint,
    load_model,
    load_tokenizer,
    resolve_directory,
)

log = logging.getLogger(__name__)


@dataclass
class Decomposition:
    """Everything a run computed; ``report.write_outputs`` turns it into files."""

    config: DecomposeConfig
    names: list[str]
    spans: dict[str, int]
    tokens: dict[str, TokenReport]
    fingerprints: dict[str, dict[str, str]]
    hashes: dict[str, str]
    pairwise: dict[str, np.ndarray]
    group: list[Fit]
    single: Fit | None
    timings: dict[str, float] = field(default_factory=dict)


class _LazyModel:
    """Loads a model and tokenizer on first use, so fully cached models are never loaded."""

    def __init__(self, ref: ModelRef, directory: Path, config: DecomposeConfig):
        self.ref, self.directory, self.config = ref, directory, config
        self._loaded: tuple[Any, Any] | None = None

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, TokenReport]:
        if self._loaded is None:
            model = load_model(self.ref, self.directory, self.config.dtype)
            check_layer(self.ref.name, model, self.config.layer)
            self._loaded = (model, load_tokenizer(self.ref, self.directory))
        model, tokenizer = self._loaded
        return embed(texts, model, tokenizer, self.config.embed_spec())


def run_decomposition(config: DecomposeConfig) -> Decomposition:
    """Run the whole decomposition described by ``config`` (outputs are written by the caller)."""
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    docs = read_documents(config.corpus)
    refs = {m.name: m for m in config.models}
    dirs = {name: resolve_directory(ref) for name, ref in refs.items()}
    memo = config.cache_dir / "hashes"
    prints = {name: fingerprint(ref, dirs[name], memo) for name, ref in refs.items()}
    ref_name = config.reference_tokenizer or config.models[0].name
    spans = draw_spans(docs, load_tokenizer(refs[ref_name], dirs[ref_name]), config.spans)
    texts = {split: span_texts(docs, spans[split]) for split in SPLITS}
    hashes = {
        "corpus": sha256_texts(docs),
        **{f"spans_{s}": sha256_texts(texts[s]) for s in SPLITS},
    }
    timings["spans"] = time.perf_counter() - clock

    clock = time.perf_counter()
    spec = config.embed_spec()
    caches: dict[str, dict[str, EmbeddingCache]] = {}
    tokens: dict[str, TokenReport] = {}
    total = sum(len(t) for t in texts.values())
    for name, ref in refs.items():
        compute = _LazyModel(ref, dirs[name], config)
        caches[name], reports = {}, []
        with progress_bar(f"embed {name}", total, config.progress) as advance:
            for split in SPLITS:
                key = {
                    "model": name,
                    "fingerprint": prints[name],
                    "spans": hashes[f"spans_{split}"],
                    "layer": spec.layer,
                    "pooling": spec.pooling,
                    "dtype": spec.dtype,
                    "exclude_special": spec.exclude_special,
                    "max_length": spec.max_length,
                }
                cache = EmbeddingCache(config.cache_dir / "embeddings", key, texts[split])
                reports.append(cache.ensure(compute, advance))
                caches[name][split] = cache
        tokens[name] = _merge_reports(reports)
        log.info(
            "%s: %.1f tokens per span, %d truncated",
            name,
            tokens[name].mean_tokens,
            tokens[name].truncated,
        )
    timings["embed"] = time.perf_counter() - clock

    clock = time.perf_counter()
    moments = accumulate(caches, list(refs))
    stats_dir = config.out / "stats"
    for split, m in moments.items():
        m.save(stats_dir / f"{split}.safetensors")
    timings["statistics"] = time.perf_counter() - clock

    clock = time.perf_counter()
    blocks = moments["train"].blocks
    # each Gram buffer becomes its covariance in place: no second D x D array per split
    solver = Decomposer(
        blocks,
        {s: SplitMoments.of(moments.pop(s), in_place=True) for s in SPLITS},
        config.alpha,
        config.alpha_mode,
    )
    pairwise = solver.pairwise()
    group = solver.leave_one_out()
    single = solver.fit(config.target, config.basis) if config.target and config.basis else None
    timings["solve"] = time.perf_counter() - clock
    return Decomposition(
        config,
        list(refs),
        {s: len(t) for s, t in texts.items()},
        tokens,
        prints,
        hashes,
        pairwise,
        group,
        single,
        timings,
    )


def accumulate(
    caches: dict[str, dict[str, EmbeddingCache]], names: list[str]
) -> dict[str, SecondMoments]:
    """Second moments per split, streaming shard by shard over all models' caches."""
    out = {}
    for split in SPLITS:
        moments: SecondMoments | None = None
        for parts in zip(*(caches[n][split].chunks() for n in names), strict=True):
            if moments is None:
                moments = SecondMoments(layout(names, [p.shape[1] for p in parts]))
            moments.update(np.hstack(parts))
        assert moments is not None
        out[split] = moments
    return out


def _merge_reports(reports: list[TokenReport]) -> TokenReport:
    spans = sum(r.spans for r in reports)
    tokens = sum(r.mean_tokens * r.spans for r in reports)
    return TokenReport(tokens / spans if spans else 0.0, sum(r.truncated for r in reports), spans)
