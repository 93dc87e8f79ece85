"""Training: distillation vs gold-only, and this loop vs a Hugging Face Trainer.

Student training throughput (real input tokens/s over the steps after a warm-up, each step timed
from its start to the next's, data loading included) on a two-language store built by
``lmalgebra.distill.stages`` (``wiki-en``, ``wiki-fr``, 1,500 examples each, 128 tokens, 15%
masking, top-8 from one random BERT teacher per language with its own WordPiece tokenizer).
Student: ``build_student`` BERT 4 x 256 over the union vocabulary, batch 32, 60 steps, fused
AdamW, the same initial weights and batches in every run. Baseline: ``transformers.Trainer``
masked LM on the same examples in the same order (full-vocabulary logits at every position), same
optimizer settings (fused AdamW is the Trainer's default). Ours: ``lmalgebra.train.loop.train``,
gold-only and distillation (KD + MLM), run alternately several times; the KD overhead keeps each
step's fastest timing in both modes. Each run is a fresh interpreter after an untimed 3-step run.
Targets: KD overhead <= 5%; this loop >= 2x the Trainer's tokens/s.

    python bench/bench_training.py [--steps 60] [--warmup 5] [--repeats 3] [--no-write]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch

from harness import (
    WORK,
    Session,
    fastest,
    figure,
    goal,
    parse_args,
    run_contender,
    table,
    wait_for_idle,
)
from lmalgebra.distill import stages
from lmalgebra.distill.pretrain import train_wordpiece
from lmalgebra.distill.recipe import LanguageSpec, MergeRecipe, TeacherSpec
from lmalgebra.distill.student import StudentSpec, build_student
from lmalgebra.distill.student_data import StoreBatches
from lmalgebra.distill.vocab_union import UnionVocab
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.packaged import asset_path
from lmalgebra.train.batches import Batch, BatchSource
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train
from lmalgebra.train.losses import combined_loss, mlm_loss
from lmalgebra.train.masked_head import masked_logits

NAME = "bench_training"
MEASURED = ("src/lmalgebra/distill", "src/lmalgebra/train")
KD_OVERHEAD_TARGET = 0.05
HF_TARGET = 2.0
LANGUAGES = {"en": "wiki-en", "fr": "wiki-fr"}
TEACHER = StudentSpec(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512)
STUDENT = StudentSpec(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=1024)


# -- the store ----------------------------------------------------------------------------------
def build_store(workdir: Path, args: argparse.Namespace) -> tuple[MergeRecipe, dict[str, Any]]:
    """Teachers (random BERT MLMs with their own WordPiece tokenizers), then the stages."""
    info: dict[str, Any] = {"teacher_vocab": {}}
    languages, teachers = {}, {}
    for lang, asset in LANGUAGES.items():
        corpus = CorpusSpec(paths=[str(asset_path(asset))], text_column="extract")
        texts = [d.strip() for d in read_documents(corpus)]
        tokenizer = train_wordpiece(texts, args.teacher_vocab, lowercase=False, max_length=512)
        model = build_student(TEACHER, len(tokenizer), tokenizer.pad_token_id, seed=args.seed)
        directory = workdir / f"teacher-{lang}"
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        info["teacher_vocab"][lang] = len(tokenizer)
        teachers[f"t_{lang}"] = TeacherSpec(path=str(directory))
        languages[lang] = LanguageSpec(
            corpus=corpus, teachers=[f"t_{lang}"], max_examples=args.examples
        )
    recipe = MergeRecipe(
        languages=languages,
        teachers=teachers,
        example_length=args.length,
        top_k=8,
        output_dir=workdir / "run",
    )
    clock = time.perf_counter()
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    stages.vocab(recipe)
    info["store_s"] = time.perf_counter() - clock
    return recipe, info


class TimedSource:
    """A batch source that records when each batch is asked for (= when each step starts)."""

    def __init__(self, source: BatchSource):
        self.source = source
        self.languages = source.languages
        self.calls: dict[int, float] = {}

    def batch(self, index: int) -> Any:
        self.calls.setdefault(index, time.perf_counter())
        return self.source.batch(index)


def step_rate(starts: dict[int, float], tokens: list[int], warmup: int) -> dict[str, float]:
    """Tokens/s from step-start times: steps ``warmup`` .. last-1 (each ends when the next
    starts)."""
    last = max(starts)
    seconds = starts[last] - starts[warmup]
    counted = sum(tokens[warmup:last])
    return {
        "seconds": seconds,
        "tokens": counted,
        "rate": counted / seconds,
        "durations": [starts[i + 1] - starts[i] for i in range(warmup, last)],
        "steps": last - warmup,
    }


# -- contenders ---------------------------------------------------------------------------------
def run_ours(
    source: StoreBatches, vocab_size: int, spec: TrainingSpec, out: Path
) -> tuple[dict[int, float], list[dict[str, Any]]]:
    model = build_student(STUDENT, vocab_size, pad_id=0, seed=spec.seed)
    timed = TimedSource(source)
    train(model, timed, spec, out, progress=False)
    log = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    return timed.calls, log


class MaskedExamples(torch.utils.data.Dataset):
    """Hugging Face MLM examples: input ids and labels (-100 where not masked), unpadded."""

    def __init__(self, batches: list[Batch]):
        self.items: list[tuple[torch.Tensor, torch.Tensor]] = []
        for b in batches:
            labels = torch.full_like(b.input_ids, -100)
            labels[b.rows, b.cols] = b.labels
            for row in range(b.input_ids.shape[0]):
                length = int(b.attention_mask[row].sum())
                self.items.append((b.input_ids[row, :length], labels[row, :length]))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, labels = self.items[index]
        return {"input_ids": ids, "labels": labels}


def pad_collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad to the batch's longest example (pad id 0, label -100)."""
    width = max(len(i["input_ids"]) for i in items)
    ids = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    attention = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n], labels[row, :n], attention[row, :n] = item["input_ids"], item["labels"], 1
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def run_hf(
    batches: list[Batch], vocab_size: int, spec: TrainingSpec, out: Path
) -> tuple[dict[int, float], dict[str, Any]]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    starts: dict[int, float] = {}
    seen: dict[str, Any] = {}

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            starts.setdefault(state.global_step, time.perf_counter())
            seen.setdefault("threads", torch.get_num_threads())

    model = build_student(STUDENT, vocab_size, pad_id=0, seed=spec.seed)
    arguments = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=spec.batch_size,
        max_steps=spec.steps,
        learning_rate=spec.lr,
        lr_scheduler_type="linear",
        warmup_steps=spec.warmup_steps,
        optim="adamw_torch_fused",  # the Trainer's default; our loop's AdamW is fused too
        weight_decay=spec.weight_decay,
        max_grad_norm=spec.max_grad_norm,
        train_sampling_strategy="sequential",
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        use_cpu=True,
        seed=spec.seed,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=MaskedExamples(batches),
        data_collator=pad_collate,
        callbacks=[StepClock()],
    )
    trainer.train()
    seen["optimizer"] = type(trainer.optimizer.optimizer).__name__
    return starts, seen


