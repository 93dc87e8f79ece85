"""Masked student training data: batches of the teachers' copies in student ids, languages drawn
per batch slot (``distill.sampling``)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch

from lmalgebra.distill.masked.store import TeacherCopies, load_copies
from lmalgebra.distill.sampling import SampledLanguages, language_pool
from lmalgebra.distill.vocab.union import UnionVocab
from lmalgebra.train.batches import Batch


class StoreBatches(SampledLanguages):
    """Batches of student-id copies from a run directory's store."""

    def __init__(
        self,
        run_dir: Path,
        teachers_of: dict[str, list[str]],
        vocab: UnionVocab,
        batch_size: int,
        alpha: float,
        mode: Literal["all", "best"],
        seed: int,
    ):
        pools = [
            language_pool([load_copies(run_dir, lang, t, vocab) for t in teachers], mode, lang)
            for lang, teachers in teachers_of.items()
        ]
        super().__init__(list(teachers_of), pools, batch_size, alpha, seed)

    def batch(self, index: int) -> Batch:
        slots = []
        for lang, item in self.draw(index):
            pool = self.pools[lang]
            slots.append((lang, pool.copies[pool.source[item]], int(pool.row[item])))
        return _collate(slots, len(self.languages))


def _collate(slots: list[tuple[int, TeacherCopies, int]], n_languages: int) -> Batch:
    width = max(int(c.token_offsets[r + 1] - c.token_offsets[r]) for _, c, r in slots)
    ids = torch.zeros((len(slots), width), dtype=torch.long)  # student [PAD] is id 0
    attention = torch.zeros((len(slots), width), dtype=torch.long)
    rows, cols, labels, langs, top_ids, top_lp = [], [], [], [], [], []
    tokens = torch.zeros(n_languages, dtype=torch.long)
    for b, (lang, c, r) in enumerate(slots):
        t0, t1 = c.token_offsets[r], c.token_offsets[r + 1]
        m0, m1 = c.mask_offsets[r], c.mask_offsets[r + 1]
        ids[b, : t1 - t0] = torch.from_numpy(c.input_ids[t0:t1])
        attention[b, : t1 - t0] = 1
        tokens[lang] += int(t1 - t0)
        rows.append(np.full(m1 - m0, b))
        cols.append(c.positions[m0:m1])
        labels.append(c.labels[m0:m1])
        langs.append(np.full(m1 - m0, lang))
        top_ids.append(c.topk_ids[m0:m1])
        top_lp.append(c.topk_logprobs[m0:m1])
    return Batch(
        input_ids=ids,
        attention_mask=attention,
        rows=torch.from_numpy(np.concatenate(rows)).long(),
        cols=torch.from_numpy(np.concatenate(cols)).long(),
        labels=torch.from_numpy(np.concatenate(labels)).long(),
        language=torch.from_numpy(np.concatenate(langs)).long(),
        tokens=tokens,
        topk_ids=torch.from_numpy(np.concatenate(top_ids)).long(),
        topk_logprobs=torch.from_numpy(np.concatenate(top_lp)).float(),
    )
