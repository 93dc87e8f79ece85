"""``lmalgebra merge evaluate``: students against their teachers on each language's held-out text.

On every held-out example, in each teacher's own tokenisation (mapped to student ids), the student
and the teacher are scored on the same selected tokens, each of them replaced by the mask token,
as a fill-mask check does: accuracy of the top prediction, mean negative log-likelihood (and
perplexity) of the gold token, and agreement with the teacher's predictions on the same input
(top-1 match, overlap of the top-k sets). The training masking (80% mask, 10% random, 10% kept)
would show the gold token at a tenth of the positions; its top-1 accuracy is reported beside, as
``top1_training_masking`` (the teacher's from the store, where it is exact). RDT (MergeDistill,
eq. 3) is the mean relative deviation of the student from the language's teachers on the main
accuracy, in percent, positive when the student is better, as in the paper's tables:
``100 / n * sum_i (P_S - P_Ti) / P_Ti``. Scores that compare a student with a
teacher on a language the teacher was not trained on are kept, marked ``comparable`` false, and
left out of RDT (:mod:`lmalgebra.evaluate.comparability`).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import read_yaml, validate
from lmalgebra.distill.masked.masking import MaskedCopy
from lmalgebra.distill.masked.store_view import TeacherCopies, load_copies
from lmalgebra.distill.masked.topk import masked_topk
from lmalgebra.distill.recipe import TeacherSpec
from lmalgebra.distill.run.model_card import add_evaluation
from lmalgebra.distill.student_inputs import check_student_name
from lmalgebra.distill.teachers import load_masked_lm, open_teacher
from lmalgebra.distill.vocab.union import UnionVocab, apply_map
from lmalgebra.evaluate.comparability import is_comparable, teacher_languages
from lmalgebra.figures import canvas
from lmalgebra.storage.atomic import write_text_atomic
from lmalgebra.storage.csv_tables import Table, csv_text, format_cell, write_table
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.storage.shard_set import ShardSet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Score:
    """Scores of one model on one (language, teacher tokenisation) held-out set.

    ``accuracy``, ``loss``, ``perplexity`` and the agreements score inputs whose selected tokens
    are all the mask token; ``top1_training_masking`` is the top-1 accuracy under the training
    masking (80/10/10), where a tenth of the positions show their gold token (NaN: not measured).
    """

    language: str
    teacher: str
    model: str
    examples: int
    masked_tokens: int
    accuracy: float
    loss: float
    perplexity: float
    top1_agreement: float
    topk_overlap: float
    top1_training_masking: float = math.nan
    # False: the teacher was not trained on this language (see evaluate.comparability); the row
    # is shown but left out of RDT and of averages
    comparable: bool = True


SCORES = Table("scores.csv", Score, nan="nan")  # one row per (language, tokenisation, model)
RDT = "rdt.csv"  # a row per student: RDT in percent per language, then "average"
RDT_FIRST_COLUMN = "student"
RDT_DECIMALS = 3
EVALUATION_DIR = "evaluation"  # in the run directory
EVALUATION_MD = "evaluation.md"
ACCURACY_PLOT = "accuracy.png"


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
    model: Any, copies: list[MaskedCopy], k: int, pad_id: int, batch_size: int = 32
) -> Predictions:
    """Top-k ids and the gold tokens' total NLL of ``model`` over ``copies`` (length-batched)."""
    outputs = masked_topk(model, copies, k, pad_id, batch_size)
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
) -> Score:
    """A ``Score`` from the top-k on the all-mask input (``main``) and the top-1 under the training
    masking (``training_top`` ``(n_masked, >=1)``), against the teacher's top-k ``reference``
    ``(n_masked, k)`` on the all-mask input, all in the ids of ``copies``."""
    labels = copies.labels[_heldout_tokens(copies)]
    total = max(labels.size, 1)
    overlap = (main.top[:, :, None] == reference[:, None, :]).any(2).sum() / reference.shape[1]
    loss = main.nll / total
    return Score(
        *ids,
        examples=int(copies.heldout.sum()),
        masked_tokens=int(labels.size),
        accuracy=float(np.sum(main.top[:, 0] == labels)) / total,
        loss=loss,
        perplexity=float(np.exp(loss)),
        top1_agreement=float(np.sum(main.top[:, 0] == reference[:, 0])) / total,
        topk_overlap=float(overlap) / total,
        top1_training_masking=float(np.sum(training_top[:, 0] == labels)) / total,
    )


