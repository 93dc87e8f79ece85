"""Reading the causal teacher store: one (language, teacher)'s records as flat numpy arrays, and
each example's record (text, tokens, byte offsets, next-token log-probabilities, top-k, draws).

Flat arrays with row offsets serve data loaders without per-token Python objects;
``CausalStore.record(r)`` is the per-example view the cross-tokenizer losses are written against.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.examples import require
from lmalgebra.distill.layout import LOGPROBS, TOKENS, RunLayout
from lmalgebra.storage.arrow_columns import ragged
from lmalgebra.storage.shard_set import ShardSet


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
            f"{examples.directory}: run `lmalgebra merge prepare RECIPE` again"
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
