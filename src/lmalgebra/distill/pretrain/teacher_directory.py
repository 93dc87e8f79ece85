"""What every ``pretrain`` command refuses before it trains the model directory ``out`` (its
training in ``out/training``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.distill.layout import refuse_special_entries, saved_steps, saved_training
from lmalgebra.distill.teachers import warn_unknown
from lmalgebra.train.config import OptimisationSpec
from lmalgebra.train.loop import (
    refuse_fewer_steps,
    refuse_other_inputs_saved,
    refuse_other_training,
    refuse_training_parts,
)

# how a pretrain makes a teacher beside one it would replace, as a refusal offers it
ANOTHER_TEACHER = either("another --out", "another out in the spec")
UNREAD_SAMPLE = 1000  # texts whose tokens are counted (the first of the corpus)


# the kind each pretrain command records in its model's ``lmalgebra.json``, as users name it
TEACHER_KINDS = {
    "pretrained-teacher": "masked teacher",
    "pretrained-causal-teacher": "causal teacher",
    "head-only-teacher": "head-only teacher",
}


def other_kind(directory: Path, kind: str) -> str | None:
    """The model lmalgebra saved at ``directory`` as another kind than ``kind``, as a message
    shows it (``a causal LM teacher (lmalgebra.json kind 'causal-teacher')``); None where it
    saved none there, or one of ``kind``."""
    found = saved_training(directory, "kind")
    if not isinstance(found, str) or found == kind:
        return None
    return (
        f"a {TEACHER_KINDS.get(found, f'model of kind {found!r}')} (lmalgebra.json kind {found!r})"
    )


def refuse_other_kind_saved(out: Path, kind: str) -> None:
    """Refuse a model saved at ``out`` of another kind than ``kind`` (a causal teacher where a
    masked one is made, a merge run's student): its checkpoints had been named as of "other
    inputs", and ``--restart`` offered; kept (``keep_saved``), it had been returned as this
    spec's teacher, or refused as made from other inputs, naming sizes."""
    if (shown := other_kind(out, kind)) is not None:
        raise UserInputError(
            f"{out} holds {shown}, and this makes a {TEACHER_KINDS[kind]}; give another --out "
            "(out), or remove it"
        )


def refuse_replacing(out: Path, training: OptimisationSpec, restart: bool, kind: str) -> None:
    """Refuse a model saved at ``out`` of another kind than ``kind`` (``refuse_other_kind_saved``),
    a training directory training cannot write in, and (unless ``restart``) a model that
    ``training`` would replace: one trained further (``steps: 0``, say) or with other
    settings; and a link or a FIFO among the model's files, which saving it refuses (it had,
    after every step)."""
    refuse_other_kind_saved(out, kind)
    refuse_training_parts(out / "training", itself=True)
    refuse_special_entries(out)
    if not restart:
        refuse_fewer_steps(saved_steps(out), training.steps, out, ANOTHER_TEACHER)
        refuse_other_training(
            saved_training(out), training, [out / "training"], out, ANOTHER_TEACHER
        )


def refuse_other_made(out: Path, made_from: dict[str, Any], restart: bool) -> None:
    """Unless ``restart``, refuse a model saved at ``out`` made from other inputs than
    ``made_from`` (its text, sizes, tokenizer: ``PretrainText.made_from``) when no checkpoint is
    left to tell: training would replace it from step 0."""
    if not restart:
        recorded = saved_training(out, "made_from")
        kept = saved_training(out)
        refuse_other_inputs_saved(recorded, made_from, [out / "training"], out, kept)


def warn_unread(owner: str, tokenizer: Any, texts: list[str], language: str) -> None:
    """Warn when a tokenizer the text was not trained on (``owner``: where it was given) reads
    much of the language as its unknown token (``distill.teachers.warn_unknown``): the teacher
    trained on it had learnt to predict that token, unsaid."""
    if tokenizer.unk_token_id is None:
        return
    rows = tokenizer(texts[:UNREAD_SAMPLE], add_special_tokens=False, verbose=False)["input_ids"]
    unknown = sum(row.count(tokenizer.unk_token_id) for row in rows)
    warn_unknown(owner, unknown, sum(len(r) for r in rows), language, tokenizer.unk_token)
