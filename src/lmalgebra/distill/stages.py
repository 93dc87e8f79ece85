"""The stages before student training, each cached and resumable shard by shard.

Run directory layout (objective masked; a causal recipe writes ``tokens/`` and ``logprobs/``
instead of ``masked/`` and ``topk/``, and has no ``vocab/``: ``lmalgebra.distill.causal.store``)::

    recipe.yaml                         the recipe as validated
    examples/<lang>/shard-*.arrow       id, text, heldout
    masked/<lang>/<teacher>/shard-*     example_id, heldout, input_ids, positions, labels
    topk/<lang>/<teacher>/shard-*       topk_ids, topk_logprobs, loss (row-aligned with masked/)
    vocab/                              student tokenizer, teacher->student id maps, report,
                                        complete.json (stamped after the rest)

Every shard set's manifest holds the key that produced it (recipe settings, teacher weight and
tokenizer hashes, masking seed, the compute dtype of teacher inference when not float32), so a
change anywhere upstream is recomputed, never reused.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa
import torch
import yaml

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.precision import dtype_name
from lmalgebra.core.progress import progress_bar
from lmalgebra.distill.causal.store import write_logprobs, write_tokens
from lmalgebra.distill.causal.teachers import open_causal_teacher
from lmalgebra.distill.example_store import examples_set, require, write_examples
from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker
from lmalgebra.distill.masked.topk import TeacherOutput, masked_topk
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.teacher_precision import dtype_key, inference_setup
from lmalgebra.distill.teachers import Teacher, check_top_k, load_masked_lm, open_teacher
from lmalgebra.distributed import main_rank_only
from lmalgebra.storage.arrow_columns import id_dtype, list_column, ragged
from lmalgebra.storage.atomic import write_json_atomic, write_text_atomic
from lmalgebra.storage.completion import CompletionStamp
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.storage.shard_set import ShardSet

log = logging.getLogger(__name__)
# what a stage writes before any output (the recipe's copy, memoised teacher hashes): a stage that
# fails before producing anything in a run directory it created takes these back with it
RUN_SCRATCH = ("recipe.yaml", ".hashes/*")


def open_teachers(recipe: MergeRecipe) -> dict[str, Teacher]:
    """Every teacher of the recipe, of the recipe's objective, checked before anything is done."""
    memo = recipe.output_dir / ".hashes"
    teachers = {}
    for name, spec in recipe.teachers.items():
        if recipe.objective == "causal":
            teachers[name] = open_causal_teacher(spec.ref(name), memo, recipe.top_k)
        else:
            teachers[name] = open_teacher(spec.ref(name), memo, recipe.example_length)
            check_top_k(name, recipe.top_k, teachers[name].tokenizer)
    return teachers


def _pairs(recipe: MergeRecipe) -> list[tuple[str, str]]:
    return [(lang, t) for lang, spec in recipe.languages.items() for t in spec.teachers]


def masked_set(recipe: MergeRecipe, lang: str, teacher: Teacher) -> ShardSet:
    key = {
        "stage": "masked",
        "examples": examples_set(recipe, lang).key,
        "teacher": teacher.name,
        "tokenizer": teacher.hashes["tokenizer"],
        "masking": recipe.masking.model_dump(mode="json"),
        "example_length": recipe.example_length,
    }
    return ShardSet(recipe.output_dir / "masked" / lang / teacher.name, key)


def topk_set(recipe: MergeRecipe, lang: str, teacher: Teacher, dtype: str) -> ShardSet:
    """The top-k store of one (language, teacher) computed in ``dtype`` (resolved)."""
    key = {
        "stage": "topk",
        "masked": masked_set(recipe, lang, teacher).key,
        "weights": teacher.hashes["weights"],
        "top_k": recipe.top_k,
        **dtype_key(dtype),
    }
    return ShardSet(recipe.output_dir / "topk" / lang / teacher.name, key)