def same_objective(batch: Batch, vocab_size: int, seed: int) -> tuple[float, float]:
    """Initial MLM loss of the student on one batch, our way and Hugging Face's (eval mode)."""
    model = build_student(STUDENT, vocab_size, pad_id=0, seed=seed).eval()
    labels = torch.full_like(batch.input_ids, -100)
    labels[batch.rows, batch.cols] = batch.labels
    with torch.no_grad():
        ours = float(mlm_loss(masked_logits(model, batch.head_inputs()), batch.labels))
        hf = float(
            model(
                input_ids=batch.input_ids, attention_mask=batch.attention_mask, labels=labels
            ).loss
        )
    return ours, hf


def loss_cost(rows: int, vocab_size: int, batch: Batch, repeats: int = 20) -> dict[str, float]:
    """Seconds per call of ``combined_loss`` forward + backward on ``(rows, vocab)`` logits,
    without and with the KD term (the only compute the KD mode adds to a step)."""
    wait_for_idle()
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab_size, generator=generator).requires_grad_()
    labels = torch.randint(vocab_size, (rows,), generator=generator)
    k = batch.topk_ids.shape[1] if batch.topk_ids is not None else 8
    ids = torch.randint(vocab_size, (rows, k), generator=generator)
    logprobs = torch.log_softmax(torch.randn(rows, k, generator=generator), dim=-1)
    out = {}
    for key, kd in (("gold", False), ("kd", True), ("gold", False), ("kd", True)):
        clock = time.perf_counter()
        for _ in range(repeats):
            parts = combined_loss(
                logits, labels, 0.5, ids if kd else None, logprobs if kd else None
            )
            parts.total.backward()
            logits.grad = None
        out[key] = (time.perf_counter() - clock) / repeats  # second round: warm
    return out


