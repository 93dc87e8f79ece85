"""A merge of two real pre-trained causal LMs: Gemma-3-270M and SmolLM2-135M, different tokenizers.

Teachers: ``package:gemma3-270m`` (SentencePiece, 262,144 tokens) and ``package:smollm2-135m``
(byte-level BPE, 49,152), both on every language of the packaged English, French and Spanish
Wikipedia leads. Student: SmolLM2's architecture with ``--layers`` of its 30 decoder layers,
initialised from SmolLM2 (``student.init`` and ``student.layers``); the subset is the one of
``CANDIDATES`` with the fewest bits per byte before training, on Wikipedia leads that neither
training nor evaluation uses (measured here, in the results). One causal store holds both
teachers; at equal steps, data and lambda, three seeds each:

- ``ce``: CE only (the baseline);
- ``<loss>-gemma``: each cross-tokenizer loss (MinED-KL, ULD, ALM, sampled) from Gemma alone
  (``training.teachers``);
- ``merge-all`` and ``merge-best``: ALM from both teachers, every copy or the best copy.

Reported: held-out bits per byte per language of both teachers, the untrained student and every
student (mean and standard deviation over seeds), the share of the gap between CE only and the
better teacher that each closes, and RDT against both teachers. Every stage resumes.

    python experiments/real_teachers.py [--steps 40] [--quick] [--out experiments/results]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
LANGUAGES = ("en", "fr", "es")
TEACHERS = {"gemma": "package:gemma3-270m", "smollm2": "package:smollm2-135m"}
STUDENT_INIT = "package:smollm2-135m"
# Six of SmolLM2's 30 decoder layers, kept in order: spread evenly, the first six, the last six,
# the first three and the last three (the first and last layers are the least interchangeable).
CANDIDATES: dict[str, list[int]] = {
    "spread": [0, 6, 12, 18, 24, 29],
    "first": [0, 1, 2, 3, 4, 5],
    "last": [24, 25, 26, 27, 28, 29],
    "ends": [0, 1, 2, 27, 28, 29],
}
# student variant -> the keys of ``training`` it sets (beside the seed)
VARIANTS: dict[str, dict[str, Any]] = {
    "ce": {"objective_mix": {"ce": 1.0}},
    "mined-gemma": {"objective_mix": {"mined_kl": 1.0}, "teachers": ["gemma"]},
    "uld-gemma": {"objective_mix": {"uld": 1.0}, "teachers": ["gemma"]},
    "alm-gemma": {"objective_mix": {"alm": 1.0}, "teachers": ["gemma"]},
    "sampled-gemma": {"objective_mix": {"sampled": 1.0}, "teachers": ["gemma"]},
    "merge-all": {"objective_mix": {"alm": 1.0}, "multi_teacher": "all"},
    "merge-best": {"objective_mix": {"alm": 1.0}, "multi_teacher": "best"},
}
# beside GOLD (one seed): top-k KL against the stored SmolLM2, the student's own tokenizer, as
# GOLD's forward KL against the online SmolLM2 (GOLD refuses Gemma's tokenizer: see the results)
BESIDE_GOLD = ("kl-smollm2", {"objective_mix": {"mined_kl": 1.0}, "teachers": ["smollm2"]})


@dataclass(frozen=True)
class Plan:
    """Sizes of the run."""

    docs_per_language: int
    heldout_fraction: float
    example_bytes: int
    top_k: int
    samples: int
    steps: int
    batch_size: int
    lr: float
    lambda_value: float
    seeds: tuple[int, ...]
    selection_docs: int  # per language, for choosing the layer subset
    variants: tuple[str, ...]
    candidates: tuple[str, ...]


FULL = Plan(
    docs_per_language=150,
    heldout_fraction=0.2,
    example_bytes=256,
    top_k=8,
    samples=8,
    steps=40,
    batch_size=8,
    lr=2e-4,
    lambda_value=0.5,
    seeds=(0, 1, 2),
    selection_docs=20,
    variants=tuple(VARIANTS),
    candidates=tuple(CANDIDATES),
)
QUICK = replace(  # every path at the smallest size that runs it
    FULL,
    docs_per_language=12,
    heldout_fraction=0.25,
    steps=2,
    batch_size=2,
    seeds=(0,),
    selection_docs=2,
    variants=("ce", "alm-gemma", "merge-best"),
    candidates=("spread", "ends"),
)


def write_corpora(out: Path, plan: Plan) -> tuple[dict[str, Path], dict[str, list[str]]]:
    """``<lang>.txt``: the first documents (training and held-out examples); and, per language,
    ``selection_docs`` later documents that no model trains or is scored on."""
    from lmalgebra.api.decompose import read_texts

    paths, unseen = {}, {}
    out.mkdir(parents=True, exist_ok=True)
    for lang in LANGUAGES:
        docs = [t.replace("\n", " ").strip() for t in read_texts(f"package:wiki-{lang}", "extract")]
        docs = [d for d in docs if d]
        cut = plan.docs_per_language
        paths[lang] = out / f"{lang}.txt"
        if not paths[lang].is_file():
            paths[lang].write_text("\n".join(docs[:cut]) + "\n", encoding="utf-8")
        unseen[lang] = [d[: plan.example_bytes] for d in docs[cut : cut + plan.selection_docs]]
    return paths, unseen


def untrained_bits(layers: list[int], texts: dict[str, list[str]]) -> dict[str, float]:
    """Bits per byte of SmolLM2 with only ``layers`` kept, untrained, on ``texts``."""
    from lmalgebra.distill.causal.bits_per_byte import score_texts
    from lmalgebra.distill.causal.student_init import init_student, open_init
    from lmalgebra.distill.student import CausalStudentSpec
    from lmalgebra.sources.kinds import source_of

    init = open_init(CausalStudentSpec(init=STUDENT_INIT, layers=layers), None)
    assert init is not None  # the spec names a model
    model = init_student(init)
    tokenizer = source_of(init.ref, init.directory).load_tokenizer()
    return {
        lang: score_texts(model, tokenizer, docs, context=init.positions).bits_per_byte
        for lang, docs in texts.items()
    }


def choose_layers(plan: Plan, unseen: dict[str, list[str]]) -> tuple[str, dict[str, Any]]:
    """The candidate subset with the fewest bits per byte (mean over languages) before training."""
    found = {}
    for name in plan.candidates:
        bits = untrained_bits(CANDIDATES[name], unseen)
        found[name] = {"layers": CANDIDATES[name], "bits_per_byte": bits}
        found[name]["mean"] = sum(bits.values()) / len(bits)
        logging.info("layer subset %s %s: %s", name, CANDIDATES[name], bits)
    return min(found, key=lambda n: found[n]["mean"]), found


def recipe(work: Path, corpora: dict[str, Path], layers: list[int], plan: Plan) -> dict[str, Any]:
    """One causal recipe: both teachers on every language, the student from SmolLM2's layers."""
    from lmalgebra.demo.real_workflow import real_training

    return {
        "objective": "causal",
        "languages": {
            lang: {"corpus": {"paths": [str(p)], "doc_sep": "line"}, "teachers": list(TEACHERS)}
            for lang, p in corpora.items()
        },
        "teachers": {name: {"path": ref} for name, ref in TEACHERS.items()},
        "causal": {"example_bytes": plan.example_bytes, "samples": plan.samples},
        "heldout_fraction": plan.heldout_fraction,
        "top_k": plan.top_k,
        "batch_size": 8,
        "output_dir": str(work / "merge"),
        "student": {"init": STUDENT_INIT, "layers": layers},
        "training": real_training(plan.steps, plan.batch_size, plan.lr, plan.lambda_value),
    }


