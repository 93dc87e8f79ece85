"""The causal teacher store: each causal teacher's tokens of every example, with UTF-8 byte
offsets, and its next-token log-probabilities, top-k and drawn tokens at every position.

Run directory layout (besides ``examples/``, which every objective shares)::

    tokens/<lang>/<teacher>/shard-*     example_id, heldout, token_ids, offsets    (merge prepare)
    logprobs/<lang>/<teacher>/shard-*   next_logprob, topk_ids, topk_logprobs      (merge teach)
                                        [, sample_ids, sample_logprobs]

Both are row-aligned with ``examples/<lang>/``: row ``r`` of every set is the same example. The
sets are the checksummed, resumable shard sets of the masked store (``storage.shard_set``):
``tokens/`` is written by the main rank, ``logprobs/`` by every rank for the shards it owns.
Ragged values are flattened per row: ``offsets`` holds ``2n`` values (start, end pairs) and the
top-k and drawn columns ``n * k`` and ``n * K`` values, in row-major order. Here is what makes
one shard of each; the sets, their keys and the loops that write them are every objective's
(``distill.objective``).
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.logprobs import CausalOutput, causal_outputs
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.teachers import Inference, Teacher, max_positions
from lmalgebra.distill.vocab.byte_alignment import encode_with_offsets
from lmalgebra.storage.arrow_columns import id_dtype, list_column, ragged

OFFSETS_RULES = "byte_alignment.encode_with_offsets/v1"  # bump when its rules change


def tokens_table(recipe: CausalRecipe, lang: str, teacher: Teacher, part: pa.Table) -> pa.Table:
    """One shard of ``tokens/``: the teacher's tokens of each example and their byte offsets,
    as the student side computes them (``byte_alignment.encode_with_offsets``)."""
    limit = max_positions(teacher.directory)
    ids, spans = [], []
    for identifier, text in zip(
        part.column("id").to_pylist(), part.column("text").to_pylist(), strict=True
    ):
        found = encode_with_offsets(teacher.tokenizer, text, teacher.name)
        if limit is not None and len(found.ids) > limit:
            raise UserInputError(
                f"example {identifier} of language {lang!r} is {len(found.ids)} tokens long "
                f"for teacher {teacher.name!r}, which reads at most {limit}; lower "
                f"causal.example_bytes (now {recipe.causal.example_bytes})"
            )
        ids.append(found.ids)
        spans.append(found.offsets)
    return pa.table(
        {
            "example_id": part.column("id"),
            "heldout": part.column("heldout"),
            "token_ids": list_column(ids, id_dtype(len(teacher.tokenizer))),
            # an example has at most example_bytes bytes: the narrowest type that holds them
            "offsets": list_column(spans, id_dtype(recipe.causal.example_bytes + 1)),
        }
    )


def _seed(recipe: CausalRecipe, teacher: str, example: str) -> list[int]:
    """The seed of one (teacher, example)'s drawn tokens: the recipe's, then a stable hash."""
    digest = hashlib.sha256(f"{teacher}\0{example}".encode()).digest()
    return [recipe.causal.sample_seed, int.from_bytes(digest[:8], "little")]


def logprobs_table(outputs: list[CausalOutput], dtype: np.dtype, samples: int) -> pa.Table:
    columns = {
        "next_logprob": list_column([o.next_logprob for o in outputs], np.float32),
        "topk_ids": list_column([o.topk_ids for o in outputs], dtype),
        "topk_logprobs": list_column([o.topk_logprobs for o in outputs], np.float16),
    }
    if samples:
        ids = [o.sample_ids for o in outputs if o.sample_ids is not None]
        values = [o.sample_logprobs for o in outputs if o.sample_logprobs is not None]
        assert len(ids) == len(values) == len(outputs)  # every output holds its draws
        columns["sample_ids"] = list_column(ids, dtype)
        columns["sample_logprobs"] = list_column(values, np.float16)
    return pa.table(columns)


def logprobs_inference(recipe: CausalRecipe, teacher: Teacher, compute: torch.dtype) -> Inference:
    """What ``teach`` makes of a ``tokens/`` shard with the teacher's model, computing in
    ``compute``: its ``logprobs/`` shard."""
    start = start_token_id(teacher.tokenizer)
    assert start is not None  # teacher_tokenizer refuses a tokenizer without one
    dtype = id_dtype(len(teacher.tokenizer))
    samples = recipe.causal.samples

    def infer(model: Any, part: pa.Table) -> pa.Table:
        values, offsets = ragged(part.column("token_ids"))
        examples = [values[offsets[r] : offsets[r + 1]] for r in range(part.num_rows)]
        seeds = [_seed(recipe, teacher.name, e) for e in part.column("example_id").to_pylist()]
        outputs = causal_outputs(
            model, examples, start, recipe.top_k, samples, seeds, recipe.batch_size, compute
        )
        return logprobs_table(outputs, dtype, samples)

    return infer
