"""Reading the teacher store in student ids: the run's id maps applied to inputs, labels and top-k.

Everything is returned as flat numpy arrays plus row offsets (no per-token Python objects), ready
for the student's data loader.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from lmalgebra.distill.examples import require
from lmalgebra.distill.layout import MASKED, TOPK, RunLayout
from lmalgebra.distill.vocab.union import UnionVocab, apply_map
from lmalgebra.storage.arrow_columns import ragged
from lmalgebra.storage.shard_set import ShardSet


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