def students(plan: Plan) -> dict[str, dict[str, Any]]:
    from lmalgebra.demo.causal_table import student_name

    return {
        student_name(v, seed): {**VARIANTS[v], "seed": seed}
        for v in plan.variants
        for seed in plan.seeds
    }


def variants_table(
    rows: list[dict[str, Any]], variants: Sequence[str], seeds: Sequence[int]
) -> dict[str, Any]:
    """``causal_table`` of the students (gap closed towards each language's better teacher),
    each teacher's bits per byte, and each variant's RDT against both teachers (mean over
    seeds)."""
    import numpy as np

    from lmalgebra.demo.causal_table import causal_table, student_name
    from lmalgebra.distill.causal.bits_per_byte import BitsRow
    from lmalgebra.distill.causal.evaluation import bits_rdt

    value = {(r["language"], r["model"]): r["bits_per_byte"] for r in rows}
    better = {lang: min(TEACHERS, key=lambda t, lang=lang: value[(lang, t)]) for lang in LANGUAGES}
    table = causal_table(
        [(r["language"], r["model"], r["bits_per_byte"]) for r in rows], better, variants, seeds
    )
    table["teacher_bits"] = {t: {lang: value[(lang, t)] for lang in LANGUAGES} for t in TEACHERS}
    bits_rows = [BitsRow(**r) for r in rows]
    both = {lang: list(TEACHERS) for lang in LANGUAGES}
    for v in variants:
        per_seed = [bits_rdt(bits_rows, student_name(v, s), both) for s in seeds]
        table["students"][v]["rdt"] = {
            k: float(np.mean([d[k] for d in per_seed])) for k in [*LANGUAGES, "average"]
        }
    return table


