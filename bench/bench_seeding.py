"""Seeding: student token embeddings from the teachers vs random initialisation.

Two teachers pre-trained by ``lmalgebra pretrain`` on the packaged Wikipedia summaries (wiki-en,
wiki-fr; WordPiece vocabularies, BERT 2 x 128, 64-token examples, batch 32, lr 1e-3), a teacher
store of 1,500 examples per language (15% masking, top-8), and a student (BERT 2 x 128 over the
union vocabulary) trained with the recipe's training defaults (distillation with linear teacher
annealing, AdamW at 5e-4, warm-up a tenth of the steps, batch 32) on the same batches from
``init_embeddings: random`` (baseline) and ``teachers`` (ours), for three seeds, all in one process
on one thread. The yardstick is the gold masked-LM loss of each training batch (the ``mlm`` the
loop logs at every step), since the training objective itself moves from KD to MLM as the
teachers are annealed; the objective at step 0 (KD alone) is shown too. Step 0 is the first
batch before any update. Steps to reach: the first step at which ours' trailing 20-step mean falls
to the baseline's final trailing mean. Ours' time includes the seeding (loading the teachers,
fitting the maps, the priors). Targets: loss at step 0 >= 20% lower; >= 30% fewer steps to reach
the baseline's final loss.

    python bench/bench_seeding.py [--steps 200] [--teacher-steps 300] [--seeds 0,1,2] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from harness import WORK, Session, figure, goal, measure_work, parse_args, table
from lmalgebra.distill import pipeline
from lmalgebra.distill.masked.student_data import StoreBatches
from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.pretrain.masked import pretrain_masked
from lmalgebra.distill.pretrain.specs import (
    MaskedPretrainSpec,
    TeacherModelSpec,
    TeacherTrainingSpec,
    WordPieceSpec,
)
from lmalgebra.distill.recipe import LanguageSpec, MaskedRecipe, MergeRecipe, TeacherSpec
from lmalgebra.distill.student import MaskedStudentSpec
from lmalgebra.distill.vocab.union import UnionVocab
from lmalgebra.experimental.seeding import apply_seeding, seed_from_teachers, seed_rows
from lmalgebra.experimental.seeding import teacher_tables as load_tables
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train
from lmalgebra.train.losses import mlm_loss
from lmalgebra.train.masked_head import masked_logits

NAME = "bench_seeding"
MEASURED = ("src/lmalgebra/distill/masked/seeding.py", "src/lmalgebra/stats")
STEP0_TARGET = 0.20
STEPS_TARGET = 0.30
WINDOW = 20
LANGUAGES = ("en", "fr")
MODEL = MaskedStudentSpec(
    hidden_size=128,
    num_layers=2,
    num_heads=2,
    intermediate_size=512,
    max_position_embeddings=128,
)


def corpus(lang: str) -> CorpusSpec:
    return CorpusSpec(paths=[f"package:wiki-{lang}"], text_column="extract")


def make_teachers(workdir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Pre-train (or, with the same settings, reuse) the two teachers; their final losses (the
    mean of the last five logged, one every ten steps)."""
    losses = {}
    for lang in LANGUAGES:
        spec = MaskedPretrainSpec(
            corpus=corpus(lang),
            language=lang,
            out=workdir / "teachers" / lang,
            example_length=args.length,
            tokenizer=WordPieceSpec(vocab_size=args.teacher_vocab),
            model=TeacherModelSpec(**MODEL.model_dump(include=set(TeacherModelSpec.model_fields))),
            training=TeacherTrainingSpec(
                steps=args.teacher_steps,
                batch_size=32,
                lr=1e-3,
                warmup_steps=args.teacher_steps // 10,
                checkpoint_every=args.teacher_steps,
                log_every=10,
            ),
        )
        done = pretrain_masked(spec, progress=False)
        lines = (done / "training" / "train_log.jsonl").read_text().splitlines()
        losses[lang] = float(np.mean([json.loads(line)["mlm"] for line in lines[-5:]]))
    return losses


