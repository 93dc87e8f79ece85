"""One decomposition run: corpus -> spans -> cached embeddings -> statistics -> fits and studies."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.splits import SPLITS
from lmalgebra.distributed import is_main
from lmalgebra.lmd.measure import Measured, ModelLayers, ModelPool, measure
from lmalgebra.lmd.plan.table import checked_plan
from lmalgebra.lmd.run.analysis import Analysis, analyse
from lmalgebra.lmd.run.caveats import run_warnings
from lmalgebra.lmd.run.sweeps import (
    draw_sweep_spans,
    language_sweep,
    layer_map,
    layer_sweep,
    length_sweep,
    train_size_sweep,
)
from lmalgebra.lmd.rundir.schema import TableRows
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.sources.corpus import documents_by_language, read_documents
from lmalgebra.sources.embed_spec import TokenReport
from lmalgebra.sources.model_source import ModelSource
from lmalgebra.stats.moments import ConstantModelError, ModelColumns
from lmalgebra.stats.solver import Fit, SplitMoments
from lmalgebra.stats.span_blocks import SpanBlockMoments
from lmalgebra.storage.atomic import make_directories
from lmalgebra.storage.lockfile import remove_stale_temporaries
from lmalgebra.storage.output_paths import (
    cache_directory,
    cache_root,
    refuse_cache_inside_output,
    tidy_on_failure,
)

log = logging.getLogger(__name__)
# memoised model hashes (``ModelPool.prints``) and the remembered spans: written before any
# embedding, taken back when a failed run made nothing else
CACHE_SCRATCH = ("hashes/*", "spans/*")
# how long a temporary of the cache must have gone unwritten before a run takes it for a dead
# writer's: the cache is shared, by processes of other machines too, and no lock guards it
CACHE_TEMPORARY_SETTLED = 3600.0


@dataclass
class RunResult:
    """Everything a run computed; ``lmd.run.outputs.write_outputs`` turns it into files."""

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
    alpha: float = 0.0
    alpha_selected_by: str = "fixed"
    tables: dict[str, TableRows] = field(default_factory=dict)
    # per split, every source: mean and covariance (in the layout ``blocks``)
    stats: dict[str, SplitMoments] = field(default_factory=dict)
    blocks: list[ModelColumns] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # lmd.run.caveats: what could mislead
    # per split, every source, per block of spans: only when RunInputs.keep_blocks and the study
    # keeps blocks (bootstrap); callers that resample other fits need them
    blocked: dict[str, SpanBlockMoments] = field(default_factory=dict)
    # how the statistics were made (exact or reduced, precision, k per model, the change of R^2
    # at half k): summary.json's ``method``
    method: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunInputs:
    """What a run takes from Python rather than from its config: the documents (instead of
    reading ``config.corpus``) and models given as objects (the config's ``memory`` models)."""

    docs: list[str] | None = None
    given: Mapping[str, ModelSource] = field(default_factory=dict)
    keep_blocks: bool = False  # return the block statistics (large: blocks x D^2 per split)
    log_warnings: bool = True  # False: the caller words (and logs) the run's warnings itself


def run_decomposition(
    config: DecomposeConfig,
    inputs: RunInputs | None = None,
    on_measured: Callable[[Measured], None] | None = None,
) -> RunResult:
    """Run the whole decomposition described by ``config``; nothing is written (the caller
    writes outputs), only the embedding cache of models named by reference is filled.
    ``on_measured`` is called with the measurement once the statistics pass has ended, before
    the analysis (``lmd.run.decompose`` starts writing the statistics files there).

    A run that fails takes back the cache directories it created and left without embeddings
    (memoised model hashes alone do not count). ``dtype: auto`` is resolved first: the result's
    configuration holds the dtype the run used."""
    config = config.resolved()
    refuse_cache_inside_output(cache_directory(config.cache_dir))
    if is_main():  # the temporaries of cache writers killed (kill -9, power loss) go
        remove_stale_temporaries(config.cache_dir, CACHE_TEMPORARY_SETTLED)
    with (
        cache_root(config.cache_dir),
        tidy_on_failure(config.cache_dir, scratch=CACHE_SCRATCH, enabled=is_main()),
    ):
        return _run(config, inputs or RunInputs(), on_measured)


def _run(
    config: DecomposeConfig,
    inputs: RunInputs,
    on_measured: Callable[[Measured], None] | None = None,
) -> RunResult:
    study = config.study
    timings: dict[str, float] = {}
    clock = time.perf_counter()
    docs = read_documents(config.corpus) if inputs.docs is None else inputs.docs
    if study.languages and inputs.docs is not None:
        raise UserInputError(
            "a per-language study reads languages from a corpus: give LANG=PATH corpora "
            "or a records file with language_column, not a list of strings"
        )
    by_language = documents_by_language(config.corpus) if study.languages else None
    plan = checked_plan(config, inputs.given)  # refused here, before any embedding
    pool = ModelPool(config, inputs.given)
    draw_sweep_spans(pool, docs, by_language)  # a sweep's spans refused here, not after embedding
    sources = [ModelLayers(n) for n in [*pool.names, *pool.null_names]]
    parts = {s: study.blocks for s in SPLITS} if study.keeps_blocks else {}
    spill = plan is not None and not config.scale.reduced and plan.spilled[config.scale.precision]
    with _scratch(config, spill) as directory:
        main = measure(pool, docs, config.spans, sources, parts, study.train_sizes, spill=directory)
    tokens = {n: main.tokens[n] for n in pool.names if n in main.tokens}  # arrays: none
    for name, report in tokens.items():
        log.info(
            "%s: %.1f tokens per span, %d truncated", name, report.mean_tokens, report.truncated
        )
    timings["measure"] = time.perf_counter() - clock
    if on_measured is not None:
        on_measured(main)

    clock = time.perf_counter()
    try:
        result: Analysis = analyse(config, main, pool.names)
    except ConstantModelError as err:
        raise _cut_short(err, config, tokens) from None
    timings["analyse"] = time.perf_counter() - clock
    timings |= {f"analyse: {part}": seconds for part, seconds in result.seconds.items()}

    clock = time.perf_counter()
    tables = {**result.tables, **_sweeps(config, pool, docs, main, result.alpha, by_language)}
    timings["sweeps"] = time.perf_counter() - clock
    return RunResult(
        config,
        pool.names,
        main.spans,
        tokens,
        pool.prints,
        main.hashes,
        result.pairwise,
        result.group,
        result.single,
        timings,
        result.alpha,
        result.selected_by,
        tables,
        main.split_moments(),
        main.blocks,
        run_warnings(
            config,
            pool.names,
            main.spans,
            tokens,
            main.blocks,
            main.split_moments(),
            inputs.log_warnings,
        ),
        main.stats if inputs.keep_blocks and study.keeps_blocks else {},
        result.method,
    )


def _cut_short(
    err: ConstantModelError, config: DecomposeConfig, tokens: dict[str, TokenReport]
) -> ConstantModelError:
    """``err``, naming the maximum length that cut every span of the model to the same few
    tokens (a BERT span to its special tokens alone at 2: ``--max_length``, or a
    SentenceTransformer's own ``max_seq_length``), which the refusal had not said."""
    report = tokens.get(err.model)
    if report is None or report.truncated < report.spans:
        return err
    if config.max_length is None:
        cause = "a SentenceTransformer's max_seq_length, or the positions the model has"
        return ConstantModelError(
            f"{err}: every span of it was cut at its maximum length ({cause})"
        )
    return ConstantModelError(
        f"{err}: every span of it was cut to its first {config.max_length} tokens (max_length, "
        f"special tokens included); raise {either('--max_length', 'max_length=')}"
    )


@contextlib.contextmanager
def _scratch(config: DecomposeConfig, wanted: bool) -> Iterator[Path | None]:
    """A private directory under the cache for covariances spilled to disk (their files are
    unlinked once mapped), removed afterwards; None when the statistics stay in memory."""
    if not wanted:
        yield None
        return
    root = config.cache_dir / "scratch"
    make_directories(root)
    log.info("the covariances do not fit in memory together: each is spilled under %s", root)
    with tempfile.TemporaryDirectory(dir=root) as directory:
        yield Path(directory)


def _sweeps(
    config: DecomposeConfig,
    pool: ModelPool,
    docs: list[str],
    main: Measured,
    alpha: float,
    by_language: dict[str, list[str]] | None,
) -> dict[str, TableRows]:
    """The study's sweeps, each a tidy table by name (``sweeps/length``...)."""
    study = config.study
    tables: dict[str, TableRows] = {}
    if study.train_sizes and main.train_curve is not None:
        tables["sweeps/train_size"] = train_size_sweep(main, pool.names, alpha, config.alpha_mode)
    if study.lengths:
        tables["sweeps/length"] = length_sweep(pool, docs, study.lengths, alpha)
    if study.layers:
        tables["sweeps/layer"] = layer_sweep(pool, docs, alpha)
    if study.layer_map:
        tables["sweeps/layer_map"] = layer_map(pool, docs, study.layer_map, alpha)
    if by_language is not None:
        tables["sweeps/language"] = language_sweep(pool, by_language, alpha)
    return tables
