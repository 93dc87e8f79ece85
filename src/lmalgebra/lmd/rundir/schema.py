"""The decomposition run directory, declared once: file names, and each table's columns as a typed
row, written and read through :mod:`lmalgebra.storage.csv_tables`.

Tidy tables (one row per setting, target, basis and split) write floats at full precision and NaN
as an empty cell. The wide tables (``pairwise_r2_{split}.csv``: a matrix with a header cell
``target \\ basis``; ``group_r2.csv``: one row per target and a ``mean`` row) write six decimals.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.splits import SPLITS
from lmalgebra.core.text_files import read_text
from lmalgebra.sources.model_source import GROUP_MEAN
from lmalgebra.stats.alpha_select import AlphaSelection
from lmalgebra.stats.attribution import AttributionRow
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.csv_tables import Table, csv_text, format_cell, parse_number

SUMMARY = "summary.json"  # written last: its presence marks the run complete
CONFIG = "config.yaml"
PROVENANCE = "provenance.json"
WEIGHTS = "weights.safetensors"
STATS_DIR = "stats"  # {split}.safetensors: the second moments
PLOTS_DIR = "plots"  # one PNG per table, named after it
REPORT = "report.html"
PAIRWISE = "pairwise_r2_{split}.csv"
PAIRWISE_CORNER = "target \\ basis"
PAIRWISE_HEATMAP = "pairwise_r2_test.png"  # at the run root: models in the run's order
CLUSTERED_HEATMAP = "pairwise_r2_test_clustered.png"  # under plots/: clustered order
WIDE_DECIMALS = 6
FILES = "files"  # summary.json's record of the run's files, checked by every reader
SUMMARY_CHECK = "sha256"  # in summary.json: of the rest of the summary, checked by every reader
RECORDED_SUFFIXES = (".csv", ".json", ".yaml", ".safetensors")  # figures and the report are
# drawn again by `report`: they are not the run's record


@dataclass(frozen=True)
class FitRow:
    """``fits.csv``: one fit on one split. ``kind`` is pairwise, group or single; ``basis`` the
    basis models joined by ``+``; the interval from the bootstrap, ``adjusted_r2`` on train only."""

    kind: str
    target: str
    basis: str
    split: str
    r2: float
    ci_low: float = math.nan
    ci_high: float = math.nan
    adjusted_r2: float = math.nan


@dataclass(frozen=True)
class NullRow:
    """``nulls.csv``: one null baseline (``shuffled_group``, ``random_group``,
    ``random_pairwise``) of one fit on one split."""

    kind: str
    target: str
    basis: str
    split: str
    r2: float


@dataclass(frozen=True)
class SimilarityRow:
    """``similarity.csv``: an ordered pair of models on one split: LMD R^2 of a from b, linear
    CKA and mean CCA (both symmetric)."""

    model_a: str
    model_b: str
    split: str
    lmd_r2: float
    cka: float
    mean_cca: float


@dataclass(frozen=True)
class AlphaCurveRow:
    """``alpha_curve.csv``: one criterion (gcv, kfold, validation) of one fit at one alpha."""

    target: str
    alpha: float
    criterion: str
    value: float


@dataclass(frozen=True)
class AttributionShareRow:
    """``attribution.csv``: one basis model's share of a target under one method (greedy:
    ``step`` is the order of addition and ``value`` R^2 after it; drop_one; shapley)."""

    target: str
    method: str
    model: str
    step: int | None
    split: str
    value: float


@dataclass(frozen=True)
class SweepRow:
    """``sweeps/{length,layer,train_size,language}.csv``: one fit at one setting of the sweep
    (T, layer, training spans or language code, as text)."""

    setting: str
    kind: str
    target: str
    basis: str
    split: str
    r2: float


@dataclass(frozen=True)
class LayerMapRow:
    """``sweeps/layer_map.csv``: R^2 of one layer of model_a from one layer of model_b."""

    model_a: str
    layer_a: int
    model_b: str
    layer_b: int
    split: str
    r2: float


@dataclass(frozen=True)
class ReductionRow:
    """``reduction.csv`` (reduced runs): one model on one split: its width, the principal
    coordinates and tail probes it kept, the share of the split's variance its coordinates hold, its
    group R^2, the same with every basis model at half its coordinates, and the largest change of
    its pairwise R^2 (as target) at half (see :mod:`lmalgebra.lmd.rundir.reduction_record`)."""

    model: str
    width: int
    components: int
    probes: int
    split: str
    retained_variance: float
    group_r2: float
    group_r2_half: float
    pairwise_change_half: float


@dataclass(frozen=True)
class GroupRow:
    """``group_r2.csv``: each model from all the others, per split; the last row's target is
    ``mean``."""

    target: str
    train: float
    validation: float
    test: float


FITS = Table("fits.csv", FitRow)
NULLS = Table("nulls.csv", NullRow)
SIMILARITY = Table("similarity.csv", SimilarityRow)
ALPHA_CURVE = Table("alpha_curve.csv", AlphaCurveRow)
ATTRIBUTION = Table("attribution.csv", AttributionShareRow)
LENGTH_SWEEP = Table("sweeps/length.csv", SweepRow)
LAYER_SWEEP = Table("sweeps/layer.csv", SweepRow)
LAYER_MAP = Table("sweeps/layer_map.csv", LayerMapRow)
TRAIN_SIZE_SWEEP = Table("sweeps/train_size.csv", SweepRow)
LANGUAGE_SWEEP = Table("sweeps/language.csv", SweepRow)
REDUCTION = Table("reduction.csv", ReductionRow)
GROUP = Table("group_r2.csv", GroupRow, decimals=WIDE_DECIMALS)

GROUP_FIGURE = "group_r2.png"  # under plots/: each target's group R^2
# the tables drawn one figure each under plots/, named after the table (``figure_name``)
FIGURE_TABLES: tuple[Table[Any], ...] = (
    SIMILARITY,
    ALPHA_CURVE,
    ATTRIBUTION,
    LENGTH_SWEEP,
    LAYER_SWEEP,
    LAYER_MAP,
    TRAIN_SIZE_SWEEP,
    LANGUAGE_SWEEP,
)
# The tidy tables a run may hold, by stem (the keys of ``Decomposition.tables``).
_TIDY: tuple[Table[Any], ...] = (FITS, NULLS, *FIGURE_TABLES, REDUCTION)
TABLES: dict[str, Table[Any]] = {t.stem: t for t in _TIDY}


def figure_name(table: Table[Any]) -> str:
    """The name of ``table``'s figure under ``plots/`` (``sweeps/length.csv``: ``length.png``)."""
    return f"{Path(table.file).stem}.png"