@torch.inference_mode()
def teacher_score(
    lang: str, teacher: str, raw: TeacherCopies, model: Any, tokenizer: Any, batch_size: int = 32
) -> tuple[Score, np.ndarray]:
    """The teacher's score in its own ids, and its top-k ``(n_masked, k)`` on the all-mask input
    (the reference of the students' agreement). Its training-masking top-1 comes from the store."""
    copies = heldout_copies(raw, tokenizer.mask_token_id)
    main = predict(model, copies, raw.topk_ids.shape[1], tokenizer.pad_token_id or 0, batch_size)
    stored = raw.topk_ids[_heldout_tokens(raw)]
    return _score((lang, teacher, teacher), raw, main, stored, main.top), main.top


@torch.inference_mode()
def student_score(
    ids: tuple[str, str, str],
    model: Any,
    mapped: TeacherCopies,
    mask_id: int,
    reference: np.ndarray,
    batch_size: int = 32,
) -> Score:
    """Student ``ids[2]``'s score on language ``ids[0]`` in teacher ``ids[1]``'s tokenisation
    (``mapped`` to student ids; ``mask_id``: the teacher's mask token in student ids), against
    the teacher's all-mask top-k ``reference`` in student ids."""
    main = predict(model, heldout_copies(mapped, mask_id), reference.shape[1], 0, batch_size)
    training = predict(model, heldout_copies(mapped, None), 1, 0, batch_size)
    return _score(ids, mapped, main, training.top, reference)


def rdt(scores: list[Score], student: str, metric: str = "accuracy") -> dict[str, float]:
    """Per language and averaged: ``100/n sum_i (P_S - P_Ti) / P_Ti`` over its teachers.

    A teacher scoring 0 leaves its term undefined: it is left out of the sum (see
    ``undefined_rdt``), and so is a score that is not comparable (see ``not_comparable``); a
    language with no term left is NaN, and the average is over the languages that have a value
    (NaN when none has)."""
    out: dict[str, float] = {}
    for lang in sorted({s.language for s in scores}):
        deviations = []
        for s in scores:
            if s.language == lang and s.model == student and s.comparable:
                teacher = next(t for t in scores if t.language == lang and t.model == s.teacher)
                base = getattr(teacher, metric)
                if base:
                    deviations.append((getattr(s, metric) - base) / base)
        out[lang] = 100 * float(np.mean(deviations)) if deviations else float("nan")
    defined = [v for v in out.values() if not np.isnan(v)]
    out["average"] = float(np.mean(defined)) if defined else float("nan")
    return out


def undefined_rdt(scores: list[Score], metric: str = "accuracy") -> list[str]:
    """One note per teacher whose ``metric`` is 0 on a language: RDT against it is undefined."""
    return [
        f"teacher {s.model} scores 0 {metric} on {s.language}: RDT against it is undefined and "
        "left out (a teacher that predicts no masked token right cannot be a reference)"
        for s in scores
        if s.model == s.teacher and not getattr(s, metric)
    ]


def incomparable_languages(scores: list[Score], student: str) -> list[str]:
    """The languages on which ``student`` has scores and none of them is comparable: its RDT
    there is left blank, as not comparable."""
    mine = [s for s in scores if s.model == student]
    return sorted({s.language for s in mine} - {s.language for s in mine if s.comparable})


def not_comparable(scores: list[Score]) -> list[str]:
    """One note per teacher with scores that are not comparable, naming the languages."""
    languages: dict[str, set[str]] = {}
    for s in scores:
        if not s.comparable:
            languages.setdefault(s.teacher, set()).add(s.language)
    return [
        f"teacher {teacher} was not trained on {', '.join(sorted(langs))}: scores there in its "
        "tokenisation are not comparable (comparable = false) and are left out of RDT and its "
        "average"
        for teacher, langs in languages.items()
    ]


