"""Sweeps: the decomposition repeated over span length, layers, training size and language.

Each sweep yields tidy rows ``setting, kind, target, basis, split, r2`` (the layer map has its own
columns). Span-length and language sweeps are new measurements (cached embeddings); layer sweeps
embed every layer in one pass; the learning curve reuses the main training statistics.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.measure import Measured, ModelLayers, ModelPool, draw_texts, measure
from lmalgebra.stats.solver import Decomposer, SplitMoments

log = logging.getLogger(__name__)

Row = dict[str, Any]


def fit_row(kind: str, target: str, basis: Sequence[str], split: str, r2: float) -> Row:
    """One fit on one split, in the columns every table of fits has."""
    return {
        "kind": kind,
        "target": target,
        "basis": "+".join(basis),
        "split": split,
        "r2": float(r2),
    }


def pairwise_rows(names: Sequence[str], pairwise: dict[str, np.ndarray]) -> list[Row]:
    """Each model of ``names`` from each other one alone (``pairwise``: split -> R^2 matrix)."""
    return [
        fit_row("pairwise", target, [basis], split, pairwise[split][i, j])
        for split in SPLITS
        for i, target in enumerate(names)
        for j, basis in enumerate(names)
        if i != j
    ]


def fit_rows(decomposer: Decomposer, setting: Any, names: Sequence[str]) -> list[Row]:
    """Pairwise and group (each model from all the others) R^2 of ``names``, every split."""
    solver = decomposer.subset(list(names)) if list(names) != _names(decomposer) else decomposer
    rows = pairwise_rows(names, solver.pairwise())
    for fit in solver.leave_one_out():
        rows += [fit_row("group", fit.target, fit.basis, s, fit.r2[s]) for s in SPLITS]
    return [{"setting": setting, **row} for row in rows]


def warn_interpolating(sweep: str, short: Sequence[str], width: int) -> None:
    """One line for the settings of a sweep whose training spans are fewer than the widest
    basis of its fits (``short``: each setting, with its spans), where each fit had warned of
    it, once per basis and setting."""
    if short:
        log.warning(
            "%s sweep: %s: fewer training spans than the widest basis's %d columns, so those "
            "fits can interpolate; trust their held-out R^2 only",
            sweep,
            ", ".join(short),
            width,
        )


def widest_basis(solver: Decomposer, names: Sequence[str]) -> int:
    """The most basis columns a fit of :func:`fit_rows` over ``names`` has (a group fit
    leaves out the narrowest model; with two, a pairwise fit is that one too)."""
    dims = [solver.block(n).basis_dim for n in names]
    return sum(dims) - min(dims)


def draw_sweep_spans(
    pool: ModelPool, docs: list[str], by_language: dict[str, list[str]] | None
) -> None:
    """Draw the spans of every span length and language the study sweeps (remembered in the
    cache, as the sweeps then read them), so that a length or a language with too little text
    is refused before any embedding, not after the main measurement; so is a k-fold choice of
    alpha with more folds than training spans."""
    spans, study = pool.config.spans, pool.config.study
    if study.alpha_select == "kfold":  # folds of training blocks: at most one block per span
        train = len(draw_texts(pool, docs, spans)[0]["train"])
        if study.folds > train:
            folds = either(f"--study.folds {study.folds}", f"study={{'folds': {study.folds}}}")
            raise UserInputError(
                f"{folds}: k-fold cuts the training spans into blocks, and the training split "
                f"has {train} spans; give fewer folds or more spans"
            )
    lengths = study.lengths or []
    drawn = [
        (either(f"--study.lengths {t}", f"study={{'lengths': {lengths}}}"), docs, {"length": t})
        for t in lengths
    ]
    drawn += [(f"language {code!r}", texts, {}) for code, texts in (by_language or {}).items()]
    for what, texts, update in drawn:
        try:
            draw_texts(pool, texts, spans.model_copy(update=update))
        except UserInputError as err:
            raise UserInputError(f"{what}: {err}") from None


def length_sweep(
    pool: ModelPool, docs: list[str], lengths: Sequence[int], alpha: float
) -> list[Row]:
    """R^2 at every span length T (new spans per T; their embeddings are cached)."""
    config = pool.config
    rows: list[Row] = []
    short, width = [], 0
    for length in lengths:
        spec = config.spans.model_copy(update={"length": length})
        measured = measure(pool, docs, spec, _model_layers(pool.names), {}, label=f"T={length}")
        solver = measured.decomposer(alpha, config.alpha_mode, None, True)
        rows += fit_rows(solver, length, pool.names)
        log.info("T=%d: %d training spans", length, measured.spans["train"])
        if solver.train.n < (width := widest_basis(solver, pool.names)):
            short.append(f"T={length} ({solver.train.n} spans)")
    warn_interpolating("length", short, width)
    return rows


def layer_sweep(pool: ModelPool, docs: list[str], alpha: float) -> list[Row]:
    """Every layer of each model fitted on all the other models (at the run's layer)."""
    config = pool.config
    rows: list[Row] = []
    layered = {}
    for name in pool.names:
        try:
            layered[name] = pool.depth(name)
        except UserInputError as err:  # an ONNX graph without hidden states, a file of vectors
            log.warning("layer sweep leaves out %s: %s", name, err)
    if not layered:
        raise UserInputError("the layer sweep needs a model with hidden layers; none has them")
    for target, depth in layered.items():
        layers = tuple(range(depth + 1))
        others = [n for n in pool.names if n != target]
        sources = [ModelLayers(target, layers), *_model_layers(others)]
        measured = measure(pool, docs, config.spans, sources, {}, label=f"{target} layers")
        solver = measured.decomposer(alpha, config.alpha_mode)
        for layer in layers:
            fit = solver.fit(f"{target}@{layer}", others)
            rows += [
                {"setting": layer, **fit_row("group", target, others, s, fit.r2[s])} for s in SPLITS
            ]
        pool.release()
    return rows


def layer_map(pool: ModelPool, docs: list[str], pair: Sequence[str], alpha: float) -> list[Row]:
    """R^2 of every layer of one model from every single layer of the other, both ways."""
    config = pool.config
    first, second = pair
    sources = [ModelLayers(name, tuple(range(_depth(pool, name) + 1))) for name in (first, second)]
    measured = measure(pool, docs, config.spans, sources, {}, label="layer map")
    solver = measured.decomposer(alpha, config.alpha_mode)
    pairwise = solver.pairwise()
    names = [b.name for b in solver.blocks]
    rows: list[Row] = []
    for split in SPLITS:
        for i, a in enumerate(names):
            for j, b in enumerate(names):
                model_a, layer_a = a.rsplit("@", 1)
                model_b, layer_b = b.rsplit("@", 1)
                if model_a == model_b:
                    continue
                rows.append(
                    {
                        "model_a": model_a,
                        "layer_a": int(layer_a),
                        "model_b": model_b,
                        "layer_b": int(layer_b),
                        "split": split,
                        "r2": float(pairwise[split][i, j]),
                    }
                )
    pool.release()
    return rows


def train_size_sweep(
    main: Measured, names: Sequence[str], alpha: float, alpha_mode: str
) -> list[Row]:
    """Learning curve: fits on growing prefixes of the training spans, scored on every split."""
    curve = main.train_curve
    if curve is None:
        raise ValueError("the main measurement kept no learning-curve statistics")
    rows: list[Row] = []
    short, width = [], 0
    for parts in range(1, len(curve.parts) + 1):
        size = curve.edges[parts]
        train = SplitMoments.of(curve.prefix(parts), in_place=True)
        solver = main.decomposer(alpha, alpha_mode, train, True)  # type: ignore[arg-type]
        rows += fit_rows(solver, size, names)
        if solver.train.n < (width := widest_basis(solver, names)):
            short.append(f"size {size}")
    warn_interpolating("train-size", short, width)
    return rows


def language_sweep(pool: ModelPool, by_language: dict[str, list[str]], alpha: float) -> list[Row]:
    """R^2 per language (spans drawn from that language's documents only)."""
    config = pool.config
    rows: list[Row] = []
    short, width = [], 0
    for language, docs in by_language.items():
        try:
            measured = measure(
                pool, docs, config.spans, _model_layers(pool.names), {}, label=language
            )
        except UserInputError as err:
            raise UserInputError(f"language {language!r}: {err}") from None
        solver = measured.decomposer(alpha, config.alpha_mode, None, True)
        rows += fit_rows(solver, language, pool.names)
        if solver.train.n < (width := widest_basis(solver, pool.names)):
            short.append(f"{language} ({solver.train.n} spans)")
    warn_interpolating("language", short, width)
    return rows


def _model_layers(names: Sequence[str]) -> list[ModelLayers]:
    return [ModelLayers(n) for n in names]


def _names(decomposer: Decomposer) -> list[str]:
    return [b.name for b in decomposer.blocks]


def _depth(pool: ModelPool, name: str) -> int:
    try:
        return pool.depth(name)
    except (AttributeError, KeyError, ValueError) as err:
        raise UserInputError(f"model {name!r}: cannot tell its number of layers ({err})") from None
