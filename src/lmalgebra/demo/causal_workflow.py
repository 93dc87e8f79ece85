"""``demo --causal``: cross-tokenizer distillation of causal LMs, offline, step by step; every step
resumes, so an interrupted demo continues where it was.

1. Corpora: Wikipedia leads in English, French and Spanish (packaged, no hub).
2. One causal teacher per language, each with its own tokenizer kind and size
   (``pretrain`` of a ``CausalPretrainSpec``).
3. The causal teacher store (prepare, teach), then one student per loss (CE only, MinED-KL, ULD,
   ALM) and seed, with the English teacher's tokenizer, equal steps and data.
4. Held-out bits per byte of teachers and students; the table (``causal-demo.md``/``.json``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmalgebra.api.merge import MergeRun, merge
from lmalgebra.api.pretrain import CausalPretrainSpec, pretrain
from lmalgebra.demo.causal_table import causal_frame, causal_markdown, causal_table, student_name
from lmalgebra.demo.plan import CAUSAL_FULL, CAUSAL_LOSSES, CAUSAL_QUICK, CausalPlan
from lmalgebra.demo.workflow import corpus_entry, run_workflow, write_corpora, write_recipe
from lmalgebra.storage.atomic import write_json_atomic, write_text_atomic

if TYPE_CHECKING:
    import pandas as pd


def model_spec(plan: CausalPlan) -> dict[str, Any]:
    """Teachers' and students' sizes; positions enough for a whole example at one byte a token."""
    return {
        "hidden_size": plan.hidden_size,
        "num_layers": plan.layers,
        "num_heads": 2,
        "intermediate_size": 4 * plan.hidden_size,
        "max_position_embeddings": plan.example_bytes + 8,
        "dropout": 0.0,
    }


def pretrain_causal_teachers(
    out: Path, corpora: dict[str, Path], plan: CausalPlan, progress: bool
) -> dict[str, Path]:
    """``teacher-<lang>`` directories, each with its own tokenizer kind and size."""
    training = {
        "steps": plan.teacher_steps,
        "batch_size": plan.batch_size,
        "lr": 3e-3,
        "warmup_steps": plan.teacher_steps // 10,
        "checkpoint_every": max(1, plan.teacher_steps // 4),
        "log_every": 10,
    }
    dirs = {}
    for lang, kind, vocab in plan.teachers:
        spec = CausalPretrainSpec.model_validate(
            {
                "corpus": corpus_entry(corpora[lang]),
                "language": lang,
                "out": out / f"teacher-{lang}",
                "example_length": plan.teacher_window,
                "heldout_fraction": plan.heldout_fraction,
                "tokenizer": {"kind": kind, "vocab_size": vocab},
                "model": model_spec(plan),
                "training": training,
            }
        )
        dirs[lang] = pretrain(spec, progress, keep_saved=True)
    return dirs


def causal_recipe(
    out: Path, corpora: dict[str, Path], teachers: dict[str, Path], plan: CausalPlan
) -> dict[str, Any]:
    """One causal recipe: each language with its teacher; the student with ``student_tokenizer``.
    Written beside ``out`` as ``<out>.yaml``."""
    data: dict[str, Any] = {
        "objective": "causal",
        "languages": {
            lang: {"corpus": corpus_entry(corpora[lang]), "teachers": [f"teacher-{lang}"]}
            for lang in teachers
        },
        "teachers": {f"teacher-{lang}": {"path": str(p)} for lang, p in teachers.items()},
        "causal": {"example_bytes": plan.example_bytes, "samples": 0},
        "heldout_fraction": plan.heldout_fraction,
        "top_k": plan.top_k,
        "output_dir": str(out),
        "student": {**model_spec(plan), "tokenizer": plan.student_tokenizer},
        "training": {
            "steps": plan.student_steps,
            "batch_size": plan.batch_size,
            "lr": 3e-3,
            "warmup_steps": plan.student_steps // 10,
            "lambda_schedule": "constant",
            "lambda_value": plan.lambda_value,
            "checkpoint_every": max(1, plan.student_steps // 2),
        },
    }
    return write_recipe(out, data)


def loss_students(
    plan: CausalPlan, losses: dict[str, tuple[dict[str, float], float]]
) -> dict[str, dict[str, Any]]:
    """One student per loss and seed: name -> the keys of ``training`` it overrides (``losses``:
    name -> objective mix and lambda; everything else the same for all)."""
    return {
        student_name(loss, seed): {
            "objective_mix": mix,
            **({} if "ce" in mix else {"lambda_value": weight}),  # CE alone weighs no KD term
            "seed": seed,
        }
        for loss, (mix, weight) in losses.items()
        for seed in plan.seeds
    }


def train_students(
    recipe: dict[str, Any], students: dict[str, dict[str, Any]], progress: bool
) -> MergeRun:
    """The store, then every student of ``students`` (``loss_students``); students already
    saved are kept."""
    stages = ["prepare", "teach", "train"]
    return merge(recipe, stages, students=students, keep_saved=True, progress=progress)


def students_bits(run: MergeRun) -> pd.DataFrame:
    """Held-out bits per byte of the run's teachers and students."""
    teachers = {name: spec.path for name, spec in run.recipe.teachers.items()}
    return run.bits_per_byte({**teachers, **run.students})


