"""``lmalgebra pretrain masked``: a small monolingual masked teacher from scratch, a WordPiece
tokenizer trained with the `tokenizers` library (or one given), then a small BERT masked LM
trained with the toolkit's one training loop, on the examples a recipe would not hold out.

The result is a normal Hugging Face model directory with a trained head, accepted as a teacher by a
MergeDistill recipe.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json, sha256_texts
from lmalgebra.distill.examples import training_examples
from lmalgebra.distill.layout import write_model_directory
from lmalgebra.distill.masked.masking import Encoded, TeacherMasker, pad_batch
from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.pretrain.specs import MaskedPretrainSpec
from lmalgebra.distill.pretrain.teacher_directory import (
    ANOTHER_TEACHER,
    refuse_other_made,
    refuse_replacing,
    warn_unread,
)
from lmalgebra.distill.recipe import MaskingSpec
from lmalgebra.distill.run.model_card import sizes, teacher_card
from lmalgebra.distill.vocab.tokenizer_trainers import train_wordpiece
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.batches import Batch
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import release_checkpoints, train

log = logging.getLogger(__name__)


# Token ids kept for examples drawn again (``TextBatches``): 32M ids is about 256 MiB in int64.
ENCODED_TOKENS_KEPT = 32 * 2**20


class TextBatches:
    """Gold-only batches masked on the fly (a new mask for each draw of an example).

    Each example is tokenised on its first draw and kept (up to :data:`ENCODED_TOKENS_KEPT`
    tokens in all), so that a later draw only masks it again: training draws each example of a
    small corpus many times, and tokenising a document to cut it at the example length costs
    about as much as masking and padding the batch."""

    def __init__(
        self,
        ids: list[str],
        texts: list[str],
        tokenizer: Any,
        masking: MaskingSpec,
        max_length: int,
        batch_size: int,
        seed: int,
        language: str,
    ):
        self.languages = [language]
        self.ids, self.texts = ids, texts
        self.masker = TeacherMasker("pretrain", tokenizer, masking, max_length)
        self.pad_id = tokenizer.pad_token_id
        self.batch_size, self.seed = batch_size, seed
        self.encoded: dict[int, Encoded] = {}
        self.kept_tokens = 0

    def _encoded(self, picks: np.ndarray) -> dict[int, Encoded]:
        """The encodings of the examples ``picks``: kept ones, the others encoded in one call
        (and kept while the budget allows)."""
        found = {i: self.encoded[i] for i in map(int, picks) if i in self.encoded}
        missing = sorted({int(i) for i in picks} - found.keys())
        for i, fresh in zip(
            missing, self.masker.encode_many([self.texts[i] for i in missing]), strict=True
        ):
            found[i] = fresh
            if self.kept_tokens + fresh.input_ids.size <= ENCODED_TOKENS_KEPT:
                self.encoded[i] = fresh
                self.kept_tokens += fresh.input_ids.size
        return found

    def batch(self, index: int) -> Batch:
        rng = np.random.default_rng([self.seed, index])
        picks = rng.integers(len(self.texts), size=self.batch_size)
        encoded = self._encoded(picks)
        copies = [self.masker.mask(f"{self.ids[i]}@{index}", encoded[int(i)]) for i in picks]
        head = pad_batch(copies, self.pad_id)
        labels = torch.from_numpy(np.concatenate([c.labels for c in copies])).long()
        return Batch(
            **head,
            labels=labels,
            language=torch.zeros_like(labels),
            tokens=head["attention_mask"].sum().reshape(1),
        )


@holding_lock("pretrain", lambda spec, **_: spec.out)
def pretrain_masked(spec: MaskedPretrainSpec, progress: bool = True, restart: bool = False) -> Path:
    """Train the tokenizer and the masked LM ``spec`` describes; write a model directory usable
    as a teacher (``spec.out``).

    Resumes from ``out/training/checkpoints`` when they were written for the same corpus and
    settings (refused, naming the change, otherwise); ``restart`` starts afresh instead."""
    refuse_replacing(spec.out, spec.training, restart, "pretrained-teacher")
    kept_ids, texts = training_examples(spec.corpus, spec.language, spec.heldout_fraction)
    refuse_other_made(spec.out, spec.made_from(texts), restart)  # no checkpoint left: text or sizes
    given = spec.tokenizer.path
    if given is None:
        assert spec.tokenizer.vocab_size is not None  # the spec has one or the other
        size, lowercase = spec.tokenizer.vocab_size, spec.tokenizer.lowercase
        chosen = train_wordpiece(texts, size, lowercase, spec.model.max_position_embeddings)
    else:
        chosen = _given_tokenizer(given)
        warn_unread(f"tokenizer.path {given}", chosen, texts, spec.language)
    seed = spec.training.seed
    model = build_masked_lm(spec.model, len(chosen), chosen.pad_token_id, seed)
    source = TextBatches(
        kept_ids,
        texts,
        chosen,
        MaskingSpec(seed=seed),
        spec.example_length,
        spec.training.batch_size,
        seed,
        spec.language,
    )
    data = {
        "language": spec.language,
        "vocab_size": spec.tokenizer.vocab_size if given is None else len(chosen),
        "lowercase": spec.tokenizer.lowercase,
        "tokenizer": None if given is None else sha256_json(chosen.get_vocab()),
        "example_length": spec.example_length,
        "heldout_fraction": spec.heldout_fraction,
    }
    inputs = {"corpus": sha256_texts(texts), "data": data}
    training = TrainingSpec.gold(spec.training)
    out = spec.out / "training"
    last = train(model, source, training, out, progress, inputs, restart, beside=ANOTHER_TEACHER)
    trained = f"WordPiece, {len(chosen)} pieces, trained on the same text"
    facts = [("tokenizer", given or trained), ("model", sizes(spec.model.model_dump()))]
    card = teacher_card(
        f"{spec.language} teacher (lmalgebra pretrain masked)",
        f"A small monolingual ({spec.language}) BERT masked LM trained from scratch by "
        "`lmalgebra pretrain masked`, usable as a MergeDistill teacher.",
        spec.language,
        len(texts),
        facts,
        spec.training.model_dump(),
    )
    metadata = {
        "kind": "pretrained-teacher",
        "language": spec.language,
        "corpus": spec.corpus.model_dump(mode="json"),
        "examples": len(texts),
        "heldout_fraction": spec.heldout_fraction,
        "model": spec.model.model_dump(),
        "training": spec.training.model_dump(),
        "tokenizer": given or "WordPiece trained on the corpus",
        "final": last,
        "made_from": spec.made_from(texts),
    }
    saved = write_model_directory(spec.out, model, chosen, metadata, card)
    release_checkpoints(spec.out / "training", spec.training)
    return saved


def _given_tokenizer(source: str) -> Any:
    """A fast tokenizer with a mask token, from a directory, hub id or ``package:NAME``."""
    from lmalgebra.sources.tokenizers import load_named_tokenizer

    chosen = load_named_tokenizer(source, f"tokenizer.path {source}")
    if chosen.mask_token_id is None or chosen.pad_token_id is None:
        raise UserInputError(f"tokenizer.path {source}: a masked LM needs mask and pad tokens")
    return chosen
