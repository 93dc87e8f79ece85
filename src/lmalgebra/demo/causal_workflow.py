"""``demo --causal``: cross-tokenizer distillation of causal LMs, offline, step by step; every step
resumes, so an interrupted demo continues where it was.

1. Corpora: Wikipedia leads in English, French and Spanish (packaged, no hub).
2. One causal teacher per language, each with its own tokenizer kind and size
   (``pretrain --causal``).
3. The causal teacher store (prepare, teach), then one student per loss (CE only, MinED-KL, ULD,
   ALM) and seed, with the English teacher's tokenizer, equal steps and data.
4. Held-out bits per byte of teachers and students; the table (``causal-demo.md``/``.json``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from lmalgebra.core.recipe_files import validate
from lmalgebra.demo.causal_table import causal_markdown, causal_table, student_name
from lmalgebra.demo.plan import CAUSAL_FULL, CAUSAL_LOSSES, CAUSAL_QUICK, CausalPlan
from lmalgebra.demo.workflow import write_corpora
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.student import StudentSpec
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.output_paths import check_directory

log = logging.getLogger(__name__)


def model_spec(plan: CausalPlan) -> StudentSpec:
    """Teachers' and students' sizes; positions enough for a whole example at one byte a token."""
    return StudentSpec(
        hidden_size=plan.hidden_size,
        num_layers=plan.layers,
        num_heads=2,
        intermediate_size=4 * plan.hidden_size,
        max_position_embeddings=plan.example_bytes + 8,
        dropout=0.0,
    )


def pretrain_causal_teachers(
    out: Path, corpora: dict[str, Path], plan: CausalPlan, progress: bool
) -> dict[str, Path]:
    """``teacher-<lang>`` directories, each with its own tokenizer kind and size."""
    from lmalgebra.distill.pretrain.causal import pretrain_causal
    from lmalgebra.sources.corpus import CorpusSpec
    from lmalgebra.train.config import TrainingSpec

    training = TrainingSpec(
        steps=plan.teacher_steps,
        batch_size=plan.batch_size,
        lr=3e-3,
        warmup_steps=plan.teacher_steps // 10,
        gold_only=True,
        checkpoint_every=max(1, plan.teacher_steps // 4),
        log_every=10,
    )
    dirs = {}
    for lang, kind, vocab in plan.teachers:
        target = out / f"teacher-{lang}"
        if not (target / "lmalgebra.json").is_file():
            log.info("pre-training the %s teacher (%s, %d tokens)", lang, kind, vocab)
            pretrain_causal(
                CorpusSpec(paths=[str(corpora[lang])], doc_sep="line"),
                lang,
                kind,
                vocab,
                target,
                model_spec(plan),
                training,
                plan.teacher_window,
                plan.heldout_fraction,
                progress,
            )
        dirs[lang] = target
    return dirs


def causal_recipe(
    out: Path, corpora: dict[str, Path], teachers: dict[str, Path], plan: CausalPlan
) -> MergeRecipe:
    """One causal recipe: each language with its teacher; the student with ``student_tokenizer``."""
    data: dict[str, Any] = {
        "objective": "causal",
        "languages": {
            lang: {
                "corpus": {"paths": [str(corpora[lang])], "doc_sep": "line"},
                "teachers": [f"teacher-{lang}"],
            }
            for lang in teachers
        },
        "teachers": {f"teacher-{lang}": {"path": str(p)} for lang, p in teachers.items()},
        "causal": {"example_bytes": plan.example_bytes, "samples": 0},
        "heldout_fraction": plan.heldout_fraction,
        "top_k": plan.top_k,
        "output_dir": str(out),
        "student": {
            **model_spec(plan).model_dump(exclude_none=True),
            "tokenizer": plan.student_tokenizer,
        },
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
    out.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return validate(MergeRecipe, data, f"{out.name}.yaml")


def train_students(recipe: MergeRecipe, plan: CausalPlan, progress: bool) -> list[str]:
    """Store, then one student per loss and seed (same steps, data and lambda); their names."""
    from lmalgebra.distill import stages
    from lmalgebra.distill.masked.training import train_student

    stages.prepare(recipe, progress)
    stages.teach(recipe, progress)
    names = []
    for loss, mix in CAUSAL_LOSSES.items():
        for seed in plan.seeds:
            name = student_name(loss, seed)
            if not (recipe.output_dir / name / "model" / "lmalgebra.json").is_file():
                log.info("training student %s", name)
                spec = recipe.training.model_copy(update={"objective_mix": mix, "seed": seed})
                train_student(recipe, name, spec, progress)
            names.append(name)
    return names


def students_table(
    recipe: MergeRecipe, names: list[str], losses: Iterable[str], seeds: Iterable[int]
) -> dict[str, Any]:
    """Held-out bits per byte of the recipe's teachers (``teacher-LANG``) and of the students
    ``names`` (``student_name(loss, seed)`` for each of ``losses`` and ``seeds``), as the
    demo's table (``causal_table``)."""
    from lmalgebra.evaluate.bits_per_byte import evaluate_bits

    refs = [spec.ref(name) for name, spec in recipe.teachers.items()]
    refs += [ModelRef(name=n, path=str(recipe.output_dir / n / "model")) for n in names]
    rows = evaluate_bits(recipe.output_dir, refs)
    return causal_table(
        [(r.language, r.model, r.bits_per_byte) for r in rows],
        {lang: f"teacher-{lang}" for lang in recipe.languages},
        losses,
        seeds,
    )


def run_causal_demo(out: Path, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run every step; returns the table (also ``causal-demo.json`` and ``causal-demo.md``)."""
    check_directory(out, "demo output directory")
    plan = CAUSAL_QUICK if quick else CAUSAL_FULL
    clock, seconds = time.perf_counter(), {}
    corpora = write_corpora(out / "data", plan)
    teachers = pretrain_causal_teachers(out / "teachers", corpora, plan, progress)
    seconds["pretrain teachers"] = time.perf_counter() - clock
    recipe = causal_recipe(out / "merge", corpora, teachers, plan)
    clock = time.perf_counter()
    names = train_students(recipe, plan, progress)
    seconds["store and students"] = time.perf_counter() - clock
    clock = time.perf_counter()
    table = students_table(recipe, names, CAUSAL_LOSSES, plan.seeds)
    seconds["bits per byte"] = time.perf_counter() - clock
    result = {
        "plan": plan.as_dict(),
        "quick": quick,
        "student_tokenizer": plan.student_tokenizer,
        **table,
        "seconds": {k: round(v, 1) for k, v in seconds.items()},
    }
    write_text_atomic(out / "causal-demo.json", json.dumps(result, indent=2, default=str))
    write_text_atomic(out / "causal-demo.md", causal_markdown(table))
    return result
