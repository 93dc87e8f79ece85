"""The demo, step by step; every step is resumable, so an interrupted demo continues where it was.

1. Corpora: Wikipedia leads in English, French and Spanish (packaged, no hub).
2. One small teacher per language, each with its own WordPiece vocabulary (``pretrain``), and a
   second English teacher with real pre-trained knowledge: a packaged encoder, frozen, with a
   masked-LM head fitted here (``pretrain --head-only``).
3. MergeDistill: store, union vocabulary, and three students with the same size and steps:
   SM3 distilled on the union vocabulary, SM2 gold-only on the union vocabulary, SM1 gold-only on
   the English teacher's vocabulary alone (MergeDistill table 5).
4. Evaluation against the teachers on held-out text (RDT), and a downstream UPOS probe.
5. LMD: packaged real encoders, teachers and student on held-out English text; and per language,
   how much of each teacher the student carries (held-out R^2 both ways).
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import yaml

from lmalgebra.core.recipe_files import validate
from lmalgebra.demo.plan import FULL, LANGUAGES, QUICK, CausalPlan, DemoPlan
from lmalgebra.distill.pipeline import STAGES, run_stages
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.run.inspection import inspect_run
from lmalgebra.evaluate.distill_scores import Score, evaluate_students
from lmalgebra.sources.packaged import asset_path
from lmalgebra.storage.output_paths import check_directory, tidy_on_failure

log = logging.getLogger(__name__)
STUDENTS = {"sm3-distilled": False, "sm2-gold": True}
HEAD_TEACHER = "teacher-en-head"  # the plan's head_encoder with a fitted masked-LM head


def write_corpora(out: Path, plan: DemoPlan | CausalPlan) -> dict[str, Path]:
    """``<lang>.txt``: the first documents, for teachers and students; ``unseen-<lang>.txt``: the
    rest, which no model trains on (text for the decompositions)."""
    paths = {}
    for lang in LANGUAGES:
        path, unseen = out / f"{lang}.txt", out / f"unseen-{lang}.txt"
        if not (path.is_file() and unseen.is_file()):
            records = json.loads(asset_path(f"wiki-{lang}").read_text(encoding="utf-8"))
            docs = [
                r["extract"].replace("\n", " ").strip()
                for r in records.values()
                if isinstance(r, dict) and r.get("extract", "").strip()
            ]
            out.mkdir(parents=True, exist_ok=True)
            cut = plan.docs_per_language
            unseen.write_text("\n".join(docs[cut:]) + "\n", encoding="utf-8")
            path.write_text("\n".join(docs[:cut]) + "\n", encoding="utf-8")
        paths[lang] = path
    return paths


def pretrain_teachers(
    out: Path, corpora: dict[str, Path], plan: DemoPlan, progress: bool
) -> dict[str, Path]:
    from lmalgebra.distill.pretrain.masked import pretrain
    from lmalgebra.distill.student import StudentSpec
    from lmalgebra.sources.corpus import CorpusSpec
    from lmalgebra.train.config import TrainingSpec

    model = StudentSpec(
        hidden_size=plan.hidden_size,
        num_layers=plan.layers,
        num_heads=2,
        intermediate_size=4 * plan.hidden_size,
        max_position_embeddings=128,
    )
    training = TrainingSpec(
        steps=plan.teacher_steps,
        batch_size=plan.batch_size,
        lr=2e-3,
        warmup_steps=plan.teacher_steps // 10,
        gold_only=True,
        checkpoint_every=max(1, plan.teacher_steps // 4),
        log_every=10,
    )
    dirs = {}
    for lang, corpus in corpora.items():
        target = out / f"teacher-{lang}"
        if not (target / "lmalgebra.json").is_file():
            log.info("pre-training the %s teacher", lang)
            pretrain(
                CorpusSpec(paths=[str(corpus)], doc_sep="line"),
                lang,
                plan.teacher_vocab,
                target,
                model,
                training,
                plan.example_length,
                0.05,
                False,
                progress,
            )
        dirs[lang] = target
    return dirs


def fit_head_teacher(out: Path, corpus: Path, plan: DemoPlan, progress: bool) -> Path:
    """The second English teacher: ``plan.head_encoder`` with a masked-LM head fitted on it."""
    from lmalgebra.distill.pretrain.head_only import pretrain_head
    from lmalgebra.sources.corpus import CorpusSpec
    from lmalgebra.train.config import TrainingSpec

    target = out / HEAD_TEACHER
    if not (target / "lmalgebra.json").is_file():
        log.info("fitting a masked-LM head on %s for English", plan.head_encoder)
        training = TrainingSpec(
            steps=plan.head_steps,
            batch_size=plan.batch_size,
            lr=5e-3,
            warmup_steps=plan.head_steps // 10,
            gold_only=True,
            checkpoint_every=max(1, plan.head_steps // 2),
        )
        pretrain_head(
            CorpusSpec(paths=[str(corpus)], doc_sep="line"),
            "en",
            plan.head_encoder,
            target,
            training,
            plan.example_length,
            0.05,
            plan.head_examples,
            progress,
        )
    return target


def merge_recipe(
    out: Path,
    corpora: dict[str, Path],
    teachers: dict[str, Path],
    plan: DemoPlan,
    single_vocabulary: bool,
    head_teacher: Path | None = None,
) -> MergeRecipe:
    """The union-vocabulary recipe, or (SM1) every language tokenised by the English teacher;
    ``head_teacher`` joins the English teachers."""
    names = {lang: "en" if single_vocabulary else lang for lang in LANGUAGES}
    paths = {f"teacher-{n}": teachers[n] for n in sorted(set(names.values()))}
    teachers_of = {lang: [f"teacher-{names[lang]}"] for lang in LANGUAGES}
    if head_teacher is not None:
        paths[HEAD_TEACHER] = head_teacher
        teachers_of["en"].append(HEAD_TEACHER)
    data: dict[str, Any] = {
        "languages": {
            lang: {
                "corpus": {"paths": [str(corpora[lang])], "doc_sep": "line"},
                "teachers": teachers_of[lang],
            }
            for lang in LANGUAGES
        },
        "teachers": {name: {"path": str(path)} for name, path in paths.items()},
        "example_length": plan.example_length,
        "heldout_fraction": 0.05,
        "top_k": 8,
        "output_dir": str(out),
        "student": {
            "hidden_size": plan.hidden_size,
            "num_layers": plan.layers,
            "num_heads": 2,
            "intermediate_size": 4 * plan.hidden_size,
            "max_position_embeddings": 128,
        },
        "training": {
            "steps": plan.student_steps,
            "batch_size": plan.batch_size,
            "lr": 2e-3,
            "warmup_steps": plan.student_steps // 10,
            "lambda_schedule": "linear",
            "checkpoint_every": max(1, plan.student_steps // 4),
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return validate(MergeRecipe, data, f"{out.name}.yaml")


def merge_and_train(recipe: MergeRecipe, students: dict[str, bool], progress: bool) -> None:
    """Every MergeDistill stage; ``students``: name -> gold-only (else distilled)."""
    trainings = {
        name: recipe.training.model_copy(update={"gold_only": gold_only})
        for name, gold_only in students.items()
    }
    run_stages(recipe, STAGES, trainings, progress)


def run_demo(out: Path, quick: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run every step and write ``out/report.html``; returns the numbers the report shows (also
    written to ``demo.json``) and the report's path under ``report``.

    A demo that fails leaves the steps it finished (a rerun resumes them) and no empty directory.
    """
    from lmalgebra.report.demo_page import render

    check_directory(out, "demo output directory")
    with tidy_on_failure(out):
        result = _run_steps(out, quick, progress)
        result["report"] = str(render(result, out))
    return result


