"""The masked teacher store: each teacher's masked copies of every example (``prepare``) and its
top-k log-probabilities at the masked positions (``teach``).

Run directory parts (``distill.layout``)::

    masked/<lang>/<teacher>/shard-*     example_id, heldout, input_ids, positions, labels
    topk/<lang>/<teacher>/shard-*       topk_ids, topk_logprobs, loss (row-aligned with masked/)

Here is what makes one shard of each; the sets, their keys and the loops that write them shard by
shard are every objective's (``distill.objective``). Every shard set's manifest holds the key that
produced it (recipe settings, teacher weight and tokenizer hashes, masking seed, the compute dtype
of teacher inference when not float32), so a change anywhere upstream is recomputed, never reused.
``load_copies`` reads both back in student ids, as flat numpy arrays plus row offsets (no
per-token Python objects), ready for the student's data loader.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lmalgebra.distill.examples import require
from lmalgebra.distill.layout import MASKED, TOPK, RunLayout
from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker
from lmalgebra.distill.masked.topk import TeacherOutput, masked_topk
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.teachers import Inference, Teacher
from lmalgebra.distill.vocab.union import UnionVocab, apply_map
from lmalgebra.storage.arrow_columns import id_dtype, list_column, ragged
from lmalgebra.storage.shard_set import ShardSet


def masking(recipe: MaskedRecipe, teacher: Teacher) -> Callable[[pa.Table], pa.Table]:
    """What ``prepare`` makes of a shard of the examples: the teacher's masked copies' shard."""
    masker = TeacherMasker(teacher.name, teacher.tokenizer, recipe.masking, recipe.example_length)
    dtype = id_dtype(len(teacher.tokenizer))

    def make(part: pa.Table) -> pa.Table:
        copies = masker.mask_many(part.column("id").to_pylist(), part.column("text").to_pylist())
        return pa.table(
            {
                "example_id": part.column("id"),
                "heldout": part.column("heldout"),
                "input_ids": list_column([c.input_ids for c in copies], dtype),
                "positions": list_column([c.positions for c in copies], np.uint16),
                "labels": list_column([c.labels for c in copies], dtype),
            }
        )

    return make


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


def topk_inference(recipe: MaskedRecipe, teacher: Teacher, compute: torch.dtype) -> Inference:
    """What ``teach`` makes of a ``masked/`` shard with the teacher's model, computing in
    ``compute``: its ``topk/`` shard."""
    dtype = id_dtype(len(teacher.tokenizer))
    pad_id, tokens = teacher.tokenizer.pad_token_id or 0, len(teacher.tokenizer)

    def infer(model: Any, part: pa.Table) -> pa.Table:
        copies = read_copies(part)
        outputs = masked_topk(
            model, copies, recipe.top_k, pad_id, recipe.batch_size, compute, tokens=tokens
        )
        return topk_table(outputs, dtype)

    return infer


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


@dataclass(frozen=True)
class TeacherCopies:
    """One teacher's copies of one language's examples, in student ids.

    Row ``r``'s tokens are ``input_ids[token_offsets[r]:token_offsets[r+1]]``; its masked tokens are
    ``positions/labels/topk_*[mask_offsets[r]:mask_offsets[r+1]]``.

    Attributes:
        example_ids: ``(rows,)`` str.
        heldout: ``(rows,) bool``.
        input_ids: ``(tokens,) int64`` masked inputs; ``token_offsets`` ``(rows + 1,) int64``.
        positions: ``(masked,) int64`` positions within the row; ``mask_offsets`` ``(rows + 1,)``.
        labels: ``(masked,) int64`` gold ids.
        topk_ids: ``(masked, k) int64``; ``topk_logprobs`` ``(masked, k) float32``.
        loss: ``(rows,) float32`` the teacher's mean NLL on the example's gold labels.
    """

    example_ids: np.ndarray
    heldout: np.ndarray
    input_ids: np.ndarray
    token_offsets: np.ndarray
    positions: np.ndarray
    labels: np.ndarray
    mask_offsets: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    loss: np.ndarray


def load_copies(run_dir: Path, lang: str, teacher: str, vocab: UnionVocab | None) -> TeacherCopies:
    """Read ``masked/`` and ``topk/`` of one (language, teacher), in student ids if ``vocab``."""
    layout = RunLayout(run_dir)
    masked = ShardSet.existing(layout.store(MASKED, lang, teacher))
    topk = ShardSet.existing(layout.store(TOPK, lang, teacher))
    require(masked, "prepare")
    require(topk, "teach")
    m, t = (pa.concat_tables(shards.tables()) for shards in (masked, topk))
    ids, token_offsets = ragged(m.column("input_ids"))
    positions, mask_offsets = ragged(m.column("positions"))
    labels, _ = ragged(m.column("labels"))
    top_ids, _ = ragged(t.column("topk_ids"))
    top_lp, _ = ragged(t.column("topk_logprobs"))
    k = int(topk.manifest["top_k"])
    ids, labels, top_ids = (a.astype(np.int64) for a in (ids, labels, top_ids))
    if vocab is not None:
        mapping = vocab.maps[teacher]
        ids, labels, top_ids = (apply_map(a, mapping) for a in (ids, labels, top_ids))
    return TeacherCopies(
        example_ids=np.asarray(m.column("example_id").to_pylist(), dtype=object),
        heldout=m.column("heldout").to_numpy(zero_copy_only=False),
        input_ids=ids,
        token_offsets=token_offsets.astype(np.int64),
        positions=positions.astype(np.int64),
        labels=labels,
        mask_offsets=mask_offsets.astype(np.int64),
        topk_ids=top_ids.reshape(-1, k),
        topk_logprobs=top_lp.astype(np.float32).reshape(-1, k),
        loss=t.column("loss").to_numpy(),
    )
