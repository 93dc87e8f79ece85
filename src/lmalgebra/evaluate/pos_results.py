"""Results of the UPOS evaluation: one row per model, written as CSV and Markdown tables."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import plain, sealed, unseal
from lmalgebra.core.text_files import not_a_file, read_record
from lmalgebra.storage.atomic import write_json_atomic, write_text_atomic
from lmalgebra.storage.csv_tables import Table, format_cell, write_table
from lmalgebra.storage.output_paths import claim_run_directory

CONFIG = "pos_config.json"
# the key of the record's checksum of itself: the results it keeps are read back as they are
CHECK = "config_sha256"
# the top-level names an evaluation writes (``--overwrite`` removes these and nothing else)
OWNED = ("pos_results.csv", "pos_results.md", CONFIG)


@dataclass(frozen=True)
class PosResult:
    """Test scores of one model, with what they depend on."""

    model: str
    mode: str
    layer: int
    accuracy: float
    macro_f1: float
    majority_accuracy: float  # the most frequent train tag, predicted everywhere
    dev_accuracy: float  # of the kept epoch
    best_epoch: int
    train_sentences: int
    test_words: int  # scored words
    words_cut: int  # all splits: past the maximum length
    words_untokenized: int  # all splits: no subword
    seconds: float


RESULTS = Table("pos_results.csv", PosResult, decimals=4, nan="nan")


def write_results(
    results: Sequence[PosResult], out: Path, settings: dict[str, Any] | None = None
) -> None:
    """``pos_results.csv``, ``pos_results.md`` and (given settings) ``pos_config.json``, which
    also keeps every result at full precision (the tables round to 4 decimals) for a resumed
    evaluation (:func:`finished_results`).

    ``pos_config.json`` goes first: it is what a run of the same evaluation recognises and
    resumes from, and the tables are made again from it. Written last, a run killed between
    the files had left tables without their record: a directory the next run refused."""
    if settings is not None:
        record = {**settings, "results": [asdict(r) for r in results]}
        write_json_atomic(out / CONFIG, sealed(record, CHECK))
    write_table(out, RESULTS, results)
    names = [f.name for f in fields(PosResult)]
    lines = ["| " + " | ".join(names) + " |", "|" + "---|" * len(names)]
    for result in results:
        cells = (format_cell(getattr(result, n), RESULTS.decimals, RESULTS.nan) for n in names)
        lines.append("| " + " | ".join(_markdown_cell(c) for c in cells) + " |")
    write_text_atomic(out / "pos_results.md", "\n".join(lines) + "\n")


def _markdown_cell(value: object) -> str:
    """A cell of the Markdown table: a model is named as given (``--models 'x|y=...'``), and a
    ``|`` or a line break in its name had split its row into other columns."""
    return " ".join(str(value).splitlines()).replace("|", "\\|")


def _recorded(out: Path) -> dict[str, Any] | None:
    """``pos_config.json`` of ``out`` as a mapping; None when absent, not a JSON object or
    edited since it was written (it fails its checksum; a record of an older release, without
    one, is read as it is)."""
    try:
        config = json.loads(read_record(out / CONFIG))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict) or unseal(config, CHECK) is False:
        return None
    return config


def finished_results(out: Path, identity: Mapping[str, Any] | None) -> dict[str, PosResult]:
    """Model name -> result, of the models an interrupted evaluation of the same ``identity``
    (``pos_tagging.evaluation_identity``: treebank files, model weights, mode and options) in
    ``out`` had finished; empty when there is none, when the evaluation there was finished (it
    is computed again) or when its record cannot be read back."""
    config = _recorded(out)
    if identity is None or config is None or config.get("finished"):
        return {}
    if config.get("identity") != plain(identity):
        return {}
    names = {f.name for f in fields(PosResult)}
    rows = config.get("results") or []
    if not all(isinstance(row, dict) and set(row) == names for row in rows):
        return {}
    return {row["model"]: PosResult(**row) for row in rows}


def _unrecognised(path: Path, config: dict[str, Any] | None) -> str:
    """Why the record ``path`` names no evaluation: an earlier release's (its settings read
    whole, with no checksum and no identity: it recorded neither), damaged, or no file."""
    if not path.is_file():
        return not_a_file(path)
    if config is not None and "mode" in config:
        return (
            "records no identity of its evaluation (an earlier release of lmalgebra wrote it, "
            "before evaluations were recorded by their inputs)"
        )
    return (
        "is damaged (no identity of an evaluation can be read from it, or it does not match "
        "its checksum; restore it if you can)"
    )


def claim_evaluation(out: Path, identity: dict[str, Any], overwrite: bool) -> None:
    """Make ``out`` this evaluation's own (``output_paths.claim_run_directory``): an empty
    directory, or one holding an evaluation of the same treebank files, models (their weights,
    tokenizer and config hashes), mode and options, which is computed again; another one is
    refused, naming what differs, unless ``overwrite`` (its files removed, and only those)."""
    config = _recorded(out)
    recorded = config.get("identity") if config is not None else None
    path = out / CONFIG
    if (path.exists() or path.is_symlink()) and not isinstance(recorded, dict) and not overwrite:
        raise UserInputError(
            f"{path} {_unrecognised(path, config)}: the evaluation there cannot be compared with "
            "this one; write to another directory, or pass --overwrite to replace the evaluation"
        )
    finished = config is not None and bool(config.get("finished"))
    claim_run_directory(
        out,
        identity,
        recorded if isinstance(recorded, dict) else None,
        finished=finished,
        overwrite=overwrite,
        what="tagging evaluation",
        owned=OWNED,
    )


def result_summary(result: PosResult) -> str:
    return (
        f"{result.mode} test accuracy {result.accuracy:.4f}, macro-F1 {result.macro_f1:.4f} "
        f"(majority {result.majority_accuracy:.4f}), {result.seconds:.0f} s"
    )
