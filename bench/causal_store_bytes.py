"""The causal teacher stores of ``bench_causal.py``: sizes, a teacher and a student tokenizer
made with the toolkit, two stores written by the stages, and their bytes per stored teacher token
against full logits and DistillKit's published figure (quoted, not measured here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness import figure
from lmalgebra.distill import pipeline
from lmalgebra.distill.causal.inspection import CAUSAL_PARTS
from lmalgebra.distill.causal.student_model import build_causal_lm
from lmalgebra.distill.pipeline import inspect_run
from lmalgebra.distill.recipe import (
    CausalRecipe,
    CausalSpec,
    LanguageSpec,
    MergeRecipe,
    TeacherSpec,
)
from lmalgebra.distill.student import CausalStudentSpec
from lmalgebra.distill.vocab.tokenizer_trainers import train_causal_tokenizer
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.packaged import asset_path
from lmalgebra.storage.shard_formats import ArrowTables
from lmalgebra.storage.shard_set import ShardSet

DISTILLKIT = "114-300"  # bytes per token: DistillKit's published figure, quoted, not measured
LARGE_VOCAB = 128_256  # Llama 3's vocabulary: full logits at a production size


@dataclass(frozen=True)
class Sizes:
    """Sizes of a run; widths are (hidden, layers) of a GPT-2, vocabularies the tokenizers'."""

    docs: int
    example_bytes: int
    vocab: int
    teacher: tuple[int, int]
    student: tuple[int, int]
    samples: int  # tokens drawn per position in the second store
    batch: int
    steps: int
    warmup: int  # steps left out of the rates
    repeats: int  # runs of each loss, alternated
    profile_batches: int


FULL = Sizes(
    docs=600,
    example_bytes=512,
    vocab=4000,
    teacher=(128, 2),
    student=(128, 4),
    samples=8,
    batch=8,
    steps=30,
    warmup=5,
    repeats=3,
    profile_batches=8,
)
# a toy size that checks the script runs (--quick), in under a minute on two idle cores
QUICK = replace(
    FULL,
    docs=120,
    example_bytes=384,
    vocab=1000,
    teacher=(32, 2),
    student=(32, 2),
    batch=4,
    steps=8,
    warmup=2,
    repeats=1,
    profile_batches=2,
)


def model_spec(width: tuple[int, int], sizes: Sizes) -> CausalStudentSpec:
    """A GPT-2 of ``width``; positions for a whole example at one byte a token."""
    hidden, layers = width
    return CausalStudentSpec(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=max(1, hidden // 32),
        intermediate_size=4 * hidden,
        max_position_embeddings=sizes.example_bytes + 8,
        dropout=0.0,
    )


# -- the store -----------------------------------------------------------------------------------
def build_runs(
    workdir: Path, sizes: Sizes, seed: int
) -> tuple[dict[str, MergeRecipe], dict[str, float]]:
    """A teacher and a student tokenizer, then two stores written by the stages: ``topk`` (no
    drawn tokens) and ``drawn`` (``sizes.samples`` per position); the seconds of each stage."""
    corpus = CorpusSpec(paths=[str(asset_path("wiki-en"))], text_column="extract")
    texts = [d.strip() for d in read_documents(corpus)][: sizes.docs]
    positions = sizes.example_bytes + 8
    teacher_dir, student_dir = workdir / "teacher", workdir / "student"
    tokenizer = train_causal_tokenizer(texts, "unigram", sizes.vocab, positions)
    build_causal_lm(model_spec(sizes.teacher, sizes), tokenizer, seed).save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)
    # a student tokenizer is named by a model directory: any causal LM that carries it
    tokenizer = train_causal_tokenizer(texts, "bytelevel-bpe", sizes.vocab, positions)
    student = model_spec(sizes.student, sizes).model_copy(update={"tokenizer": str(student_dir)})
    build_causal_lm(student, tokenizer, seed).save_pretrained(student_dir)
    tokenizer.save_pretrained(student_dir)
    recipes, seconds = {}, {}
    for name, samples in (("topk", 0), ("drawn", sizes.samples)):
        recipes[name] = CausalRecipe(
            languages={
                "en": LanguageSpec(corpus=corpus, teachers=["teacher"], max_examples=sizes.docs)
            },
            teachers={"teacher": TeacherSpec(path=str(teacher_dir))},
            causal=CausalSpec(example_bytes=sizes.example_bytes, samples=samples, sample_seed=seed),
            output_dir=workdir / name,
            student=student,
        )
        for stage in (pipeline.prepare, pipeline.teach):
            clock = time.perf_counter()
            stage(recipes[name], progress=False)
            seconds[f"{name} {stage.__name__}"] = time.perf_counter() - clock
    return recipes, seconds


