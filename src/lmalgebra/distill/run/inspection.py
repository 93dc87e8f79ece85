"""What a MergeDistill run directory holds, read from its shard sets: per (language, teacher) the
examples and what the teacher store holds of them, and bytes per stored token; the vocabulary's
report. Each objective makes its own rows (``distill.masked.inspection``,
``distill.causal.inspection``); both return a ``RunInspection``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmalgebra.core.errors import UserInputError, call_bound, merge_stage
from lmalgebra.distill.run.store_check import missing_set
from lmalgebra.storage.shard_set import ShardSet

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunInspection:
    """What a MergeDistill run directory holds (``MergeRun.inspect``, ``merge inspect``).

    Attributes:
        run_dir: the run directory.
        pairs: one row per (language, teacher): its examples, what the store holds of them, bytes
            per stored token (the keys of ``columns``' values); ``frame()`` as a DataFrame.
        columns: the command's table: heading -> key of a row.
        summary: one line (pairs, examples, tokens; the student vocabulary's size when built).
        caption: what the table's abbreviations mean ("" when none).
        vocab: the union vocabulary's report (masked runs, after ``merge vocab``), or None.
        row_types: every key of a row and its pandas dtype: ``frame()``'s columns where there is
            no row yet.
    """

    run_dir: Path
    pairs: list[dict[str, Any]]
    columns: dict[str, str]
    summary: str
    caption: str
    vocab: dict[str, Any] | None
    row_types: dict[str, str] = field(default_factory=dict)

    @call_bound
    def frame(self) -> pd.DataFrame:
        """``pairs`` as a DataFrame indexed by (language, teacher)."""
        import pandas as pd

        # a run without examples yet: no rows, the columns and types of a row (they had been the
        # printed table's alone, as objects: ``teach_complete`` was missing)
        empty = {key: pd.Series(dtype=kind) for key, kind in self.row_types.items()}
        frame = pd.DataFrame(self.pairs or empty).set_index(["language", "teacher"])
        # a figure not known yet (a pair not taught: None) is missing, its column numbers: an
        # object column of None had been neither summed nor plotted
        for name in frame.columns[frame.dtypes.map(pd.api.types.is_object_dtype)]:
            if all(v is None or isinstance(v, int | float) for v in frame[name]):
                frame[name] = pd.to_numeric(frame[name])
        return frame

    @call_bound
    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``merge inspect --json``): the run directory as text."""
        found = asdict(self)
        del found["row_types"]
        return {**found, "run_dir": str(self.run_dir)}


def inspected_set(directory: Path, stage: str) -> ShardSet:
    """The shard set in ``directory`` as ``merge inspect`` reads it; one whose manifest is
    damaged is refused, naming it and ``stage``, the ``merge`` command that writes it again (it
    had been shown as a set of no examples)."""
    shards = ShardSet.existing(directory)
    if shards.manifest_damaged:
        raise UserInputError(missing_set(shards, stage))
    return shards


def inspected_tables(shards: ShardSet, stage: str) -> list[Any]:
    """Every shard's table of ``shards`` (sizes and decoding checked, not checksums); a shard
    missing or damaged is refused naming ``stage``, the ``merge`` command that writes it again
    (the line had said "run again", which ``merge inspect`` is not)."""
    return shards.tables(verify=False, again=f"run {merge_stage(stage)} again")
