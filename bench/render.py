"""Render bench/RESULTS.md from the figures in bench/results/*.json (one file per benchmark).

python bench/render.py
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ORDER = (
    "bench_solver",
    "bench_embedding",
    "bench_teacher_inference",
    "bench_training",
    "bench_causal",
    "bench_real_teachers",
    "bench_bootstrap",
    "bench_scaling",
    "bench_alpha_sweep",
    "bench_integrity",
    "bench_seeding",
    "bench_wide",
)

INTRO = """# Benchmarks

Rendered by `bench/render.py` from `bench/results/<benchmark>.json`; edit those, not this file.
Each `bench/bench_*.py` measures through `bench/harness.py` and rewrites its own JSON file
(`--no-write` only prints it); `make bench` runs them all, e.g.

    HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_solver.py [--sizes 8000,32000]

Unless a section says otherwise: each contender runs in a fresh interpreter, started once other
processes use under 10% of the CPUs (waiting up to a time limit); a measurement during which they
took more than 5% is repeated and the fastest attempt kept. *Speed-up* is the baseline's time over
ours (rates: ours over the baseline's). *Peak RSS* is the contender process's peak resident set
size (`ru_maxrss`; results before the harness: `VmHWM`), 1 MiB = 2^20 bytes. *Others* is the
share of all CPUs other processes took during the measurement.
"""


def fmt(value: Any) -> str:
    """A figure as recorded (the JSON keeps the significant digits), thousands separated."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    if isinstance(value, float):
        return f"{value:,}" if abs(value) >= 1e-4 or value == 0 else f"{value:.1e}"
    return str(value)


def conditions_line(c: dict[str, Any]) -> str:
    from harness import conditions_line as line

    return line(c)


def machine_line(m: dict[str, Any]) -> str:
    from harness import machine_line as line

    return line(m)


def ratio(f: dict[str, Any]) -> str:
    """``2.4x faster`` (a speed-up), ``1.48x the time`` (a cost: ours does more work) or
    ``1.2x lower`` (a loss, the baseline's over ours)."""
    kind = {"cost": "the time", "lower": "lower"}.get(f.get("ratio_is", ""), "faster")
    return f"**{fmt(f['ratio'])}x** {kind}"


def _table(columns: list[str], rows: list[list[Any]]) -> list[str]:
    return [
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
        *("| " + " | ".join(fmt(v) for v in row) + " |" for row in rows),
    ]


def _figures(figures: list[dict[str, Any]]) -> list[str]:
    memory = any("peak_mib" in f for f in figures)
    others = any("others_share" in f for f in figures)
    columns = ["case", "unit", "baseline", "ours", "ours vs baseline"]
    columns += ["peak RSS baseline / ours"] * memory + ["others baseline / ours"] * others
    rows = []
    for f in figures:
        row = [f["case"], f["unit"], f["baseline"], f["ours"], ratio(f)]
        if memory:
            peak = f.get("peak_mib")
            row.append(f"{peak['baseline']:,} / {peak['ours']:,} MiB" if peak else "-")
        if others:
            share = f.get("others_share")
            row.append(f"{share['baseline']:.0%} / {share['ours']:.0%}" if share else "-")
        rows.append(row)
    return _table(columns, rows)


def _script(record: dict[str, Any]) -> str:
    """The script that made ``record``; records before the field: the name less its ``--tag``
    (script names have no hyphen)."""
    return str(record.get("script") or f"bench/{record['name'].split('-', 1)[0]}.py")


def section(record: dict[str, Any], common_machine: str) -> list[str]:
    lines = [f"<a id='{record['name']}'></a>", f"## {record['title']}", "", record["about"], ""]
    lines.append(f"- Date: {record['date']}; code {record['code']}; script `{_script(record)}`.")
    here = machine_line(record["machine"])
    if here != common_machine:
        lines.append(f"- Machine: {here}")
    if record.get("conditions"):
        lines.append(f"- Conditions: {conditions_line(record['conditions'])}.")
    lines.append("- Sizes: " + "; ".join(f"{k} {fmt(v)}" for k, v in record["sizes"].items()) + ".")
    lines += ["", *_figures(record["figures"])]
    if record.get("targets"):
        lines.append("")
        for t in record["targets"]:
            verdict = "met" if t["met"] else "NOT met"
            lines.append(f"- Target {t['target']}: **{verdict}** ({t['value']}).")
    for extra in record.get("tables", []):
        lines += ["", f"{extra['title']}:", "", *_table(extra["columns"], extra["rows"])]
    if record.get("notes"):
        lines += ["", *(f"- {note}" for note in record["notes"])]
    if record.get("minutes") is not None:
        lines.append(f"- Whole benchmark: {record['minutes']} min.")
    return lines


def load(results: Path) -> list[dict[str, Any]]:
    records = {p.stem: json.loads(p.read_text(encoding="utf-8")) for p in results.glob("*.json")}
    names = [n for n in ORDER if n in records] + sorted(set(records) - set(ORDER))
    return [records[n] for n in names]


def render(results: Path = BENCH / "results", out: Path = BENCH / "RESULTS.md") -> str:
    """Write ``out`` from every JSON file in ``results``; returns the text."""
    records = load(results)
    machines = Counter(machine_line(r["machine"]) for r in records)
    common = machines.most_common(1)[0][0] if machines else ""
    lines = [INTRO, f"Machine (where a section names no other): {common}", ""]
    lines += [
        "| benchmark | case | baseline | ours | ours vs baseline | targets |",
        "|---|---|---|---|---|---|",
    ]
    for r in records:
        verdicts = "; ".join(
            f"{t['target']}: {'met' if t['met'] else 'NOT met'}" for t in r.get("targets", [])
        )
        for i, f in enumerate(r["figures"]):
            unit = f["unit"]
            lines.append(
                f"| [{r['title'].split(':')[0]}](#{r['name']}) | {f['case']} "
                f"| {fmt(f['baseline'])} {unit} | {fmt(f['ours'])} {unit} | {ratio(f)} "
                f"| {verdicts if i == 0 else ''} |"
            )
    for r in records:
        lines += ["", *section(r, common)]
    text = "\n".join(lines) + "\n"
    out.write_text(text, encoding="utf-8")
    return text


if __name__ == "__main__":
    render()
