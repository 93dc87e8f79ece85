"""The table of ``demo --real`` (and of ``experiments/real_teachers.py``): held-out bits per byte
per language of both teachers, the untrained student and every trained variant (mean and
standard deviation over seeds), the share of the gap between CE only and the better teacher
that each variant closes, and RDT against both teachers."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from lmalgebra.demo.causal_table import causal_frame, causal_table, mean_sd_cell, student_name

if TYPE_CHECKING:
    import pandas as pd

GAP, RDT = "gap closed", "RDT %"


def real_table(
    bits: pd.DataFrame,
    rdt: pd.DataFrame,
    teachers: Sequence[str],
    untrained: str,
    variants: Sequence[str],
    seeds: Sequence[int],
    languages: Sequence[str] | None = None,
) -> pd.DataFrame:
    """One row per model (index ``model``: the teachers, ``untrained``, then each variant).

    ``bits``: a ``MergeRun.bits_per_byte`` table holding every teacher, ``untrained`` and each
    variant's students (``student_name(variant, seed)``); ``rdt``: ``MergeRun.bits_rdt`` of it.
    Columns: per language its bits per byte (``LANG``, the seed mean for a variant) and the
    seeds' sample standard deviation (``LANG sd``; NaN for one seed and for single models);
    ``gap closed``: the share of the gap between the CE-only variant ``ce`` and each language's
    better teacher that a variant closes, averaged over languages (NaN where the teacher is not
    better); ``RDT %``: RDT against both teachers, averaged over languages and seeds."""
    import pandas as pd

    languages = list(languages or dict.fromkeys(bits["language"]))
    value = {(r.language, r.model): float(r.bits_per_byte) for r in bits.itertuples()}
    better = {lang: min(teachers, key=lambda t: value[(lang, t)]) for lang in languages}
    triples = [(lang, model, b) for (lang, model), b in value.items()]
    trained = causal_frame(causal_table(triples, better, variants, seeds)).drop(index="teachers")
    for variant in variants:
        seeds_rdt = [float(rdt.loc[student_name(variant, s), "average"]) for s in seeds]
        trained.loc[variant, RDT] = sum(seeds_rdt) / len(seeds_rdt)
    single = {m: {lang: value[(lang, m)] for lang in languages} for m in [*teachers, untrained]}
    frame = pd.concat([pd.DataFrame.from_dict(single, orient="index"), trained])
    frame.loc[untrained, RDT] = float(rdt.loc[untrained, "average"])
    frame.index.name = "model"
    return frame[list(trained.columns)]


def real_markdown(table: pd.DataFrame, teachers: Sequence[str], baseline: str = "ce") -> str:
    """``table`` (``real_table``) as Markdown; ``teachers`` name the teacher rows."""
    languages = [c for c in table.columns if c not in (GAP, RDT) and not c.endswith(" sd")]
    head = "| model | " + " | ".join(f"{x} bits/byte" for x in languages) + " | gap closed | RDT |"
    lines = [head, "|" + "---|" * (len(languages) + 3)]
    for model, row in table.iterrows():
        cells = [mean_sd_cell(row[x], row[f"{x} sd"]) for x in languages]
        gap = "(baseline)" if model == baseline else _percent(row[GAP])
        label = f"teacher {model}" if model in teachers else str(model)
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {gap} | {_percent(row[RDT], 1)} |")
    return "\n".join(lines) + "\n"


def _percent(value: float, scale: float = 100) -> str:
    return "" if math.isnan(value) else f"{scale * value:.1f}%"
