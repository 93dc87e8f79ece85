"""A candidate teacher's quality on a language's held-out text: masked-token accuracy and loss.

The positions are those the recipe's masking would choose for the teacher (same seed, same
example ids), and every one of them is replaced by the mask token, so the model never sees a gold
token it is asked for (fill-mask style). It needs only the teacher and the held-out examples: it
runs before any teacher inference on the corpus.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from lmalgebra.distill.examples import Example
from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker, pad_batch
from lmalgebra.distill.recipe import MaskingSpec
from lmalgebra.distill.teachers import Teacher, load_lm
from lmalgebra.sources.models import ModelRef
from lmalgebra.train.masked_head import masked_logits


@dataclass(frozen=True)
class TeacherQuality:
    """Held-out masked-token scores of one teacher on one language."""

    language: str
    teacher: str
    examples: int
    masked_tokens: int
    accuracy: float  # top-1; a gold unknown token counts as missed
    loss: float  # mean negative log-likelihood of the gold token, nats


def fully_masked(copy: MaskedCopy, mask_id: int) -> MaskedCopy:
    """The copy with every chosen position shown as the mask token."""
    ids = copy.input_ids.copy()
    ids[copy.positions] = mask_id
    return MaskedCopy(ids, copy.positions, copy.labels)


@torch.inference_mode()
def held_out_quality(
    language: str,
    teacher: Teacher,
    ref: ModelRef,
    examples: Sequence[Example],
    masking: MaskingSpec,
    example_length: int,
    batch_size: int = 32,
) -> TeacherQuality:
    """Score ``teacher`` on ``examples`` (its masking, every chosen position masked)."""
    model = load_lm(ref, teacher.directory, "masked")
    tokenizer = teacher.tokenizer
    masker = TeacherMasker(teacher.name, tokenizer, masking, example_length)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    copies = [fully_masked(masker(e.id, e.text), tokenizer.mask_token_id) for e in examples]
    copies = [c for c in copies if c.positions.size]
    correct, nll, total = 0, 0.0, 0
    for start in range(0, len(copies), batch_size):
        chunk = copies[start : start + batch_size]
        logits = masked_logits(model, pad_batch(chunk, pad)).float()
        labels = torch.from_numpy(np.concatenate([c.labels for c in chunk]))
        hit = logits.argmax(-1) == labels
        if tokenizer.unk_token_id is not None:  # its unknown token predicted is no credit: a
            hit &= labels != tokenizer.unk_token_id  # teacher that reads a language as it had led
        correct += int(hit.sum())
        nll += float(torch.nn.functional.cross_entropy(logits, labels, reduction="sum"))
        total += labels.numel()
    return TeacherQuality(
        language,
        teacher.name,
        len(copies),
        total,
        correct / total if total else 0.0,
        nll / total if total else float("nan"),
    )