def _run_steps(out: Path, quick: bool, progress: bool) -> dict[str, Any]:
    plan = QUICK if quick else FULL
    clock, timings = time.perf_counter(), {}
    corpora = write_corpora(out / "data", plan)
    teachers = pretrain_teachers(out / "teachers", corpora, plan, progress)
    timings["pretrain teachers"] = time.perf_counter() - clock
    clock = time.perf_counter()
    head = fit_head_teacher(out / "teachers", corpora["en"], plan, progress)
    timings["fit the head-only teacher"] = time.perf_counter() - clock
    union = merge_recipe(out / "merge", corpora, teachers, plan, False, head)
    single = merge_recipe(
        out / "merge-en-vocabulary", corpora, teachers, plan, single_vocabulary=True
    )
    clock = time.perf_counter()
    merge_and_train(union, STUDENTS, progress)
    merge_and_train(single, {"sm1-gold": True}, progress)
    timings["merge and train students"] = time.perf_counter() - clock
    clock = time.perf_counter()
    scores, rdt = evaluate_students(union.output_dir, list(STUDENTS))
    sm1_scores, sm1_rdt = evaluate_students(single.output_dir, ["sm1-gold"])
    timings["evaluate"] = time.perf_counter() - clock
    result: dict[str, Any] = {
        "plan": plan.as_dict(),
        "quick": quick,
        "inspect": inspect_run(union.output_dir),
        "scores": [s.__dict__ for s in scores + sm1_scores],
        "rdt": {**rdt, **sm1_rdt},
        "findings": findings(scores, sm1_scores, rdt),
    }
    from lmalgebra.demo.analyses import downstream_pos, lmd_analyses

    clock = time.perf_counter()
    models = {
        **{f"teacher-{k}": v for k, v in teachers.items()},
        **{n: union.output_dir / n / "model" for n in STUDENTS},
        "sm1-gold": single.output_dir / "sm1-gold" / "model",
    }
    result["pos"] = downstream_pos(out / "pos", models, plan, progress)
    pos = {row["model"]: row["accuracy"] for row in result["pos"]}
    result["findings"]["3 union vocabulary beats one teacher's vocabulary"].update(
        sm2_pos_accuracy=pos["sm2-gold"],
        sm1_pos_accuracy=pos["sm1-gold"],
        holds=pos["sm2-gold"] > pos["sm1-gold"],
    )
    timings["downstream UPOS"] = time.perf_counter() - clock
    clock = time.perf_counter()
    result["lmd"] = lmd_analyses(out / "lmd", union, teachers, plan, progress)
    timings["decomposition"] = time.perf_counter() - clock
    result["seconds"] = {k: round(v, 1) for k, v in timings.items()}
    (out / "demo.json").write_text(json.dumps(result, indent=2, default=str))
    return result