def loop_log_rate(log: list[dict[str, Any]], tokens: list[int], warmup: int) -> float:
    """Tokens/s from the loop's own per-step timing (JSONL), steps after the warm-up."""
    seconds = counted = 0.0
    for record in log:
        step = int(record["step"]) - 1
        if step < warmup:
            continue
        rate = sum(v for k, v in record.items() if k.startswith("tokens_per_s/"))
        seconds += tokens[step] / rate
        counted += tokens[step]
    return counted / seconds


# -- a run in a fresh interpreter ---------------------------------------------------------------
def spec_of(options: dict[str, Any]) -> TrainingSpec:
    steps = options["steps"]
    return TrainingSpec(
        steps=steps,
        batch_size=options["batch_size"],
        lr=options["lr"],
        warmup_steps=min(10, steps // 4),
        log_every=1,
        checkpoint_every=steps,
        seed=options["seed"],
    )


def store_source(run_dir: Path, teachers: dict[str, list[str]], spec: TrainingSpec) -> Any:
    vocab = UnionVocab.load(run_dir / "vocab")
    source = StoreBatches(
        run_dir,
        teachers,
        vocab,
        spec.batch_size,
        spec.sampling_exponent,
        spec.multi_teacher,
        spec.seed,
    )
    return source, len(vocab.tokens)


def contender(
    which: str, run_dir: str, teachers: dict[str, list[str]], out: str, **options: Any
) -> Callable[[], dict[str, Any]]:
    """Untimed: the store's batches and a 3-step run (one-time set-up). The work: a whole run
    of ``hf``, ``gold`` or ``kd``; returns each step's start time (and our loop's own log)."""
    torch.set_num_threads(options["threads"])
    spec = spec_of(options)
    source, vocab_size = store_source(Path(run_dir), teachers, spec)
    warm = spec.model_copy(update={"steps": 3, "warmup_steps": 1, "checkpoint_every": 3})
    target = Path(out)
    if which == "hf":
        batches = [source.batch(i) for i in range(spec.steps)]
        run_hf(batches[:3], vocab_size, warm, target / "warm")

        def hf() -> dict[str, Any]:
            starts, seen = run_hf(batches, vocab_size, spec, target / "run")
            return {"starts": sorted(starts.items()), "log": None, "seen": seen}

        return hf
    run_ours(source, vocab_size, warm, target / "warm")
    spec = spec.model_copy(update={"gold_only": which == "gold"})

    def ours() -> dict[str, Any]:
        starts, log = run_ours(source, vocab_size, spec, target / "run")
        return {"starts": sorted(starts.items()), "log": log}

    return ours


def measure(which: str, tokens: list[int], options: dict[str, Any], args: Any) -> dict[str, Any]:
    """The fastest (in tokens/s) of up to ``--attempts`` runs of ``which``."""

    def run() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(dir=WORK) as out:
            result = run_contender(
                "bench_training:contender", {"which": which, "out": out, **options}
            )
        starts = {int(step): t for step, t in result["output"]["starts"]}
        rate = step_rate(starts, tokens, args.warmup)
        log = result["output"]["log"]
        own = loop_log_rate(log, tokens, args.warmup) if log else None
        return {**result, **rate, "slowness": -rate["rate"], "own": own}

    return fastest(run, args.attempts, key="slowness", label=which)


# -- main ---------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5, help="steps left out of the rates")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--length", type=int, default=128, help="example length in tokens")
    parser.add_argument("--examples", type=int, default=1500, help="examples per language")
    parser.add_argument("--teacher-vocab", type=int, default=12000)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each of our modes")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parse_args(parser, attempts=2)
    torch.set_num_threads(args.threads)
    session = Session(NAME, MEASURED)
    WORK.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="training-", dir=WORK))
    try:
        run_all(args, workdir, session)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def run_all(args: argparse.Namespace, workdir: Path, session: Session) -> None:
    recipe, info = build_store(workdir, args)
    teachers = {lang: spec.teachers for lang, spec in recipe.languages.items()}
    options = {"steps": args.steps, "batch_size": args.batch_size, "lr": args.lr}
    options |= {"seed": args.seed, "threads": args.threads}
    source, vocab_size = store_source(recipe.output_dir, teachers, spec_of(options))
    batches = [source.batch(i) for i in range(args.steps)]
    tokens = [int(b.tokens.sum()) for b in batches]
    padded = [int(b.input_ids.numel()) for b in batches]
    masked = [int(b.labels.numel()) for b in batches]
    losses = same_objective(batches[0], vocab_size, args.seed)
    print(f"store built in {info['store_s']:.0f} s; initial MLM loss {losses}", flush=True)
    loss_s = loss_cost(int(np.mean(masked)), vocab_size, batches[0])
    options |= {"run_dir": str(recipe.output_dir), "teachers": teachers}
    runs = {"hf": measure("hf", tokens, options, args)}
    tries: dict[str, list[dict[str, Any]]] = {"gold": [], "kd": []}
    for _ in range(args.repeats):  # alternating, so slow phases of the machine hit both modes
        for key in tries:
            tries[key].append(measure(key, tokens, options, args))
    runs |= {key: max(found, key=lambda r: r["rate"]) for key, found in tries.items()}
    shape = {"tokens": tokens, "padded": padded, "masked": masked, "vocab": vocab_size}
    save(args, info, runs, tries, shape, losses, loss_s, session)


