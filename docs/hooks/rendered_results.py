"""Figures rendered from recorded results: blocks of README.md and docs/ written from the JSON an
experiment or benchmark recorded, never copied by hand.

A block is marked in the Markdown as::

    <!-- rendered: NAME from PATH -->   (PATH may be a glob: every match, by its stem)
    ...the rendering of PATH's JSON by the renderer NAME...
    <!-- end rendered -->

As an MkDocs hook, every block of README.md and docs/ is compared with its rendering before the
site is built; a stale block is a warning, so ``mkdocs build --strict`` (``make lint``) fails on
it. ``python docs/hooks/rendered_results.py`` rewrites every block from the current results; the
test suite checks them too (``tests/docs/test_docs.py``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger("mkdocs.hooks.rendered_results")
ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(
    r"(<!-- rendered: (?P<name>[\w-]+) from (?P<path>\S+) -->\n)"
    r"(?P<body>.*?)(<!-- end rendered -->)",
    re.S,
)
LANGUAGES = ("en", "fr", "es")


def _mean_sd(cell: dict[str, float]) -> str:
    return f"{cell['mean']:.3f} ± {cell['std']:.3f}"


def _bits(student: dict[str, Any]) -> str:
    """A student's held-out bits per byte, one cell a language."""
    return " | ".join(_mean_sd(student["bits_per_byte"][x]) for x in LANGUAGES)


def _targets(table: dict[str, Any]) -> list[str]:
    """One bullet a target of a regime's table: what was measured, met or not."""
    return [
        f"- {lang}: {got['text']}: {'met' if got['met'] else 'not met'}."
        for lang, got in table["targets"].items()
    ]


def real_teachers_readme(result: dict[str, Any]) -> str:
    """The README's table of ``experiments/real_teachers.py``: teachers, CE only, ALM from both
    teachers, and the best loss's share of the gap closed."""
    table = result["table"]
    teachers = table["teacher_bits"]
    ce, merged = table["students"]["ce"], table["students"]["merge-all"]
    rows = [
        "| model | en | fr | es |",
        "|---|---|---|---|",
        "| Gemma-3-270M, SmolLM2-135M (teachers) | "
        + " | ".join(f"{teachers['gemma'][x]:.3f}, {teachers['smollm2'][x]:.3f}" for x in LANGUAGES)
        + " |",
        f"| student, CE only | {_bits(ce)} |",
        f"| student, ALM from both teachers | {_bits(merged)} |",
        "",
        f"No distillation loss closes the targeted 30% of the gap at this budget (the best, "
        f"{table['best_loss']}, {100 * table['best_gap_closed']:.1f}%). With SmolLM2 as "
        f"teacher, lmalgebra's stored teacher trains {_gold_ratio(result):.2f}x TRL GOLD's "
        "online one per step (target 2x).",
    ]
    return "\n".join(rows) + "\n"


def _gold_ratio(result: dict[str, Any]) -> float:
    """GOLD's seconds per step over ours (each run's wall time over its steps)."""
    side = result["gold"]
    return side["gold"]["seconds_per_step"] / (side["ours"]["seconds"] / result["plan"]["steps"])


def real_teachers_rerun(result: dict[str, Any]) -> str:
    """The fresh-clone rerun's GOLD ratio."""
    return (
        f"In the rerun on a fresh clone ({result['date']}), lmalgebra trained "
        f"{_gold_ratio(result):.2f}x GOLD per step.\n"
    )


def regime_readme(result: dict[str, Any]) -> str:
    """A regime of ``experiments/distillation_regimes.py`` for the README: held-out bits per byte
    of the teachers and each variant (mean ± sd over seeds), and its targets."""
    table, plan = result["table"], result["plan"]
    seeds = ", ".join(str(s) for s in plan["seeds"])
    teachers = table["teacher_bits"]
    rows = [
        f"Regime `{plan['regime']}`, commit {result['commit']}, {result['date']}, seeds {seeds} "
        f"({result['machine']}); held-out bits per byte, each student at its best validation "
        "checkpoint:",
        "",
        "| model | en | fr | es |",
        "|---|---|---|---|",
        "| Gemma-3-270M, SmolLM2-135M (teachers) | "
        + " | ".join(f"{teachers['gemma'][x]:.3f}, {teachers['smollm2'][x]:.3f}" for x in LANGUAGES)
        + " |",
    ]
    for name, row in table["students"].items():
        rows.append(f"| {name} | {_bits(row)} |")
    return "\n".join([*rows, "", *_targets(table)]) + "\n"


