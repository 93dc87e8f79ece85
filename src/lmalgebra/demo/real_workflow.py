"""``demo --real``: a merge of two real pre-trained causal LMs with different tokenizers
(Gemma-3-270M and SmolLM2-135M, packaged GGUF files), offline, step by step; every step
resumes, so an interrupted demo continues where it was.

1. Corpora: Wikipedia leads in English, French and Spanish (packaged, no hub).
2. One causal store of both teachers on every language (prepare, teach).
3. The student: some of SmolLM2's decoder layers, started from SmolLM2's weights; kept
   untrained (``steps: 0``, the floor) and trained as each variant (CE only, label smoothing,
   both teachers merged by prefix projection) for every seed, at equal steps and data, many
   epochs over little data, each at its best checkpoint on a validation split: the regime in
   which distillation pays (``experiments/results/little_data.md``).
4. Held-out bits per byte of teachers and students, RDT against both teachers; the table
   (``real-demo.md``/``.json``).

A smaller run of ``experiments/distillation_regimes.py little-data`` (two seeds, three of its
variants), whose recorded figures are the reference.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmalgebra.api.merge import MergeRun, merge
from lmalgebra.core.precision import native_bf16
from lmalgebra.demo.causal_table import student_name
from lmalgebra.demo.plan import REAL_FULL, REAL_QUICK, REAL_VARIANTS, RealPlan
from lmalgebra.demo.real_table import real_markdown, real_table
from lmalgebra.demo.workflow import corpus_entry, run_workflow, write_corpora, write_recipe
from lmalgebra.storage.atomic import write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    import pandas as pd

UNTRAINED = "untrained"  # the student as it starts (``steps: 0``)


@dataclass(frozen=True)
class RealDemoResult:
    """What ``demo --real`` measured.

    Attributes:
        plan: the sizes it ran at; run: the merge run (its directory holds the store and every
            student).
        table: ``real_table``: one row per teacher, the untrained student and each variant.
        bits: held-out bits per byte per (language, model), ``MergeRun.bits_per_byte``'s table.
        rdt: RDT per student against both teachers, ``MergeRun.bits_rdt``'s table.
        seconds: wall time of each step.
    """

    plan: RealPlan
    run: MergeRun
    table: pd.DataFrame
    bits: pd.DataFrame
    rdt: pd.DataFrame
    seconds: dict[str, float]

    @property
    def precision(self) -> str:
        """What the students trained in (the store records what its teachers ran in)."""
        mixed = self.run.recipe.training.mixed_precision
        return "bfloat16 autocast" if mixed == "bf16" else "float32"

    def markdown(self) -> str:
        """The table as Markdown, with the sizes it was measured at."""
        plan, minutes = self.plan, sum(self.seconds.values()) / 60
        seeds = ", ".join(str(s) for s in plan.seeds)
        note = (
            f"Student: layers {list(plan.layers)} of {plan.student_init}, up to {plan.steps} steps "
            f"of {plan.batch_size} examples, at its best checkpoint on "
            f"{plan.validation_fraction:.0%} of the training examples (scored every "
            f"{plan.validation_every} steps, patience "
            f"{plan.patience}), seeds {seeds}; {plan.docs_per_language} leads per language, "
            f"{plan.heldout_fraction:.0%} held out, top-{plan.top_k}; {self.precision}; "
            f"{minutes:.1f} minutes. Held-out "
            "bits per byte (mean ± standard deviation over seeds). Gap closed: the share of the "
            "gap between CE only and each language's better teacher, averaged over languages; "
            "RDT against both teachers (positive: fewer bits than the teachers)."
        )
        teachers = [name for name, _ in plan.teachers]
        return real_markdown(self.table, teachers) + "\n" + note + "\n"

    def as_dict(self) -> dict[str, Any]:
        """Plain values (``real-demo.json``)."""
        return {
            "plan": self.plan.as_dict(),
            "run_dir": str(self.run.run_dir),
            "table": json.loads(self.table.to_json(orient="index")),
            "bits": self.bits.to_dict("records"),
            "rdt": json.loads(self.rdt.to_json(orient="index")),
            "seconds": self.seconds,
            "precision": self.precision,
        }


def real_recipe(out: Path, corpora: dict[str, Path], plan: RealPlan) -> dict[str, Any]:
    """One causal recipe: both teachers on every language; the student from ``plan``'s layers.
    Written beside ``out`` as ``<out>.yaml``."""
    names = [name for name, _ in plan.teachers]
    data: dict[str, Any] = {
        "objective": "causal",
        "languages": {
            lang: {"corpus": corpus_entry(path), "teachers": names}
            for lang, path in corpora.items()
        },
        "teachers": {name: {"path": ref} for name, ref in plan.teachers},
        "causal": {"example_bytes": plan.example_bytes, "samples": 0},
        "heldout_fraction": plan.heldout_fraction,
        "top_k": plan.top_k,
        "output_dir": str(out),
        "student": {"init": plan.student_init, "layers": list(plan.layers)},
        "training": real_training(
            plan.steps, plan.batch_size, plan.lr, plan.lambda_value, plan.validation_every
        ),
    }
    bf16 = plan.precision == "auto" and native_bf16()
    data["dtype"] = "bfloat16" if bf16 else "float32"
    data["training"] |= {
        "validation_fraction": plan.validation_fraction,
        "validation_every": plan.validation_every,
        "patience": plan.patience,
        "mixed_precision": "bf16" if bf16 else "no",
    }
    return write_recipe(out, data)


def real_training(
    steps: int, batch_size: int, lr: float, lambda_value: float, every: int | None = None
) -> dict[str, Any]:
    """The students' ``training``: ``lambda_value`` constant, a tenth of the steps to warm up,
    a checkpoint and a log line every ``every`` steps (default: a checkpoint halfway, a log line
    every quarter), checkpoints removed once the student is saved (each of a real student's
    checkpoints is about 0.6 GB) (the demo's and ``experiments/real_teachers.py``'s)."""
    return {
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "warmup_steps": max(1, steps // 10),
        "lambda_schedule": "constant",
        "lambda_value": lambda_value,
        "checkpoint_every": every or max(1, steps // 2),
        "log_every": every or max(1, steps // 4),
        "keep_checkpoints": 0,
    }


def real_students(plan: RealPlan) -> dict[str, dict[str, Any]]:
    """Student name -> the keys of ``training`` it sets: the untrained student, then every
    variant and seed."""
    untrained = {"steps": 0, "warmup_steps": 0, "objective_mix": {"ce": 1.0}}
    students: dict[str, dict[str, Any]] = {UNTRAINED: untrained}
    for variant in plan.variants:
        for seed in plan.seeds:
            students[student_name(variant, seed)] = {**REAL_VARIANTS[variant], "seed": seed}
    return students


def run_real_demo(
    out: Path, quick: bool = False, progress: bool = True, plan: RealPlan | None = None
) -> RealDemoResult:
    """Run every step (at ``plan``'s sizes; default the full or the quick plan); also writes
    ``real-demo.json`` and ``real-demo.md``.

    A demo that fails leaves the steps it finished (a rerun resumes them) and no empty directory.
    """
    chosen = plan or (REAL_QUICK if quick else REAL_FULL)
    identity = {"demo": "quick real" if chosen == REAL_QUICK else "real", "plan": chosen.as_dict()}
    return run_workflow(out, lambda: _run_steps(out, chosen, progress), identity)


def _run_steps(out: Path, plan: RealPlan, progress: bool) -> RealDemoResult:
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    corpora = write_corpora(out / "data", plan)
    recipe = real_recipe(out / "merge", corpora, plan)
    merge(recipe, ["prepare", "teach"], progress=progress)
    seconds["teacher store"] = time.perf_counter() - clock
    clock = time.perf_counter()
    students = real_students(plan)
    run = merge(recipe, ["train"], students=students, keep_saved=True, progress=progress)
    seconds["students"] = time.perf_counter() - clock
    clock = time.perf_counter()
    bits = run.bits_per_byte({**dict(plan.teachers), **run.students})
    rdt = run.bits_rdt(bits)
    seconds["bits per byte"] = time.perf_counter() - clock
    teachers = [name for name, _ in plan.teachers]
    languages = list(run.recipe.languages)
    table = real_table(bits, rdt, teachers, UNTRAINED, plan.variants, plan.seeds, languages)
    rounded = {k: round(v, 1) for k, v in seconds.items()}
    result = RealDemoResult(plan, run, table, bits, rdt, rounded)
    write_json_atomic(out / "real-demo.json", result.as_dict())
    write_text_atomic(out / "real-demo.md", result.markdown())
    return result
