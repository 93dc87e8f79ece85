"""Text corpora from local files: .txt, .jsonl, .json, .csv, .parquet, or a saved dataset.

A corpus is an ordered list of documents (strings). Empty documents are dropped.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from lmalgebra.errors import UserInputError
from lmalgebra.sources.packaged import PACKAGE_PREFIX, asset_path

DocSep = Literal["auto", "line", "blank"]


class CorpusSpec(BaseModel):
    """Where the text comes from and which field holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paths: list[str] = Field(
        description="Corpus files or saved-dataset directories, read in order."
    )
    text_column: str = Field(
        default="text", description="Field holding the text (.jsonl/.json/.csv/.parquet/datasets)."
    )
    doc_sep: DocSep = Field(
        default="auto",
        description="For .txt: 'line' = one document per line, 'blank' = blank-line separated, "
        "'auto' = blank-line separated if the file has blank lines.",
    )
    split: str = Field(default="train", description="Split to read from a saved DatasetDict.")


def _txt(path: Path, doc_sep: DocSep) -> list[str]:
    text = path.read_text(encoding="utf-8-sig")
    lines = text.splitlines()
    blank = doc_sep == "blank" or (doc_sep == "auto" and any(not ln.strip() for ln in lines))
    if not blank:
        return lines
    docs, current = [], []
    for line in lines:
        if line.strip():
            current.append(line)
        elif current:
            docs.append("\n".join(current))
            current = []
    if current:
        docs.append("\n".join(current))
    return docs


def _field(record: object, column: str, where: str) -> str:
    if not isinstance(record, dict) or column not in record:
        raise UserInputError(f"{where}: no text field {column!r}")
    value = record[column]
    return value if isinstance(value, str) else ""


def _jsonl(path: Path, column: str) -> list[str]:
    docs = []
    with path.open(encoding="utf-8-sig") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise UserInputError(f"{path}:{number}: not valid JSON ({err.msg})") from err
            docs.append(_field(record, column, f"{path}:{number}"))
    return docs


def _json(path: Path, column: str) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8-sig"))
    except json.JSONDecodeError as err:
        raise UserInputError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err
    records = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise UserInputError(f"{path}: expected a list of records or a mapping of records")
    return [_field(r, column, str(path)) for r in records]


def _csv(path: Path, column: str) -> list[str]:
    csv.field_size_limit(sys.maxsize)
    with path.open(encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames is None or column not in reader.fieldnames:
            raise UserInputError(f"{path}: no column {column!r} (columns: {reader.fieldnames})")
        return [row[column] or "" for row in reader]


def _arrow_column(table: object, column: str, where: Path) -> list[str]:
    import pyarrow as pa

    assert isinstance(table, pa.Table)
    if column not in table.column_names:
        raise UserInputError(f"{where}: no column {column!r} (columns: {table.column_names})")
    return [v if isinstance(v, str) else "" for v in table.column(column).to_pylist()]


def _parquet(path: Path, column: str) -> list[str]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path, columns=None)
    except Exception as err:
        raise UserInputError(f"{path}: not a readable Parquet file ({err})") from err
    return _arrow_column(table, column, path)


def _saved_dataset(path: Path, column: str, split: str) -> list[str]:
    """A directory written by ``datasets.Dataset(Dict).save_to_disk``: Arrow stream files."""
    import pyarrow as pa

    try:
        return _read_saved_dataset(path, column, split)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as err:
        raise UserInputError(
            f"{path}: damaged saved dataset ({type(err).__name__}: {err})"
        ) from None


def _read_saved_dataset(path: Path, column: str, split: str) -> list[str]:
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        if split not in splits:
            raise UserInputError(f"{path}: no split {split!r} (splits: {splits})")
        path = path / split
    state = path / "state.json"
    if not state.is_file():
        raise UserInputError(f"{path}: a directory, but not a saved dataset (no state.json)")
    files = [path / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    tables = []
    for file in files:
        with pa.memory_map(str(file)) as source:
            tables.append(pa.ipc.open_stream(source).read_all())
    return _arrow_column(pa.concat_tables(tables), column, path)


def read_documents(spec: CorpusSpec) -> list[str]:
    """All non-empty documents of the corpus, in file order."""
    if not spec.paths:
        raise UserInputError("no corpus given")
    docs: list[str] = []
    for name in spec.paths:
        if name.startswith(PACKAGE_PREFIX):
            name = str(asset_path(name.removeprefix(PACKAGE_PREFIX)))
        path = Path(name).expanduser()
        if not path.exists():
            raise UserInputError(f"corpus {path} does not exist")
        suffix = path.suffix.lower()
        try:
            if path.is_dir():
                found = _saved_dataset(path, spec.text_column, spec.split)
            elif suffix in (".txt", ".text", ""):
                found = _txt(path, spec.doc_sep)
            elif suffix == ".jsonl":
                found = _jsonl(path, spec.text_column)
            elif suffix == ".json":
                found = _json(path, spec.text_column)
            elif suffix == ".csv":
                found = _csv(path, spec.text_column)
            elif suffix == ".parquet":
                found = _parquet(path, spec.text_column)
            else:
                raise UserInputError(
                    f"corpus {path}: unknown format {suffix!r} "
                    "(use .txt, .jsonl, .json, .csv, .parquet or a saved dataset)"
                )
        except UnicodeDecodeError as err:
            raise UserInputError(f"corpus {path} is not UTF-8 text ({err.reason})") from err
        except PermissionError as err:
            raise UserInputError(f"corpus {path} is not readable ({err.strerror})") from err
        kept = [d for d in found if d.strip()]
        if not kept:
            raise UserInputError(f"corpus {path} holds no text")
        docs.extend(kept)
    return docs