@holding_lock("merge prepare", lambda recipe, **_: recipe.output_dir, RUN_SCRATCH)
@main_rank_only  # light work: one process writes it, the others wait
def prepare(recipe: MergeRecipe, progress: bool = True) -> None:
    """Examples per language, then each teacher's tokenised and masked copy of each example
    (causal: its tokens of each example with their byte offsets)."""
    teachers = open_teachers(recipe)  # refuses unusable teachers before anything is written
    recipe.output_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(
        recipe.output_dir / "recipe.yaml",
        yaml.safe_dump(recipe.model_dump(mode="json"), sort_keys=False),
    )
    for lang in recipe.languages:
        examples = write_examples(recipe, lang)
        for name in recipe.languages[lang].teachers:
            if recipe.objective == "causal":
                write_tokens(recipe, lang, teachers[name], examples, progress)
            else:
                _write_masked(recipe, lang, teachers[name], examples, progress)


def _write_masked(
    recipe: MergeRecipe, lang: str, teacher: Teacher, examples: pa.Table, progress: bool
) -> None:
    shards = masked_set(recipe, lang, teacher)
    starts = list(range(0, examples.num_rows, recipe.shard_rows))
    todo = set(shards.plan(len(starts), shared=False))  # this stage runs on the main rank alone
    if shards.complete:
        return
    masker = TeacherMasker(teacher.name, teacher.tokenizer, recipe.masking, recipe.example_length)
    dtype = id_dtype(len(teacher.tokenizer))
    with progress_bar(f"mask {lang}/{teacher.name}", len(starts), progress) as advance:
        for index, start in enumerate(starts):
            if index not in todo:
                advance(1)
                continue
            part = examples.slice(start, recipe.shard_rows)
            copies = [
                masker(i, t)
                for i, t in zip(
                    part.column("id").to_pylist(), part.column("text").to_pylist(), strict=True
                )
            ]
            shards.write(
                index,
                _masked_table(part, copies, dtype),
                masked_tokens=int(sum(c.positions.size for c in copies)),
            )
            advance(1)
    shards.finish(
        masked_tokens=sum(int(s["masked_tokens"]) for s in shards.manifest["shards"]),
        vocab_size=len(teacher.tokenizer),
        teacher_hashes=teacher.hashes,
    )


def _masked_table(part: pa.Table, copies: list[MaskedCopy], dtype: np.dtype) -> pa.Table:
    return pa.table(
        {
            "example_id": part.column("id"),
            "heldout": part.column("heldout"),
            "input_ids": list_column([c.input_ids for c in copies], dtype),
            "positions": list_column([c.positions for c in copies], np.uint16),
            "labels": list_column([c.labels for c in copies], dtype),
        }
    )


def read_copies(table: pa.Table) -> list[MaskedCopy]:
    """Masked copies of a ``masked/`` shard, ids as int64."""
    ids, id_off = ragged(table.column("input_ids"))
    pos, pos_off = ragged(table.column("positions"))
    lab, _ = ragged(table.column("labels"))
    return [
        MaskedCopy(
            ids[id_off[r] : id_off[r + 1]].astype(np.int64),
            pos[pos_off[r] : pos_off[r + 1]].astype(np.int64),
            lab[pos_off[r] : pos_off[r + 1]].astype(np.int64),
        )
        for r in range(table.num_rows)
    ]


@holding_lock("merge teach", lambda recipe, **_: recipe.output_dir, RUN_SCRATCH)
def teach(
    recipe: MergeRecipe,
    progress: bool = True,
    setup: tuple[torch.device, torch.dtype] | None = None,
) -> None:
    """Offline teacher inference over every masked copy: top-k log-probs and per-example loss
    (causal: next-token log-probs, top-k and drawn tokens at every position of every example).

    ``setup``: device and dtype already resolved (``teacher_precision.inference_setup``)."""
    setup = setup or inference_setup(recipe)  # an unusable device or dtype: refused first
    teachers = open_teachers(recipe)
    for lang, name in _pairs(recipe):
        if recipe.objective == "causal":
            write_logprobs(recipe, lang, teachers[name], setup, progress)
            continue
        masked = masked_set(recipe, lang, teachers[name])
        require(masked, "prepare")
        _write_topk(recipe, lang, teachers[name], masked, setup, progress)


