"""The demo, step by step, through the Python API; every step is resumable, so an interrupted demo
continues where it was.

1. Corpora: Wikipedia leads in English, French and Spanish (packaged, no hub).
2. One small teacher per language, each with its own WordPiece vocabulary (``pretrain``), and a
   second English teacher with real pre-trained knowledge: a packaged encoder, frozen, with a
   masked-LM head fitted here (``pretrain`` of a ``HeadOnlySpec``).
3. MergeDistill: store, union vocabulary, and three students with the same size and steps:
   SM3 distilled on the union vocabulary, SM2 gold-only on the union vocabulary, SM1 gold-only on
   the English teacher's vocabulary alone (MergeDistill table 5).
4. Evaluation against the teachers on held-out text (RDT), and a downstream UPOS probe.
5. LMD: packaged real encoders, teachers and student on held-out English text; and per language,
   how much of each teacher the student carries (held-out R^2 both ways).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd
import yaml

from lmalgebra.api.decompose import read_texts
from lmalgebra.api.merge import MergeRun, merge, recipe_of
from lmalgebra.api.pretrain import HeadOnlySpec, MaskedPretrainSpec, pretrain
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import read_json_object
from lmalgebra.demo.plan import FULL, LANGUAGES, QUICK, CausalPlan, DemoPlan, RealPlan
from lmalgebra.demo.side_by_side import processes, side_by_side
from lmalgebra.storage.atomic import write_json_atomic, write_text_atomic
from lmalgebra.storage.lockfile import (
    held_by_parent,
    holder_record,
    run_directory_lock,
)
from lmalgebra.storage.output_paths import (
    DEMO_PLAN,
    LOCK_NAME,
    check_directory,
    output_at,
    tidy_on_failure,
)

if TYPE_CHECKING:
    from lmalgebra.api.merge import RunInspection
    from lmalgebra.demo.analyses import LmdFindings

Result = TypeVar("Result")
STUDENTS = {"sm3-distilled": False, "sm2-gold": True}
HEAD_TEACHER = "teacher-en-head"  # the plan's head_encoder with a fitted masked-LM head


def run_workflow(
    out: Path, steps: Callable[[], Result], identity: Mapping[str, Any] | None = None
) -> Result:
    """``steps()``'s result, with ``out`` checked first; a failure leaves the steps finished
    (a rerun resumes them) and no empty directory (the one failure clean-up of the demos and
    the experiments).

    ``identity``: which demo at which sizes (``{"demo": ..., "plan": ...}``), recorded in
    ``out/demo-plan.json`` before any step. A directory recording another one is refused before
    anything is written: its corpora, teachers and runs would be taken as this demo's (the steps
    resume what they find), and a directory holding another kind of lmalgebra output too. A
    demo holds ``out``'s lock throughout: a second demo there is refused at once, naming the
    holder (it had run until the first step the two shared).
    """
    if identity is None:
        check_directory(out, "output directory")
        with tidy_on_failure(out):
            return steps()
    with run_directory_lock(out, "demo"):
        _check_demo_directory(out, identity)
        write_text_atomic(out / DEMO_PLAN, json.dumps(identity, indent=2) + "\n")
        return steps()


def _check_demo_directory(out: Path, identity: Mapping[str, Any]) -> None:
    marker = out / DEMO_PLAN
    if not (marker.exists() or marker.is_symlink()):
        if out.is_dir():
            _refuse_foreign(out)
        return
    recorded = read_json_object(marker, "the demo's record")
    wanted = json.loads(json.dumps(identity))  # as the file holds it: tuples become lists
    if recorded != wanted:
        held, asked = (f"the {d.get('demo', 'another')} demo" for d in (recorded, wanted))
        what = f"{held} at other sizes" if held == asked else f"{held}, not {asked}"
        raise UserInputError(
            f"{out} holds {what} ({DEMO_PLAN}): its steps would be taken as this one's; give "
            "--out another directory, or remove it"
        )


def _refuse_foreign(out: Path) -> None:
    """Refuse a directory that records no demo and holds files of the user's: the steps take
    what they find as their own (a ``data/en.txt`` of the user's had been replaced by the
    demo's corpus, a ``report.html`` by its page). Other lmalgebra outputs may be there (the
    other demos' default directories under ``demo-output``), and so may the lock and the
    temporary of a ``demo-plan.json`` whose write was killed."""
    ours = (LOCK_NAME, f".{DEMO_PLAN}.tmp-*")
    found = sorted(
        p.name + "/" * p.is_dir()
        for p in out.iterdir()
        if not any(p.match(name) for name in ours) and output_at(p) is None
    )
    if found:
        more = f" and {len(found) - 3} more" if len(found) > 3 else ""
        raise UserInputError(
            f"{out} is not empty and holds no demo ({', '.join(found[:3])}{more}; no "
            f"{DEMO_PLAN}): the demo's steps would take those files as their own or replace "
            "them; give --out a new or empty directory"
        )


def write_corpora(out: Path, plan: DemoPlan | CausalPlan | RealPlan) -> dict[str, Path]:
    """``<lang>.txt``: the first documents, for teachers and students; ``unseen-<lang>.txt``: the
    rest, which no model trains on (text for the decompositions). Each written whole or not at
    all: one killed as it was written had been taken, cut, as the corpus."""
    paths = {}
    for lang in LANGUAGES:
        path, unseen = out / f"{lang}.txt", out / f"unseen-{lang}.txt"
        if not (path.is_file() and unseen.is_file()):
            texts = read_texts(f"package:wiki-{lang}", text_column="extract")
            docs = [t.replace("\n", " ").strip() for t in texts]
            cut = plan.docs_per_language
            write_text_atomic(unseen, "\n".join(docs[cut:]) + "\n")
            write_text_atomic(path, "\n".join(docs[:cut]) + "\n")
        paths[lang] = path
    return paths


def corpus_entry(path: Path) -> dict[str, Any]:
    """A recipe's ``corpus`` of one of :func:`write_corpora`'s files (a document a line)."""
    return {"paths": [str(path)], "doc_sep": "line"}


def write_recipe(out: Path, data: dict[str, Any]) -> dict[str, Any]:
    """``data``, a merge recipe of run directory ``out``, written beside it as ``<out>.yaml``."""
    out.mkdir(parents=True, exist_ok=True)
    (out.parent / f"{out.name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return data


def _training(plan: DemoPlan, steps: int, lr: float, checkpoints: int) -> dict[str, Any]:
    return {
        "steps": steps,
        "batch_size": plan.batch_size,
        "lr": lr,
        "warmup_steps": steps // 10,
        "checkpoint_every": max(1, steps // checkpoints),
    }


def _model(plan: DemoPlan) -> dict[str, Any]:
    """Teachers' and students' sizes."""
    return {
        "hidden_size": plan.hidden_size,
        "num_layers": plan.layers,
        "num_heads": 2,
        "intermediate_size": 4 * plan.hidden_size,
        "max_position_embeddings": 128,
    }


def teacher_specs(
    out: Path, corpora: dict[str, Path], plan: DemoPlan
) -> dict[str, MaskedPretrainSpec | HeadOnlySpec]:
    """``teacher-<lang>``: a small BERT and its WordPiece vocabulary per language; and
    :data:`HEAD_TEACHER`, the second English teacher: ``plan.head_encoder`` with a masked-LM head
    fitted on it."""
    training = {**_training(plan, plan.teacher_steps, 2e-3, 4), "log_every": 10}
    specs: dict[str, MaskedPretrainSpec | HeadOnlySpec] = {}
    for lang, corpus in corpora.items():
        specs[f"teacher-{lang}"] = MaskedPretrainSpec.model_validate(
            {
                "corpus": corpus_entry(corpus),
                "language": lang,
                "out": out / f"teacher-{lang}",
                "example_length": plan.example_length,
                "tokenizer": {"vocab_size": plan.teacher_vocab},
                "model": _model(plan),
                "training": training,
            }
        )
    specs[HEAD_TEACHER] = HeadOnlySpec.model_validate(
        {
            "corpus": corpus_entry(corpora["en"]),
            "language": "en",
            "out": out / HEAD_TEACHER,
            "encoder": plan.head_encoder,
            "example_length": plan.example_length,
            "max_examples": plan.head_examples,
            "training": _training(plan, plan.head_steps, 5e-3, 2),
        }
    )
    return specs


def pretrain_teachers(
    out: Path, corpora: dict[str, Path], plan: DemoPlan, progress: bool
) -> dict[str, Path]:
    """Every teacher of :func:`teacher_specs`, side by side (``side_by_side``), by name."""
    specs = teacher_specs(out, corpora, plan)
    bars = progress and processes(len(specs)) == 1
    return side_by_side({name: (_pretrain, (spec, bars)) for name, spec in specs.items()})


def _pretrain(spec: MaskedPretrainSpec | HeadOnlySpec, progress: bool) -> Path:
    return pretrain(spec, progress, keep_saved=True)


def merge_recipe(
    out: Path,
    corpora: dict[str, Path],
    teachers: dict[str, Path],
    plan: DemoPlan,
    single_vocabulary: bool,
    head_teacher: Path | None = None,
) -> dict[str, Any]:
    """The union-vocabulary recipe, or (SM1) every language tokenised by the English teacher;
    ``head_teacher`` joins the English teachers. Written beside ``out`` as ``<out>.yaml``."""
    names = {lang: "en" if single_vocabulary else lang for lang in LANGUAGES}
    paths = {f"teacher-{n}": teachers[n] for n in sorted(set(names.values()))}
    teachers_of = {lang: [f"teacher-{names[lang]}"] for lang in LANGUAGES}
    if head_teacher is not None:
        paths[HEAD_TEACHER] = head_teacher
        teachers_of["en"].append(HEAD_TEACHER)
    data: dict[str, Any] = {
        "languages": {
            lang: {"corpus": corpus_entry(corpora[lang]), "teachers": teachers_of[lang]}
            for lang in LANGUAGES
        },
        "teachers": {name: {"path": str(path)} for name, path in paths.items()},
        "example_length": plan.example_length,
        "heldout_fraction": 0.05,
        "top_k": 8,
        "output_dir": str(out),
        "student": _model(plan),
        "training": {**_training(plan, plan.student_steps, 2e-3, 4), "lambda_schedule": "linear"},
    }
    return write_recipe(out, data)


def merge_and_train(
    recipe: dict[str, Any], students: dict[str, bool], progress: bool, threads: int | None = None
) -> MergeRun:
    """Every MergeDistill stage, then the students evaluated; ``students``: name -> gold-only
    (else distilled). Students already saved are kept.

    The students of the run train side by side (``side_by_side``, ``threads`` shared out among
    them), under the run directory's lock, which this process holds while they train: a demo
    student trains at 57-66% of its two-thread speed on one thread, so two one-thread processes
    train two students sooner than one after the other (the union run's two: 357 s, against
    506 s in turn before the masked head's 8% saving; 290 s since freed memory is reused;
    2 cores). The demo's two merge runs go one after the other: the union run has twice the
    single run's work, and alone on one thread it outlasted both runs in turn."""
    trainings = {name: {"gold_only": gold_only} for name, gold_only in students.items()}
    if processes(len(students), threads) < 2:
        return merge(recipe, students=trainings, keep_saved=True, progress=progress)
    merge(recipe, ["prepare", "teach", "vocab"], progress=progress)
    run_dir = recipe_of(recipe).output_dir
    with run_directory_lock(run_dir, "merge train"):
        recorded = holder_record(run_dir) is not None  # not where the file system has no locks
        jobs = {
            name: (_train, (recipe, name, t, run_dir, recorded)) for name, t in trainings.items()
        }
        side_by_side(jobs, threads)
    return merge(
        recipe, ["train", "evaluate"], students=trainings, keep_saved=True, progress=progress
    )


def _train(
    recipe: dict[str, Any], name: str, training: dict[str, Any], run_dir: Path, recorded: bool
) -> None:
    """One student of :func:`merge_and_train`, in a job process, under its parent's lock."""
    with held_by_parent(run_dir, recorded):
        merge(recipe, ["train"], students={name: training}, keep_saved=True)


@dataclass(frozen=True)
class Finding:
    """One of the paper's findings, measured (never asserted): its ``claim``, whether it holds
    (None: not measured) and the figures behind it."""

    claim: str
    holds: bool | None
    figures: dict[str, Any]

    @classmethod
    def of(cls, found: Mapping[str, Any]) -> Finding:
        figures = {k: v for k, v in found.items() if k not in ("claim", "holds")}
        return cls(found["claim"], found.get("holds"), figures)

    def as_dict(self) -> dict[str, Any]:
        return {"claim": self.claim, **self.figures, "holds": self.holds}


@dataclass(frozen=True)
class DemoResult:
    """What the demo measured.

    Attributes:
        plan: the sizes it ran at; quick: whether the quick plan.
        run: the union-vocabulary merge run (SM3 distilled, SM2 gold-only); single_run: SM1's,
            every language in the English teacher's vocabulary.
        inspection: what the union run's store holds.
        scores: held-out masked-token scores of both runs (``MergeRun.scores``'s columns).
        rdt: RDT per student and language (``MergeRun.rdt``'s table, both runs).
        findings: key -> the paper's finding, measured.
        pos: the downstream UPOS probe per model (accuracy, macro_f1, majority_accuracy,
            train_sentences, test_words).
        lmd: the decompositions (``LmdFindings``).
        seconds: wall time of each step; report: the HTML report.
    """

    plan: DemoPlan
    quick: bool
    run: MergeRun
    single_run: MergeRun
    inspection: RunInspection
    scores: pd.DataFrame
    rdt: pd.DataFrame
    findings: dict[str, Finding]
    pos: pd.DataFrame
    lmd: LmdFindings
    seconds: dict[str, float]
    report: Path

    def as_dict(self) -> dict[str, Any]:
        """Plain values (``demo.json``; what the report renders)."""
        return {
            "plan": self.plan.as_dict(),
            "quick": self.quick,
            "inspect": self.inspection.as_dict(),
            "scores": list(self.scores.to_dict("records")),
            "rdt": rdt_dict(self.rdt),
            "findings": {k: f.as_dict() for k, f in self.findings.items()},
            "pos": list(self.pos.to_dict("records")),
            "lmd": self.lmd.as_dict(),
            "seconds": self.seconds,
            "report": str(self.report),
        }


def run_demo(out: Path, quick: bool = False, progress: bool = True) -> DemoResult:
    """Run every step and write ``out/report.html``; returns what it measured (also written to
    ``demo.json``).

    A demo that fails leaves the steps it finished (a rerun resumes them) and no empty directory.
    """
    plan = QUICK if quick else FULL
    identity = {"demo": "quick masked" if quick else "masked", "plan": plan.as_dict()}
    return run_workflow(out, lambda: _run_steps(out, quick, progress), identity)


def _run_steps(out: Path, quick: bool, progress: bool) -> DemoResult:
    from lmalgebra.demo.analyses import downstream_pos, lmd_analyses
    from lmalgebra.report.demo_page import render

    plan = QUICK if quick else FULL
    clock, timings = time.perf_counter(), {}
    corpora = write_corpora(out / "data", plan)
    trained = pretrain_teachers(out / "teachers", corpora, plan, progress)
    teachers = {lang: trained[f"teacher-{lang}"] for lang in corpora}
    timings["pretrain teachers (with the head-only teacher)"] = time.perf_counter() - clock
    union = merge_recipe(out / "merge", corpora, teachers, plan, False, trained[HEAD_TEACHER])
    single = merge_recipe(
        out / "merge-en-vocabulary", corpora, teachers, plan, single_vocabulary=True
    )
    clock = time.perf_counter()
    union_run = merge_and_train(union, STUDENTS, progress)
    single_run = merge_and_train(single, {"sm1-gold": True}, progress)
    timings["merge, train and evaluate students"] = time.perf_counter() - clock
    assert union_run.scores is not None and single_run.scores is not None  # merge() evaluated
    assert union_run.rdt is not None and single_run.rdt is not None
    rdt = pd.concat([union_run.rdt, single_run.rdt])
    found = findings(
        list(union_run.scores.to_dict("records")),
        list(single_run.scores.to_dict("records")),
        rdt_dict(rdt),
    )
    clock = time.perf_counter()
    models = {
        **{f"teacher-{k}": v for k, v in teachers.items()},
        **union_run.students,
        **single_run.students,
    }
    pos_table = downstream_pos(out / "pos", models, plan, progress)
    pos = dict(zip(pos_table["model"], pos_table["accuracy"], strict=True))
    found["union_vocabulary"].update(
        sm2_pos_accuracy=pos["sm2-gold"],
        sm1_pos_accuracy=pos["sm1-gold"],
        holds=pos["sm2-gold"] > pos["sm1-gold"],
    )
    timings["downstream UPOS"] = time.perf_counter() - clock
    clock = time.perf_counter()
    lmd = lmd_analyses(out / "lmd", union_run, teachers, plan, progress)
    timings["decomposition"] = time.perf_counter() - clock
    result = DemoResult(
        plan=plan,
        quick=quick,
        run=union_run,
        single_run=single_run,
        inspection=union_run.inspect(),
        scores=pd.concat([union_run.scores, single_run.scores], ignore_index=True),
        rdt=rdt,
        findings={k: Finding.of(v) for k, v in found.items()},
        pos=pos_table,
        lmd=lmd,
        seconds={k: round(v, 1) for k, v in timings.items()},
        report=out / "report.html",
    )
    plain = result.as_dict()
    render(plain, out)
    write_json_atomic(out / "demo.json", plain)
    return result


def rdt_dict(rdt: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``MergeRun.rdt``'s table as student -> language (and ``average``) -> RDT."""
    return {str(k): dict(v) for k, v in rdt.to_dict("index").items()}


def findings(
    scores: list[dict[str, Any]], sm1: list[dict[str, Any]], rdt: dict[str, dict[str, float]]
) -> dict[str, Any]:
    """The three directions of the paper's findings, measured (never asserted), each with its
    ``claim``. Only comparable scores count (``comparable``): SM1's French and Spanish rows,
    scored against the English-only teacher, are in the tables but in no number here."""

    def mean_accuracy(rows: list[dict[str, Any]], model: str) -> float:
        picked = [s["accuracy"] for s in rows if s["model"] == model and s["comparable"]]
        return sum(picked) / len(picked) if picked else math.nan

    per_language = {
        k: v for k, v in rdt["sm3-distilled"].items() if k != "average" and not math.isnan(v)
    }
    sm3, sm2 = mean_accuracy(scores, "sm3-distilled"), mean_accuracy(scores, "sm2-gold")
    return {
        "rdt_within_5_percent": {
            "claim": "Student within 5% RDT of each teacher",
            "rdt_percent": per_language,
            "holds": bool(per_language) and all(v >= -5 for v in per_language.values()),
        },
        "distilled_beats_gold_only": {
            "claim": "Distilled beats gold-only (same size, data, steps)",
            "sm3_accuracy": sm3,
            "sm2_accuracy": sm2,
            "holds": sm3 > sm2,
        },
        "union_vocabulary": {
            "claim": "Union vocabulary beats one teacher's vocabulary",
            "note": "compared downstream (UPOS probe), where tokenisations do not matter",
            "sm1_masked_accuracy_comparable": mean_accuracy(sm1, "sm1-gold"),
        },
    }
