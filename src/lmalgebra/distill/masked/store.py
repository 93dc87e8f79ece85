"""The masked teacher store: each teacher's masked copies of every example (``prepare``) and its
top-k log-probabilities at the masked positions (``teach``).

Run directory parts (``distill.layout``)::

    masked/<lang>/<teacher>/shard-*     example_id, heldout, input_ids, positions, labels
    topk/<lang>/<teacher>/shard-*       topk_ids, topk_logprobs, loss (row-aligned with masked/)

Here is what makes one shard of each; the sets, their keys and the loops that write them shard by
shard are every objective's (``distill.objective``). Every shard set's manifest holds the key that
produced it (recipe settings, teacher weight and tokenizer hashes, masking seed, the compute dtype
of teacher inference when not float32), so a change anywhere upstream is recomputed, never reused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker
from lmalgebra.distill.masked.topk import TeacherOutput, masked_topk
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.teachers import Inference, Teacher
from lmalgebra.storage.arrow_columns import id_dtype, list_column, ragged


def masking(recipe: MaskedRecipe, teacher: Teacher) -> Callable[[pa.Table], pa.Table]:
    """What ``prepare`` makes of a shard of the examples: the teacher's masked copies' shard."""
    masker = TeacherMasker(teacher.name, teacher.tokenizer, recipe.masking, recipe.example_length)
    dtype = id_dtype(len(teacher.tokenizer))

    def make(part: pa.Table) -> pa.Table:
        copies = masker.mask_many(part.column("id").to_pylist(), part.column("text").to_pylist())
        return _masked_table(part, copies, dtype)

    return make


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


def topk_inference(recipe: MaskedRecipe, teacher: Teacher, compute: torch.dtype) -> Inference:
    """What ``teach`` makes of a ``masked/`` shard with the teacher's model, computing in
    ``compute``: its ``topk/`` shard."""
    dtype = id_dtype(len(teacher.tokenizer))
    pad_id = teacher.tokenizer.pad_token_id or 0

    def infer(model: Any, part: pa.Table) -> pa.Table:
        copies = read_copies(part)
        outputs = masked_topk(model, copies, recipe.top_k, pad_id, recipe.batch_size, compute)
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