def students_table(
    bits: pd.DataFrame, run: MergeRun, losses: Iterable[str], seeds: Iterable[int]
) -> dict[str, Any]:
    """The demo's table (``causal_table``) of ``bits`` (``students_bits``): the run's teachers
    (``teacher-LANG``) and students (``student_name(loss, seed)`` for each of ``losses`` and
    ``seeds``)."""
    rows = bits.to_dict("records")
    return causal_table(
        [(r["language"], r["model"], r["bits_per_byte"]) for r in rows],
        {lang: f"teacher-{lang}" for lang in run.recipe.languages},
        losses,
        seeds,
    )


@dataclass(frozen=True)
class CausalDemoResult:
    """What ``demo --causal`` measured.

    Attributes:
        plan: the sizes it ran at; quick: whether the quick plan; run: the merge run.
        bits: held-out bits per byte per (language, model), ``MergeRun.bits_per_byte``'s table.
        table: one row per loss (index ``loss``) and a last row ``teachers``: per language the
            seed mean (``LANG``) and standard deviation (``LANG sd``) of bits per byte, and the
            share of the CE-to-teacher gap closed (``gap closed``, averaged over languages).
        summary: the same figures as plain values, every seed's too (``causal-demo.json``),
            with ``best_loss`` (the loss that closes the most of the gap) and ``target_met``
            (whether it closes 25%).
        seconds: wall time of each step.
    """

    plan: CausalPlan
    quick: bool
    run: MergeRun
    bits: pd.DataFrame
    table: pd.DataFrame
    summary: dict[str, Any]
    seconds: dict[str, float]

    def markdown(self) -> str:
        """The table as Markdown (``causal-demo.md``)."""
        return causal_markdown(self.summary)

    def as_dict(self) -> dict[str, Any]:
        """Plain values (``causal-demo.json``)."""
        return {
            "plan": self.plan.as_dict(),
            "quick": self.quick,
            "student_tokenizer": self.plan.student_tokenizer,
            **self.summary,
            "seconds": self.seconds,
        }


def run_causal_demo(out: Path, quick: bool = False, progress: bool = True) -> CausalDemoResult:
    """Run every step; returns what it measured (also ``causal-demo.json`` and
    ``causal-demo.md``).

    A demo that fails leaves the steps it finished (a rerun resumes them) and no empty directory.
    """
    plan = CAUSAL_QUICK if quick else CAUSAL_FULL
    identity = {"demo": "quick causal" if quick else "causal", "plan": plan.as_dict()}
    return run_workflow(out, lambda: _run_steps(out, quick, progress), identity)


def _run_steps(out: Path, quick: bool, progress: bool) -> CausalDemoResult:
    plan = CAUSAL_QUICK if quick else CAUSAL_FULL
    clock, seconds = time.perf_counter(), {}
    corpora = write_corpora(out / "data", plan)
    teachers = pretrain_causal_teachers(out / "teachers", corpora, plan, progress)
    seconds["pretrain teachers"] = time.perf_counter() - clock
    recipe = causal_recipe(out / "merge", corpora, teachers, plan)
    clock = time.perf_counter()
    losses = {loss: (mix, plan.lambda_value) for loss, mix in CAUSAL_LOSSES.items()}
    run = train_students(recipe, loss_students(plan, losses), progress)
    seconds["store and students"] = time.perf_counter() - clock
    clock = time.perf_counter()
    bits = students_bits(run)
    summary = students_table(bits, run, CAUSAL_LOSSES, plan.seeds)
    seconds["bits per byte"] = time.perf_counter() - clock
    result = CausalDemoResult(
        plan=plan,
        quick=quick,
        run=run,
        bits=bits,
        table=causal_frame(summary),
        summary=summary,
        seconds={k: round(v, 1) for k, v in seconds.items()},
    )
    write_json_atomic(out / "causal-demo.json", result.as_dict())
    write_text_atomic(out / "causal-demo.md", result.markdown())
    return result