def findings(
    scores: list[Score], sm1: list[Score], rdt: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The three directions of the paper's findings, measured (never asserted). Only comparable
    scores count (``Score.comparable``): SM1's French and Spanish rows, scored against the
    English-only teacher, are in the tables but in no number here."""

    def mean_accuracy(rows: list[Score], model: str) -> float:
        picked = [s.accuracy for s in rows if s.model == model and s.comparable]
        return sum(picked) / len(picked) if picked else math.nan

    per_language = {
        k: v for k, v in rdt["sm3-distilled"].items() if k != "average" and not math.isnan(v)
    }
    sm3, sm2 = mean_accuracy(scores, "sm3-distilled"), mean_accuracy(scores, "sm2-gold")
    return {
        "1 student within 5% RDT of each teacher": {
            "rdt_percent": per_language,
            "holds": bool(per_language) and all(v >= -5 for v in per_language.values()),
        },
        "2 distilled beats gold-only (same size, data, steps)": {
            "sm3_accuracy": sm3,
            "sm2_accuracy": sm2,
            "holds": sm3 > sm2,
        },
        "3 union vocabulary beats one teacher's vocabulary": {
            "note": "compared downstream (UPOS probe), where tokenisations do not matter",
            "sm1_masked_accuracy_comparable": mean_accuracy(sm1, "sm1-gold"),
        },
    }