# every file a decomposition run writes (relative paths, each by its exact name): what
# --overwrite may remove, a file at a time, so that a user's file kept in one of its directories,
# or named like one of its own (``plots/mine.png``), is found
OWNED = (
    SUMMARY,
    CONFIG,
    PROVENANCE,
    WEIGHTS,
    *(f"{STATS_DIR}/{split}.safetensors" for split in SPLITS),
    *(f"{PLOTS_DIR}/{name}" for name in (CLUSTERED_HEATMAP, GROUP_FIGURE)),
    *(f"{PLOTS_DIR}/{figure_name(t)}" for t in FIGURE_TABLES),
    REPORT,
    PAIRWISE_HEATMAP,
    *(PAIRWISE.format(split=split) for split in SPLITS),
    *sorted({t.file for t in (*TABLES.values(), GROUP)}),
)
# the directories a run writes its own files into (``stats/``, ``plots/``, ``sweeps/``)
RUN_DIRECTORIES = (
    STATS_DIR,
    PLOTS_DIR,
    *sorted({t.file.split("/")[0] for t in TABLES.values() if "/" in t.file}),
)


def refuse_linked_directories(run_dir: Path) -> None:
    """Refuse a run directory one of whose own directories (``RUN_DIRECTORIES``) is a symbolic
    link: the run (or ``report``, drawing its figures) writes its files there itself, and
    through the link would replace the files of the directory it names (a user's
    ``group_r2.png`` among them)."""
    for name in RUN_DIRECTORIES:
        path = Path(run_dir) / name
        if path.is_symlink():
            raise UserInputError(
                f"{path} is a symbolic link to {path.readlink()}: a decomposition writes its "
                f"files into {name}/ itself and would replace those of the directory the link "
                "names; remove the link"
            )


TableRow = (
    FitRow
    | NullRow
    | SimilarityRow
    | AlphaCurveRow
    | AttributionShareRow
    | SweepRow
    | LayerMapRow
    | ReductionRow
)
# Rows handed to the writer: typed rows, or mappings of column -> value (the sweeps' tidy rows).
TableRows = Sequence[TableRow] | Sequence[Mapping[str, Any]]


