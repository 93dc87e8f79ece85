"""What the MergeDistill commands print: a run's store (``merge run``, ``merge inspect``) and the
plan of a dry run, as tables of the rows the library returns."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.table import Table

from lmalgebra.cli.app import bold

if TYPE_CHECKING:
    from lmalgebra.distill.run.inspection import RunInspection

_TEXT = ("language", "teacher")


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


def run_table(report: RunInspection) -> Table:
    """The rows of ``MergeRun.inspect()`` under its ``columns``, its ``caption`` below."""
    table = Table(title=f"MergeDistill run {report.run_dir}")
    for heading, key in report.columns.items():
        table.add_column(heading, justify="left" if key in _TEXT else "right")
    for row in report.pairs:
        table.add_row(*(_cell(row[key]) for key in report.columns.values()))
    table.caption = report.caption or None
    return table


def _bytes(count: float) -> str:
    """``18.0 KiB``: a byte count in binary units."""
    units = ("B", "KiB", "MiB", "GiB", "TiB")
    power = 0
    while count >= 1024 and power < len(units) - 1:
        count, power = count / 1024, power + 1
    return f"{count:,.0f} B" if power == 0 else f"{count:,.1f} {units[power]}"


def plan_tables(plan: Any, run_dir: Path, stages: list[str]) -> list[Table]:
    """``merge_plan``'s DataFrame as two tables: counts and bytes, then seconds per stage
    (``stages``: those the command runs)."""
    counts = Table(title=f"Dry run of {run_dir}: nothing written")
    for column in ("language", "teacher", "examples", "held out", "tokens", "predicted", "store"):
        counts.add_column(column, justify="left" if column in _TEXT else "right")
    totals = plan.sum(numeric_only=True, min_count=1)
    for row in [*plan.to_dict("records"), {"language": bold("total"), "teacher": "", **totals}]:
        numbers = [
            f"{int(row[k]):,}" for k in ("examples", "heldout", "tokens", "predicted_tokens")
        ]
        counts.add_row(row["language"], row["teacher"], *numbers, _bytes(row["store_bytes"]))
    counts.caption = (
        "predicted: the tokens the teacher store holds outputs for; store: the shard files of "
        "the teachers' outputs (top-k ids and log-probabilities)"
    )
    times = Table(title="Time per stage (an estimate)")
    for column in ("stage", "seconds", "this command", "from"):
        times.add_column(column, justify="right" if column == "seconds" else "left")
    from lmalgebra.distill.run.dry_run import PLAN_STAGES

    unknown = False
    for stage in [s for s in PLAN_STAGES if f"{s}_s" in totals]:  # the objective's stages
        how = "its work, timed here in memory" if stage in ("prepare", "vocab") else "FLOPs model"
        runs = "runs" if stage in stages else ""
        seconds = totals[f"{stage}_s"]
        unknown = unknown or math.isnan(seconds)
        times.add_row(stage, "-" if math.isnan(seconds) else f"{seconds:,.2f}", runs, how)
    times.caption = (
        "FLOPs model: FLOPs over a matmul rate probed on this machine, plus per-layer overhead "
        "and model loading (docs/merge/index.md: dry runs). File writes and process start-up "
        "not counted"
        + ("; '-': no estimate (a causal student without a tokenizer)." if unknown else ".")
    )
    return [counts, times]
