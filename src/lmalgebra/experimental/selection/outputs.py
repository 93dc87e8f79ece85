"""The files of ``experimental select``: ranked sets and teachers (CSV), the recommended recipe,
a figure.

``sets.csv``      one row per (language, set): rank, members, complementarity, quality, score and
                  their intervals, ``recommended``; language ``overall`` ranks sets for the student.
``teachers.csv``  one row per (language, candidate): held-out accuracy and loss, group R^2.
``recommended.yaml``  the recipe with each language's teachers replaced by its recommended set.
``selection.png``  per language, the scores of the best sets with their intervals.
``summary.json``  the recommendation, timings and the selection's identity; written last.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from lmalgebra.core.errors import OVERWRITE, UserInputError
from lmalgebra.core.text_files import not_a_file, read_record
from lmalgebra.distill.recipe import MADE_IN, MergeRecipe
from lmalgebra.experimental.selection.teacher_sets import Selection
from lmalgebra.figures import canvas
from lmalgebra.storage.atomic import write_json_atomic, write_text_atomic
from lmalgebra.storage.csv_tables import csv_text, format_cell
from lmalgebra.storage.output_paths import (
    cache_directory,
    check_directory,
    claim_run_directory,
    holds_only,
    refuse_cache_overlap,
)

SET_COLUMNS = (
    "language",
    "rank",
    "members",
    "size",
    "complementarity",
    "complementarity_low",
    "complementarity_high",
    "quality",
    "score",
    "score_low",
    "score_high",
    "recommended",
)
SCORE_FIELDS = SET_COLUMNS[4:-1]  # complementarity ... score_high: SetScore's own fields
TEACHER_COLUMNS = (
    "language",
    "teacher",
    "examples",
    "masked_tokens",
    "accuracy",
    "loss",
    "group_r2",
)
SUMMARY = "summary.json"
# the top-level names a selection writes (``--overwrite`` removes these and nothing else)
OWNED = ("sets.csv", "teachers.csv", "recommended.yaml", "selection.png", SUMMARY)
DECIMALS = 6
SHOWN = 8  # sets per language in the figure


def set_rows(selection: Selection) -> list[dict[str, Any]]:
    """Every ranked set, per language then ``overall``, best first."""
    ranked = {lang: found.ranking for lang, found in selection.languages.items()}
    ranked["overall"] = selection.overall
    return [
        {
            "language": lang,
            "rank": rank,
            "members": "+".join(s.members),
            "size": len(s.members),
            **{column: getattr(s, column) for column in SCORE_FIELDS},
            "recommended": rank == 1,
        }
        for lang, ranking in ranked.items()
        for rank, s in enumerate(ranking, start=1)
    ]


def teacher_rows(selection: Selection) -> list[dict[str, Any]]:
    """One row per (language, candidate teacher)."""
    return [
        {
            "language": lang,
            "teacher": q.teacher,
            "examples": q.examples,
            "masked_tokens": q.masked_tokens,
            "accuracy": q.accuracy,
            "loss": q.loss,
            "group_r2": found.group_r2.get(q.teacher, float("nan")),
        }
        for lang, found in selection.languages.items()
        for q in found.qualities
    ]


def _csv(rows: list[dict[str, Any]], columns: tuple[str, ...]) -> str:
    body = [[format_cell(r[c], DECIMALS, nan="") for c in columns] for r in rows]
    return csv_text([list(columns), *body])


def write_selection(selection: Selection, recipe: MergeRecipe, out: Path) -> list[Path]:
    """Write the selection's files into ``out`` (which exists); returns their paths."""
    paths = [out / "sets.csv", out / "teachers.csv", out / "recommended.yaml"]
    write_text_atomic(paths[0], _csv(set_rows(selection), SET_COLUMNS))
    write_text_atomic(paths[1], _csv(teacher_rows(selection), TEACHER_COLUMNS))
    chosen = selection.recipe(recipe).model_dump(mode="json")
    header = "# teachers chosen by `lmalgebra experimental select` (see sets.csv beside it)\n"
    header += f"{MADE_IN}{json.dumps(str(Path.cwd()))}\n"  # its relative paths are the recipe's
    write_text_atomic(paths[2], header + yaml.safe_dump(chosen, sort_keys=False))
    paths.append(plot_selection(selection, out / "selection.png"))
    summary = {
        "size": selection.size,
        "recommended": selection.recommended,
        "overall": list(selection.overall[0].members) if selection.overall else [],
        "seconds": selection.timings,
        "identity": selection.identity,
    }
    paths.append(out / SUMMARY)  # last: it marks the selection complete
    write_json_atomic(paths[-1], summary)
    return paths