def store_bytes(recipe: MergeRecipe) -> dict[str, Any]:
    """Bytes per stored teacher token of each part (``causal.inspection.CAUSAL_PARTS``): payload
    (from ``merge inspect``) and on disk (the part's columns alone, encoded as the store's
    shards)."""
    found = inspect_run(recipe.output_dir).pairs[0]
    tokens = int(found["tokens"])
    sets = [
        ShardSet.existing(recipe.output_dir / s / "en" / "teacher") for s in ("tokens", "logprobs")
    ]
    tables = [t for shards in sets for t in shards.tables(verify=False)]
    on_disk = {}
    for part, columns in CAUSAL_PARTS.items():
        held = [t.select(list(columns)) for t in tables if set(columns) <= set(t.column_names)]
        if held:
            on_disk[part] = sum(len(ArrowTables().encode(t)) for t in held) / tokens
    return {
        "tokens": tokens,
        "examples": int(found["examples"]),
        "k": int(found["top_k"]),
        "samples": int(found["samples"]),
        "payload": {
            part: found[f"{part}_bytes_per_token"]
            for part in CAUSAL_PARTS
            if found[f"{part}_bytes_per_token"]
        },
        "on_disk": on_disk,
        "store": float(found["store_bytes_per_token"]),
        "vocab": int(sets[0].manifest["vocab_size"]),
    }


def bytes_rows(store: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """Each part (draws from the ``drawn`` store, the rest from ``topk``), the whole stores, full
    logits, DistillKit's quoted figure."""
    t, d = store["topk"], store["drawn"]
    k, draws = t["k"], d["samples"]

    def part(found: dict[str, Any], key: str, label: str) -> list[Any]:
        return [label, round(found["payload"][key], 2), round(found["on_disk"][key], 2)]

    def whole(found: dict[str, Any], label: str) -> list[Any]:
        return [label, round(sum(found["payload"].values()), 2), round(found["store"], 2)]

    def logits(entries: int, width: int, label: str) -> list[Any]:
        return [f"full logits, {label}, {entries:,} entries", entries * width, entries * width]

    return [
        part(t, "topk", f"top-k ids + fp16 log-probs (k = {k})"),
        part(d, "samples", f"drawn ids + fp16 log-probs (K = {draws})"),
        part(t, "offsets", "byte offsets (start, end)"),
        part(t, "next_logprob", "next-token log-prob (fp32)"),
        part(t, "token_ids", "token ids"),
        whole(t, f"whole store, top-{k} (`tokens/` + `logprobs/` files, with example ids)"),
        whole(d, f"whole store, top-{k} + {draws} draws"),
        logits(t["vocab"], 2, "fp16"),
        logits(t["vocab"], 4, "fp32"),
        logits(LARGE_VOCAB, 2, "fp16, Llama 3's vocabulary"),
        ["DistillKit's published figure (quoted, not measured here)", DISTILLKIT, DISTILLKIT],
    ]


def bytes_figures(store: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each whole store on disk against the teacher's full logits in fp16."""
    vocab, k = store["topk"]["vocab"], store["topk"]["k"]
    found = []
    for name, what in (("topk", f"top-{k}"), ("drawn", f"top-{k} + draws")):
        case = f"store, {what}, on disk; baseline: full fp16 logits ({vocab:,} entries)"
        found.append(figure(case, "bytes/token", 2.0 * vocab, store[name]["store"]))
        found[-1]["ratio_is"] = "lower"
    return found


def store_notes(t: dict[str, Any], seconds: dict[str, float]) -> list[str]:
    """The store's size and the seconds each stage took; DistillKit's figure, quoted."""
    return [
        f"Store: {t['examples']:,} examples, {t['tokens']:,} teacher tokens; "
        + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        + ".",
        f"DistillKit's published figure, {DISTILLKIT} bytes per token, is quoted for comparison; "
        "it is not measured here.",
    ]
