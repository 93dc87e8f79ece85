"""Pre-training a small monolingual causal teacher from scratch: a tokenizer of a chosen kind
(``causal_tokenizers``), then a GPT-2-style causal LM trained with the toolkit's one training loop.

The loop trains on labels at chosen positions (``train.batches.Batch``: ``rows``, ``cols``,
``labels``); for a causal LM those are every position of a window and the token after it, so the
same step, loss and checkpoints serve (the gold term, logged as ``mlm``, is then the next-token
cross-entropy). Windows start with the beginning-of-sequence token when they start a document.
Examples held out by a recipe with the same language and held-out fraction are held out here too.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.distill.pretrain.masked import training_examples
from lmalgebra.distill.run.model_card import causal_teacher_card, write_card
from lmalgebra.distill.student import StudentSpec
from lmalgebra.distill.vocab.tokenizer_choice import TokenizerKind
from lmalgebra.distill.vocab.tokenizer_trainers import train_causal_tokenizer
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.batches import Batch
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.loop import train

log = logging.getLogger(__name__)


def build_causal_lm(spec: StudentSpec, tokenizer: Any, seed: int = 0) -> Any:
    """A freshly initialised ``GPT2LMHeadModel`` of ``spec``'s sizes for ``tokenizer``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    if spec.embedding_size not in (None, spec.hidden_size):
        raise UserInputError("a causal teacher has no factorised embeddings: omit embedding_size")
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=spec.max_position_embeddings,
        n_embd=spec.hidden_size,
        n_layer=spec.num_layers,
        n_head=spec.num_heads,
        n_inner=spec.intermediate_size,
        resid_pdrop=spec.dropout,
        embd_pdrop=spec.dropout,
        attn_pdrop=spec.dropout,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    return GPT2LMHeadModel(config)


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


@holding_lock("pretrain", lambda out, **_: out)
def pretrain_causal(
    corpus: CorpusSpec,
    language: str,
    kind: TokenizerKind,
    vocab_size: int,
    out: Path,
    model: StudentSpec,
    training: TrainingSpec,
    example_length: int = 128,
    heldout_fraction: float = 0.05,
    progress: bool = True,
    restart: bool = False,
) -> Path:
    """Train a ``kind`` tokenizer and a causal LM; write a model directory usable as a causal
    teacher (``AutoModelForCausalLM``, ``text-generation`` pipeline).

    ``example_length``: tokens per training window. Resumes from ``out/training/checkpoints``
    when they were written for the same corpus and settings; ``restart`` starts afresh."""
    if not 2 <= example_length <= model.max_position_embeddings:
        raise UserInputError(
            f"--example-length must be between 2 and the model's "
            f"{model.max_position_embeddings} positions, got {example_length}"
        )
    if not 0 <= heldout_fraction < 1:
        raise UserInputError(f"--heldout-fraction must be in [0, 1), got {heldout_fraction}")
    kept_ids, texts = training_examples(corpus, language, heldout_fraction)
    tokenizer = train_causal_tokenizer(texts, kind, vocab_size, model.max_position_embeddings)
    network = build_causal_lm(model, tokenizer, training.seed)
    source = CausalTextBatches(
        _sequences(tokenizer, texts),
        example_length,
        training.batch_size,
        training.seed,
        language,
        tokenizer.pad_token_id,
    )
    data = {
        "language": language,
        "objective": "causal",
        "tokenizer_kind": kind,
        "vocab_size": vocab_size,
        "example_length": example_length,
        "heldout_fraction": heldout_fraction,
    }
    inputs = {"corpus": sha256_texts(texts), "data": data}
    spec = training.model_copy(update={"gold_only": True})
    last = train(network, source, spec, out / "training", progress, inputs, restart)
    (out / "lmalgebra.json").unlink(missing_ok=True)  # written last: marks the teacher complete
    with naming_file(out):
        network.save_pretrained(out)
        tokenizer.save_pretrained(out)
    card = causal_teacher_card(
        language, len(texts), kind, len(tokenizer), model.model_dump(), training.model_dump()
    )
    write_card(out, card)
    write_json_atomic(
        out / "lmalgebra.json",
        {
            "kind": "pretrained-causal-teacher",
            **data,
            "corpus": corpus.model_dump(mode="json"),
            "examples": len(kept_ids),
            "model": model.model_dump(),
            "training": training.model_dump(),
            "final": last,
        },
    )
    return out