def check_selection_directory(out: Path, cache: Path | None) -> None:
    """Refuse ``out`` unless it is, or can be made, a writable directory, and a cache directory
    ``cache`` (the selection's ``cache_dir``; None: the default) inside it, inside another
    output, or holding ``out`` in its own directories: by the command before any work, and by
    ``TeacherSelection.save`` before writing (a cache inside it had been refused as "files of
    no selection", an ``out`` inside the cache's written)."""
    check_directory(out, "selection directory")
    refuse_cache_overlap(out, cache_directory(cache))


def claim_selection(
    out: Path, identity: dict[str, Any], overwrite: bool, run: Path | None = None
) -> None:
    """Make ``out`` this selection's own (``output_paths.claim_run_directory``): an empty
    directory, one holding a selection of the same recipe, settings, held-out text and teachers
    (computed again into the same files), or an unfinished selection's files; another selection,
    or files of no selection, is refused, naming what differs or a few of the files, unless
    ``overwrite`` (a selection's files removed, and only those). ``run``, the recipe's
    ``output_dir``, which the recommended recipe keeps: refused when it is ``out`` or inside it
    (``merge run`` of the recommendation would then be refused among the selection's files)."""
    if run is not None and run.resolve().is_relative_to(out.resolve()):
        raise UserInputError(
            f"selection directory {out} {'is' if run.resolve() == out.resolve() else 'holds'} "
            f"the recipe's output_dir {run}, which its recommended.yaml keeps: merge run would "
            "write there among the selection's files; write the selection elsewhere (by default "
            "OUTPUT_DIR/selection)"
        )
    try:
        summary = json.loads(read_record(out / SUMMARY))
    except FileNotFoundError:
        summary = None
    except (OSError, ValueError):
        summary = {}
    damaged = summary is not None and not isinstance(
        summary.get("identity") if isinstance(summary, dict) else None, dict
    )
    if damaged and not overwrite:
        path = out / SUMMARY
        why = (
            "is damaged (no identity of a selection can be read from it)"
            if path.is_file()
            else not_a_file(path)
        )
        raise UserInputError(
            f"{path} {why}: the selection there cannot be compared with this one; restore it, "
            f"write to another directory, or pass {OVERWRITE} to replace the selection"
        )
    if summary is None:  # nothing finished: a selection's own files are made again, others refused
        recorded: dict[str, Any] | None = identity if holds_only(out, OWNED) else None
    else:
        found = summary.get("identity") if isinstance(summary, dict) else None
        recorded = found if isinstance(found, dict) else None
    claim_run_directory(
        out,
        identity,
        recorded,
        finished=summary is not None,
        overwrite=overwrite,
        what="teacher selection",
        owned=OWNED,
    )


def plot_selection(selection: Selection, path: Path) -> Path:
    """Horizontal bars of the best sets' scores per language, with their intervals."""
    panels = {lang: f.ranking[:SHOWN] for lang, f in selection.languages.items()}
    if len(selection.languages) > 1:
        panels["overall"] = selection.overall[:SHOWN]
    height = max(1.6, 0.35 * max(len(r) for r in panels.values()) + 0.9)
    fig, axes = canvas.figure(1, len(panels), 4.2, height)
    for ax, (lang, ranking) in zip(axes[0], panels.items(), strict=True):
        labels = [" + ".join(s.members) for s in ranking]
        scores = np.array([s.score for s in ranking])
        low = np.array([s.score_low for s in ranking])
        high = np.array([s.score_high for s in ranking])
        y = np.arange(len(ranking))[::-1]
        colours = [canvas.colour(0 if i else 1) for i in range(len(ranking))]
        ax.barh(y, scores, color=colours)
        if np.isfinite(low).all():  # no bars without an interval, drawn as it is (its score
            # may lie outside a bootstrap interval, a negative length matplotlib refuses)
            ax.errorbar((low + high) / 2, y, xerr=(high - low) / 2, fmt="none", ecolor="k")
        ax.set_yticks(y, labels)
        ax.set_xlim(0, max(1.0, float(np.nanmax(high)) if np.isfinite(high).any() else 1.0))
        ax.set_xlabel("score = complementarity x quality")
        ax.set_title(f"{lang}: sets of {len(ranking[0].members)}" if ranking else lang)
    return canvas.save(fig, path)
