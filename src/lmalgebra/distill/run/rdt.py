"""RDT (MergeDistill, eq. 3): the mean relative deviation of a student from a language's teachers,
in percent, for a metric where higher is better (masked-token accuracy) or lower is better (bits
per byte); positive when the student is better, as in the paper's tables::

    higher is better:  RDT = 100/n * sum_i (P_S - P_Ti) / P_Ti
    lower is better:   RDT = 100/n * sum_i (P_Ti - P_S) / P_Ti

over the language's teachers ``T_i`` that are a reference (see ``rdt``), and ``rdt.csv``
(``layout.RDT_FILE``), a row per student.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from lmalgebra.core.errors import OVERWRITE, UserInputError, either
from lmalgebra.core.text_files import read_text
from lmalgebra.storage.csv_tables import csv_text, format_cell

RDT_FIRST_COLUMN = "student"
RDT_DECIMALS = 3


def rdt(
    terms: Iterable[tuple[str, float, float]], languages: Iterable[str], higher_is_better: bool
) -> dict[str, float]:
    """Per language of ``languages`` and averaged: RDT over ``terms``, each ``(language,
    teacher's value, student's value)`` of one teacher. A teacher scoring 0 leaves its term
    undefined and is left out; a language with no term left is NaN, and the average is over the
    languages that have a value (NaN when none has)."""
    found = list(terms)
    out: dict[str, float] = {}
    for lang in languages:
        deviations = [
            (student - teacher) / teacher if higher_is_better else (teacher - student) / teacher
            for language, teacher, student in found
            if language == lang and teacher
        ]
        out[lang] = 100 * float(np.mean(deviations)) if deviations else math.nan
    defined = [v for v in out.values() if not math.isnan(v)]
    out["average"] = float(np.mean(defined)) if defined else math.nan
    return out


def rdt_text(deviations: Mapping[str, Mapping[str, float]]) -> str:
    """``rdt.csv``: a header ``student,LANG,...,average`` and one row per student."""
    columns = list(next(iter(deviations.values())))
    rows: list[list[str]] = [[RDT_FIRST_COLUMN, *columns]]
    rows += [
        [name, *(format_cell(v[k], RDT_DECIMALS) for k in columns)]
        for name, v in deviations.items()
    ]
    return csv_text(rows)


def recorded(path: Path) -> tuple[list[str], list[str]]:
    """The students and the languages of the ``rdt.csv`` at ``path`` (none where there is none);
    one that is not such a table is refused, named."""
    if not path.is_file():
        return [], []
    rows = list(csv.reader(read_text(path, "evaluation table").splitlines()))
    if not rows or rows[0][:1] != [RDT_FIRST_COLUMN] or rows[0][-1:] != ["average"]:
        raise UserInputError(f"{path} is damaged: no '{RDT_FIRST_COLUMN},...,average' header")
    return [row[0] for row in rows[1:] if row], rows[0][1:-1]


def refuse_dropping(table: Path, students: Sequence[str], languages: Sequence[str] | None) -> None:
    """Refuse an evaluation that would replace the evaluation whose ``rdt.csv`` is ``table`` with
    fewer rows: students, or languages, scored there and not in this one (an evaluation without
    the record whose rows a later one keeps: ``evaluation_record``)."""
    had, scored = recorded(table)
    for what, before, now in (
        ("students", had, list(students)),
        ("languages", scored, list(languages or scored)),
    ):
        lost = [x for x in before if x not in now]
        if lost:
            every = list(dict.fromkeys([*before, *now]))
            together = either(" ".join(f"--{what} {x}" for x in every), f"{what}={every!r}")
            raise UserInputError(
                f"{table.parent} holds the scores of {what} {', '.join(lost)}, which this "
                f"evaluation would drop: score them together ({together}), or pass "
                f"{OVERWRITE} to replace the evaluation with this one's rows alone"
            )
