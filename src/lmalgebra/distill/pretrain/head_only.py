"""Head-only teachers: an existing encoder, frozen, with a masked-LM head fitted on text.

The encoder (a directory, ``package:NAME`` or hub id; its own tokenizer) is loaded into the
masked-LM class transformers has for its architecture (``AutoModelForMaskedLM``: BERT's prediction
head, RoBERTa's or MPNet's ``lm_head``, ...) with a freshly initialised head. Every encoder weight
is frozen. The head trains: its transform and output bias, and its output projection only where the
architecture does not tie it to the input embeddings (where it does, the projection *is* the frozen
embedding matrix, as in the original pre-training).

Since the encoder never changes, its last hidden states at the masked positions are computed once
per training example (one BERT-style masking per example) and the head trains on those with the
one training loop: while it runs, the encoder inside the model is replaced by a stand-in that
returns the cached states, so a step costs only the head. Examples that a recipe with the same
language and held-out fraction holds out are left out, as by ``pretrain masked``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.progress import progress_bar
from lmalgebra.core.remote_code import announce_remote_code, load_failure, refuse_code_replaced
from lmalgebra.distill.examples import training_examples
from lmalgebra.distill.layout import write_model_directory
from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker, pad_batch
from lmalgebra.distill.pretrain.specs import HeadOnlySpec
from lmalgebra.distill.pretrain.teacher_directory import (
    ANOTHER_TEACHER,
    refuse_other_made,
    refuse_replacing,
    warn_unread,
)
from lmalgebra.distill.recipe import MaskingSpec
from lmalgebra.distill.run.model_card import teacher_card
from lmalgebra.distill.teachers import max_positions
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.loaded_weights import CHECKED_LOAD, refuse_incomplete
from lmalgebra.sources.model_files import refuse_damaged
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.batches import Batch
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import release_checkpoints, train

log = logging.getLogger(__name__)


def encoder_with_new_head(ref: ModelRef, directory: Path, seed: int) -> Any:
    """The encoder's ``*ForMaskedLM`` with the encoder's weights loaded and frozen and a freshly
    initialised (seeded) head; refused, naming the model, for what has no masked-LM form."""
    from transformers import AutoConfig, AutoModel, AutoModelForMaskedLM

    if not ref.source.pretrained:
        what = "random-initialised weights" if ref.random_init else ref.source.what
        raise UserInputError(
            f"encoder {ref.path}: {what} cannot carry a head-only teacher "
            "(give a trained transformers encoder: a directory, package:NAME or hub id)"
        )
    refuse_damaged(f"encoder {ref.path}", directory)  # a student written here, read as written
    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    else:
        refuse_code_replaced(f"encoder {ref.path}", ref.path, directory, "AutoModel")
    remote = ref.trust_remote_code
    try:
        config = AutoConfig.from_pretrained(directory, trust_remote_code=remote)
        if getattr(config, "is_encoder_decoder", False):
            raise ValueError(f"{config.model_type} is an encoder-decoder model")
        torch.manual_seed(seed)
        model = AutoModelForMaskedLM.from_config(config, trust_remote_code=remote)
    except Exception as err:
        raise UserInputError(
            f"encoder {ref.path}: not an encoder with a masked-LM form in transformers "
            f"({load_failure(err)})"
        ) from err
    try:
        encoder, info = AutoModel.from_pretrained(
            directory, **CHECKED_LOAD, trust_remote_code=remote
        )
    except Exception as err:
        raise UserInputError(f"encoder {ref.path}: cannot load it: {load_failure(err)}") from err
    refuse_incomplete(f"encoder {ref.path}", directory, encoder, info, unused=("pooler",))
    # keys the masked LM's encoder has and the bare model does not
    missing = set(model.base_model.load_state_dict(encoder.state_dict(), strict=False)[0])
    if missing:
        shown = ", ".join(sorted(missing)[:3]) + (" ..." if len(missing) > 3 else "")
        raise UserInputError(f"encoder {ref.path}: the checkpoint lacks encoder weights ({shown})")
    model.base_model.requires_grad_(False)
    return model.eval()


@torch.no_grad()
def masked_states(
    encoder: Any,
    copies: Sequence[MaskedCopy],
    pad_id: int,
    batch_size: int = 32,
    progress: bool = False,
) -> torch.Tensor:
    """``(n_masked, hidden) float32``: the encoder's last hidden states at each copy's masked
    positions, copies in order, positions in order; batched by length."""
    order = sorted(range(len(copies)), key=lambda i: -len(copies[i].input_ids))
    parts: list[torch.Tensor | None] = [None] * len(copies)
    starts = range(0, len(order), batch_size)
    with progress_bar("encoder states", len(starts), progress) as advance:
        for start in starts:
            chosen = order[start : start + batch_size]
            batch = pad_batch([copies[i] for i in chosen], pad_id)
            hidden = encoder(
                input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
            ).last_hidden_state
            picked = hidden[batch["rows"], batch["cols"]].float()
            counts = [len(copies[i].positions) for i in chosen]
            for i, rows in zip(chosen, picked.split(counts), strict=True):
                parts[i] = rows
            advance(1)
    return torch.cat([p for p in parts if p is not None])


class CachedEncoder(torch.nn.Module):
    """Stands in for the frozen encoder while the head trains: its input ids are row numbers of
    the cached states ``(rows, hidden)``, and it returns those rows as the last hidden states."""

    states: torch.Tensor

    def __init__(self, states: torch.Tensor):
        super().__init__()
        self.register_buffer("states", states, persistent=False)  # never in a checkpoint

    def forward(self, input_ids: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        from transformers.modeling_outputs import BaseModelOutput

        return BaseModelOutput(last_hidden_state=self.states[input_ids])


@contextmanager
def encoder_replaced(model: Any, stand_in: torch.nn.Module) -> Iterator[Any]:
    """``model`` with its encoder (``base_model``) swapped for ``stand_in``; put back on exit."""
    prefix = model.base_model_prefix
    encoder = getattr(model, prefix)
    setattr(model, prefix, stand_in)
    try:
        yield model
    finally:
        setattr(model, prefix, encoder)


class CachedBatches:
    """Batches of training examples as rows of the cached states (see ``CachedEncoder``).

    Example ``i``'s masked tokens are rows ``offsets[i]:offsets[i + 1]``; a batch's ``input_ids``
    ``(batch, width)`` holds those row numbers (padding points at row 0 and is never scored), its
    ``rows``/``cols`` every real entry, ``labels`` their gold ids. Examples are drawn with
    replacement from a generator seeded by ``(seed, index)``, as ``pretrain masked`` draws them.
    """

    def __init__(
        self,
        offsets: np.ndarray,
        labels: np.ndarray,
        lengths: np.ndarray,
        batch_size: int,
        seed: int,
        language: str,
    ):
        self.languages = [language]
        self.offsets, self.labels, self.lengths = offsets, labels, lengths
        self.batch_size, self.seed = batch_size, seed

    def batch(self, index: int) -> Batch:
        rng = np.random.default_rng([self.seed, index])
        picks = rng.integers(len(self.lengths), size=self.batch_size)
        starts, counts = self.offsets[picks], np.diff(self.offsets)[picks]
        width = max(int(counts.max()), 1)
        cols = np.concatenate([np.arange(c) for c in counts])
        rows = np.repeat(np.arange(len(picks)), counts)
        cached = np.repeat(starts, counts) + cols
        ids = np.zeros((len(picks), width), dtype=np.int64)
        ids[rows, cols] = cached
        attention = (np.arange(width)[None, :] < counts[:, None]).astype(np.int64)
        labels = torch.from_numpy(self.labels[cached]).long()
        return Batch(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(attention),
            rows=torch.from_numpy(rows).long(),
            cols=torch.from_numpy(cols).long(),
            labels=labels,
            language=torch.zeros_like(labels),
            tokens=torch.tensor([int(self.lengths[picks].sum())]),
        )


def cached_source(
    model: Any,
    tokenizer: Any,
    examples: tuple[list[str], list[str]],
    example_length: int,
    training: TrainingSpec,
    language: str,
    progress: bool = False,
) -> tuple[torch.Tensor, CachedBatches]:
    """The encoder's states ``(n_masked, hidden) float32`` under one seeded masking of every
    example (drawn from ``(example id, "head", seed)``, as a recipe draws a teacher's), and the
    batches over them; ``examples`` are ids and texts. Examples with nothing to mask are dropped."""
    masker = TeacherMasker("head", tokenizer, MaskingSpec(seed=training.seed), example_length)
    copies = masker.mask_many(*examples)
    copies = [c for c in copies if c.labels.size]
    if not copies:
        raise UserInputError(f"corpus for {language!r}: no training example has a token to mask")
    counts = np.array([c.labels.size for c in copies])
    log.info(
        "caching the encoder's states at %d masked tokens of %d examples (%.0f MB)",
        counts.sum(),
        len(copies),
        counts.sum() * model.config.hidden_size * 4 / 2**20,
    )
    states = masked_states(model.base_model, copies, tokenizer.pad_token_id or 0, progress=progress)
    source = CachedBatches(
        offsets=np.concatenate([[0], np.cumsum(counts)]),
        labels=np.concatenate([c.labels for c in copies]),
        lengths=np.array([len(c.input_ids) for c in copies]),
        batch_size=training.batch_size,
        seed=training.seed,
        language=language,
    )
    return states, source


@holding_lock("pretrain", lambda spec, **_: spec.out)
def pretrain_head(spec: HeadOnlySpec, progress: bool = True, restart: bool = False) -> Path:
    """Fit a masked-LM head on the frozen encoder ``spec`` names; write a model directory usable
    as a teacher (``spec.out``).

    Resumes from ``out/training/checkpoints`` when they were written for the same encoder,
    corpus and settings (refused, naming the change, otherwise); ``restart`` starts afresh."""
    refuse_replacing(spec.out, spec.training, restart, "head-only-teacher")
    ref = ModelRef.parse(spec.encoder).model_copy(  # messages name the setting: "model 'encoder'"
        update={"trust_remote_code": spec.trust_remote_code, "name": "encoder"}
    )
    directory = ref.source.resolve()
    limit = max_positions(directory)
    if limit is not None and spec.example_length > limit:
        raise UserInputError(
            f"example_length {spec.example_length} exceeds the {limit} positions of encoder "
            f"{spec.encoder}"
        )
    model = encoder_with_new_head(ref, directory, spec.training.seed)
    tokenizer = source_of(ref, directory).load_tokenizer()
    if tokenizer.mask_token_id is None:
        raise UserInputError(f"encoder {ref.path}: its tokenizer has no mask token")
    ids, texts = training_examples(spec.corpus, spec.language, spec.heldout_fraction)
    made_from = spec.made_from(texts)  # the text before max_examples, as keep_saved reads it
    refuse_other_made(spec.out, made_from, restart)  # no checkpoint left: text or sizes
    ids, texts = ids[: spec.max_examples], texts[: spec.max_examples]
    warn_unread(f"encoder {ref.path}", tokenizer, texts, spec.language)
    hashes = source_of(ref, directory).fingerprint()
    data = {"language": spec.language, "example_length": spec.example_length}
    inputs = {
        "corpus": sha256_texts(texts),
        "encoder": hashes["weights"],
        "tokenizer": hashes["tokenizer"],
        "data": {**data, "heldout_fraction": spec.heldout_fraction},
    }
    training = TrainingSpec.gold(spec.training)
    states, source = cached_source(
        model, tokenizer, (ids, texts), spec.example_length, training, spec.language, progress
    )
    with encoder_replaced(model, CachedEncoder(states)) as fitting:
        out = spec.out / "training"
        last = train(
            fitting, source, training, out, progress, inputs, restart, beside=ANOTHER_TEACHER
        )
    # the head's own parameters, not the tied projection
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    metadata = {
        "kind": "head-only-teacher",
        "language": spec.language,
        "corpus": spec.corpus.model_dump(mode="json"),
        "examples": len(texts),
        "heldout_fraction": spec.heldout_fraction,
        "example_length": spec.example_length,
        "encoder": {"reference": ref.path, **hashes},
        "trained_parameters": trained,
        "tied_output_projection": tied,
        "training": spec.training.model_dump(),
        "final": last,
        "made_from": made_from,
    }
    head = f"trained: {', '.join(trained)}"
    if tied:
        head += "; output projection tied to the frozen input embeddings"
    facts = [
        ("encoder", f"{ref.path} (frozen; weights sha256 {hashes['weights'][:12]})"),
        ("tokenizer", "the encoder's own"),
        ("head", head),
    ]
    card = teacher_card(
        f"{spec.language} head-only teacher (lmalgebra pretrain head-only)",
        f"A pre-trained encoder, unchanged, with a masked-LM head fitted on {spec.language} text "
        "by `lmalgebra pretrain head-only`, usable as a MergeDistill teacher.",
        spec.language,
        len(texts),
        facts,
        spec.training.model_dump(),
    )
    saved = write_model_directory(spec.out, model, tokenizer, metadata, card)
    release_checkpoints(spec.out / "training", spec.training)
    return saved