def _load_student(run_dir: Path, name: str) -> Any:
    check_student_name(name)
    from transformers import AutoModelForMaskedLM

    directory = run_dir / name / "model"
    if not (directory / "config.json").is_file():
        raise UserInputError(
            f"{directory} has no trained student: run "
            f"`lmalgebra merge train RECIPE --name {name}` first"
        )
    return AutoModelForMaskedLM.from_pretrained(directory).eval()


def _load_teacher(run_dir: Path, spec: dict[str, Any], name: str) -> tuple[Any, Any]:
    """The teacher's masked LM and tokenizer (its all-mask predictions are not in the store)."""
    ref = validate(TeacherSpec, spec, str(run_dir / "recipe.yaml")).ref(name)
    teacher = open_teacher(ref, run_dir / ".hashes")
    for manifest in (run_dir / "topk").glob(f"*/{name}/manifest.json"):
        if ShardSet.existing(manifest.parent).manifest.get("teacher_hashes") != teacher.hashes:
            raise UserInputError(
                f"teacher {name!r} ({teacher.directory}) changed since `lmalgebra merge teach` "
                f"wrote {manifest.parent}: run it again on the run's recipe"
            )
    return load_masked_lm(ref, teacher.directory), teacher.tokenizer


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
    in_student_ids = apply_map(reference, mapping)
    return [own] + [
        student_score((lang, name, s), m, mapped, mask_id, in_student_ids, batch_size)
        for s, m in students.items()
    ]


@holding_lock("merge evaluate", lambda run_dir, **_: run_dir)
def evaluate_run(
    run_dir: Path, students: list[str], languages: list[str] | None = None, batch_size: int = 32
) -> tuple[list[Score], dict[str, dict[str, float]]]:
    """Scores of every teacher and student per (language, teacher), and each student's RDT."""
    recipe_path = run_dir / "recipe.yaml"
    if not recipe_path.is_file():
        raise UserInputError(
            f"{run_dir} is not a merge run directory (no recipe.yaml): "
            "run `lmalgebra merge prepare RECIPE` first"
        )
    recipe = read_yaml(recipe_path)
    if recipe.get("objective") == "causal":
        raise UserInputError(
            f"{run_dir} holds a causal store: score causal models with "
            f"`lmalgebra merge bits-per-byte {run_dir}`"
        )
    teachers_of = {lang: spec["teachers"] for lang, spec in recipe["languages"].items()}
    trained_on = teacher_languages(recipe.get("teachers", {}))
    for lang in languages or []:
        if lang not in teachers_of:
            raise UserInputError(
                f"language {lang!r} is not in the run {run_dir} "
                f"(languages: {', '.join(teachers_of)})"
            )
    if not (run_dir / "vocab" / "vocab_union.json").is_file():
        raise UserInputError(
            f"{run_dir / 'vocab'} is missing: run `lmalgebra merge vocab RECIPE` first"
        )
    vocab = UnionVocab.load(run_dir / "vocab")
    models = {name: _load_student(run_dir, name) for name in students}
    teachers: dict[str, tuple[Any, Any]] = {}
    scores: list[Score] = []
    for lang in languages or list(teachers_of):
        for teacher in teachers_of[lang]:
            if teacher not in teachers:
                teachers[teacher] = _load_teacher(run_dir, recipe["teachers"][teacher], teacher)
            comparable = is_comparable(lang, trained_on.get(teacher))
            pair = _pair_scores(
                run_dir, (lang, teacher), teachers[teacher], vocab, models, batch_size
            )
            scores += [replace(score, comparable=comparable) for score in pair]
    deviations = {name: rdt(scores, name) for name in students}
    for name in students:
        mine = [s for s in scores if s.model in (name, s.teacher)]
        add_evaluation(run_dir / name / "model", markdown(mine, {name: deviations[name]}))
    return scores, deviations


def evaluate_students(
    run_dir: Path, students: list[str], languages: list[str] | None = None
) -> tuple[list[Score], dict[str, dict[str, float]]]:
    """``evaluate_run``, then its tables written to ``run_dir/evaluation`` (``merge evaluate``)."""
    scores, deviations = evaluate_run(run_dir, students, languages)
    write_evaluation(run_dir / EVALUATION_DIR, scores, deviations)
    return scores, deviations


