"""Library entry point of ``lmalgebra decompose``: run, then write outputs, complete or nothing."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from lmalgebra.core.errors import OVERWRITE, UserInputError
from lmalgebra.core.fingerprint import sha256_file, sha256_texts, unseal
from lmalgebra.core.recipe_files import yaml_problem
from lmalgebra.core.text_files import not_a_file, read_record, read_text
from lmalgebra.distributed import any_rank, barrier, is_main
from lmalgebra.lmd.measure import Measured, ModelPool
from lmalgebra.lmd.run.outputs import write_outputs
from lmalgebra.lmd.run.pipeline import RunInputs, RunResult, run_decomposition
from lmalgebra.lmd.rundir.schema import (
    CONFIG,
    FILES,
    OWNED,
    PROVENANCE,
    STATS_DIR,
    SUMMARY,
    SUMMARY_CHECK,
    recordable,
    refuse_linked_directories,
)
from lmalgebra.lmd.rundir.statistics_files import StatisticsWriter
from lmalgebra.lmd.settings.recipe import DecomposeConfig, config_yaml, run_identity
from lmalgebra.lmd.settings.spans import most_spans, refuse_unfillable
from lmalgebra.sources.corpus import documents_by_language, read_documents
from lmalgebra.sources.kinds import bound_sources
from lmalgebra.sources.model_source import ModelSource
from lmalgebra.storage.atomic import remove_file, write_atomic, write_text_atomic
from lmalgebra.storage.lockfile import lock_file_refusal, run_directory_lock
from lmalgebra.storage.output_paths import (
    LOCK_NAME,
    cache_directory,
    cache_root,
    check_directory,
    claim_run_directory,
    refuse_cache_inside_output,
    refuse_cache_overlap,
    refuse_inside_other_output,
    refuse_unusable_cache_parts,
)


def _recorded_identity(out: Path, checked: bool = True) -> dict[str, Any] | None:
    """The identity of the decomposition already in ``out``, from its ``config.yaml``;
    ``checked``: refused, naming it, where the finished run's ``summary.json`` records another
    sha256 of it (edited since, it would pass another configuration off as the run's), or
    where it records one that is gone (the run had been called no decomposition at all)."""
    path = out / CONFIG
    if not path.is_file():
        if checked and _recorded_sha256(path) is not None:
            raise UserInputError(
                f"{path} {not_a_file(path)}, though {out / SUMMARY} records it: the run's "
                "configuration cannot be read; restore it, write to another directory, or pass "
                f"{OVERWRITE} to replace the run"
            )
        return None
    try:
        data = yaml.safe_load(read_text(path, "run configuration"))
    except yaml.YAMLError as err:
        raise UserInputError(
            f"{path} is not a readable run configuration: {yaml_problem(err)}"
        ) from err
    if checked and _recorded_sha256(path) not in (None, sha256_file(path)):
        raise UserInputError(
            f"{path} was edited since the run finished (its sha256 is not the one "
            f"{out / SUMMARY} records): the run's configuration cannot be read from it; "
            f"restore it, write to another directory, or pass {OVERWRITE} to replace the run"
        )
    return run_identity(data) if isinstance(data, dict) else None


Inputs = Callable[[], tuple[str, dict[str, dict[str, str]]]]  # the corpus hash, model prints


def run_inputs(config: DecomposeConfig, inputs: RunInputs | None) -> Inputs:
    """What a run of ``config`` reads, as its provenance records it: the documents' hash and each
    model's fingerprint (computed when called: only a rerun over a finished run needs them)."""

    def compute() -> tuple[str, dict[str, dict[str, str]]]:
        given = inputs or RunInputs()
        docs = read_documents(config.corpus) if given.docs is None else given.docs
        return sha256_texts(docs), ModelPool(config, given.given).prints

    return compute


def _check_inputs(out: Path, current: Inputs, overwrite: bool) -> None:
    """Refuse to recompute a finished run of the same configuration over other inputs (a changed
    corpus file, other documents or arrays under the same names): its outputs would be replaced
    by those of another run. Refused unless ``overwrite``; a run without a provenance (made
    before it recorded one) is not checked, and one whose provenance is damaged is refused (its
    inputs cannot be compared), naming it: so is one deleted that its ``summary.json`` records.
    """
    path = out / PROVENANCE
    if overwrite or not (out / SUMMARY).is_file():
        return
    stray = sorted(set(OWNED) - set(owned_names(out)))
    if stray:  # left there, it would be read back as the run's
        raise UserInputError(
            f"{out / stray[0]} is no file of the finished run in {out} ({SUMMARY} records no "
            "such file: an earlier run's, or your own); move it away, or write to another "
            "directory"
        )
    if not path.exists() and not path.is_symlink():
        if _recorded_sha256(path) is not None:
            raise UserInputError(
                f"{path} is missing, though {out / SUMMARY} records it: the finished run's "
                "inputs cannot be compared with these; restore it, write to another "
                f"directory, or pass {OVERWRITE} to replace the run"
            )
        return
    corpus, models = _recorded_inputs(path)
    now_corpus, now_models = current()
    differ = ["corpus (its documents)"] if corpus != now_corpus else []
    differ += [f"model {n!r}" for n, p in now_models.items() if n in models and models[n] != p]
    if differ:
        raise UserInputError(
            f"{out} holds a finished decomposition of the same configuration on other inputs "
            f"({', '.join(differ)} {'differ' if len(differ) > 1 else 'differs'} since); write to "
            f"another directory, or pass {OVERWRITE} to replace it"
        )


def _recorded_inputs(path: Path) -> tuple[str, dict[str, Any]]:
    """The documents' hash and the models' fingerprints a finished run's ``provenance.json``
    (``path``) records; a damaged one is refused, naming it."""
    try:
        text = read_text(path, "run provenance")
        if _recorded_sha256(path) not in (None, sha256_file(path)):  # the record edited
            raise ValueError(f"its sha256 is not the one {SUMMARY} records")
        recorded = json.loads(text)
        corpus, models = recorded["hashes"]["corpus"], recorded["models"]
        if not isinstance(corpus, str) or not isinstance(models, dict):
            raise TypeError("hashes.corpus is no hash or models no mapping")
    except (ValueError, KeyError, TypeError) as err:
        raise UserInputError(
            f"{path} is damaged ({type(err).__name__}: {err}): the finished run's inputs "
            "cannot be compared with these; restore it, write to another directory, or pass "
            f"{OVERWRITE} to replace the run"
        ) from None
    return corpus, models


def owned_names(out: Path) -> tuple[str, ...]:
    """The names a decomposition writes (``OWNED``), which ``--overwrite`` removes and a run of
    the same configuration writes again, less those of a file the finished run in ``out`` does
    not record writing (``summary.json``'s ``files``): a table of an earlier run or a user's
    (``sweeps/length.csv`` beside a run of no sweeps) is refused, named, as any other file is,
    where it had been removed, or recorded as the run's and read back as its result."""
    try:
        record = json.loads(read_record(out / SUMMARY))[FILES]
    except (OSError, ValueError, KeyError, TypeError):
        return OWNED
    if not isinstance(record, dict):
        return OWNED
    stray = set(recordable(out)) - set(record)
    return tuple(name for name in OWNED if name not in stray)


def _recorded_sha256(path: Path) -> str | None:
    """The sha256 the finished run's ``summary.json`` records of its file ``path``; None when it
    records none (a run of an older release, or no finished run). A damaged summary is refused
    (``_recorded_files``)."""
    record = _recorded_files(path.parent)
    entry = record.get(path.name) if record is not None else None
    digest = entry.get("sha256") if isinstance(entry, dict) else None
    return digest if isinstance(digest, str) else None


def _recorded_files(out: Path) -> dict[str, Any] | None:
    """The record of the run's files that the finished run's ``summary.json`` in ``out`` keeps
    (None: no summary, or one of an older release, without the record). A summary that is no
    JSON object, was edited since the run wrote it (its checksum) or whose record is no mapping
    is refused, naming it: read as no record, it had switched off the comparison of the run's
    ``provenance.json`` and ``config.yaml`` with the sha256 it records, and a run of other
    inputs had replaced the finished one."""
    path = out / SUMMARY
    if not path.is_file():
        return None
    try:
        summary = json.loads(read_record(path))
        if not isinstance(summary, dict):
            raise ValueError("it holds no JSON object")
        if unseal(summary, SUMMARY_CHECK) is False:
            raise ValueError(f"edited since the run wrote it: its {SUMMARY_CHECK} is another")
        record = summary.get(FILES)
        if record is not None and not isinstance(record, dict):
            raise ValueError(f"its record of the run's files ({FILES!r}) is no mapping")
    except ValueError as err:  # not JSON, or bytes that are not UTF-8, too
        raise UserInputError(
            f"{path} is damaged ({err}): the finished run's records cannot be checked against "
            f"it; restore it, write to another directory, or pass {OVERWRITE} to replace the run"
        ) from None
    return record


def claim_copy(source: Path, target: Path, overwrite: bool) -> None:
    """Claim ``target`` for a copy of the finished run in ``source`` (``Decomposition.save`` of
    a run read back) as a run of its configuration claims its directory: empty, or holding this
    run, finished or a copy cut short (copied again into the same files); another
    configuration, the same one on other inputs or files of no run are refused, or with
    ``overwrite`` the old run's files alone removed. As a run does, the copy's ``summary.json``
    is removed and its ``config.yaml`` written before anything else: copied last, the summary
    marks the copy finished."""
    identity = _recorded_identity(source) or {}
    claim_run_directory(
        target,
        identity,
        _recorded_identity(target, checked=not overwrite),
        finished=(target / SUMMARY).is_file(),
        overwrite=overwrite,
        what="decomposition",
        owned=owned_names(target),
    )
    if (source / PROVENANCE).is_file():
        _check_inputs(target, lambda: _recorded_inputs(source / PROVENANCE), overwrite)
    remove_file(target / SUMMARY)
    if (source / CONFIG).is_file():
        write_atomic(target / CONFIG, functools.partial(shutil.copyfile, source / CONFIG))


def check_output_directory(out: Path, what: str = "output directory") -> None:
    """What a decomposition refuses of its directory before claiming it: one it cannot write
    (``check_directory``), and one inside another lmalgebra output (a run, a model directory,
    at any depth; a demo's directory, which holds its own runs, aside), whose own files those of
    a run would mix with (a run read back and saved into a folder of itself had copied itself
    into the copy); and its lock file that is no regular file (a FIFO, a link), which taking
    the lock refuses (a dry run, which takes none, had planned the run)."""
    check_directory(out, what)
    refuse_inside_other_output(out, what, allowed=("a demo's output",))
    refuse_linked_directories(out)
    if (lock := lock_file_refusal(out)) is not None:
        raise UserInputError(lock)


def check_claim(config: DecomposeConfig, overwrite: bool, inputs: RunInputs | None = None) -> None:
    """What a run of ``config`` refuses of its output directory, found without writing or
    removing anything (``decompose --dry-run``): a file in its place, a directory holding
    another configuration's run or files of no run (or, with ``overwrite``, files a run does not
    write), and a finished run of this configuration on other documents or arrays (the
    corpus is read to check it anyway; an array is hashed in memory). The models' weights are
    not compared with a finished run's: that reads them. Its cache directory is checked as the
    run checks it (a file, or no writable directory: the dry run had passed it), and so are the
    cache's directories the run writes into (``_cache_parts``)."""
    config = config.resolved()
    check_output_directory(config.out)
    check_cache(config)
    refuse_cache_overlap(config.out, cache_directory(config.cache_dir))
    if config.out.is_dir():
        _claim_directory(config, overwrite, dry=True)
        if inputs is not None or config.corpus.paths:  # a plan may be given no documents
            _check_inputs(config.out, _unread_inputs(config, inputs), overwrite)


def check_cache(config: DecomposeConfig) -> None:
    """What a run of ``config`` refuses of its cache: the root a file, or no writable
    directory, and the cache's directories it writes into (``_cache_parts``) files or links
    to nothing; found without writing anything."""
    cache = cache_directory(config.cache_dir)
    refuse_cache_inside_output(cache)
    refuse_unusable_cache_parts(cache, _cache_parts(config))


def _cache_parts(config: DecomposeConfig) -> list[str]:
    """The cache's directories a run of ``config`` writes into: the remembered hashes of models
    read from files, and where a model embeds here, the span plan and the embeddings."""
    from lmalgebra.sources.kinds import KINDS

    parts = ["hashes"] if not all(KINDS[m.kind].python_object for m in config.models) else []
    if any(KINDS[m.kind].cached for m in config.models):
        parts += ["spans", "embeddings"]
    return parts


def _unread_inputs(config: DecomposeConfig, inputs: RunInputs | None) -> Inputs:
    """``run_inputs`` less what reads weights: the documents' hash, and the fingerprints of the
    models given as arrays of embeddings (other models are left out, and so not compared)."""

    def compute() -> tuple[str, dict[str, dict[str, str]]]:
        given = inputs or RunInputs()
        docs = read_documents(config.corpus) if given.docs is None else given.docs
        arrays = {n: m.fingerprint() for n, m in given.given.items() if m.fixed_spans}
        return sha256_texts(docs), arrays

    return compute


def check_corpus(config: DecomposeConfig) -> list[str] | None:
    """What a run of ``config`` refuses of its corpus, read as the run reads it before any
    embedding (``decompose --dry-run``): a file that is no regular file, is not UTF-8 text or
    holds no text, or a per-language study of documents without languages. The documents the
    run cuts its spans from (None: per language), for ``check_spans``."""
    if config.study.languages:
        documents_by_language(config.corpus)
        return None
    return read_documents(config.corpus)


def check_spans(
    config: DecomposeConfig, docs: list[str] | None, given: Mapping[str, ModelSource]
) -> None:
    """What a run of ``config`` refuses of the spans of ``docs`` that is known without a
    tokenizer (``decompose --dry-run``, after the models, as the run checks them first):
    spans longer than the documents can hold (``refuse_unfillable``), and a model given as its
    span embeddings (an array among ``given``, a file) of more rows than the run can have
    spans. A per-language study cuts each language's spans apart: those are left to the run."""
    if config.study.languages:
        return
    if docs is not None:
        refuse_unfillable(docs, config.spans)
    most = most_spans(docs, config.spans)
    sources = bound_sources(config.models, given)
    for name, source in sources.items():
        rows = source.span_rows()
        if rows > sum(most.values()):
            listed = ", ".join(f"{s} {n}" for s, n in most.items())
            raise UserInputError(
                f"model {name!r}: {rows} rows of embeddings, but the run has {sum(most.values())} "
                f"spans at most ({listed}: spans.counts, or what the documents can hold); "
                "lmalgebra.spans() lists them in row order"
            )


def _claim_directory(
    config: DecomposeConfig, overwrite: bool, dry: bool = False
) -> dict[str, Any] | None:
    """``claim_run_directory`` for a decomposition of ``config``; the recorded identity."""
    recorded = _recorded_identity(config.out, checked=not overwrite)
    claim_run_directory(
        config.out,
        run_identity(config.model_dump(mode="json")),
        recorded,
        finished=(config.out / SUMMARY).is_file(),
        overwrite=overwrite,
        what="decomposition",
        owned=owned_names(config.out),
        dry=dry,
    )
    return recorded


def _claim(config: DecomposeConfig, overwrite: bool, current: Inputs) -> None:
    out = config.out
    recorded = _claim_directory(config, overwrite)
    if recorded is not None:  # the same configuration (else refused, or removed by overwrite)
        _check_inputs(out, current, overwrite)
    remove_file(out / SUMMARY)
    if recorded is not None and not config.save_statistics:  # an earlier run's moments, which
        for name in OWNED:  # this one writes no more: gone, not left for report to refuse
            if name.startswith(f"{STATS_DIR}/"):
                remove_file(out / name)
        with contextlib.suppress(OSError):  # not there, or holding what claim let be
            (out / STATS_DIR).rmdir()
    write_text_atomic(out / CONFIG, config_yaml(config))


def decompose(
    config: DecomposeConfig, overwrite: bool = False, inputs: RunInputs | None = None
) -> RunResult:
    """Run a decomposition and write its outputs under ``config.out``.

    ``config.out`` must be empty, or hold a run of the same configuration (resumed, or computed
    again into the same files); ``overwrite`` empties it first. Its ``summary.json`` is removed
    before any work, so a failed run never looks complete. Output and cache paths are checked
    before anything is loaded. ``inputs``: documents and model objects given from Python.
    ``dtype: auto`` is recorded as the dtype it resolved to.
    """
    config = config.resolved()
    check_output_directory(config.out)
    refuse_cache_overlap(config.out, cache_directory(config.cache_dir))
    with cache_root(config.cache_dir), run_directory_lock(config.out, "decompose"):
        _claim_everywhere(config, overwrite, run_inputs(config, inputs))
        writers: list[StatisticsWriter] = []

        def write_statistics(measured: Measured) -> None:  # during the analysis
            if is_main() and config.save_statistics:
                writers.append(
                    StatisticsWriter(config.out, measured.blocks, measured.split_moments())
                )

        try:
            result = run_decomposition(config, inputs, on_measured=write_statistics)
        except BaseException:
            for writer in writers:
                writer.discard()
            _release_claim(config.out)
            raise
        if is_main():  # under several processes every rank holds the result; one writes it
            try:
                write_outputs(result, statistics=writers[0] if writers else None)
            finally:  # no thread outlives the lock, whatever writing met
                for writer in writers:
                    writer.join()
        barrier()  # the ranks finish together, once the outputs are written
    return result


def save_result(result: RunResult, overwrite: bool = False) -> Path:
    """Write a result computed without an output directory to ``result.config.out``, claimed and
    locked as :func:`decompose` does (the same files as a run made with that directory)."""
    result.config = config = result.config.resolved()
    check_output_directory(config.out)
    with run_directory_lock(config.out, "decompose"):
        _claim_everywhere(config, overwrite, lambda: (result.hashes["corpus"], result.fingerprints))
        if is_main():
            write_outputs(result)
    return config.out


def _claim_everywhere(config: DecomposeConfig, overwrite: bool, current: Inputs) -> None:
    refusal: UserInputError | None = None
    if is_main():
        try:
            _claim(config, overwrite, current)
        except UserInputError as err:
            refusal = err
    if any_rank(refusal is not None):
        raise refusal or UserInputError(f"{config.out}: refused (see the main rank's message)")


def _release_claim(out: Path) -> None:
    """After a failure before anything was computed, take back the claim's ``config.yaml`` so that
    a directory this command created is left empty (and removed with the lock)."""
    if is_main() and [p.name for p in out.iterdir() if p.name != LOCK_NAME] == [CONFIG]:
        (out / CONFIG).unlink()