def attribution_rows(rows: Sequence[AttributionRow]) -> list[AttributionShareRow]:
    """Attribution results as rows of ``attribution.csv`` (a sampled Shapley value's standard
    error is not part of the table)."""
    return [
        AttributionShareRow(r.target, r.method, r.model, r.step, r.split, r.value) for r in rows
    ]


def alpha_curve_rows(selection: AlphaSelection) -> list[AlphaCurveRow]:
    """The curves an alpha was chosen from, as rows of ``alpha_curve.csv``."""
    return [
        AlphaCurveRow(str(r["target"]), float(r["alpha"]), str(r["criterion"]), float(r["value"]))
        for r in selection.rows()
    ]


def group_rows(targets: Sequence[str], r2: Sequence[dict[str, float]]) -> list[GroupRow]:
    """``group_r2.csv``: each target's R^2 per split, then their mean."""
    rows = [GroupRow(t, *(v[s] for s in SPLITS)) for t, v in zip(targets, r2, strict=True)]
    mean = [float(np.mean([v[s] for v in r2])) for s in SPLITS]
    return [*rows, GroupRow(GROUP_MEAN, *mean)]


def pairwise_text(names: Sequence[str], matrix: np.ndarray) -> str:
    """``pairwise_r2_{split}.csv``: ``matrix`` ``(n, n)`` (row = target, column = basis), NaN
    (the diagonal) as an empty cell."""
    rows: list[list[Any]] = [[PAIRWISE_CORNER, *names]]
    rows += [[t, *(format_cell(v, WIDE_DECIMALS) for v in matrix[i])] for i, t in enumerate(names)]
    return csv_text(rows)


def write_pairwise(run_dir: Path, split: str, names: Sequence[str], matrix: np.ndarray) -> Path:
    path = run_dir / PAIRWISE.format(split=split)
    write_text_atomic(path, pairwise_text(names, matrix))
    return path


def read_pairwise(run_dir: Path, split: str = "test") -> tuple[list[str], np.ndarray] | None:
    """Model names and the ``(n, n)`` float64 pairwise R^2 matrix (row = target, column = basis).

    NaN where a cell is empty (the diagonal). None if the file is absent.
    """
    path = run_dir / PAIRWISE.format(split=split)
    if not path.is_file():
        return None
    with io.StringIO(read_text(path, "run file", newline=""), newline="") as handle:
        table = [row for row in csv.reader(handle) if row]
    if not table or len(table[0]) < 2:
        raise UserInputError(f"{path}: expected a header '{PAIRWISE_CORNER},MODEL,...'")
    names = table[0][1:]
    index = {n: i for i, n in enumerate(names)}
    matrix = np.full((len(names), len(names)), np.nan)
    for line, row in enumerate(table[1:], start=2):
        if row[0] not in index or len(row) != len(names) + 1:
            raise UserInputError(f"{path}, line {line}: expected a row for one of {names}")
        for j, cell in enumerate(row[1:]):
            matrix[index[row[0]], j] = parse_number(cell.strip(), f"{path}, line {line}", names[j])
    return names, matrix


def recorded_outputs(
    out: Path, tables: Iterable[str], weights: bool, statistics: bool
) -> list[Path]:
    """The files of run directory ``out`` that ``summary.json`` records: those the run wrote,
    its tables (``tables``, by stem), configuration, provenance, and its weights and moments
    where it saved them (not figures, the report, hidden files or the summary; nor a file of
    those names it did not write, an earlier run's or a user's, which a run computed again over
    it had recorded as its own, and ``report`` then read as the run's)."""
    written = set(tables)
    unwritten = {t.file for stem, t in TABLES.items() if stem not in written}
    if not weights:
        unwritten.add(WEIGHTS)
    if not statistics:
        unwritten.update(f"{STATS_DIR}/{split}.safetensors" for split in SPLITS)
    return [out / name for name in recordable(out) if name not in unwritten]


def recordable(out: Path) -> list[str]:
    """The names of the files of ``out`` a run's ``summary.json`` may record (the run's own
    names, as regular files; not through a link in place of one of its directories, which is
    refused as such)."""
    return [
        name
        for name in OWNED
        if name.endswith(RECORDED_SUFFIXES)
        and name != SUMMARY
        and (out / name).is_file()
        and not (out / name).parent.is_symlink()
    ]
