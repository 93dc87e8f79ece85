"""The record of a run's evaluation, ``evaluation/evaluation.json``: every row of the evaluation's
tables, and what the rows were scored from.

An evaluation of some of the run's students or languages (``merge evaluate --students s2``,
``--languages xx``) adds its rows to those already there: a row it scores again (its language is
one this evaluation scores, its model one of this evaluation's students or of that language's
teachers) is replaced, every other row is kept, and the files (the scores, ``rdt.csv``,
``evaluation.md``) are made again from them all, so they always agree with each other. A kept
row must still hold: the language's held-out examples, the run's teachers, the student and the
evaluation's settings must be what they were when it was scored (``Basis``); otherwise the
evaluation is refused, naming what changed, unless ``overwrite`` (this evaluation's rows alone).

The record is written first, the files after it from its rows: a command stopped in between
leaves a record that the next evaluation keeps its rows from, and files it writes again. A
record edited or cut short (its checksum, a row of another shape) is refused, named.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import OVERWRITE, UserInputError, either, merge_stage
from lmalgebra.core.fingerprint import plain, sha256_file, sha256_json
from lmalgebra.core.text_files import absent, not_a_directory, read_json_object
from lmalgebra.distill.layout import (
    FILES_KEY,
    MARKER,
    RDT_FILE,
    RunLayout,
    is_complete,
    read_marker,
)
from lmalgebra.distill.run.rdt import refuse_dropping
from lmalgebra.storage.atomic import write_json_atomic

RECORD = "evaluation.json"  # in evaluation/
REPLACE = f"pass {OVERWRITE} to replace the evaluation with this one's rows alone"
_REPLACING = either("`lmalgebra merge evaluate RUN --overwrite`", "evaluate(overwrite=True)")


@dataclass(frozen=True)
class RowKind:
    """The rows of one table of an evaluation: their dataclass, and the fields that say whether
    an evaluation scores a row again (``language``, and ``model``: the teacher or student
    scored; None for a row of the language alone)."""

    name: str
    row: type
    language: str = "language"
    model: str | None = "model"


@dataclass(frozen=True)
class Basis:
    """What an evaluation's rows are scored from, as it is now.

    Attributes:
        objective: the run's objective (``masked``, ``causal``).
        settings: the evaluation's settings that change its rows (causal: LMD coverage's).
        heldout: language -> digest of its held-out examples' texts, every language scored.
        teachers: teacher -> what identifies its files (``Teacher.hashes``).
    """

    objective: str
    settings: dict[str, Any]
    heldout: dict[str, str]
    teachers: dict[str, Any]


@dataclass
class Earlier:
    """What an evaluation keeps of the one before it: rows per table, and its students in the
    order they were first scored, with the identity each was scored as."""

    rows: dict[str, list[dict[str, Any]]]
    students: dict[str, str]


def student_identity(layout: RunLayout, name: str) -> str | None:
    """What identifies student ``name``'s saved model: the digest of the sha256 of every file of
    it that its marker records (its weights, configuration and tokenizer; not the card an
    evaluation writes, nor the timings of its training), or of the marker of an older release
    that records none; None when it has no complete model."""
    model = layout.model(name)
    if not is_complete(model):
        return None
    files = read_marker(model).get(FILES_KEY)
    return sha256_json(files) if isinstance(files, dict) else sha256_file(model / MARKER)


def _json(value: Any) -> Any:
    """``value`` as the record holds it once read back (tuples as lists, say)."""
    return json.loads(json.dumps(value, default=str))


_TYPES: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float, type(None)),  # null: a NaN, as strict JSON writes one
    "bool": (bool,),
}


def _is_row(kind: RowKind, value: Any) -> bool:
    """Whether ``value`` is a row of ``kind`` as the record holds one (its fields, their types)."""
    columns = fields(kind.row)
    if not isinstance(value, dict) or set(value) != {f.name for f in columns}:
        return False
    for column in columns:
        allowed = _TYPES.get(str(column.type))
        item = value[column.name]
        if allowed is None:
            continue
        if not isinstance(item, allowed) or isinstance(item, bool) != (bool in allowed):
            return False
    return True


def read_record(path: Path, objective: str, kinds: Sequence[RowKind]) -> dict[str, Any]:
    """The record at ``path``, checked whole; UserInputError naming it when it is damaged. A
    row's NaN, which the file holds as null, is NaN again."""

    def damaged(why: str) -> UserInputError:
        return UserInputError(
            f"{path} is damaged ({why}): the rows of the evaluation there cannot be kept; "
            f"restore it, or {REPLACE}"
        )

    try:
        record = read_json_object(path, "evaluation record")
    except UserInputError as err:
        raise damaged(str(err)) from None
    shapes = {
        "objective": str,
        "settings": dict,
        "heldout": dict,
        "teachers": dict,
        "students": dict,
        "tables": dict,
        "checksum": str,
    }
    for key, shape in shapes.items():
        if not isinstance(record.get(key), shape):
            raise damaged(f"no {key}")
    if record["objective"] != objective:
        raise damaged(f"it records an evaluation of a {record['objective']} run")
    if _checksum(record) != record["checksum"]:
        raise damaged("it does not match its checksum")
    tables = record["tables"]
    if set(tables) != {k.name for k in kinds}:
        raise damaged(f"its tables are {', '.join(sorted(tables))}")
    models = {*record["teachers"], *record["students"]}
    for kind in kinds:
        rows = tables[kind.name]
        if not isinstance(rows, list) or not all(_is_row(kind, r) for r in rows):
            raise damaged(f"a row of {kind.name} is not one of its rows")
        if kind.model and any(r[kind.model] not in models for r in rows):
            raise damaged(f"a row of {kind.name} names a model it does not record")
    identities = [*record["heldout"].values(), *record["students"].values()]
    if not all(isinstance(v, str) for v in identities):
        raise damaged("an identity is not a digest")
    for kind in kinds:  # each NaN, written as null, back
        nullable = [f.name for f in fields(kind.row) if str(f.type) == "float"]
        for row in tables[kind.name]:
            row.update({c: float("nan") for c in nullable if row[c] is None})
    return record


