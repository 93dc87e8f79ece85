"""``lmalgebra pretrain causal``: a small monolingual causal teacher from scratch, a tokenizer of a
chosen kind (``distill.vocab.tokenizer_trainers``), then a GPT-2-style causal LM trained with the
toolkit's one training loop.

The loop trains on labels at chosen positions (``train.batches.Batch``: ``rows``, ``cols``,
``labels``); for a causal LM those are every position of a window and the token after it, so the
same step, loss and checkpoints serve (the gold term, logged as ``mlm``, is then the next-token
cross-entropy). Windows start with the beginning-of-sequence token when they start a document.
Examples a recipe with the same language and held-out fraction holds out are left out here too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.distill.causal.student_model import build_causal_lm
from lmalgebra.distill.examples import training_examples
from lmalgebra.distill.layout import write_model_directory
from lmalgebra.distill.pretrain.specs import CausalPretrainSpec
from lmalgebra.distill.pretrain.teacher_directory import (
    ANOTHER_TEACHER,
    refuse_other_made,
    refuse_replacing,
)
from lmalgebra.distill.run.model_card import sizes, teacher_card
from lmalgebra.distill.vocab.tokenizer_trainers import train_causal_tokenizer
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.batches import Batch
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import release_checkpoints, train

log = logging.getLogger(__name__)


class CausalTextBatches:
    """Next-token batches: random windows of ``[bos] + document + [eos]`` token sequences.

    Args:
        sequences: each document's token ids, framed by the start and end tokens.
        max_length: tokens per window (a longer document gives a window at a random start).
        batch_size, seed: windows per batch; batch ``i`` is drawn from ``(seed, i)`` alone.
        language: the one language (for throughput logs).
        pad_id: the id right-padded windows are filled with (never a label).
    """

    def __init__(
        self,
        sequences: list[np.ndarray],
        max_length: int,
        batch_size: int,
        seed: int,
        language: str,
        pad_id: int,
    ):
        self.languages = [language]
        self.sequences = [s for s in sequences if len(s) >= 2]  # something to predict
        if not self.sequences:
            raise UserInputError(f"the {language!r} text gives no document of two tokens or more")
        self.max_length, self.batch_size, self.seed = max_length, batch_size, seed
        self.pad_id = pad_id

    def _window(self, rng: np.random.Generator, pick: int) -> np.ndarray:
        sequence = self.sequences[pick]
        spare = len(sequence) - self.max_length
        start = int(rng.integers(spare + 1)) if spare > 0 else 0
        return sequence[start : start + self.max_length]

    def batch(self, index: int) -> Batch:
        """Windows ``(batch, width) int64``; labels: each position's next token, row-major."""
        rng = np.random.default_rng([self.seed, index])
        picks = rng.integers(len(self.sequences), size=self.batch_size)
        windows = [self._window(rng, int(p)) for p in picks]
        width = max(len(w) for w in windows)
        ids = torch.full((len(windows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(windows), width), dtype=torch.long)
        for row, window in enumerate(windows):
            ids[row, : len(window)] = torch.from_numpy(window)
            mask[row, : len(window)] = 1
        predicting = mask[:, 1:].bool()  # position j predicts token j + 1
        rows, cols = predicting.nonzero(as_tuple=True)
        labels = ids[rows, cols + 1]
        return Batch(
            input_ids=ids,
            attention_mask=mask,
            rows=rows,
            cols=cols,
            labels=labels,
            language=torch.zeros_like(labels),
            tokens=mask.sum().reshape(1),
        )


def _sequences(tokenizer: Any, texts: list[str]) -> list[np.ndarray]:
    """``[bos] + tokens + [eos]`` of each text (the tokenizer's post-processor adds the bos)."""
    encoded = tokenizer(texts, add_special_tokens=True, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    return [np.asarray([*ids, eos], dtype=np.int64) for ids in encoded]


@holding_lock("pretrain", lambda spec, **_: spec.out)
def pretrain_causal(spec: CausalPretrainSpec, progress: bool = True, restart: bool = False) -> Path:
    """Train the tokenizer and the causal LM ``spec`` describes; write a model directory usable
    as a causal teacher (``AutoModelForCausalLM``, ``text-generation`` pipeline).

    Resumes from ``out/training/checkpoints`` when they were written for the same corpus and
    settings; ``restart`` starts afresh."""
    refuse_replacing(spec.out, spec.training, restart, "pretrained-causal-teacher")
    kept_ids, texts = training_examples(spec.corpus, spec.language, spec.heldout_fraction)
    refuse_other_made(spec.out, spec.made_from(texts), restart)  # no checkpoint left: text or sizes
    kind, size = spec.tokenizer.kind, spec.tokenizer.vocab_size
    tokenizer = train_causal_tokenizer(texts, kind, size, spec.model.max_position_embeddings)
    seed = spec.training.seed
    network = build_causal_lm(spec.model, tokenizer, seed)
    source = CausalTextBatches(
        _sequences(tokenizer, texts),
        spec.example_length,
        spec.training.batch_size,
        seed,
        spec.language,
        tokenizer.pad_token_id,
    )
    data = {
        "language": spec.language,
        "objective": "causal",
        "tokenizer_kind": kind,
        "vocab_size": size,
        "example_length": spec.example_length,
        "heldout_fraction": spec.heldout_fraction,
    }
    inputs = {"corpus": sha256_texts(texts), "data": data}
    training = TrainingSpec.gold(spec.training)
    out = spec.out / "training"
    last = train(network, source, training, out, progress, inputs, restart, beside=ANOTHER_TEACHER)
    facts = [
        ("tokenizer", f"{kind}, {len(tokenizer)} tokens, trained on the same text"),
        ("model", sizes(spec.model.model_dump())),
    ]
    card = teacher_card(
        f"{spec.language} causal teacher (lmalgebra pretrain causal)",
        f"A small monolingual ({spec.language}) GPT-2-style causal LM trained from scratch by "
        "`lmalgebra pretrain causal`, usable as a causal teacher.",
        spec.language,
        len(texts),
        facts,
        spec.training.model_dump(),
        task="text-generation",
    )
    metadata = {
        "kind": "pretrained-causal-teacher",
        **data,
        "corpus": spec.corpus.model_dump(mode="json"),
        "examples": len(kept_ids),
        "model": spec.model.model_dump(),
        "training": spec.training.model_dump(),
        "final": last,
        "made_from": spec.made_from(texts),
    }
    saved = write_model_directory(spec.out, network, tokenizer, metadata, card)
    release_checkpoints(spec.out / "training", spec.training)
    return saved