def model_rows(
    table: dict[str, Any], untrained: dict[str, float], more: Callable[[str], str] = str
) -> list[str]:
    """Markdown rows: each teacher, the untrained student, then each variant (mean ± sd over
    seeds; the mean alone with one seed), its gap closed and RDT, and ``more(variant)``'s cells
    (``"| x"``; teacher rows get as many empty cells)."""
    blank = " |" * (2 + more("ce").count("|"))
    lines = []
    for name, bits in table["teacher_bits"].items():
        cells = " | ".join(f"{bits[x]:.3f}" for x in LANGUAGES)
        lines.append(f"| teacher {name} | {cells} |{blank}")
    cells = " | ".join(f"{untrained[x]:.3f}" for x in LANGUAGES)
    lines.append(f"| student, untrained | {cells} |{blank}")
    for v, row in table["students"].items():
        cells = " | ".join(
            f"{row['bits_per_byte'][x]['mean']:.3f} ± {row['bits_per_byte'][x]['std']:.3f}"
            if len(table["seeds"]) > 1
            else f"{row['bits_per_byte'][x]['mean']:.3f}"
            for x in LANGUAGES
        )
        closed = "(baseline)" if v == "ce" else f"{100 * row['gap_closed_mean']:.1f}%"
        lines.append(f"| {v} | {cells} | {closed} | {row['rdt']['average']:.1f}% {more(v)}|")
    return lines


def summarise(
    rows: list[dict[str, Any]], untrained: dict[str, float], plan: Plan
) -> dict[str, Any]:
    """The table: teachers, untrained student, every variant (mean, sd), gap closed against the
    better teacher per language, RDT against both teachers, and the issue's targets."""
    table = variants_table(rows, plan.variants, plan.seeds)
    table["untrained"] = untrained
    ce = table["students"]["ce"]["bits_per_byte"]
    targets = {}
    for lang in ("fr", "es"):
        margin = {}
        for v in plan.variants:
            if v == "ce":
                continue
            got = table["students"][v]["bits_per_byte"][lang]
            spread = max(got["std"], ce[lang]["std"])
            margin[v] = (ce[lang]["mean"] - got["mean"]) / spread if spread > 0 else math.nan
        best = max(margin, key=lambda v: -math.inf if math.isnan(margin[v]) else margin[v])
        closed = table["students"][best]["gap_closed"][lang]
        targets[lang] = {
            "best": best,
            "sd_margin": margin[best],
            "beats_ce_by_2sd": bool(margin[best] > 2),
            "gap_closed": closed,
            "closes_30pct": bool(closed >= 0.30),
        }
    table["targets"] = targets
    return table