def make_store(workdir: Path, args: argparse.Namespace, init: str) -> MergeRecipe:
    languages = {
        lang: LanguageSpec(corpus=corpus(lang), teachers=[lang], max_examples=args.examples)
        for lang in LANGUAGES
    }
    recipe = MaskedRecipe(
        languages=languages,
        teachers={lang: TeacherSpec(path=str(workdir / "teachers" / lang)) for lang in LANGUAGES},
        example_length=args.length,
        output_dir=workdir / "run",
        student=MODEL.model_copy(update={"init_embeddings": init}),
    )
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    pipeline.vocab(recipe)
    return recipe


def schedule(args: argparse.Namespace, seed: int) -> TrainingSpec:
    return TrainingSpec(
        steps=args.steps,
        warmup_steps=args.steps // 10,
        log_every=1,
        checkpoint_every=args.steps,
        seed=seed,
    )


def source(recipe: MaskedRecipe, vocab: UnionVocab, spec: TrainingSpec) -> StoreBatches:
    teachers = {lang: s.teachers for lang, s in recipe.languages.items()}
    return StoreBatches(
        recipe.output_dir,
        teachers,
        vocab,
        spec.batch_size,
        spec.sampling_exponent,
        spec.multi_teacher,
        spec.seed,
    )


def one_run(recipe: MaskedRecipe, vocab: UnionVocab, seed: int, args: argparse.Namespace) -> Any:
    """The work of one training run: build (and seed) the student, train, read its log."""
    spec = schedule(args, seed)
    batches = source(recipe, vocab, spec)

    def work() -> dict[str, Any]:
        model = build_masked_lm(recipe.student, len(vocab.tokens), pad_id=0, seed=seed)
        if recipe.student.init_embeddings == "teachers":
            seed_from_teachers(model, recipe, vocab)
        with tempfile.TemporaryDirectory(dir=WORK) as out:
            train(model, batches, spec, Path(out), progress=False)
            lines = (Path(out) / "train_log.jsonl").read_text().splitlines()
        log = [json.loads(line) for line in lines]
        return {"mlm": [r["mlm"] for r in log], "loss": [r["loss"] for r in log]}

    return work


def trailing(values: list[float]) -> np.ndarray:
    """Mean of the last ``WINDOW`` values at each step from step ``WINDOW`` on."""
    return np.convolve(np.asarray(values), np.ones(WINDOW) / WINDOW, mode="valid")


def steps_to_reach(curve: list[float], level: float) -> int | None:
    """First step whose trailing mean is at most ``level``; None when never."""
    below = np.flatnonzero(trailing(curve) <= level)
    return int(below[0]) + WINDOW if below.size else None


def step0_ablation(
    recipe: MaskedRecipe, vocab: UnionVocab, args: argparse.Namespace
) -> tuple[dict[str, float], dict[str, Any]]:
    """Gold MLM loss before training (eval mode, 4 batches) of students seeded in part; the
    seeding's report."""
    seeding = seed_rows(load_tables(recipe), vocab, MODEL.hidden_size, 0.02)
    batches = [source(recipe, vocab, schedule(args, 0)).batch(i) for i in range(4)]
    parts = {
        "random": None,
        "token embeddings only": (seeding.rows, np.full_like(seeding.bias, np.nan)),
        "output prior only": (np.full_like(seeding.rows, np.nan), seeding.bias),
        "both (ours)": (seeding.rows, seeding.bias),
    }
    out = {}
    for label, part in parts.items():
        model = build_masked_lm(MODEL, len(vocab.tokens), pad_id=0, seed=0)
        if part is not None:
            apply_seeding(model, type(seeding)(part[0], part[1], {}, seeding.scale), pad_id=0)
        model.eval()
        with torch.no_grad():
            losses = [
                float(mlm_loss(masked_logits(model, b.head_inputs()), b.labels)) for b in batches
            ]
        out[label] = float(np.mean(losses))
    return out, seeding.report


