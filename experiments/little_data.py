"""Little data, many epochs: where soft targets should pay (Hinton et al. 2015; BabyLM).

Teachers: ``package:gemma3-270m`` and ``package:smollm2-135m`` (different tokenizers) on every
language of the packaged English, French and Spanish Wikipedia leads, ``docs_per_language`` of
each (a quarter held out as the test text, never read while training). Student: SmolLM2's
architecture with six of its 30 decoder layers (the subset of ``real_teachers.CANDIDATES`` with
the fewest bits per byte before training, on leads that no model trains or is scored on),
initialised from SmolLM2, trained for many epochs over the little data. A validation split is
carved from the training examples (``training.validation_fraction``); each student is its best
validation checkpoint, and stops early once validation stops improving (``training.patience``).
Three seeds of each variant, at equal steps, data and lambda:

- ``ce``: CE only; ``ce-smooth``: CE with label smoothing 0.1 (the regularisation of soft targets
  without a teacher);
- ``kl-smollm2``: top-k plus tail KL from SmolLM2 (the student's own tokenizer: same-tokenizer
  KD, the ceiling a cross-tokenizer loss is measured against);
- ``prefix-gemma``: Gemma's top-k plus tail by first-token prefix at chunk starts;
  ``alm-gemma``: ALM from Gemma;
- ``merge``: both teachers, every copy, by first-token prefix (the same-tokenizer case for
  SmolLM2).

Reported: held-out bits per byte per language (mean and standard deviation over seeds) of both
teachers, the untrained student and every variant, the best validation step, and the targets:
the best distilled student beats both CE and label-smoothing twins by more than two standard
deviations on French and Spanish. Every stage resumes.

    python experiments/little_data.py [--quick] [--out experiments/results]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from real_teachers import (  # noqa: E402  (the experiment beside this one: corpora, layers, machine)
    CANDIDATES,
    LANGUAGES,
    STUDENT_INIT,
    TEACHERS,
    choose_layers,
    machine,
    untrained_bits,
    write_corpora,
)

# variant -> the keys of ``training`` it sets (beside the seed)
VARIANTS: dict[str, dict[str, Any]] = {
    "ce": {"objective_mix": {"ce": 1.0}},
    "ce-smooth": {"objective_mix": {"ce": 1.0}, "label_smoothing": 0.1},
    "kl-smollm2": {"objective_mix": {"tail_kl": 1.0}, "teachers": ["smollm2"]},
    "prefix-gemma": {"objective_mix": {"prefix_kl": 1.0}, "teachers": ["gemma"]},
    "alm-gemma": {"objective_mix": {"alm": 1.0}, "teachers": ["gemma"]},
    "merge": {"objective_mix": {"prefix_kl": 1.0}, "multi_teacher": "all"},
}
TWINS = ("ce", "ce-smooth")  # the students without a teacher


@dataclass(frozen=True)
class Plan:
    """Sizes of the run."""

    docs_per_language: int
    heldout_fraction: float
    validation_fraction: float
    example_bytes: int
    top_k: int
    steps: int
    batch_size: int
    lr: float
    lambda_value: float
    validation_every: int
    patience: int
    seeds: tuple[int, ...]
    selection_docs: int
    variants: tuple[str, ...]
    candidates: tuple[str, ...]


FULL = Plan(
    docs_per_language=48,
    heldout_fraction=0.25,
    validation_fraction=0.2,
    example_bytes=256,
    top_k=64,
    steps=64,
    batch_size=8,
    lr=3e-4,
    lambda_value=0.5,
    validation_every=8,
    patience=3,
    seeds=(0, 1, 2),
    selection_docs=20,
    variants=tuple(VARIANTS),
    candidates=tuple(CANDIDATES),
)
QUICK = replace(  # every path at the smallest size that runs it
    FULL,
    docs_per_language=12,
    steps=4,
    batch_size=2,
    validation_every=2,
    patience=1,
    seeds=(0, 1),
    selection_docs=2,
    candidates=("ends",),
)


def recipe(work: Path, corpora: dict[str, Path], layers: list[int], plan: Plan) -> dict[str, Any]:
    """One causal recipe: both teachers on every language, top-k of ``plan``, no drawn tokens."""
    return {
        "objective": "causal",
        "languages": {
            lang: {"corpus": {"paths": [str(p)], "doc_sep": "line"}, "teachers": list(TEACHERS)}
            for lang, p in corpora.items()
        },
        "teachers": {name: {"path": ref} for name, ref in TEACHERS.items()},
        "causal": {"example_bytes": plan.example_bytes, "samples": 0},
        "heldout_fraction": plan.heldout_fraction,
        "top_k": plan.top_k,
        "batch_size": 8,
        "output_dir": str(work / "merge"),
        "student": {"init": STUDENT_INIT, "layers": layers},
        "training": {
            "steps": plan.steps,
            "batch_size": plan.batch_size,
            "lr": plan.lr,
            "warmup_steps": max(1, plan.steps // 16),
            "lambda_schedule": "constant",
            "lambda_value": plan.lambda_value,
            "checkpoint_every": plan.validation_every,
            "log_every": plan.validation_every,
            "keep_checkpoints": 0,
            "validation_fraction": plan.validation_fraction,
            "validation_every": plan.validation_every,
            "patience": plan.patience,
        },
    }


def students(plan: Plan) -> dict[str, dict[str, Any]]:
    from lmalgebra.demo.causal_table import student_name

    return {
        student_name(v, seed): {**VARIANTS[v], "seed": seed}
        for v in plan.variants
        for seed in plan.seeds
    }


def summarise(rows: list[dict[str, Any]], plan: Plan) -> dict[str, Any]:
    """Per variant and language: mean and sd over seeds; the targets against both twins."""
    from lmalgebra.demo.causal_table import causal_table

    value = {(r["language"], r["model"]): r["bits_per_byte"] for r in rows}
    better = {lang: min(TEACHERS, key=lambda t, lang=lang: value[(lang, t)]) for lang in LANGUAGES}
    table = causal_table(
        [(r["language"], r["model"], r["bits_per_byte"]) for r in rows],
        better,
        plan.variants,
        plan.seeds,
    )
    table["teacher_bits"] = {t: {lang: value[(lang, t)] for lang in LANGUAGES} for t in TEACHERS}
    students_ = table["students"]
    targets = {}
    for lang in ("fr", "es"):
        margins = {}
        for v in plan.variants:
            if v in TWINS:
                continue
            got = students_[v]["bits_per_byte"][lang]
            margins[v] = min(_margin(students_[t]["bits_per_byte"][lang], got) for t in TWINS)
        best = max(margins, key=lambda v: -math.inf if math.isnan(margins[v]) else margins[v])
        targets[lang] = {
            "best": best,
            "sd_margin_over_both_twins": margins[best],
            "met": bool(margins[best] > 2),
        }
    table["targets"] = targets
    return table


def _margin(twin: dict[str, float], got: dict[str, float]) -> float:
    """How many standard deviations (the larger of the two) ``got`` is below ``twin``."""
    spread = max(twin["std"], got["std"])
    return (twin["mean"] - got["mean"]) / spread if spread > 0 else math.nan


def markdown(result: dict[str, Any]) -> str:
    t, plan = result["table"], result["plan"]
    minutes = sum(result["seconds"].values()) / 60
    parts = ", ".join(f"{k} {v / 60:.1f}" for k, v in result["seconds"].items())
    lines = [
        f"Run {result['date']} at commit {result['commit']} on {result['machine']}, float32, "
        f"{minutes:.0f} minutes (minutes: {parts}). {plan['docs_per_language']} documents per "
        f"language ({plan['heldout_fraction']:.0%} held out as the test text, "
        f"{plan['validation_fraction']:.0%} of the rest for validation), up to {plan['steps']} "
        f"steps of {plan['batch_size']} examples, validation every {plan['validation_every']} "
        f"steps, patience {plan['patience']}, top-{plan['top_k']}, lambda "
        f"{plan['lambda_value']}; layers {result['layers']}. Held-out bits per byte, mean ± "
        "standard deviation over seeds; best validation step (mean over seeds):",
        "",
        "| model | " + " | ".join(f"{x} bits/byte" for x in LANGUAGES) + " | best step |",
        "|" + "---|" * (len(LANGUAGES) + 2),
    ]
    for name, bits in t["teacher_bits"].items():
        lines.append(
            f"| teacher {name} | " + " | ".join(f"{bits[x]:.3f}" for x in LANGUAGES) + " | |"
        )
    untrained = result["untrained"]
    lines.append(
        "| student, untrained | " + " | ".join(f"{untrained[x]:.3f}" for x in LANGUAGES) + " | |"
    )
    for v, row in t["students"].items():
        cells = " | ".join(
            f"{row['bits_per_byte'][x]['mean']:.3f} ± {row['bits_per_byte'][x]['std']:.3f}"
            for x in LANGUAGES
        )
        lines.append(f"| {v} | {cells} | {result['best_steps'][v]:.0f} |")
    lines += ["", "Targets (French and Spanish):", ""]
    for lang, got in t["targets"].items():
        lines.append(
            f"- {lang}: best {got['best']}, {got['sd_margin_over_both_twins']:.2f} standard "
            "deviations below the better of CE only and label smoothing (target > 2: "
            f"{'met' if got['met'] else 'NOT met'})."
        )
    return "\n".join(lines) + "\n"


def best_steps(run_dir: Path, plan: Plan) -> dict[str, float]:
    """Mean over seeds of each variant's best validation step (from its model's record)."""
    from lmalgebra.demo.causal_table import student_name

    out = {}
    for v in plan.variants:
        steps = []
        for seed in plan.seeds:
            meta = run_dir / student_name(v, seed) / "model" / "lmalgebra.json"
            steps.append(json.loads(meta.read_text())["final"].get("best_step", math.nan))
        out[v] = sum(steps) / len(steps)
    return out


def commit() -> str:
    done = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE
    )
    return done.stdout.strip() or "unknown"


def run(out: Path, work: Path, plan: Plan) -> dict[str, Any]:
    """Every step through ``lmalgebra.merge``; a failure leaves the finished steps to resume."""
    from lmalgebra.demo.workflow import run_workflow

    return run_workflow(work, lambda: _run(out, work, plan))


def _run(out: Path, work: Path, plan: Plan) -> dict[str, Any]:
    from lmalgebra.api.merge import merge
    from lmalgebra.distill.examples import heldout_texts

    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    corpora, unseen = write_corpora(work / "data", plan)
    chosen, _ = choose_layers(plan, unseen)
    seconds["choose layers"] = time.perf_counter() - clock
    data = recipe(work, corpora, CANDIDATES[chosen], plan)
    clock = time.perf_counter()
    merge(data, ["prepare", "teach"], progress=False)
    seconds["teacher store"] = time.perf_counter() - clock
    clock = time.perf_counter()
    trained = merge(data, ["train"], students=students(plan), keep_saved=True, progress=False)
    seconds["students"] = time.perf_counter() - clock
    clock = time.perf_counter()
    run_dir = Path(data["output_dir"])
    untrained = untrained_bits(CANDIDATES[chosen], heldout_texts(run_dir))
    frame = trained.bits_per_byte({**TEACHERS, **trained.students})
    seconds["bits per byte"] = time.perf_counter() - clock
    result = {
        "plan": asdict(plan),
        "layers": f"{chosen} {CANDIDATES[chosen]}",
        "table": summarise(frame.to_dict("records"), plan),
        "untrained": untrained,
        "best_steps": best_steps(run_dir, plan),
        "bits": frame.to_dict("records"),
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
        "machine": machine(),
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    stem = "little_data_quick" if plan is QUICK else "little_data"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / f"{stem}.md").write_text(markdown(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--work", type=Path, default=HERE / "_work" / "little_data")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    plan = QUICK if args.quick else FULL
    result = run(args.out, args.work / ("quick" if args.quick else "full"), plan)
    print(markdown(result))


if __name__ == "__main__":
    from lmalgebra.cli import run_command

    run_command(main)  # bad input or a full disk: one line, exit status 2
