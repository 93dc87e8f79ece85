"""``select_teachers``: LMD chooses a recipe's teachers, from Python, with DataFrames.

Experimental (``lmalgebra.experimental``): the recorded Spearman correlation between its score and
the distilled students' accuracy is 0.24, interval [-0.30, 0.66], for a target of 0.5.

The same work as ``lmalgebra experimental select``: per language, every candidate teacher embeds the
language's held-out text (LMD pipeline and cache) and is scored by held-out masked-token accuracy;
sets of teachers are ranked by complementarity times quality (``lmalgebra.stats.complementarity``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from lmalgebra.api.merge import recipe_of
from lmalgebra.api.runtime import library_entry
from lmalgebra.core.recipe_files import Call, validate
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.experimental.selection.outputs import (
    SET_COLUMNS,
    TEACHER_COLUMNS,
    check_selection_directory,
    claim_selection,
    set_rows,
    teacher_rows,
    write_selection,
)
from lmalgebra.experimental.selection.selection_spec import SelectionSpec
from lmalgebra.experimental.selection.teacher_sets import Selection
from lmalgebra.experimental.selection.teacher_sets import select_teachers as _select
from lmalgebra.storage.lockfile import run_directory_lock


class TeacherSelection:
    """What ``select_teachers`` found.

    Attributes:
        sets: one row per (language, set of teachers), best first per language, then the rows of
            language ``overall`` (sets for the whole student); the columns of ``sets.csv``.
        teachers: one row per (language, candidate): held-out accuracy, loss, group R^2.
        recommended: language -> the best set's teachers.
        recipe: the input recipe with each language's teachers replaced by the recommendation.
        seconds: time spent scoring quality, on LMD, and on the overall ranking.
    """

    def __init__(self, selection: Selection, recipe: MergeRecipe) -> None:
        self.selection = selection
        self.sets = pd.DataFrame(set_rows(selection), columns=list(SET_COLUMNS))
        self.teachers = pd.DataFrame(teacher_rows(selection), columns=list(TEACHER_COLUMNS))
        self.recommended = selection.recommended
        self.recipe = selection.recipe(recipe)
        self.seconds = dict(selection.timings)
        self._input = recipe

    @library_entry
    def save(self, out: str | Path, overwrite: bool = False) -> list[Path]:
        """Write ``sets.csv``, ``teachers.csv``, ``recommended.yaml``, ``selection.png`` and
        ``summary.json`` into ``out``, as ``lmalgebra experimental select`` does.

        A selection of another recipe, settings, held-out text or teachers already in ``out``
        is refused, naming what differs, unless ``overwrite`` (its files removed, and only
        those; anything else in ``out`` is refused)."""
        check_selection_directory(Path(out), self.selection.cache_dir)  # made by the lock
        with run_directory_lock(Path(out), "experimental select"):
            claim_selection(Path(out), self.selection.identity, overwrite, self._input.output_dir)
            return write_selection(self.selection, self._input, Path(out))

    def __repr__(self) -> str:
        chosen = "; ".join(f"{k}: {'+'.join(v)}" for k, v in self.recommended.items())
        return f"<TeacherSelection sets of {self.selection.size}: {chosen}>"


@library_entry
def select_teachers(recipe: Any, **settings: Any) -> TeacherSelection:
    """Rank each language's sets of teachers by LMD complementarity times quality.

    Args:
        recipe: a MergeDistill recipe (YAML path, mapping or ``MergeRecipe``).
        settings: the keys of ``SelectionSpec`` (``lmalgebra experimental select``'s flags):
            ``size`` (teachers per set, default 2), ``languages`` (default all), ``spans`` (a
            mapping of span keys: ``length`` default 32, ``counts`` default (2000, 250, 500),
            ``per_doc`` default 16, ``fractions`` default (0.7, 0.1, 0.2), ``seed``), ``max_texts``
            (held-out examples per language, default all), ``alpha``, ``bootstrap`` (replicates,
            default 1000), ``level``, ``seed``, ``batch_size``, ``progress`` (default off here),
            ``cache_dir``.
    """
    config = recipe_of(recipe, "select_teachers()")
    spec = validate(SelectionSpec, {"progress": False, **settings}, Call("select_teachers()"))
    return TeacherSelection(_select(config, spec), config)