def context_free_floor(
    recipe: MaskedRecipe, vocab: UnionVocab, args: argparse.Namespace, seed: int
) -> float:
    """Entropy (nats) of the gold tokens' own distribution over the training batches of ``seed``:
    no prediction that ignores the context (a student whose body is random) can score lower on
    these batches on average."""
    batches = source(recipe, vocab, schedule(args, seed))
    labels = np.concatenate([batches.batch(i).labels.numpy() for i in range(args.steps)])
    shares = np.bincount(labels) / labels.size
    shares = shares[shares > 0]
    return float(-(shares * np.log(shares)).sum())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="student training steps")
    parser.add_argument("--teacher-steps", type=int, default=300)
    parser.add_argument("--teacher-vocab", type=int, default=4000)
    parser.add_argument("--examples", type=int, default=1500, help="store examples per language")
    parser.add_argument("--length", type=int, default=64, help="example length in tokens")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument(
        "--workdir", type=Path, help="keep teachers and store here (reused by a later run)"
    )
    args = parse_args(parser, attempts=1)
    torch.set_num_threads(1)
    session = Session(NAME, MEASURED)
    WORK.mkdir(parents=True, exist_ok=True)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="seeding-", dir=WORK))
    try:
        run_all(args, workdir, session)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


def run_all(args: argparse.Namespace, workdir: Path, session: Session) -> None:
    clock = time.perf_counter()
    teacher_losses = make_teachers(workdir, args)
    setup_s = time.perf_counter() - clock
    recipes = {init: make_store(workdir, args, init) for init in ("random", "teachers")}
    vocab = UnionVocab.load(recipes["random"].output_dir / "vocab")
    print(f"teachers and store in {time.perf_counter() - clock:.0f} s", flush=True)
    ablation, report = step0_ablation(recipes["teachers"], vocab, args)
    ablation["no context, best possible (gold tokens' own unigram)"] = context_free_floor(
        recipes["random"], vocab, args, 0
    )
    print(f"step-0 losses: {ablation}", flush=True)
    seeds = [int(s) for s in args.seeds.split(",")]
    runs: dict[str, list[dict[str, Any]]] = {"random": [], "teachers": []}
    for seed in seeds:
        for init, recipe in recipes.items():
            result = measure_work(one_run(recipe, vocab, seed, args))
            runs[init].append(result)
            print(
                f"seed {seed} {init}: step 0 {result['output']['mlm'][0]:.3f}, final "
                f"{trailing(result['output']['mlm'])[-1]:.3f}, {result['seconds']:.0f} s",
                flush=True,
            )
    info = {"teachers": teacher_losses, "setup_s": setup_s, "ablation": ablation, "report": report}
    save(args, info, runs, seeds, len(vocab.tokens), session)