def _write_topk(
    recipe: MergeRecipe,
    lang: str,
    teacher: Teacher,
    masked: ShardSet,
    setup: tuple[torch.device, torch.dtype],
    progress: bool,
) -> None:
    device, compute = setup
    shards = topk_set(recipe, lang, teacher, dtype_name(compute))
    count = len(masked.manifest["shards"])
    todo = set(shards.plan(count))  # under several processes: this rank's missing shards
    if shards.complete:
        return
    model: Any = None
    dtype = id_dtype(len(teacher.tokenizer))
    with progress_bar(f"teach {lang}/{teacher.name}", count, progress) as advance:
        for index in range(count):
            if index in todo:
                if model is None:
                    spec = recipe.teachers[teacher.name]
                    model = load_masked_lm(spec.ref(teacher.name), teacher.directory)
                    model.to(device)
                copies = read_copies(masked.read(index))
                outputs = masked_topk(
                    model,
                    copies,
                    recipe.top_k,
                    teacher.tokenizer.pad_token_id or 0,
                    recipe.batch_size,
                    compute,
                )
                shards.write(index, topk_table(outputs, dtype))
            advance(1)
    shards.finish(top_k=recipe.top_k, dtype=dtype_name(compute), teacher_hashes=teacher.hashes)


def topk_table(outputs: list[TeacherOutput], dtype: np.dtype) -> pa.Table:
    """A ``topk/`` shard: per copy its masked positions' top-k ids (``dtype``, the narrowest that
    holds the teacher's ids) and log-probabilities (float16), and its loss (float32)."""
    return pa.table(
        {
            "topk_ids": list_column([o.topk_ids for o in outputs], dtype),
            "topk_logprobs": list_column([o.topk_logprobs for o in outputs], np.float16),
            "loss": pa.array(np.array([o.loss for o in outputs], dtype=np.float32)),
        }
    )


@holding_lock("merge vocab", lambda recipe, **_: recipe.output_dir, RUN_SCRATCH)
@main_rank_only
def vocab(recipe: MergeRecipe) -> None:
    """The union student vocabulary, teacher->student id maps, student tokenizer and report."""
    from lmalgebra.distill.vocab.union import build_union, tokens_per_language

    if recipe.objective == "causal":
        raise UserInputError(
            "a causal recipe has no union vocabulary (its student keeps a tokenizer of its own): "
            "`merge vocab` applies to recipes with objective masked"
        )
    teachers = open_teachers(recipe)
    out = recipe.output_dir / "vocab"
    stamp = vocab_stamp(recipe, teachers)
    if stamp.done():
        return
    texts = {}
    for lang in recipe.languages:  # read first: a missing stage is refused before any write
        shards = examples_set(recipe, lang)
        require(shards, "prepare")
        texts[lang] = pa.concat_tables(shards.tables()).column("text").to_pylist()[:2000]
    stamp.clear()
    tokenizers = {name: t.tokenizer for name, t in teachers.items()}
    union = build_union(tokenizers)
    union.save(out)
    report = union.report(tokenizers)
    report["tokens_per_language"] = tokens_per_language(texts, union.student_tokenizer())
    write_json_atomic(out / "report.json", report)
    stamp.mark()


def vocab_stamp(recipe: MergeRecipe, teachers: dict[str, Teacher]) -> CompletionStamp:
    """The vocabulary's completion mark, keyed by the teachers' tokenizers."""
    key = sha256_json({name: t.hashes["tokenizer"] for name, t in teachers.items()})
    return CompletionStamp(recipe.output_dir / "vocab", key)
