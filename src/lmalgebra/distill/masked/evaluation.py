"""``lmalgebra merge evaluate``: students against their teachers on each language's held-out text.

On every held-out example, in each teacher's own tokenisation (mapped to student ids), the student
and the teacher are scored on the same selected tokens, each of them replaced by the mask token,
as a fill-mask check does: accuracy of the top prediction, mean negative log-likelihood (and
perplexity) of the gold token, and agreement with the teacher's predictions on the same input
(top-1 match, overlap of the top-k sets). The training masking (80% mask, 10% random, 10% kept)
would show the gold token at a tenth of the positions; its top-1 accuracy is reported beside, as
``top1_training_masking`` (the teacher's from the store, where it is exact). RDT (MergeDistill,
eq. 3) is the mean relative deviation of the student from the language's teachers on the main
accuracy, in percent, positive when the student is better (``distill.run.rdt``). Scores that
compare a student with a teacher on a language the teacher was not trained on are kept, marked
``comparable`` false, and left out of RDT (``distill.masked.comparability``). The rows and
tables are ``distill.masked.scores``'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError, merge_stage
from lmalgebra.distill.examples import heldout_texts
from lmalgebra.distill.layout import RunLayout, trusted_model
from lmalgebra.distill.masked.comparability import is_comparable, teacher_languages
from lmalgebra.distill.masked.masking import MaskedCopy
from lmalgebra.distill.masked.scores import Score
from lmalgebra.distill.masked.store import TeacherCopies, load_copies
from lmalgebra.distill.masked.teachers import open_masked_teacher
from lmalgebra.distill.masked.topk import masked_topk
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.teachers import load_lm
from lmalgebra.distill.vocab.union import META_FILE, UnionVocab, apply_map
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.lockfile import holding_lock


@dataclass(frozen=True)
class Predictions:
    """A model's predictions at the held-out masked tokens of one tokenisation, in store order.

    Attributes:
        top: ``(n_masked, k) int64`` the k most likely ids, most likely first.
        nll: total negative log-likelihood of the gold tokens (nats).
    """

    top: np.ndarray
    nll: float


def heldout_copies(copies: TeacherCopies, mask_id: int | None) -> list[MaskedCopy]:
    """The held-out rows as masked copies: inputs as stored (the training masking), or with every
    selected position replaced by ``mask_id``."""
    out = []
    for r in np.flatnonzero(copies.heldout):
        ids = copies.input_ids[copies.token_offsets[r] : copies.token_offsets[r + 1]].copy()
        m0, m1 = copies.mask_offsets[r], copies.mask_offsets[r + 1]
        positions = copies.positions[m0:m1]
        if mask_id is not None:
            ids[positions] = mask_id
        out.append(MaskedCopy(ids, positions, copies.labels[m0:m1]))
    return out


def predict(
    model: Any,
    copies: list[MaskedCopy],
    k: int,
    pad_id: int,
    batch_size: int = 32,
    tokens: int | None = None,
) -> Predictions:
    """Top-k ids (of the first ``tokens``) and the gold tokens' total NLL of ``model`` over
    ``copies`` (length-batched)."""
    outputs = masked_topk(model, copies, k, pad_id, batch_size, tokens=tokens)
    scored = [(o, c) for o, c in zip(outputs, copies, strict=True) if c.labels.size]
    top = np.concatenate([o.topk_ids for o, _ in scored]) if scored else np.zeros((0, k), int)
    return Predictions(top.astype(np.int64), float(sum(o.loss * c.labels.size for o, c in scored)))


def _heldout_tokens(copies: TeacherCopies) -> np.ndarray:
    """``(n_masked,) int64`` store indices of the held-out rows' selected tokens, in order."""
    rows = np.flatnonzero(copies.heldout)
    spans = zip(copies.mask_offsets[rows], copies.mask_offsets[rows + 1], strict=True)
    return np.concatenate([np.zeros(0, np.int64), *(np.arange(a, b) for a, b in spans)])


def _score(
    ids: tuple[str, str, str],
    copies: TeacherCopies,
    main: Predictions,
    training_top: np.ndarray,
    reference: np.ndarray,
    unk_id: int | None,
) -> Score:
    """A ``Score`` from the top-k on the all-mask input (``main``) and the top-1 under the training
    masking (``training_top`` ``(n_masked, >=1)``), against the teacher's top-k ``reference``
    ``(n_masked, k)`` on the all-mask input, all in the ids of ``copies``. A gold unknown token
    (``unk_id``) counts as missed, as teacher selection counts it: a teacher that reads a
    language as unknown tokens had scored high by predicting them, and RDT compared with it."""
    labels = copies.labels[_heldout_tokens(copies)]
    total = max(labels.size, 1)
    known = labels if unk_id is None else np.where(labels == unk_id, -1, labels)
    overlap = (main.top[:, :, None] == reference[:, None, :]).any(2).sum() / reference.shape[1]
    loss = main.nll / total
    return Score(
        *ids,
        examples=int(copies.heldout.sum()),
        masked_tokens=int(labels.size),
        accuracy=float(np.sum(main.top[:, 0] == known)) / total,
        loss=loss,
        perplexity=float(np.exp(loss)),
        top1_agreement=float(np.sum(main.top[:, 0] == reference[:, 0])) / total,
        topk_overlap=float(overlap) / total,
        top1_training_masking=float(np.sum(training_top[:, 0] == known)) / total,
    )


