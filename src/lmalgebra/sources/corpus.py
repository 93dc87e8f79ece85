"""Text corpora from local files: .txt, .jsonl, .json, .csv, .parquet, or a saved dataset.

A corpus is an ordered list of documents (strings). Empty documents are dropped. Documents may carry
a language: from a field of each record (``language_column``) or from the corpus entry itself
(``LANG=PATH``, one language per file).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import logging
import re
import sys
from collections.abc import Iterator
from itertools import groupby
from pathlib import Path
from typing import Literal

from pydantic import ConfigDict, Field

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.settings import PLAIN_NAME, PLAIN_NAME_RULE, PathText, Settings, home_expanded
from lmalgebra.core.text_files import absent, read_lines, read_text
from lmalgebra.sources.packaged import PACKAGE_PREFIX, asset_path

log = logging.getLogger(__name__)
# the per-language study as a refusal reached from the command line and Python names it
STUDY_LANGUAGES = 'study={"languages": True}'
DocSep = Literal["auto", "line", "blank"]


class CorpusSpec(Settings):
    """Where the text comes from and which field holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    paths: list[PathText] = Field(
        description="Corpus files or saved-dataset directories, read in order; LANG=PATH "
        "gives a file's language (for per-language results)."
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
    language_column: str | None = Field(
        default=None, description="Field holding each document's language (records formats)."
    )


_LANGUAGE_ENTRY = re.compile(rf"^({PLAIN_NAME.pattern})=(.+)$")  # a recipe's language code


def split_language(entry: str) -> tuple[str | None, str]:
    """``"fr=wiki.txt"`` -> ``("fr", "wiki.txt")``; without a language -> ``(None, entry)``."""
    match = _LANGUAGE_ENTRY.match(entry)
    if match is None or home_expanded(Path(entry)).exists():
        return None, entry
    return match.group(1), match.group(2)


def refuse_other_languages(spec: CorpusSpec, language: str, owner: str) -> None:
    """Refuse a corpus entry labelled with another language than ``language`` (``fr=a.txt`` in
    the corpus of ``xx``): the label was dropped and its text read as ``language``'s."""
    for entry in spec.paths:
        label, _ = split_language(entry)
        if label is not None and label != language:
            raise UserInputError(
                f"{owner}: corpus entry {entry!r} is labelled {label!r}: its text would be read "
                f"as language {language!r}; give its file alone, or the language it is"
            )


def _not_a_language(entry: str) -> str:
    """What a missing ``entry`` of the form ``X=PATH`` whose ``PATH`` exists adds to its refusal:
    ``X`` is no language code (``ünï``, ``../x``), so the whole was read as a file's name."""
    code, equals, rest = entry.partition("=")
    if not (code and equals and rest) or _LANGUAGE_ENTRY.match(entry):
        return ""  # no '=': the whole is the file's name (``Path("")`` would be here, and exist)
    if not home_expanded(Path(rest)).exists():
        return ""
    return f" ({code!r} is no language code of LANG=PATH: {PLAIN_NAME_RULE})"


def _txt(path: Path, doc_sep: DocSep) -> list[str]:
    lines = read_lines(path, "corpus")
    blank = doc_sep == "blank" or (doc_sep == "auto" and any(not ln.strip() for ln in lines))
    if not blank:
        return lines
    # a document: a run of non-blank lines
    return ["\n".join(run) for kept, run in groupby(lines, key=lambda ln: bool(ln.strip())) if kept]


def _field(record: object, column: str, where: str) -> object:
    if not isinstance(record, dict):
        raise UserInputError(
            f"{where}: a record is not an object with fields, so it has no {column!r}"
        )
    if column not in record:
        fields = ", ".join(map(repr, record)) or "none"
        raise UserInputError(
            f"{where}: no text field {column!r} (fields: {fields}; "
            "choose one with corpus.text_column)"
        )
    return record[column]


def _strings(values: list[object], column: str, source: Path, places: list[str]) -> list[str]:
    """``values`` with every non-string (null, number, list...) read as ``""`` (so dropped as an
    empty document); a warning counts them and names the first one's place and type."""
    bad = [i for i, v in enumerate(values) if not isinstance(v, str)]
    if bad:
        first = values[bad[0]]
        log.warning(
            "corpus %s: %d record(s) whose %r is not a string are read as empty (first: %s, %s)",
            source,
            len(bad),
            column,
            places[bad[0]],
            "null" if first is None else type(first).__name__,
        )
    return [v if isinstance(v, str) else "" for v in values]


def _jsonl(path: Path, column: str) -> list[str]:
    values: list[object] = []
    places: list[str] = []
    for number, line in enumerate(io.StringIO(read_text(path, "corpus")), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise UserInputError(f"{path}:{number}: not valid JSON ({err.msg})") from err
        values.append(_field(record, column, f"{path}:{number}"))
        places.append(f"line {number}")
    return _strings(values, column, path, places)


def _json(path: Path, column: str) -> list[str]:
    try:
        data = json.loads(read_text(path, "corpus"))
    except json.JSONDecodeError as err:
        raise UserInputError(f"{path}: not valid JSON ({err.msg}, line {err.lineno})") from err
    records = list(data.values()) if isinstance(data, dict) else data
    if not isinstance(records, list):
        raise UserInputError(f"{path}: expected a list of records or a mapping of records")
    values = [_field(r, column, str(path)) for r in records]
    return _strings(values, column, path, [f"record {i + 1}" for i in range(len(values))])


def _csv(path: Path, column: str) -> list[str]:
    csv.field_size_limit(sys.maxsize)
    reader = csv.DictReader(io.StringIO(read_text(path, "corpus", newline=""), newline=""))
    if reader.fieldnames is None or column not in reader.fieldnames:
        raise UserInputError(
            f"{path}: no column {column!r} (columns: {', '.join(reader.fieldnames or [])}; "
            "choose one with corpus.text_column)"
        )
    return [row[column] or "" for row in reader]


def _arrow_column(table: object, column: str, where: Path) -> list[str]:
    import pyarrow as pa

    assert isinstance(table, pa.Table)
    if column not in table.column_names:
        raise UserInputError(
            f"{where}: no column {column!r} (columns: {', '.join(table.column_names)}; "
            "choose one with corpus.text_column)"
        )
    values = table.column(column).to_pylist()
    return _strings(values, column, where, [f"row {i + 1}" for i in range(len(values))])


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
        folder = path
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
            if split not in splits:
                raise UserInputError(f"{path}: no split {split!r} (splits: {splits})")
            folder = path / split
        state = folder / "state.json"
        if not state.is_file():
            raise UserInputError(f"{folder}: a directory, but not a saved dataset (no state.json)")
        tables = []
        for f in json.loads(state.read_text())["_data_files"]:
            with pa.memory_map(str(folder / f["filename"])) as source:
                tables.append(pa.ipc.open_stream(source).read_all())
        return _arrow_column(pa.concat_tables(tables), column, folder)
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as err:
        raise UserInputError(
            f"{path}: damaged saved dataset ({type(err).__name__}: {err})"
        ) from None


def read_documents(spec: CorpusSpec) -> list[str]:
    """All non-empty documents of the corpus, in file order."""
    return [text for text, _ in read_labelled(spec)]


def documents_by_language(spec: CorpusSpec) -> dict[str, list[str]]:
    """Documents grouped by language, languages in order of first appearance."""
    out: dict[str, list[str]] = {}
    for text, language in read_labelled(spec):
        if language is None:
            raise UserInputError(
                "a per-language study needs languages: give corpora as LANG=PATH "
                "or name the records' language field with language_column"
            )
        out.setdefault(language, []).append(text)
    if len(out) == 1:  # its one row would be the main fits again
        raise UserInputError(
            f"{either('--study.languages', STUDY_LANGUAGES)} would be ignored: the corpus holds "
            f"one language ({next(iter(out))}), and a per-language study compares languages; "
            "leave it out"
        )
    return out


def corpus_paths(spec: CorpusSpec) -> list[tuple[str | None, Path]]:
    """``(language or None, file)`` of every corpus entry, ``package:NAME`` resolved; refused,
    naming it, when there is none or one does not exist (before anything reads them: a dry run
    checks them too)."""
    if not spec.paths:
        raise UserInputError("no corpus given")
    found: list[tuple[str | None, Path]] = []
    for entry in spec.paths:
        language, name = split_language(entry)
        if name.startswith(PACKAGE_PREFIX):
            name = str(asset_path(name.removeprefix(PACKAGE_PREFIX), kind="corpus"))
        path = home_expanded(Path(name))
        if not path.exists():
            raise UserInputError(f"corpus {path} {absent(path)}{_not_a_language(entry)}")
        found.append((language, path))
    with as_given(spec):
        _refuse_unread_fields(spec, found)
    return found


@contextlib.contextmanager
def as_given(spec: CorpusSpec) -> Iterator[None]:
    """A refusal of the block that names the file of a packaged corpus (``package:wiki-en``, a
    file inside the installed package) names it as the corpus gives it: the user wrote
    ``package:NAME``, and a path inside site-packages had read as a file of theirs to fix."""
    try:
        yield
    except UserInputError as err:
        text = str(err)
        for entry in spec.paths:
            name = split_language(entry)[1]
            if name.startswith(PACKAGE_PREFIX):
                packaged = asset_path(name.removeprefix(PACKAGE_PREFIX), kind="corpus")
                text = text.replace(str(packaged), name)
        if text == str(err):
            raise
        raise UserInputError(text) from None


def _refuse_unread_fields(spec: CorpusSpec, found: list[tuple[str | None, Path]]) -> None:
    """Refuse a field given a value of its own that no file of the corpus reads (a
    ``text_column`` beside ``.txt`` files alone, a ``doc_sep`` beside none, a ``split`` beside
    no saved dataset, a ``language_column`` beside no records file without its ``LANG=``)."""
    files = [path for _, path in found]
    records = [path for path in files if _has_records(path)]
    unlabelled = [path for language, path in found if language is None and _has_records(path)]
    unused = {
        "text_column": "records files (.jsonl, .json, .csv, .parquet, saved datasets)",
        "doc_sep": ".txt files",
        "split": "saved datasets (directories)",
        "language_column": "records files not given as LANG=PATH",
    }
    read = {
        "text_column": bool(records),
        "doc_sep": len(records) < len(files),
        "split": any(path.is_dir() for path in files),
        "language_column": bool(unlabelled),
    }
    fields = type(spec).model_fields
    for name, applies_to in unused.items():
        value = getattr(spec, name)
        if not read[name] and value != fields[name].get_default(call_default_factory=True):
            shown = ", ".join(str(path) for path in files[:3]) + (" ..." if len(files) > 3 else "")
            raise UserInputError(
                f"corpus.{name} {value!r} would be ignored: it applies to {applies_to} only, "
                f"and the corpus has none ({shown})"
            )


def read_labelled(spec: CorpusSpec) -> list[tuple[str, str | None]]:
    """``(document, language or None)`` for every non-empty document, in file order."""
    docs: list[tuple[str, str | None]] = []
    for language, path in corpus_paths(spec):
        with as_given(spec):
            docs.extend(_labelled(path, language, spec))
    return docs


def _labelled(path: Path, language: str | None, spec: CorpusSpec) -> list[tuple[str, str | None]]:
    """``read_labelled``'s pairs of one corpus file."""
    texts = _read(path, spec.text_column, spec)
    labels: list[str | None] = [language] * len(texts)
    if spec.language_column is not None and language is None and _has_records(path):
        labels = [v or None for v in _read(path, spec.language_column, spec)]
    kept = [(t, lang) for t, lang in zip(texts, labels, strict=True) if t.strip()]
    if not kept:
        raise UserInputError(f"corpus {path} holds no text")
    return kept


def _has_records(path: Path) -> bool:
    return path.is_dir() or path.suffix.lower() in (".jsonl", ".json", ".csv", ".parquet")


def _read(path: Path, column: str, spec: CorpusSpec) -> list[str]:
    """One field of every record of one corpus file (the text itself for .txt)."""
    suffix = path.suffix.lower()
    try:
        if path.is_dir():
            return _saved_dataset(path, column, spec.split)
        if suffix in (".txt", ".text", ""):
            return _txt(path, spec.doc_sep)
        if suffix == ".jsonl":
            return _jsonl(path, column)
        if suffix == ".json":
            return _json(path, column)
        if suffix == ".csv":
            return _csv(path, column)
        if suffix == ".parquet":
            return _parquet(path, column)
        raise UserInputError(
            f"corpus {path}: unknown format {suffix!r} "
            "(use .txt, .jsonl, .json, .csv, .parquet or a saved dataset)"
        )
    except UnicodeDecodeError as err:
        raise UserInputError(f"corpus {path} is not UTF-8 text ({err.reason})") from err
    except PermissionError as err:
        raise UserInputError(f"corpus {path} is not readable ({err.strerror})") from err