def save(
    args: argparse.Namespace,
    info: dict[str, Any],
    runs: dict[str, dict[str, Any]],
    tries: dict[str, list[dict[str, Any]]],
    shape: dict[str, Any],
    losses: tuple[float, float],
    loss_s: dict[str, float],
    session: Session,
) -> None:
    fastest_steps = {k: np.min([r["durations"] for r in tries[k]], axis=0).sum() for k in tries}
    overhead = fastest_steps["kd"] / fastest_steps["gold"] - 1
    hf = runs["hf"]
    vs_hf = {k: runs[k]["rate"] / hf["rate"] for k in ("gold", "kd")}
    labels = {"hf": "baseline: HF `Trainer`", "gold": "ours: gold-only", "kd": "ours: distillation"}
    figures = [
        figure(
            labels[k].split(": ")[1],
            "tokens/s",
            hf["rate"],
            runs[k]["rate"],
            peak_mib=(hf["peak_rss_mib"], runs[k]["peak_rss_mib"]),
            others_share=(hf["others_share"], runs[k]["others_share"]),
            higher_is_better=True,
        )
        for k in ("gold", "kd")
    ]
    rows = [
        [
            labels[k],
            round(r["rate"]),
            round(r["seconds"] / r["steps"], 2),
            round(r["own"]) if r["own"] else "-",
            round(r["peak_rss_mib"]),
        ]
        for k, r in runs.items()
    ]
    masked, vocab = float(np.mean(shape["masked"])), shape["vocab"]
    kd_step = runs["kd"]["seconds"] / runs["kd"]["steps"]
    params = sum(p.numel() for p in build_student(STUDENT, vocab).parameters())
    session.save(
        __doc__,
        {
            "examples per language": args.examples,
            "example length": args.length,
            "steps": args.steps,
            "batch": args.batch_size,
            "union vocabulary": vocab,
            "student parameters": f"{params / 1e6:.1f}M",
            "runs of each of our modes": args.repeats,
        },
        figures,
        targets=[
            goal(
                f"KD overhead <= {KD_OVERHEAD_TARGET:.0%}",
                overhead <= KD_OVERHEAD_TARGET,
                f"{overhead:.1%}",
            ),
            goal(
                f"this loop >= {HF_TARGET:.1f}x the Hugging Face Trainer",
                min(vs_hf.values()) >= HF_TARGET,
                f"{vs_hf['gold']:.2f}x gold-only, {vs_hf['kd']:.2f}x distillation",
            ),
        ],
        tables=[
            table(
                "Runs",
                ["run", "tokens/s", "s/step", "loop's own log (tokens/s)", "peak RSS (MiB)"],
                rows,
            )
        ],
        notes=[
            "Whole runs vary: gold-only "
            + ", ".join(f"{r['rate']:,.0f}" for r in tries["gold"])
            + ", distillation "
            + ", ".join(f"{r['rate']:,.0f}" for r in tries["kd"])
            + " tokens/s.",
            f"The KD term alone on {masked:,.0f} x {vocab:,} logits: loss forward + backward "
            f"{1e3 * loss_s['gold']:.0f} ms gold-only vs {1e3 * loss_s['kd']:.0f} ms with KD, "
            f"{(loss_s['kd'] - loss_s['gold']) / kd_step:.1%} of a distillation step.",
            f"The Trainer projects all {np.mean(shape['padded']):,.0f} positions of a batch onto "
            f"the vocabulary, ours the {masked:,.0f} masked ones.",
            f"Same objective: initial MLM loss on batch 0 is {losses[0]:.5f} ours vs "
            f"{losses[1]:.5f} Hugging Face; the store took {info['store_s']:.0f} s to build.",
        ],
        write=not args.no_write,
    )


if __name__ == "__main__":
    main()