@torch.inference_mode()
def teacher_score(
    lang: str, teacher: str, raw: TeacherCopies, model: Any, tokenizer: Any, batch_size: int = 32
) -> tuple[Score, np.ndarray]:
    """The teacher's score in its own ids, and its top-k ``(n_masked, k)`` on the all-mask input
    (the reference of the students' agreement). Its training-masking top-1 comes from the store."""
    copies = heldout_copies(raw, tokenizer.mask_token_id)
    pad_id, k = tokenizer.pad_token_id or 0, raw.topk_ids.shape[1]
    main = predict(model, copies, k, pad_id, batch_size, len(tokenizer))
    stored = raw.topk_ids[_heldout_tokens(raw)]
    score = _score((lang, teacher, teacher), raw, main, stored, main.top, tokenizer.unk_token_id)
    return score, main.top


@torch.inference_mode()
def student_score(
    ids: tuple[str, str, str],
    model: Any,
    mapped: TeacherCopies,
    mask_id: int,
    reference: np.ndarray,
    batch_size: int = 32,
    unk_id: int | None = None,
) -> Score:
    """Student ``ids[2]``'s score on language ``ids[0]`` in teacher ``ids[1]``'s tokenisation
    (``mapped`` to student ids; ``mask_id``, ``unk_id``: the teacher's mask and unknown tokens
    in student ids), against the teacher's all-mask top-k ``reference`` in student ids."""
    main = predict(model, heldout_copies(mapped, mask_id), reference.shape[1], 0, batch_size)
    training = predict(model, heldout_copies(mapped, None), 1, 0, batch_size)
    return _score(ids, mapped, main, training.top, reference, unk_id)


def _load_student(layout: RunLayout, name: str) -> Any:
    directory = trusted_model(
        layout.model(name),
        f"{layout.model(name)} has no trained student: run {merge_stage('train', name)} first",
    )
    return load_lm(ModelRef(name=name, path=str(directory)), directory, "masked", "student")


def _load_teacher(recipe: MaskedRecipe, name: str) -> tuple[Any, Any]:
    """The teacher's masked LM and tokenizer (its all-mask predictions are not in the store)."""
    layout = RunLayout(recipe.output_dir)
    ref = recipe.teachers[name].ref(name)
    teacher = open_masked_teacher(ref, layout.hashes)  # its store: checked by check_students
    return load_lm(ref, teacher.directory, "masked"), teacher.tokenizer


def _pair_scores(
    run_dir: Path,
    pair: tuple[str, str],
    teacher: tuple[Any, Any],
    vocab: UnionVocab,
    students: dict[str, Any],
    batch_size: int = 32,
) -> list[Score]:
    """The teacher's and each student's scores on one (language, teacher tokenisation)."""
    lang, name = pair
    model, tokenizer = teacher
    own, reference = teacher_score(
        lang, name, load_copies(run_dir, lang, name, None), model, tokenizer, batch_size
    )
    mapping = vocab.maps[name]
    mapped = load_copies(run_dir, lang, name, vocab)
    mask_id = int(apply_map(np.array([tokenizer.mask_token_id]), mapping)[0])
    unk = tokenizer.unk_token_id
    unk_id = None if unk is None else int(apply_map(np.array([unk]), mapping)[0])
    in_student_ids = apply_map(reference, mapping)
    return [own] + [
        student_score((lang, name, s), m, mapped, mask_id, in_student_ids, batch_size, unk_id)
        for s, m in students.items()
    ]


@holding_lock("merge evaluate", lambda recipe, **_: recipe.output_dir)
def evaluate_run(
    recipe: MaskedRecipe,
    students: list[str],
    languages: list[str] | None = None,
    batch_size: int = 32,
) -> list[Score]:
    """Scores of every teacher and student per (language, teacher) of the recipe's run (of
    ``languages``, default every language)."""
    layout = RunLayout(recipe.output_dir)
    teachers_of = {lang: spec.teachers for lang, spec in recipe.languages.items()}
    trained_on = teacher_languages({n: t.path for n, t in recipe.teachers.items()})
    for lang in languages or []:
        if lang not in teachers_of:
            raise UserInputError(
                f"language {lang!r} is not in the run {layout.root} "
                f"(languages: {', '.join(teachers_of)})"
            )
    if not (layout.vocab / META_FILE).is_file():
        raise UserInputError(f"{layout.vocab} is missing: run {merge_stage('vocab')} first")
    chosen = list(languages or teachers_of)
    heldout_texts(layout.root, chosen)  # a language holding out no example has nothing to score
    vocab = UnionVocab.load(layout.vocab)
    models = {name: _load_student(layout, name) for name in students}
    teachers: dict[str, tuple[Any, Any]] = {}
    scores: list[Score] = []
    for lang in chosen:
        for teacher in teachers_of[lang]:
            if teacher not in teachers:
                teachers[teacher] = _load_teacher(recipe, teacher)
            comparable = is_comparable(lang, trained_on.get(teacher))
            pair = _pair_scores(
                layout.root, (lang, teacher), teachers[teacher], vocab, models, batch_size
            )
            scores += [replace(score, comparable=comparable) for score in pair]
    return scores