MERGE_NAMES = {
    "ce": "CE only",
    "kl-smollm2": "SmolLM2 alone (all languages)",
    "prefix-gemma": "Gemma alone (all languages)",
    "merge-by-language": "merged: SmolLM2 for en, Gemma for fr and es",
}


def merge_readme(result: dict[str, Any]) -> str:
    """The merge regime (MergeDistill on the real models) for the README: per language held-out
    bits per byte of the teachers and the students, the share of the gap to the better teacher
    closed, RDT against both teachers, and the targets (what English lost among them)."""
    table, plan = result["table"], result["plan"]
    seeds = ", ".join(str(s) for s in plan["seeds"])
    teachers = table["teacher_bits"]
    written = plan.get("teacher_text", 0)
    text = f" and {written} documents Gemma wrote for fr and for es" if written else ""
    rows = [
        f"Student: the whole SmolLM2-135M; {plan['docs_per_language']} leads per language "
        f"({plan['heldout_fraction']:.0%} held out){text}, up to {plan['steps']} steps of "
        f"{plan['batch_size']} examples, each student at its best validation checkpoint; seeds "
        f"{seeds}; commit {result['commit']}, {result['date']}, {result['machine']}, "
        f"{result.get('precision', 'float32')}. Held-out bits per byte:",
        "",
        "| model | en | fr | es | gap closed (fr, es) | RDT |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("gemma", "smollm2"):
        cells = " | ".join(f"{teachers[name][x]:.3f}" for x in LANGUAGES)
        rows.append(f"| teacher {name} | {cells} | | |")
    for name, row in table["students"].items():
        cells = _bits(row)
        closed = ", ".join(f"{100 * row['gap_closed'][x]:.1f}%" for x in ("fr", "es"))
        rdt = f"{row['rdt']['average']:.1f}%"
        named = MERGE_NAMES.get(name, name) + (", real + Gemma's text" if written else "")
        rows.append(f"| {named} | {cells} | {closed} | {rdt} |")
    return "\n".join([*rows, "", *_targets(table)]) + "\n"


def merge_pilots(result: dict[str, Any]) -> str:
    """The merge's one-seed pilots scored on development leads (``merge_pilot.json``): each
    student's bits per byte there and the share of the French and Spanish gap between CE only on
    the same real documents and Gemma that it closes; its best validation where its validation
    split is the plan's (Gemma's text in it makes it another)."""
    few = result["more_text"]["100 documents"]
    many = result["more_text"]["300 documents"]
    every, text = result["every_position"], result["teacher_text"]
    rows = [  # text, student, its bits, its validation record, the CE-only twin's bits
        ("100 real documents", "CE only", few, "ce", few["students"]["ce"]),
        ("", "merge (prefix_kl)", few, "merge", few["students"]["merge-by-language"]),
        ("300 real documents", "CE only", many, "ce", many["students"]["ce"]),
        ("", "merge (prefix_kl)", many, "merge", many["students"]["merge-by-language"]),
        ("100 real documents", "merge (prefix_all_kl)", every, "prefix_all_kl", every["student"]),
        ("+ 100 of Gemma's", "CE only", text, "ce, with Gemma's text", None),
        ("", "merge (prefix_kl)", text, "merge, with Gemma's text", None),
    ]
    gemma = few["development_bits_per_byte"]["gemma"]
    lines = [
        "| French and Spanish text | student | best validation (step) | en | fr | es "
        "| gap closed fr / es |",
        "|---|---|---|---|---|---|---|",
        f"| | Gemma | | {' | '.join(f'{gemma[x]:.3f}' for x in LANGUAGES)} | |",
    ]
    for corpus, name, pilot, key, student in rows:
        bits = pilot["development_bits_per_byte"][key]
        ce = (many if pilot is many else few)["development_bits_per_byte"]["ce"]
        closed = (
            "(the twin)"
            if bits is ce
            else " / ".join(
                f"{100 * (ce[x] - bits[x]) / (ce[x] - gemma[x]):.1f}%" for x in ("fr", "es")
            )
        )
        best = "" if student is None else f"{student['best']:.3f} ({student['best_step']})"
        cells = " | ".join(f"{bits[x]:.3f}" for x in LANGUAGES)
        lines.append(f"| {corpus} | {name} | {best} | {cells} | {closed} |")
    return "\n".join(lines) + "\n"


def demo_real(result: dict[str, Any]) -> str:
    """A recorded ``demo --real`` table (its ``real-demo.json``), as the demo prints it."""
    import pandas as pd

    from lmalgebra.demo.real_table import real_markdown

    table = pd.DataFrame.from_dict(result["table"], orient="index").astype(float)
    return real_markdown(table, [name for name, _ in result["plan"]["teachers"]])


def _whole_command(result: dict[str, Any], spans: str) -> float | None:
    """The whole command's speed-up over the baseline at ``spans`` training spans, if run."""
    for row in result["figures"]:
        if row["case"].startswith(spans) and row["case"].endswith("whole command"):
            return float(row["ratio"])
    return None


def decompose_hosts(results: dict[str, Any]) -> str:
    """One row per recorded ``bench/bench_decompose.py`` run (each host, kernels and load):
    the whole command's speed-up over the authors' per-fit solver at 32k and 128k spans."""
    rows = [
        "| result | date, code | CPU (flags) | BLAS kernels | load | whole command, 32k | "
        "whole command, 128k |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, result in sorted(results.items()):
        machine = result["machine"]
        flags = ", ".join(f for f in machine["flags"] if f.startswith(("avx512f", "amx_tile")))
        cells = [
            f"[{name}](results.md#{name})",
            f"{result['date'][:10]}, {result['code']}",
            f"{machine['cpu']} ({flags or 'avx2'})",
            (machine.get("openblas") or "-").split(",")[0].split()[-1],
            result["sizes"].get("load", "idle"),
        ]
        for spans, target in (("32,000", 15), ("128,000", 20)):
            got = _whole_command(result, spans)
            verdict = (
                "-" if got is None else f"{got:.1f}x ({'met' if got >= target else 'not met'})"
            )
            cells.append(verdict)
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def bench_figures(result: dict[str, Any]) -> str:
    """A benchmark's recorded figures and targets (``bench/results/NAME.json``), with its date,
    code and CPU: what ``bench/RESULTS.md`` shows of it, in short."""
    machine = result["machine"]
    rows = [
        f"{result['title'].split(':')[0]} ({result['date'][:10]}, code {result['code']}, "
        f"{machine['cpu']}, {machine['cores']} cores):",
        "",
        f"| case | baseline ({result['figures'][0]['unit']}) | ours | ours vs baseline |",
        "|---|---|---|---|",
    ]
    for row in result["figures"]:
        ratio = f"{row['ratio']:.2f}x" + (" faster" if row["ratio_is"] == "speed-up" else "")
        rows.append(f"| {row['case']} | {row['baseline']:.3g} | {row['ours']:.3g} | {ratio} |")
    rows.append("")
    for target in result["targets"]:
        met = "met" if target["met"] else "not met"
        rows.append(f"- Target {target['target']}: {met} ({target['value']}).")
    return "\n".join(rows) + "\n"


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "bench-figures": bench_figures,
    "decompose-hosts": decompose_hosts,
    "demo-real": demo_real,
    "merge-readme": merge_readme,
    "merge-pilots": merge_pilots,
    "regime-readme": regime_readme,
    "real-teachers-readme": real_teachers_readme,
    "real-teachers-rerun": real_teachers_rerun,
}


def blocks(text: str) -> list[tuple[str, str, str]]:
    """``(name, path, body)`` of every rendered block of ``text``."""
    return [(m["name"], m["path"], m["body"]) for m in BLOCK.finditer(text)]


def render(name: str, path: str) -> str:
    """Renderer ``name`` applied to the JSON at ``path`` (relative to the repository)."""
    if name not in RENDERERS:
        raise KeyError(f"no renderer {name!r} (renderers: {', '.join(RENDERERS)})")
    if "*" in path:  # a glob: every matching result, by its file's stem
        found = sorted(ROOT.glob(path))
        return RENDERERS[name]({f.stem: json.loads(f.read_text(encoding="utf-8")) for f in found})
    return RENDERERS[name](json.loads((ROOT / path).read_text(encoding="utf-8")))


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def stale() -> list[str]:
    """Every block whose text is not its rendering: ``file: name from path``."""
    found = []
    for page in pages():
        for name, path, body in blocks(page.read_text(encoding="utf-8")):
            if body != render(name, path):
                found.append(f"{page}: {name} from {path}")
    return found


def rewrite() -> list[Path]:
    """Write every block from its results; the pages changed."""
    changed = []
    for page in pages():
        text = page.read_text(encoding="utf-8")
        new = BLOCK.sub(lambda m: m[1] + render(m["name"], m["path"]) + m[5], text)
        if new != text:
            page.write_text(new, encoding="utf-8")
            changed.append(page)
    return changed


def on_pre_build(config: Any, **kwargs: Any) -> None:
    for block in stale():
        log.warning("rendered block out of date with its results: %s (run %s)", block, __file__)


if __name__ == "__main__":
    for page in rewrite():
        print(f"rewrote {page}")
    sys.exit(0)
