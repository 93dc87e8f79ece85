"""Seeding the student's token embeddings from its teachers (``student.init_embeddings: teachers``).

The teachers' input embeddings live in spaces of their own widths and bases. They are brought into
one space of the student's embedding width, in closed form:

* the *reference* teacher (the widest; the first listed among equals) is projected onto its top
  principal axes (PCA of its centred embedding matrix). A reference narrower than the student
  fills its leading columns and leaves the rest at zero: the seeded rows span the reference's
  width and training grows the rest;
* every other teacher is mapped onto that PCA space by a ridge fit (the decomposition's solver,
  ``stats.LinearDecomposition``), the paired rows being the tokens it shares with the reference
  (the same student token, through the id maps).

A student token takes the mapped embedding of each teacher that has it (the mean of that
teacher's ids mapping to it, when several do), averaged over those teachers. Then one scalar
scales every seeded row so that their root-mean-square entry equals the student's initialiser
std (``initializer_range``, 0.02 for BERT), the magnitude LayerNorm and AdamW see in a random
student; the geometry between tokens is kept. A student token no teacher has (a vocabulary built
otherwise) takes, as FOCUS does, the mean of the seeded rows of the teacher pieces that the
teacher tokenizers cut its text into; it keeps its random row only when no piece is seeded, and
special tokens without a teacher keep theirs. The padding row stays as the student initialised it.

The masked-LM head's output bias is seeded with each token's prior under the teachers: the log of
the mixture, teachers weighted equally, of each teacher's prediction without context (its softmax
at the masked positions of an input of [MASK] tokens only, averaged over the positions; a token a
teacher lacks has probability 0 there). The student's output embedding is tied to the input one
and its seeded rows are small (the initialiser's scale), so without this prior the first
predictions stay near uniform over the whole union vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.masked.masking import MaskedCopy, pad_batch
from lmalgebra.distill.masked.teachers import open_teachers
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.teachers import load_lm, model_config
from lmalgebra.distill.vocab.union import STUDENT_SPECIALS, UnionVocab
from lmalgebra.experimental import warn_feature
from lmalgebra.stats.linear_decomposition import LinearDecomposition
from lmalgebra.train.masked_head import masked_logits

warn_feature("student.init_embeddings: teachers")

log = logging.getLogger(__name__)
RIDGE_ALPHA = 1e-2  # relative ridge strength of the maps onto the reference (LMD's default)
PAD = STUDENT_SPECIALS.index("[PAD]")
MIN_SHARED = 8  # fewer paired tokens than this leave a map onto the reference undetermined


@dataclass(frozen=True)
class TeacherTable:
    """One teacher's token table.

    Attributes:
        embeddings: ``(ids, d) float64``, the input embedding of each teacher id.
        prior: ``(ids,) float64``, the teacher's prediction without context (sums to 1).
        tokenizer: the teacher's tokenizer (cuts tokens no teacher has into pieces).
    """

    embeddings: np.ndarray
    prior: np.ndarray
    tokenizer: Any


@dataclass(frozen=True)
class AffineMap:
    """``x -> x @ weight.T + bias``: ``weight (width, d) float64``, ``bias (width,) float64``."""

    weight: np.ndarray
    bias: np.ndarray

    def __call__(self, rows: np.ndarray) -> np.ndarray:
        """``(n, d) -> (n, width)`` float64."""
        return rows @ self.weight.T + self.bias


@dataclass
class Seeding:
    """Seeded rows of the student's embedding matrix and output bias.

    Attributes:
        rows: ``(student_vocab, width) float64``; rows without a seed are NaN.
        bias: ``(student_vocab,) float64``; NaN where not seeded.
        maps: per teacher, its map into the reference's PCA space (before ``scale``).
        scale: the scalar applied to every mapped row.
        report: reference, shared tokens, ridge R^2 and counts, for logs and the model card.
    """

    rows: np.ndarray
    bias: np.ndarray
    maps: dict[str, AffineMap]
    scale: float
    report: dict[str, Any] = field(default_factory=dict)


def pca_map(embeddings: np.ndarray, width: int) -> AffineMap:
    """Centred projection of ``embeddings (n, d)`` onto its top ``min(d, width)`` principal axes.

    Rows ``d..width`` of the weight are zero when ``d < width``. Each axis' sign is fixed (its
    largest-magnitude entry positive) so that the map does not depend on the eigensolver.
    """
    mean = embeddings.mean(axis=0)
    centred = embeddings - mean
    values, vectors = np.linalg.eigh(centred.T @ centred)  # ascending eigenvalues, float64
    keep = min(width, embeddings.shape[1])
    axes = vectors[:, np.argsort(values)[::-1][:keep]]  # (d, keep)
    signs = np.sign(axes[np.abs(axes).argmax(axis=0), np.arange(keep)])
    weight = np.zeros((width, embeddings.shape[1]))
    weight[:keep] = (axes * signs).T
    return AffineMap(weight, -weight @ mean)


def ridge_map(source: np.ndarray, target: np.ndarray, alpha: float = RIDGE_ALPHA) -> AffineMap:
    """Ridge regression ``target (n, w) ~ source (n, d) @ W.T + b`` (LMD's solver, relative
    alpha: the penalty is ``alpha`` times the mean per-feature variance of ``source``)."""
    fit = LinearDecomposition(alpha=alpha, alpha_mode="relative").fit(source, target)
    return AffineMap(np.atleast_2d(fit.coef_), np.atleast_1d(fit.intercept_))


def per_student_id(values: np.ndarray, mapping: np.ndarray, size: int) -> np.ndarray:
    """Mean of ``values (ids, ...)`` over the teacher ids mapping to each student id.

    Returns ``(size, ...) float64``, NaN where no teacher id maps.
    """
    sums = np.zeros((size, *values.shape[1:]))
    np.add.at(sums, mapping, values)
    counts = np.bincount(mapping, minlength=size).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums / counts.reshape(-1, *([1] * (values.ndim - 1)))


def _nanmean(stack: list[np.ndarray]) -> np.ndarray:
    """Mean over the arrays that are not NaN at each place; NaN where none is."""
    data = np.stack(stack)
    have = ~np.isnan(data)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(have, data, 0.0).sum(axis=0) / have.sum(axis=0)


def mapped_reference(ids: Mapping[str, np.ndarray], widths: Mapping[str, int]) -> str:
    """The reference teacher (the first of the widest ``widths``, their embedding widths), once
    every other teacher is known to share ``MIN_SHARED`` plain tokens with it (``ids``: each
    teacher's student ids); refused, naming the first that does not."""
    reference = max(widths, key=lambda name: widths[name])
    for name, mine in ids.items():
        if name == reference:
            continue
        shared = np.intersect1d(ids[reference], mine)
        plain = int((shared >= len(STUDENT_SPECIALS)).sum())
        if plain < MIN_SHARED:
            raise UserInputError(
                f"init_embeddings: teachers: teacher {name!r} shares {plain} tokens with the "
                f"reference teacher {reference!r}, fewer than the {MIN_SHARED} needed to map its "
                "embeddings; use init_embeddings: random"
            )
    return reference


def fit_maps(
    tables: Mapping[str, TeacherTable], vocab: UnionVocab, width: int
) -> tuple[dict[str, AffineMap], dict[str, Any]]:
    """Each teacher's map into the reference teacher's PCA space of ``width`` dimensions."""
    size = len(vocab.tokens)
    widths = {name: table.embeddings.shape[1] for name, table in tables.items()}
    reference = mapped_reference({n: _map(vocab, n, tables) for n in tables}, widths)
    mine = per_student_id(tables[reference].embeddings, _map(vocab, reference, tables), size)
    maps = {reference: pca_map(tables[reference].embeddings, width)}
    target = maps[reference](np.nan_to_num(mine))
    report: dict[str, Any] = {"reference": reference, "alignment": {}}
    for name, table in tables.items():
        if name == reference:
            continue
        theirs = per_student_id(table.embeddings, _map(vocab, name, tables), size)
        shared = np.flatnonzero(~np.isnan(mine[:, 0]) & ~np.isnan(theirs[:, 0]))
        maps[name] = ridge_map(theirs[shared], target[shared])
        residual = target[shared] - maps[name](theirs[shared])
        spread = target[shared] - target[shared].mean(axis=0)
        r2 = 1 - float((residual**2).sum() / (spread**2).sum())  # pooled, as LMD scores
        report["alignment"][name] = {"shared_tokens": int(shared.size), "r2": round(r2, 4)}
    return maps, report


def _map(vocab: UnionVocab, name: str, tables: Mapping[str, TeacherTable]) -> np.ndarray:
    """Teacher ``name``'s id map cut to the rows of its embedding matrix."""
    return vocab.maps[name][: tables[name].embeddings.shape[0]].astype(np.int64)


def seed_rows(
    tables: Mapping[str, TeacherTable], vocab: UnionVocab, width: int, init_std: float
) -> Seeding:
    """Seeded embedding rows and output bias of every student token (see the module docstring).

    ``tables`` holds every teacher of ``vocab.maps``, in the recipe's order (the first of the
    widest is the reference); ``width`` is the student's embedding width, ``init_std`` the std of
    its random initialiser. The report's ``r2`` is each map's in-sample pooled R^2 on the shared
    tokens.
    """
    if missing := [name for name in vocab.maps if name not in tables]:
        raise UserInputError(f"no embeddings given for teacher {missing[0]!r} of the vocabulary")
    size = len(vocab.tokens)
    maps, report = fit_maps(tables, vocab, width)
    mapped, mixture = [], np.zeros(size)
    for name, table in tables.items():
        ids = _map(vocab, name, tables)
        mapped.append(per_student_id(maps[name](table.embeddings), ids, size))
        np.add.at(mixture, ids, table.prior[: ids.size] / len(tables))
    rows = _nanmean(mapped)
    rows[PAD] = np.nan  # feeds only padded positions, masked out: it keeps the student's own
    seeded = ~np.isnan(rows[:, 0])
    rms = float(np.sqrt(np.mean(rows[seeded] ** 2)))
    scale = init_std / rms if rms > 0 else 1.0
    rows *= scale
    with np.errstate(divide="ignore"):
        bias = np.where(mixture > 0, np.log(mixture), np.nan)
    bias[PAD] = np.nan
    focus = focus_rows(rows, bias, vocab, {n: t.tokenizer for n, t in tables.items()})
    report |= {
        "scale": scale,
        "from_teachers": int(seeded.sum()),
        "from_pieces": focus,
        "random": size - int(seeded.sum()) - focus,
    }
    return Seeding(rows, bias, maps, scale, report)


def token_pieces(token: str, vocab: UnionVocab, tokenizers: Mapping[str, Any]) -> np.ndarray:
    """Student ids of the pieces each teacher tokenizer cuts ``token``'s text into (``##`` of a
    continuation dropped): sorted, distinct, ``int64``. Specials, [UNK] and pieces without text
    (a bare SentencePiece word-start ``▁``) are left out: they overlap nothing."""
    text = token.removeprefix("##")
    found: set[int] = set()
    for name, tokenizer in tokenizers.items():
        ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
        mapping = vocab.maps[name]
        found.update(int(mapping[i]) for i in ids if i < len(mapping))
    kept = (i for i in found if i >= len(STUDENT_SPECIALS) and vocab.tokens[i].strip("#"))
    return np.array(sorted(kept), dtype=np.int64)


def focus_rows(
    rows: np.ndarray, bias: np.ndarray, vocab: UnionVocab, tokenizers: Mapping[str, Any]
) -> int:
    """Fill in place each unseeded, non-special token's row (and bias) with the mean of its seeded
    pieces' (see ``token_pieces``); returns how many tokens were filled."""
    specials = set(STUDENT_SPECIALS) | set(vocab.extra_specials)
    filled = 0
    for index in np.flatnonzero(np.isnan(rows[:, 0])):
        token = vocab.tokens[index]
        if token in specials:
            continue
        pieces = token_pieces(token, vocab, tokenizers)
        pieces = pieces[~np.isnan(rows[pieces, 0])]
        if pieces.size == 0:
            continue
        rows[index] = rows[pieces].mean(axis=0)
        known = pieces[~np.isnan(bias[pieces])]
        if known.size:
            bias[index] = bias[known].mean()
        filled += 1
    return filled


def apply_seeding(model: Any, seeding: Seeding, pad_id: int) -> None:
    """Write the seeded rows and biases into ``model``'s (tied) token embedding and output bias;
    rows left NaN and the padding row keep the model's own initialisation."""
    import torch

    weight = model.get_input_embeddings().weight
    head_bias = getattr(model.get_output_embeddings(), "bias", None)
    if seeding.rows.shape[1] != weight.shape[1] or seeding.rows.shape[0] > weight.shape[0]:
        raise ValueError(
            f"seeded rows of shape {seeding.rows.shape} do not fit the student's token "
            f"embedding of shape {tuple(weight.shape)}"
        )
    with torch.no_grad():
        for values, target in ((seeding.rows, weight), (seeding.bias, head_bias)):
            if target is None:
                continue
            known = ~np.isnan(values if values.ndim == 1 else values[:, 0])
            known[pad_id] = False
            index = torch.from_numpy(np.flatnonzero(known))
            target[index] = torch.from_numpy(values[known]).to(target.dtype)


def teacher_tables(recipe: MaskedRecipe) -> dict[str, TeacherTable]:
    """Each teacher's input embeddings and prior (``no_context_prior``), in recipe order."""
    tables = {}
    for name, teacher in open_teachers(recipe).items():
        model = load_lm(recipe.teachers[name].ref(name), teacher.directory, "masked")
        embeddings = model.get_input_embeddings().weight.detach().double().numpy()
        prior = no_context_prior(model, teacher.tokenizer, recipe.example_length)
        tables[name] = TeacherTable(embeddings, prior[: len(embeddings)], teacher.tokenizer)
        del model
    return tables


def no_context_prior(model: Any, tokenizer: Any, length: int) -> np.ndarray:
    """``(vocab,) float64``: the masked LM's softmax over an input of ``length`` tokens, its
    template's special tokens (e.g. [CLS] ... [SEP]) around [MASK] tokens only, averaged over the
    masked positions."""
    import torch

    frame = list(tokenizer("", verbose=False)["input_ids"])
    head = frame[:1] if len(frame) > 1 else []
    count = max(1, length - len(frame))
    ids = np.array(head + [tokenizer.mask_token_id] * count + frame[len(head) :], dtype=np.int64)
    copy = MaskedCopy(ids, np.arange(len(head), len(head) + count), np.zeros(count, np.int64))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    with torch.inference_mode():
        logits = masked_logits(model, pad_batch([copy], pad)).double()
    return torch.softmax(logits, dim=-1).mean(dim=0).numpy()


class TeacherSeeding:
    """The ``teachers`` embedding init (its entry point): calling it seeds a student; ``plan``
    refuses, for the dry run, what seeding would refuse."""

    def __call__(self, model: Any, recipe: MaskedRecipe, vocab: UnionVocab) -> dict[str, Any]:
        return _seed_from_teachers(model, recipe, vocab)

    @staticmethod
    def plan(vocab: UnionVocab, directories: Mapping[str, Path]) -> None:
        """Refuse teachers whose tokens seeding cannot map (``mapped_reference``), their
        embedding widths read from ``config.json`` (nothing checked where one gives none)."""
        widths = {name: _width(model_config(where)) for name, where in directories.items()}
        known = {name: width for name, width in widths.items() if width is not None}
        if len(known) == len(widths):
            mapped_reference({name: vocab.maps[name] for name in known}, known)


def _width(config: dict[str, Any]) -> int | None:
    """A masked LM's token embedding width, as its configuration gives it (None: not given)."""
    width = config.get("embedding_size", config.get("hidden_size"))
    return width if type(width) is int else None


seed_from_teachers = TeacherSeeding()


def _seed_from_teachers(model: Any, recipe: MaskedRecipe, vocab: UnionVocab) -> dict[str, Any]:
    """Seed ``model``'s token embeddings and output bias from the recipe's teachers (in place);
    returns the report of ``seed_rows``."""
    width = model.get_input_embeddings().weight.shape[1]
    seeding = seed_rows(teacher_tables(recipe), vocab, width, model.config.initializer_range)
    apply_seeding(model, seeding, pad_id=PAD)
    log.info(
        "student embeddings seeded from teachers: %d tokens from teachers, %d from their pieces, "
        "%d random (reference %s, scale %.3g)",
        seeding.report["from_teachers"],
        seeding.report["from_pieces"],
        seeding.report["random"],
        seeding.report["reference"],
        seeding.scale,
    )
    return seeding.report