def record_problems(
    layout: RunLayout,
    objective: str,
    kinds: Sequence[RowKind],
    texts: Callable[[dict[str, Any]], dict[str, str]],
) -> list[str]:
    """The run's evaluation record damaged, as ``merge evaluate`` would refuse it (``merge
    verify``): none when the run holds no record. An evaluation folder that is no directory
    (a FIFO, a file, a link to nothing), which evaluate refuses, is named (it had passed); so is
    each of its text files that does not hold what the record's rows make (``texts``: the
    objective's ``evaluation_texts`` of a record): edited since, or not yet written again by an
    evaluation stopped between its record and its files, it had passed as the run's result."""
    folder = layout.evaluation
    if (folder.exists() or folder.is_symlink()) and not folder.is_dir():
        what = not_a_directory(folder) if folder.exists() else absent(folder)
        return [f"merge evaluate: evaluation directory {folder} {what}"]
    path = layout.evaluation / RECORD
    if not (path.exists() or path.is_symlink()):
        return []
    try:
        record = read_record(path, objective, kinds)
    except UserInputError as err:
        return [f"merge evaluate: {err}"]
    stale = [  # rows an evaluation of the other students refuses to keep (``_refuse_changed``)
        f"{path} holds the rows of student {name!r}"
        + (_again(name) if now is not None else _gone(name, f"run {_REPLACING} to replace them"))
        for name, identity in record["students"].items()
        if (now := student_identity(layout, name)) != identity
    ]
    return stale or [
        f"{folder / name} does not hold what {RECORD} records (edited since, or the evaluation "
        f"was stopped before it wrote it): "
        f"{either('`lmalgebra merge evaluate RUN`', 'evaluate()')} writes it again"
        for name, text in texts(record).items()
        if _text_of(folder / name) != text
    ]


def _text_of(path: Path) -> str | None:
    """The text of the regular file ``path`` (None where there is none: a FIFO is not read)."""
    return path.read_bytes().decode("utf-8", "replace") if path.is_file() else None


def _again(name: str) -> str:
    """Student ``name`` trained again since it was scored: its evaluation alone, as the command
    line and Python run it, scores it again."""
    again = either(f"`lmalgebra merge evaluate RUN --students {name}`", f"evaluate([{name!r}])")
    return f" as it was before it was trained again: {again} scores it again"


def _gone(name: str, replace: str) -> str:
    """Student ``name`` scored there, of which the run holds no saved model (removed, or the
    evaluation another run's): no evaluation keeps its rows, so its remedies are training it
    or an evaluation replacing them (``replace``; one of it alone names it untrained)."""
    return (
        f", of which the run holds no saved model now (removed, or the evaluation another run's): "
        f"train it again ({merge_stage('train', name)}) and evaluate it, or {replace}"
    )


def _checksum(record: Mapping[str, Any]) -> str:
    """The digest of everything the record holds but its checksum."""
    return sha256_json({k: v for k, v in record.items() if k != "checksum"})