def markdown(result: dict[str, Any]) -> str:
    """The experiment's table and its targets as Markdown."""
    t, langs, plan = result["table"], LANGUAGES, result["plan"]
    minutes = sum(result["seconds"].values()) / 60
    chosen = result["layers"]["chosen"]
    layers = result["layers"]["candidates"][chosen]["layers"]
    parts = ", ".join(f"{k} {v / 60:.1f}" for k, v in result["seconds"].items())
    lines = [
        f"Run {result['date']} on {result['machine']}, float32, {minutes:.0f} minutes "
        f"(minutes: {parts}). Layers "
        f"kept: {chosen} {layers} of SmolLM2's 30; "
        f"{plan['steps']} steps of {plan['batch_size']} examples, seeds "
        f"{', '.join(str(s) for s in plan['seeds'])}. Held-out bits per byte, mean ± standard "
        "deviation over seeds:",
        "",
        "| model | " + " | ".join(f"{x} bits/byte" for x in langs) + " | gap closed | RDT |",
        "|" + "---|" * (len(langs) + 3),
    ]
    lines += model_rows(t, t["untrained"], lambda v: "")
    lines += ["", "Targets (French and Spanish):", ""]
    for lang, got in t["targets"].items():
        lines.append(
            f"- {lang}: best {got['best']}, {got['sd_margin']:.2f} standard deviations below CE "
            f"only (target > 2: {'met' if got['beats_ce_by_2sd'] else 'NOT met'}); closes "
            f"{100 * got['gap_closed']:.1f}% of the gap to the better teacher (target >= 30%: "
            f"{'met' if got['closes_30pct'] else 'NOT met'})."
        )
    lines += ["", *gold_markdown(result)]
    return "\n".join(lines) + "\n"


def gold_markdown(result: dict[str, Any]) -> list[str]:
    """GOLD beside lmalgebra: bits per byte and seconds per step, same student and teacher."""
    side, steps = result["gold"], result["plan"]["steps"]
    value = {(r["language"], r["model"]): r["bits_per_byte"] for r in result["bits"]}
    ours, gold = side["ours"]["student"], "gold"
    ours_step = side["ours"]["seconds"] / steps
    gold_step = side["gold"]["seconds_per_step"]
    lines = [
        f"Beside TRL's GOLD (trl {side['gold']['trl']}), teacher SmolLM2 (the student's own "
        f"tokenizer), seed 0, {steps} steps of {result['plan']['batch_size']} examples:",
        "",
        "| trainer | " + " | ".join(f"{x} bits/byte" for x in LANGUAGES) + " | s/step |",
        "|" + "---|" * (len(LANGUAGES) + 2),
        f"| lmalgebra, stored teacher (top-{result['plan']['top_k']} KL) | "
        + " | ".join(f"{value[(x, ours)]:.3f}" for x in LANGUAGES)
        + f" | {ours_step:.2f} |",
        "| GOLD, online teacher (full-vocabulary forward KL) | "
        + " | ".join(f"{value[(x, gold)]:.3f}" for x in LANGUAGES)
        + f" | {gold_step:.2f} |",
        "",
        f"Per step, lmalgebra is {gold_step / ours_step:.2f}x GOLD (target >= 2x: "
        f"{'met' if gold_step / ours_step >= 2 else 'NOT met'}); each run's wall time over its "
        "steps, loading its models included; the store was written "
        f"once for every student ({result['seconds']['teacher store']:.0f} s, both teachers).",
        "",
        f"GOLD with Gemma as teacher (cross-tokenizer ULD): {side['gold_with_gemma']}",
    ]
    return lines


def machine() -> str:
    """Cores, CPU model and the flags that choose the float kernels (``lscpu``)."""
    text = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    flags = fields.get("Flags", "").split()
    wanted = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    cpu = fields.get("Model name", platform.machine()).strip()
    return f"{os.cpu_count()} cores, {cpu} ({', '.join(wanted)})"


