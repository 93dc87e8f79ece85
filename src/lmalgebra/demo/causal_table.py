"""The table of ``demo --causal``: held-out bits per byte per language of every student (mean and
standard deviation over seeds), the teachers', and the share of the CE-to-teacher gap each loss
closes."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import pandas as pd


def student_name(loss: str, seed: int) -> str:
    """The run directory of the student trained with ``loss`` and ``seed``."""
    return f"{loss}-seed{seed}"


def causal_table(
    bits: Iterable[tuple[str, str, float]],
    teachers: Mapping[str, str],
    losses: Iterable[str],
    seeds: Iterable[int],
) -> dict[str, Any]:
    """Summarise ``(language, model, bits per byte)`` triples.

    ``teachers``: language -> its teacher's model name; students are named by ``student_name``;
    ``losses`` must include ``ce``. Gap closed by loss L on a language:
    ``(B_ce - B_L) / (B_ce - B_teacher)`` on the seed means (NaN where the teacher is not better
    than the CE student); its average is over the languages where it is defined."""
    value = {(lang, model): b for lang, model, b in bits}
    languages, seeds = list(teachers), list(seeds)
    rows: dict[str, Any] = {}
    for loss in losses:
        per_lang = {}
        for lang in languages:
            got = np.array([value[(lang, student_name(loss, s))] for s in seeds], dtype=np.float64)
            std = float(got.std(ddof=1)) if got.size > 1 else math.nan
            per_lang[lang] = {"mean": float(got.mean()), "std": std, "seeds": got.tolist()}
        rows[loss] = {"bits_per_byte": per_lang}
    teacher_bits = {lang: value[(lang, teachers[lang])] for lang in languages}
    ce = rows["ce"]["bits_per_byte"]
    for row in rows.values():
        closed = {}
        for lang in languages:
            gap = ce[lang]["mean"] - teacher_bits[lang]
            shift = ce[lang]["mean"] - row["bits_per_byte"][lang]["mean"]
            closed[lang] = shift / gap if gap > 0 else math.nan
        finite = [v for v in closed.values() if not math.isnan(v)]
        row["gap_closed"] = closed
        row["gap_closed_mean"] = float(np.mean(finite)) if finite else math.nan
    distilled = {k: v["gap_closed_mean"] for k, v in rows.items() if k != "ce"}
    best = max(distilled, key=lambda k: -math.inf if math.isnan(distilled[k]) else distilled[k])
    return {
        "languages": languages,
        "seeds": seeds,
        "teachers": {
            lang: {"model": teachers[lang], "bits_per_byte": b} for lang, b in teacher_bits.items()
        },
        "students": rows,
        "best_loss": best,
        "best_gap_closed": distilled[best],
        "target_met": bool(distilled[best] >= 0.25),
    }


def causal_frame(table: Mapping[str, Any]) -> pd.DataFrame:
    """``table`` (``causal_table``) as a DataFrame: one row per loss (index ``loss``), then
    ``teachers``; per language the seed mean (``LANG``) and standard deviation (``LANG sd``) of
    bits per byte, and ``gap closed`` averaged over languages (the teachers' row: 1)."""
    import pandas as pd

    langs = table["languages"]
    rows = {}
    for loss, row in table["students"].items():
        got = row["bits_per_byte"]
        rows[loss] = {x: got[x]["mean"] for x in langs} | {f"{x} sd": got[x]["std"] for x in langs}
        rows[loss]["gap closed"] = row["gap_closed_mean"]
    rows["teachers"] = {x: table["teachers"][x]["bits_per_byte"] for x in langs}
    rows["teachers"] |= {f"{x} sd": math.nan for x in langs} | {"gap closed": 1.0}
    frame = pd.DataFrame.from_dict(rows, orient="index")
    frame.index.name = "loss"
    return frame


def mean_sd_cell(mean: float, std: float) -> str:
    """A Markdown cell: the seeds' mean, and their standard deviation unless it is NaN."""
    return f"{mean:.3f}" if math.isnan(std) else f"{mean:.3f} ± {std:.3f}"


def causal_markdown(table: Mapping[str, Any]) -> str:
    """The table as Markdown: one row per loss and one for the teachers."""
    langs = table["languages"]
    head = "| student loss | " + " | ".join(f"{x} bits/byte" for x in langs) + " | gap closed |"
    lines = [head, "|" + "---|" * (len(langs) + 2)]
    for loss, row in table["students"].items():
        got = row["bits_per_byte"]
        cells = [mean_sd_cell(got[x]["mean"], got[x]["std"]) for x in langs]
        closed = "(baseline)" if loss == "ce" else _percent(row["gap_closed_mean"])
        lines.append(f"| {loss} | " + " | ".join(cells) + f" | {closed} |")
    teach = [f"{table['teachers'][x]['bits_per_byte']:.3f}" for x in langs]
    lines.append("| teachers | " + " | ".join(teach) + " | 100% |")
    seeds = ", ".join(str(s) for s in table["seeds"])
    verdict = "met" if table["target_met"] else "not met"
    best = f"{table['best_loss']} ({_percent(table['best_gap_closed'])}; target 25%: {verdict})"
    if math.isnan(table["best_gap_closed"]):
        best = "none: no language's teacher is better than CE only (target 25%: not met)"
    lines += [
        "",
        f"Mean ± standard deviation over seeds {seeds}. Gap closed: the share of the gap between "
        "the CE-only student and each language's teacher that a loss closes, averaged over "
        f"languages where the teacher is the better (n/a: none). Best: {best}.",
    ]
    return "\n".join(lines) + "\n"


def _percent(share: float) -> str:
    return "n/a" if math.isnan(share) else f"{100 * share:.1f}%"
