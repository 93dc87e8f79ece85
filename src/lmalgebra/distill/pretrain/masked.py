"""Pre-training a small monolingual teacher from scratch: a WordPiece tokenizer trained with the
`tokenizers` library, then a small BERT masked LM trained with the toolkit's one training loop.

The result is a normal Hugging Face model directory with a trained head, accepted as a teacher by a
MergeDistill recipe. Examples held out by a recipe with the same language and held-out fraction are
held out here too (the decision depends only on the example's id), so teachers never see the text
they are evaluated on. ``head_only.pretrain_head`` makes a teacher of an existing encoder instead,
fitting only a masked-LM head on its frozen states.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json, sha256_texts
from lmalgebra.distill.examples import example_id, is_heldout
from lmalgebra.distill.masked.masking import TeacherMasker, pad_batch
from lmalgebra.distill.recipe import MIN_EXAMPLE_LENGTH, MaskingSpec
from lmalgebra.distill.run.model_card import teacher_card, write_card
from lmalgebra.distill.student import StudentSpec, build_student
from lmalgebra.distill.vocab.tokenizer_trainers import train_wordpiece
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.batches import Batch
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train

log = logging.getLogger(__name__)


class TextBatches:
    """Gold-only batches masked on the fly (a new mask for each draw of an example)."""

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

    def batch(self, index: int) -> Batch:
        rng = np.random.default_rng([self.seed, index])
        picks = rng.integers(len(self.texts), size=self.batch_size)
        copies = [self.masker(f"{self.ids[i]}@{index}", self.texts[i]) for i in picks]
        head = pad_batch(copies, self.pad_id)
        labels = torch.from_numpy(np.concatenate([c.labels for c in copies])).long()
        return Batch(
            **head,
            labels=labels,
            language=torch.zeros_like(labels),
            tokens=head["attention_mask"].sum().reshape(1),
        )


@holding_lock("pretrain", lambda out, **_: out)
def pretrain(
    corpus: CorpusSpec,
    language: str,
    vocab_size: int,
    out: Path,
    model: StudentSpec,
    training: TrainingSpec,
    example_length: int = 128,
    heldout_fraction: float = 0.05,
    lowercase: bool = False,
    progress: bool = True,
    restart: bool = False,
    tokenizer: str | None = None,
) -> Path:
    """Train tokenizer and masked LM; write a model directory usable as a teacher.

    ``tokenizer`` (a directory, hub id or ``package:NAME``) uses that tokenizer instead of
    training a WordPiece one (``vocab_size`` and ``lowercase`` are then ignored): teachers that
    share one tokenizer give students one vocabulary.

    Resumes from ``out/training/checkpoints`` when they were written for the same corpus and
    settings (refused, naming the change, otherwise); ``restart`` starts afresh instead."""
    if model.init_embeddings != "random":  # a model from scratch has no teachers to seed from
        raise UserInputError(
            f"init_embeddings {model.init_embeddings!r} needs teachers; pre-training starts random"
        )
    check_lengths(example_length, heldout_fraction, model.max_position_embeddings)
    kept_ids, texts = training_examples(corpus, language, heldout_fraction)
    if tokenizer is None:
        chosen = train_wordpiece(texts, vocab_size, lowercase, max(example_length, 512))
    else:
        chosen = _given_tokenizer(tokenizer)
    student = build_student(model, len(chosen), chosen.pad_token_id, training.seed)
    source = TextBatches(
        kept_ids,
        texts,
        chosen,
        MaskingSpec(seed=training.seed),
        example_length,
        training.batch_size,
        training.seed,
        language,
    )
    inputs = {
        "corpus": sha256_texts(texts),
        "data": {
            "language": language,
            "vocab_size": vocab_size if tokenizer is None else len(chosen),
            "lowercase": lowercase,
            "tokenizer": None if tokenizer is None else sha256_json(chosen.get_vocab()),
            "example_length": example_length,
            "heldout_fraction": heldout_fraction,
        },
    }
    spec = training.model_copy(update={"gold_only": True})
    last = train(student, source, spec, out / "training", progress, inputs, restart)
    (out / "lmalgebra.json").unlink(missing_ok=True)  # written last: marks the teacher complete
    with naming_file(out):
        student.save_pretrained(out)
        chosen.save_pretrained(out)
    card = teacher_card(
        language, len(texts), len(chosen), model.model_dump(), training.model_dump()
    )
    write_card(out, card)
    write_json_atomic(
        out / "lmalgebra.json",
        {
            "kind": "pretrained-teacher",
            "language": language,
            "corpus": corpus.model_dump(mode="json"),
            "examples": len(texts),
            "heldout_fraction": heldout_fraction,
            "model": model.model_dump(),
            "training": training.model_dump(),
            "tokenizer": tokenizer or "WordPiece trained on the corpus",
            "final": last,
        },
    )
    return out


def _given_tokenizer(source: str) -> Any:
    """A fast tokenizer with a mask token, from a directory, hub id or ``package:NAME``."""
    from lmalgebra.sources.models import load_named_tokenizer

    chosen = load_named_tokenizer(source, f"--tokenizer {source}")
    if chosen.mask_token_id is None or chosen.pad_token_id is None:
        raise UserInputError(f"--tokenizer {source}: a masked LM needs mask and pad tokens")
    return chosen


def training_examples(
    corpus: CorpusSpec, language: str, heldout_fraction: float
) -> tuple[list[str], list[str]]:
    """Ids and texts of the corpus's examples that a recipe with the same language and held-out
    fraction would not hold out."""
    docs = [d.strip() for d in read_documents(corpus)]
    ids = [example_id(language, d) for d in docs]
    keep = [i for i, ident in enumerate(ids) if not is_heldout(ident, heldout_fraction)]
    if not keep:
        raise UserInputError(f"corpus for {language!r} has no text left after holding out examples")
    return [ids[i] for i in keep], [docs[i] for i in keep]


def check_lengths(example_length: int, heldout_fraction: float, positions: int | None) -> None:
    """Refuse an example length that leaves nothing to mask or exceeds the model's ``positions``
    (None: unknown, not checked), and a held-out share outside [0, 1)."""
    if example_length < MIN_EXAMPLE_LENGTH:
        raise UserInputError(
            f"--example-length must be at least {MIN_EXAMPLE_LENGTH} tokens "
            f"([CLS], [SEP] and words to mask), got {example_length}"
        )
    if positions is not None and example_length > positions:
        raise UserInputError(
            f"--example-length {example_length} exceeds the model's {positions} positions"
        )
    if not (math.isfinite(heldout_fraction) and 0 <= heldout_fraction < 1):
        raise UserInputError(f"--heldout-fraction must be in [0, 1), got {heldout_fraction}")
