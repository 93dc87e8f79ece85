"""Which held-out scores compare like with like.

A student is scored against a teacher on one language's held-out text in that teacher's
tokenisation. When the teacher was never trained on that language (the demo's SM1 is scored on
French and Spanish in the English teacher's tokenisation, against that English-only teacher), the
teacher is no reference: its score there measures a model on text it never learnt, and a student
"beating" it says nothing. Such score rows are marked ``comparable`` false and left out of RDT and
of every average.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path

from lmalgebra.core.settings import home_expanded
from lmalgebra.distill.layout import MARKER
from lmalgebra.lmd.rundir.files import read_json

PRETRAINED = "pretrained-teacher"  # the "kind" `lmalgebra pretrain masked` records


def is_comparable(language: str, trained_on: Collection[str] | None) -> bool:
    """The rule: a score on ``language`` in a teacher's tokenisation is comparable unless the
    teacher is known (``trained_on``, its training languages; None: unknown) not to have been
    trained on ``language``."""
    return trained_on is None or language in trained_on


def teacher_languages(teachers: Mapping[str, str | Path]) -> dict[str, frozenset[str] | None]:
    """Teacher name -> the languages it was trained on, for a recipe's teachers (name -> path).

    Known for a teacher pre-trained by ``lmalgebra pretrain masked``: its directory's
    ``lmalgebra.json`` records the language. None (unknown, so every score counts as comparable)
    for any other teacher: a hub id, a package, a directory without that record.
    """
    found: dict[str, frozenset[str] | None] = {}
    for name, path in teachers.items():
        record_path = home_expanded(Path(str(path))) / MARKER
        record = read_json(record_path) if record_path.is_file() else {}
        language = record.get("language") if record.get("kind") == PRETRAINED else None
        found[name] = frozenset({language}) if isinstance(language, str) and language else None
    return found
