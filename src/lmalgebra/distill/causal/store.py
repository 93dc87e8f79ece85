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
(``distill.objective``). ``load_causal_store`` reads them back as flat numpy arrays with row
offsets (data loaders need no per-token Python objects); ``CausalStore.record(r)`` is the
per-example view the cross-tokenizer losses are written against.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from lmalgebra.core.errors import UserInputError, merge_stage
from lmalgebra.distill.causal.logprobs import CausalOutput, causal_outputs
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.examples import require
from lmalgebra.distill.layout import LOGPROBS, TOKENS, RunLayout
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.teachers import Inference, Teacher, max_positions
from lmalgebra.distill.vocab.byte_alignment import encode_with_offsets
from lmalgebra.sources.embed import refuse_foreign_ids
from lmalgebra.storage.arrow_columns import id_dtype, list_column, ragged
from lmalgebra.storage.shard_set import ShardSet

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
        # the start token leads every input (a token added to the tokenizer alone: past the table)
        refuse_foreign_ids(f"teacher {teacher.name!r}", model, [[start]])
        values, offsets = ragged(part.column("token_ids"))
        examples = [values[offsets[r] : offsets[r + 1]] for r in range(part.num_rows)]
        seeds = [_seed(recipe, teacher.name, e) for e in part.column("example_id").to_pylist()]
        outputs = causal_outputs(
            model,
            examples,
            start,
            recipe.top_k,
            samples,
            seeds,
            recipe.batch_size,
            compute,
            tokens=len(teacher.tokenizer),
        )
        return logprobs_table(outputs, dtype, samples)

    return infer


@dataclass(frozen=True)
class CausalRecord:
    """One example as one causal teacher saw it (``n`` tokens, ``data = text.encode()``).

    Attributes:
        example_id, text, heldout: the example.
        token_ids: ``(n,) int64`` the teacher's tokens (no special token).
        offsets: ``(n, 2) int32`` byte offsets ``[start, end)`` of each token in ``data``.
        next_logprob: ``(n,) float32`` log p(token_i | start token, token_<i).
        topk_ids: ``(n, k) int64``, topk_logprobs ``(n, k) float32``: the top-k of the
            distribution over token i (same conditioning), most likely first.
        sample_ids: ``(n, K) int64`` draws from that distribution (ascending), or None;
            sample_logprobs ``(n, K) float32`` their log-probabilities, or None.
    """

    example_id: str
    text: str
    heldout: bool
    token_ids: np.ndarray
    offsets: np.ndarray
    next_logprob: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    sample_ids: np.ndarray | None
    sample_logprobs: np.ndarray | None


@dataclass(frozen=True)
class CausalStore:
    """One teacher's records of one language's examples, flat: example ``r``'s tokens are rows
    ``token_offsets[r]:token_offsets[r + 1]`` of every per-token array.

    Attributes:
        example_ids, texts: ``(rows,)`` str; heldout ``(rows,) bool``.
        token_offsets: ``(rows + 1,) int64``.
        token_ids: ``(tokens,) int64``; offsets ``(tokens, 2) int32``; next_logprob
            ``(tokens,) float32``; topk_ids ``(tokens, k) int64``; topk_logprobs
            ``(tokens, k) float32``; sample_ids ``(tokens, K) int64`` and sample_logprobs
            ``(tokens, K) float32`` or None.
        start_token_id: the token the first token was predicted after.
    """

    example_ids: np.ndarray
    texts: np.ndarray
    heldout: np.ndarray
    token_offsets: np.ndarray
    token_ids: np.ndarray
    offsets: np.ndarray
    next_logprob: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    sample_ids: np.ndarray | None
    sample_logprobs: np.ndarray | None
    start_token_id: int

    def __len__(self) -> int:
        return len(self.example_ids)

    def record(self, row: int) -> CausalRecord:
        """Example ``row``'s record."""
        lo, hi = int(self.token_offsets[row]), int(self.token_offsets[row + 1])
        drawn = self.sample_ids, self.sample_logprobs
        return CausalRecord(
            str(self.example_ids[row]),
            str(self.texts[row]),
            bool(self.heldout[row]),
            self.token_ids[lo:hi],
            self.offsets[lo:hi],
            self.next_logprob[lo:hi],
            self.topk_ids[lo:hi],
            self.topk_logprobs[lo:hi],
            *(None if a is None else a[lo:hi] for a in drawn),
        )


def _flat(table: pa.Table, column: str, dtype: type, width: int) -> np.ndarray:
    values, _ = ragged(table.column(column))
    return values.astype(dtype).reshape(-1, width)


def load_causal_store(run_dir: Path, lang: str, teacher: str) -> CausalStore:
    """``tokens/``, ``logprobs/`` and the texts of ``examples/`` of (``lang``, ``teacher``)."""
    layout = RunLayout(run_dir)
    sets = {
        part: ShardSet.existing(layout.store(part, lang, teacher)) for part in (TOKENS, LOGPROBS)
    }
    examples = ShardSet.existing(layout.examples(lang))
    require(examples, "prepare")
    require(sets[TOKENS], "prepare")
    require(sets[LOGPROBS], "teach")
    text = pa.concat_tables(examples.tables())
    tok = pa.concat_tables(sets[TOKENS].tables())
    out = pa.concat_tables(sets[LOGPROBS].tables())
    ids = np.asarray(tok.column("example_id").to_pylist(), dtype=object)
    if ids.tolist() != text.column("id").to_pylist():
        raise UserInputError(
            f"{sets[TOKENS].directory} was made from other examples than "
            f"{examples.directory}: run {merge_stage('prepare')} again"
        )
    token_ids, token_offsets = ragged(tok.column("token_ids"))
    k, samples = (int(sets[LOGPROBS].manifest[f]) for f in ("top_k", "samples"))
    drawn: tuple[np.ndarray | None, np.ndarray | None] = (None, None)
    if samples:
        drawn = (
            _flat(out, "sample_ids", np.int64, samples),
            _flat(out, "sample_logprobs", np.float32, samples),
        )
    return CausalStore(
        example_ids=ids,
        texts=np.asarray(text.column("text").to_pylist(), dtype=object),
        heldout=tok.column("heldout").to_numpy(zero_copy_only=False),
        token_offsets=token_offsets.astype(np.int64),
        token_ids=token_ids.astype(np.int64),
        offsets=_flat(tok, "offsets", np.int32, 2),
        next_logprob=ragged(out.column("next_logprob"))[0].astype(np.float32),
        topk_ids=_flat(out, "topk_ids", np.int64, k),
        topk_logprobs=_flat(out, "topk_logprobs", np.float32, k),
        sample_ids=drawn[0],
        sample_logprobs=drawn[1],
        start_token_id=int(sets[TOKENS].manifest["start_token_id"]),
    )