@holding_lock("merge evaluate", lambda out, **_: out)
def write_evaluation(
    out: Path, scores: list[Score], deviations: dict[str, dict[str, float]]
) -> None:
    """``scores.csv``, ``rdt.csv``, ``evaluation.md`` and ``accuracy.png`` under ``out``."""
    write_table(out, SCORES, scores)
    write_text_atomic(out / RDT, rdt_text(deviations))
    write_text_atomic(out / EVALUATION_MD, markdown(scores, deviations))
    _bar_plot(scores, out / ACCURACY_PLOT)


def rdt_text(deviations: dict[str, dict[str, float]]) -> str:
    """``rdt.csv``: a header ``student,LANG,...,average`` and one row per student."""
    columns = list(next(iter(deviations.values())))
    rows: list[list[str]] = [[RDT_FIRST_COLUMN, *columns]]
    rows += [
        [name, *(format_cell(v[k], RDT_DECIMALS) for k in columns)]
        for name, v in deviations.items()
    ]
    return csv_text(rows)


def _or_na(value: float) -> str:
    return "n/a" if np.isnan(value) else f"{value:.4f}"


def markdown(scores: list[Score], deviations: dict[str, dict[str, float]]) -> str:
    lines = [
        "Every scored token replaced by the mask token; the training masking (80/10/10, a tenth "
        "of the tokens shown) beside, for reference.",
        "",
        "| language | tokenisation | model | masked tokens | accuracy | perplexity | "
        "top-1 agreement | top-k overlap | accuracy (training masking) | comparable |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in scores:
        lines.append(
            f"| {s.language} | {s.teacher} | {s.model} | {s.masked_tokens} | "
            f"{s.accuracy:.4f} | {s.perplexity:.2f} | {s.top1_agreement:.3f} | "
            f"{s.topk_overlap:.3f} | {_or_na(s.top1_training_masking)} | "
            f"{'yes' if s.comparable else 'no'} |"
        )
    lines += [
        "",
        "RDT on masked-token accuracy (%, positive = student better than its teachers):",
        "",
        "| student | " + " | ".join(next(iter(deviations.values()))) + " |",
        "|---|" + "---|" * len(next(iter(deviations.values()))),
    ]
    for name, values in deviations.items():
        apart = incomparable_languages(scores, name)
        cells = (
            "not comparable" if k in apart else "n/a" if np.isnan(v) else f"{v:+.2f}"
            for k, v in values.items()
        )
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    notes = [*undefined_rdt(scores), *not_comparable(scores)]
    lines += ["", *(f"Note: {note}." for note in notes)]
    return "\n".join(lines).rstrip("\n") + "\n"


def _bar_plot(scores: list[Score], path: Path) -> None:
    groups = sorted({(s.language, s.teacher) for s in scores})
    comparable = {(s.language, s.teacher) for s in scores if s.comparable}
    models = list(dict.fromkeys("teacher" if s.model == s.teacher else s.model for s in scores))
    fig, axes = canvas.figure(1, 1, max(5.0, 1.4 * len(groups) * len(models) / 2), 3.6, layout=None)
    ax = axes[0, 0]
    width = 0.8 / len(models)
    for m, model in enumerate(models):
        values = [
            next(
                (
                    s.accuracy
                    for s in scores
                    if (s.language, s.teacher) == g
                    and ("teacher" if s.model == s.teacher else s.model) == model
                ),
                0.0,
            )
            for g in groups
        ]
        ax.bar(np.arange(len(groups)) + m * width, values, width, label=model)
    ax.set_xticks(
        np.arange(len(groups)) + width * (len(models) - 1) / 2,
        [
            f"{lang}\n({teacher})" + ("" if (lang, teacher) in comparable else "\nnot comparable")
            for lang, teacher in groups
        ],
    )
    ax.set_ylabel("held-out masked-token accuracy")
    ax.legend()
    fig.tight_layout()
    canvas.save(fig, path, dpi=120)
