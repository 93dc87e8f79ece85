"""The top-k store of ``bench_teacher_inference.py``: written by ``pipeline.prepare`` and
``pipeline.teach`` (the small BERT as teacher), its bytes per masked token part by part against
naive storage and FuseLLM's (quoted, not measured here)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from harness import goal, table
from lmalgebra.distill.recipe import LanguageSpec, MaskedRecipe, TeacherSpec
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.storage.arrow_columns import id_dtype
from teacher_topk import SHAPES, build_model

BYTES_TARGET = 40.0
NAIVE_BYTES = 48  # int32 id + fp16 value per entry, k = 8
FUSELLM_BYTES = 100  # per token per teacher, as quoted in the target


def store_bytes(workdir: Path, tokenizer: Any, wiki: Path, docs: int, seed: int) -> dict[str, Any]:
    """Build a real store with the stages; bytes per masked token of its parts."""
    from lmalgebra.distill import pipeline
    from lmalgebra.storage.shard_set import ShardSet

    teacher_dir = workdir / "teacher"
    model = build_model(SHAPES["small BERT"], len(tokenizer), seed)
    model.save_pretrained(teacher_dir)
    tokenizer.save_pretrained(teacher_dir)
    del model
    recipe = MaskedRecipe(
        languages={
            "en": LanguageSpec(
                corpus=CorpusSpec(paths=[str(wiki)], text_column="extract"),
                teachers=["bert"],
                max_examples=docs,
            )
        },
        teachers={"bert": TeacherSpec(path=str(teacher_dir))},
        output_dir=workdir / "run",
    )
    clock = time.perf_counter()
    pipeline.prepare(recipe, progress=False)
    prepare_s = time.perf_counter() - clock
    clock = time.perf_counter()
    pipeline.teach(recipe, progress=False)
    teach_s = time.perf_counter() - clock
    run = recipe.output_dir
    examples = ShardSet.existing(run / "examples" / "en")
    masked = ShardSet.existing(run / "masked" / "en" / "bert")
    topk = ShardSet.existing(run / "topk" / "en" / "bert")
    tokens = int(masked.manifest["masked_tokens"])
    tables = topk.tables()
    payload = sum(
        t.column(c).combine_chunks().values.nbytes
        for t in tables
        for c in ("topk_ids", "topk_logprobs")
    )
    input_tokens = sum(
        len(t.column("input_ids").combine_chunks().values) for t in masked.tables(verify=False)
    )

    def on_disk(shards: ShardSet) -> int:
        return sum(p.stat().st_size for p in shards.directory.glob("shard-*.arrow"))

    return {
        "examples": examples.rows,
        "heldout": int(examples.manifest.get("heldout", 0)),
        "shards": len(topk.manifest["shards"]),
        "masked_tokens": tokens,
        "input_tokens": input_tokens,
        "k": int(topk.manifest["top_k"]),
        "id_bytes": id_dtype(len(tokenizer)).itemsize,
        "payload": payload,
        "topk_file": on_disk(topk),
        "masked_file": on_disk(masked),
        "examples_file": on_disk(examples),
        "prepare_s": prepare_s,
        "teach_s": teach_s,
    }


def store_table(s: dict[str, Any]) -> tuple[float, list[list[Any]]]:
    """Bytes per masked token of the top-k files, and the table's rows."""
    n = s["masked_tokens"]
    topk = s["topk_file"] / n
    nominal = s["k"] * (s["id_bytes"] + 2)
    return topk, [
        [
            f"top-k payload (uint{8 * s['id_bytes']} ids + fp16 log-probs, k = {s['k']}; nominal "
            f"{nominal})",
            round(s["payload"] / n, 1),
        ],
        ["top-k Arrow files on disk (`topk/`)", round(topk, 1)],
        ["masked inputs on disk (`masked/`)", round(s["masked_file"] / n, 1)],
        ["whole store (`masked/` + `topk/`)", round((s["topk_file"] + s["masked_file"]) / n, 1)],
        ["(info) example text (`examples/`)", round(s["examples_file"] / n, 1)],
        [f"naive: int32 ids + fp16 values, k = {s['k']}", NAIVE_BYTES],
        ["FuseLLM-style storage (per token per teacher)", f"~{FUSELLM_BYTES}"],
    ]


def store_record(s: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The bytes table, the bytes target and a note on the store's sizes and times."""
    per, rows = store_table(s)
    target = goal(
        f"<= {BYTES_TARGET:.0f} bytes per masked token in the top-k store",
        per <= BYTES_TARGET,
        f"{per:.1f}",
    )
    note = (
        f"Store: {s['examples']:,} documents ({s['heldout']} held out), {s['shards']} shards, "
        f"{s['masked_tokens']:,} masked tokens in {s['input_tokens']:,} input tokens; "
        f"`prepare` {s['prepare_s']:.1f} s, `teach` {s['teach_s']:.1f} s."
    )
    return table("Bytes per masked token", ["what", "bytes"], rows), target, note
