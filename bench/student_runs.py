"""What the student-training benchmarks share: the two-language store the stages build from
random teachers, the loop's settings and batch source over it, and throughput from the time each
step starts."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from lmalgebra.distill import pipeline
from lmalgebra.distill.masked.student_data import StoreBatches
from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.recipe import LanguageSpec, MaskedRecipe, MergeRecipe, TeacherSpec
from lmalgebra.distill.student import MaskedStudentSpec
from lmalgebra.distill.vocab.tokenizer_trainers import train_wordpiece
from lmalgebra.distill.vocab.union import UnionVocab
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.packaged import asset_path
from lmalgebra.train.batches import BatchSource
from lmalgebra.train.config import TrainingSpec

LANGUAGES = {"en": "wiki-en", "fr": "wiki-fr"}
TEACHER = MaskedStudentSpec(hidden_size=128, num_layers=2, num_heads=2, intermediate_size=512)


def build_store(workdir: Path, args: argparse.Namespace) -> tuple[MergeRecipe, dict[str, Any]]:
    """Teachers (random BERT MLMs with their own WordPiece tokenizers), then the stages."""
    info: dict[str, Any] = {"teacher_vocab": {}}
    languages, teachers = {}, {}
    for lang, asset in LANGUAGES.items():
        corpus = CorpusSpec(paths=[str(asset_path(asset))], text_column="extract")
        texts = [d.strip() for d in read_documents(corpus)]
        tokenizer = train_wordpiece(texts, args.teacher_vocab, lowercase=False, max_length=512)
        model = build_masked_lm(TEACHER, len(tokenizer), tokenizer.pad_token_id, seed=args.seed)
        directory = workdir / f"teacher-{lang}"
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
        info["teacher_vocab"][lang] = len(tokenizer)
        teachers[f"t_{lang}"] = TeacherSpec(path=str(directory))
        languages[lang] = LanguageSpec(
            corpus=corpus, teachers=[f"t_{lang}"], max_examples=args.examples
        )
    recipe = MaskedRecipe(
        languages=languages,
        teachers=teachers,
        example_length=args.length,
        top_k=8,
        output_dir=workdir / "run",
    )
    clock = time.perf_counter()
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    pipeline.vocab(recipe)
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