def save(
    args: argparse.Namespace,
    info: dict[str, Any],
    runs: dict[str, list[dict[str, Any]]],
    seeds: list[int],
    vocab_size: int,
    session: Session,
) -> None:
    base, ours = runs["random"], runs["teachers"]
    step0 = [np.mean([r["output"]["mlm"][0] for r in rs]) for rs in (base, ours)]
    objective0 = [np.mean([r["output"]["loss"][0] for r in rs]) for rs in (base, ours)]
    finals = [trailing(r["output"]["mlm"])[-1] for r in base]
    reached = [steps_to_reach(r["output"]["mlm"], f) for r, f in zip(ours, finals, strict=True)]
    steps = [args.steps if n is None else n for n in reached]  # not reached: counted as all
    lower = 1 - step0[1] / step0[0]
    lower_objective = 1 - objective0[1] / objective0[0]
    fewer = 1 - float(np.mean(steps)) / args.steps
    peak = [max(r["work_peak_rss_mib"] for r in rs) for rs in (base, ours)]
    share = [max(r["others_share"] for r in rs) for rs in (base, ours)]
    seconds = [float(np.mean([r["seconds"] for r in rs])) for rs in (base, ours)]
    loss0 = figure(
        "gold MLM loss at step 0", "nats", step0[0], step0[1], peak_mib=(peak[0], peak[1])
    )
    objective = figure(
        "training objective (KD + MLM) at step 0",
        "nats",
        objective0[0],
        objective0[1],
        peak_mib=(peak[0], peak[1]),
    )
    loss0["ratio_is"] = objective["ratio_is"] = "lower"
    figures = [
        loss0,
        objective,
        figure(
            "steps to the baseline's final loss",
            "steps",
            args.steps,
            float(np.mean(steps)),
            peak_mib=(peak[0], peak[1]),
        ),
        figure(
            "one training run (seeding included)",
            "s",
            seconds[0],
            seconds[1],
            peak_mib=(peak[0], peak[1]),
            others_share=(share[0], share[1]),
            cost=True,
        ),
    ]
    rows = []
    for seed, b, o, n in zip(seeds, base, ours, reached, strict=True):
        rows.append(
            [
                seed,
                round(b["output"]["mlm"][0], 3),
                round(o["output"]["mlm"][0], 3),
                round(b["output"]["loss"][0], 3),
                round(o["output"]["loss"][0], 3),
                round(float(trailing(b["output"]["mlm"])[-1]), 3),
                round(float(trailing(o["output"]["mlm"])[-1]), 3),
                "not reached" if n is None else n,
            ]
        )
    report = info["report"]
    alignment = "; ".join(
        f"{name} -> {report['reference']}: {a['shared_tokens']:,} shared tokens, R^2 {a['r2']}"
        for name, a in report["alignment"].items()
    )
    session.save(
        __doc__,
        {
            "teacher pre-training steps": args.teacher_steps,
            "teacher vocabularies": args.teacher_vocab,
            "examples per language": args.examples,
            "example length": args.length,
            "student steps": args.steps,
            "batch": 32,
            "union vocabulary": vocab_size,
            "seeds": len(seeds),
        },
        figures,
        targets=[
            goal(
                f"gold MLM loss at step 0 >= {STEP0_TARGET:.0%} lower",
                lower >= STEP0_TARGET,
                f"{lower:.1%}",
            ),
            goal(
                f"training objective at step 0 >= {STEP0_TARGET:.0%} lower",
                lower_objective >= STEP0_TARGET,
                f"{lower_objective:.1%}",
            ),
            goal(
                f">= {STEPS_TARGET:.0%} fewer steps to the baseline's final loss",
                fewer >= STEPS_TARGET,
                f"{fewer:.1%}",
            ),
        ],
        tables=[
            table(
                "Per seed (gold MLM loss unless named; objective = KD + MLM as trained)",
                [
                    "seed",
                    "step 0 random",
                    "step 0 ours",
                    "objective step 0 random",
                    "objective step 0 ours",
                    "final random",
                    "final ours",
                    "ours reaches random's final at step",
                ],
                rows,
            ),
            table(
                "Step 0 by part of the seeding (gold MLM, eval mode, 4 batches, seed 0; the "
                "floor over all the run's batches)",
                ["student", "gold MLM loss"],
                [[k, round(v, 3)] for k, v in info["ablation"].items()],
            ),
        ],
        notes=[
            "Teachers' final training loss: "
            + ", ".join(f"{k} {v:.2f}" for k, v in info["teachers"].items())
            + f"; teachers and store built in {info['setup_s']:.0f} s.",
            f"Seeding: reference teacher {report['reference']}; {alignment}; "
            f"{report['from_teachers']:,} tokens from the teachers, {report['from_pieces']} from "
            f"pieces, {report['random']} random.",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