def earlier_rows(
    layout: RunLayout,
    basis: Basis,
    kinds: Sequence[RowKind],
    languages: Sequence[str],
    students: Sequence[str],
    overwrite: bool,
) -> Earlier:
    """The rows of the run's evaluation that an evaluation of ``students`` (and every teacher,
    ``basis.teachers``) on ``languages`` keeps (see the module); refused, naming what changed,
    when a kept row no longer holds, and when the record is damaged, unless ``overwrite``.
    Without a record (none yet, or tables written by an older release), an evaluation that would
    drop rows of its tables is refused."""
    out = layout.evaluation
    none = Earlier({k.name: [] for k in kinds}, {})
    if overwrite:
        return none
    path = out / RECORD
    if not (path.exists() or path.is_symlink()):
        refuse_dropping(out / RDT_FILE, students, languages)
        return none
    record = read_record(path, basis.objective, kinds)
    scored = {*students, *basis.teachers}
    kept: dict[str, list[dict[str, Any]]] = {}
    for kind in kinds:
        kept[kind.name] = [
            row
            for row in record["tables"][kind.name]
            if row[kind.language] not in languages
            or (kind.model is not None and row[kind.model] not in scored)
        ]
    rows = [r for found in kept.values() for r in found]
    if not rows:
        return none
    _refuse_changed(out, record, basis, kinds, kept, layout)
    in_rows = {r[k.model] for k in kinds if k.model for r in kept[k.name]}
    return Earlier(kept, {s: v for s, v in record["students"].items() if s in in_rows})


def _refuse_changed(
    out: Path,
    record: dict[str, Any],
    basis: Basis,
    kinds: Sequence[RowKind],
    kept: dict[str, list[dict[str, Any]]],
    layout: RunLayout,
) -> None:
    """Refuse keeping rows that no longer hold, naming the first thing that changed."""

    def refuse(why: str) -> UserInputError:
        return UserInputError(
            f"{out} holds rows this evaluation would keep beside its own, but {why}: evaluate "
            f"every student and language again together, or {REPLACE}"
        )

    if record["settings"] != _json(basis.settings):
        changed = sorted(
            k
            for k in {*record["settings"], *basis.settings}
            if record["settings"].get(k) != _json(basis.settings).get(k)
        )
        before = {k: record["settings"].get(k) for k in changed}
        asked = {k: _json(basis.settings).get(k) for k in changed}
        raise refuse(f"they were scored with {before}, this evaluation asks {asked}")
    languages = sorted({r[k.language] for k in kinds for r in kept[k.name]})
    for lang in languages:
        if record["heldout"].get(lang) != basis.heldout.get(lang):
            raise refuse(f"the held-out examples of {lang} changed since they were scored")
    for name, identity in record["teachers"].items():
        if name in basis.teachers and _json(basis.teachers[name]) != identity:
            raise refuse(f"teacher {name!r} changed since they were scored")
    models = {r[k.model] for k in kinds if k.model for r in kept[k.name]}
    for name in [s for s in record["students"] if s in models]:
        now = student_identity(layout, name)
        if now is None:
            raise UserInputError(f"{out} holds the rows of student {name!r}{_gone(name, REPLACE)}")
        if now != record["students"][name]:
            raise refuse(f"student {name!r} was trained again since it was scored")


def merged(
    earlier: Earlier,
    fresh: Mapping[str, Iterable[Any]],
    order: Mapping[str, Callable[[dict[str, Any]], Any]],
) -> dict[str, list[dict[str, Any]]]:
    """Each table's kept rows and this evaluation's (dataclass instances), sorted by the
    table's ``order`` (a key of a row as a mapping)."""
    tables: dict[str, list[dict[str, Any]]] = {}
    for name, rows in earlier.rows.items():
        found = [*rows, *(_json(asdict(r)) for r in fresh.get(name, []))]
        tables[name] = sorted(found, key=order[name])
    return tables


def student_order(earlier: Earlier, students: Sequence[str]) -> list[str]:
    """The students the merged evaluation holds: those kept, in the order they were first
    scored, then this evaluation's."""
    return list(dict.fromkeys([*earlier.students, *students]))


def write_record(
    layout: RunLayout,
    basis: Basis,
    tables: dict[str, list[dict[str, Any]]],
    students: dict[str, str],
) -> None:
    """``evaluation/evaluation.json`` of the merged ``tables`` and ``students`` (name -> the
    identity it was scored as): written before any file made from them."""
    languages = sorted({r["language"] for rows in tables.values() for r in rows})
    record: dict[str, Any] = {
        "objective": basis.objective,
        "settings": _json(basis.settings),
        "heldout": {lang: basis.heldout[lang] for lang in languages if lang in basis.heldout},
        "teachers": _json(basis.teachers),
        "students": students,
        "tables": tables,
    }
    record = plain(record)  # a NaN as null, as the file holds it: what the checksum covers
    record["checksum"] = _checksum(record)
    write_json_atomic(layout.evaluation / RECORD, record)