def gold_side(work: Path, data: dict[str, Any], layers: list[int], plan: Plan) -> dict[str, Any]:
    """GOLD (online SmolLM2 teacher) and lmalgebra (stored SmolLM2) on the same student, steps,
    batches and texts, seed 0: seconds and the model directories; and GOLD's answer to Gemma."""
    import sys

    from lmalgebra.api.merge import merge
    from lmalgebra.demo.causal_table import student_name
    from lmalgebra.distill.examples import stored_texts

    sys.path.insert(0, str(HERE))
    from gold_baseline import attempt_cross_tokenizer, train_gold

    run_dir = Path(data["output_dir"])
    texts = [t for docs in stored_texts(run_dir, heldout=False).values() for t in docs]
    name = student_name(BESIDE_GOLD[0], 0)
    timed = work / "ours-beside-gold.json"  # the training's seconds, kept for a resumed run
    saved = (run_dir / name / "model" / "lmalgebra.json").is_file()
    clock = time.perf_counter()
    ours = merge(data, ["train"], students={name: {**BESIDE_GOLD[1], "seed": 0}}, keep_saved=True)
    ours_seconds = time.perf_counter() - clock
    if not saved:  # trained now, from step 0 or a checkpoint (then the figure is partial)
        timed.write_text(json.dumps({"seconds": ours_seconds}))
    # trained by an earlier run: its seconds, or NaN when it stopped before writing them
    ours_seconds = json.loads(timed.read_text())["seconds"] if timed.is_file() else math.nan
    gold = train_gold(
        work / "gold", TEACHERS["smollm2"], STUDENT_INIT, layers, texts, data["training"], 0
    )
    refused = attempt_cross_tokenizer(
        work / "gold-gemma", TEACHERS["gemma"], STUDENT_INIT, layers, texts[0]
    )
    return {
        "ours": {"student": name, "model": str(ours.students[name]), "seconds": ours_seconds},
        "gold": gold,
        "gold_with_gemma": refused,
    }


def run(out: Path, work: Path, plan: Plan) -> dict[str, Any]:
    """Every step (through ``lmalgebra.merge``, as the demos); a failure leaves the steps
    finished (a rerun resumes them) and no empty directory."""
    from lmalgebra.demo.workflow import run_workflow

    return run_workflow(work, lambda: _run(out, work, plan))


def _run(out: Path, work: Path, plan: Plan) -> dict[str, Any]:
    from lmalgebra.api.merge import merge
    from lmalgebra.distill.examples import heldout_texts

    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    corpora, unseen = write_corpora(work / "data", plan)
    chosen, subsets = choose_layers(plan, unseen)
    seconds["choose layers"] = time.perf_counter() - clock
    data = recipe(work, corpora, CANDIDATES[chosen], plan)
    clock = time.perf_counter()
    merge(data, ["prepare", "teach"], progress=False)
    seconds["teacher store"] = time.perf_counter() - clock
    clock = time.perf_counter()
    trained = merge(data, ["train"], students=students(plan), keep_saved=True, progress=False)
    seconds["students"] = time.perf_counter() - clock
    clock = time.perf_counter()
    beside = gold_side(work, data, CANDIDATES[chosen], plan)
    seconds["GOLD and its counterpart"] = time.perf_counter() - clock
    clock = time.perf_counter()
    texts = heldout_texts(Path(data["output_dir"]))
    untrained = untrained_bits(CANDIDATES[chosen], texts)
    extra = {beside["ours"]["student"]: beside["ours"]["model"], "gold": beside["gold"]["model"]}
    frame = trained.bits_per_byte({**TEACHERS, **trained.students, **extra})
    seconds["bits per byte"] = time.perf_counter() - clock
    result = {
        "plan": asdict(plan),
        "layers": {"chosen": chosen, "candidates": subsets},
        "table": summarise(frame.to_dict("records"), untrained, plan),
        "gold": beside,
        "bits": frame.to_dict("records"),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    stem = "real_teachers_quick" if plan is QUICK else "real_teachers"
    out.mkdir(parents=True, exist_ok=True)
    from lmalgebra.core.fingerprint import plain  # NaN as null: strict JSON readers refuse NaN

    (out / f"{stem}.json").write_text(json.dumps(plain(result), indent=2, allow_nan=False) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=FULL.steps, help="student optimizer steps")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--work", type=Path, default=HERE / "_work" / "real_teachers")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    plan = QUICK if args.quick else replace(FULL, steps=args.steps)
    result = run(args.out, args.work / ("quick" if args.quick else "full"), plan)
    print(markdown(result))


if __name__ == "__main__":
    from lmalgebra.cli import run_command

    run_command(main)  # bad input or a full disk: one line, exit status 2
