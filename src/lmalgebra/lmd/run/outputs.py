"""Writing a decomposition run directory: tables (through the schema), weights, resolved config,
provenance, figures, and ``summary.json`` last."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra import __version__
from lmalgebra.core.fingerprint import plain, sealed
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.figures.heatmaps import pairwise_heatmap
from lmalgebra.lmd.figures.run_figures import write_plots
from lmalgebra.lmd.run.pipeline import RunResult
from lmalgebra.lmd.rundir.schema import (
    CONFIG,
    FILES,
    GROUP,
    PAIRWISE_HEATMAP,
    PROVENANCE,
    SUMMARY,
    SUMMARY_CHECK,
    TABLES,
    WEIGHTS,
    group_rows,
    recorded_outputs,
    write_pairwise,
)
from lmalgebra.lmd.rundir.statistics_files import StatisticsWriter, write_statistics
from lmalgebra.lmd.settings.recipe import config_yaml
from lmalgebra.storage.atomic import write_atomic, write_json_atomic, write_text_atomic
from lmalgebra.storage.csv_tables import write_table
from lmalgebra.storage.file_record import record_files


def versions() -> dict[str, str]:
    """The versions that made a run, read from the installed packages' metadata: a run that
    loaded no model does not import transformers to learn its version."""
    from importlib.metadata import PackageNotFoundError, version

    found = {"lmalgebra": __version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "numpy"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found


def summary(result: RunResult) -> dict[str, Any]:
    names = result.names
    off_diagonal = ~np.eye(len(names), dtype=bool)
    group = {f.target: f.r2 for f in result.group}
    reports = [(n, result.tokens.get(n)) for n in names]
    return plain(
        {  # as summary.json holds it: an R^2 that could not be computed is None
            "status": "complete",
            "models": names,
            "spans": result.spans,
            "group_dependency": {s: float(np.mean([g[s] for g in group.values()])) for s in SPLITS},
            "group_r2": group,
            "mean_pairwise_r2": {s: float(result.pairwise[s][off_diagonal].mean()) for s in SPLITS},
            # None: a model given as its span embeddings, which nothing here tokenised
            "tokens_per_span": {n: round(r.mean_tokens, 3) if r else None for n, r in reports},
            "truncated_spans": {n: r.truncated if r else None for n, r in reports},
            "single_fit": None
            if result.single is None
            else {
                "target": result.single.target,
                "basis": list(result.single.basis),
                "r2": result.single.r2,
            },
            "alpha": {
                "value": result.alpha,
                "mode": result.config.alpha_mode,
                "selected_by": result.alpha_selected_by,
            },
            "tables": sorted(f"{stem}.csv" for stem in result.tables),
            "seconds": {k: round(v, 3) for k, v in result.timings.items()},
            "method": result.method,
            "warnings": result.warnings,
        }
    )


def write_outputs(result: RunResult, statistics: StatisticsWriter | None = None) -> Path:
    """Write every output; ``summary.json`` goes last and marks the run complete, recording the
    size (and for text files the sha256) of every file its readers read. ``statistics``: the
    writer that has been writing the statistics files since the measurement ended, else they are
    written here (where ``save_statistics`` asks for them)."""
    out = result.config.out
    names = result.names
    for split in SPLITS:
        write_pairwise(out, split, names, result.pairwise[split])
    write_table(
        out, GROUP, group_rows([f.target for f in result.group], [f.r2 for f in result.group])
    )
    if statistics is not None:  # written during the analysis
        statistics.wait()
    elif result.config.save_statistics:
        write_statistics(out, result.blocks, result.stats)
    if result.config.save_weights:
        _write_weights(result, out / WEIGHTS)
    write_text_atomic(out / CONFIG, config_yaml(result.config))
    provenance = {"versions": versions(), "hashes": result.hashes, "models": result.fingerprints}
    write_json_atomic(out / PROVENANCE, provenance)
    for stem, table_rows in result.tables.items():
        write_table(out, TABLES[stem], table_rows)
    if result.config.figures:  # drawn from the tables just written (matplotlib only then)
        pairwise_heatmap(result.pairwise["test"], names, out / PAIRWISE_HEATMAP)
        write_plots(out, chosen=result.alpha)
    saved = (result.config.save_weights, result.config.save_statistics)
    record = record_files(out, recorded_outputs(out, result.tables, *saved))
    write_json_atomic(out / SUMMARY, sealed({**summary(result), FILES: record}, SUMMARY_CHECK))
    return out


def _write_weights(result: RunResult, path: Path) -> None:
    from safetensors.numpy import save_file

    fits = [("group", f) for f in result.group] + (
        [("fit", result.single)] if result.single else []
    )
    tensors, meta = {}, {}
    for kind, f in fits:
        tensors[f"{kind}.{f.target}.weight"] = np.ascontiguousarray(f.weight)
        tensors[f"{kind}.{f.target}.bias"] = f.bias
        meta[f"{kind}.{f.target}.basis"] = ",".join(f.basis)
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))
