"""Warnings that keep a small or unusual run from misleading: each says what is off and the remedy.

They go to the log, into ``summary.json`` (``warnings``), the terminal caption and the HTML report.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

import numpy as np

from lmalgebra.core.errors import either
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.spans.draw import SPAN_LENGTH, shortfall
from lmalgebra.sources.embed_spec import TokenReport
from lmalgebra.stats.moments import ModelColumns
from lmalgebra.stats.solver import SplitMoments

log = logging.getLogger(__name__)
# remedies as both the command line and the Python API name them (both reach these warnings)
_GCV = either("--study.alpha_select gcv", 'study={"alpha_select": "gcv"}')
_TRAIN_SIZES = either("--study.train_sizes", 'study={"train_sizes": [...]}')


def _bootstrap(replicates: int) -> str:
    return either(f"--study.bootstrap {replicates}", f'study={{"bootstrap": {replicates}}}')


def _widest_basis(names: Sequence[str], blocks: Sequence[ModelColumns] | None) -> tuple[str, int]:
    """The group fit with the most basis columns: (its target, that width)."""
    if not blocks:
        return "", 0
    dims = {c.name: c.basis_dim for c in blocks if c.name in names}
    total = sum(dims.values())
    target = min(dims, key=lambda n: dims[n])  # leaving out the narrowest model leaves the most
    return target, total - dims[target]


def run_warnings(
    config: DecomposeConfig,
    names: Sequence[str],
    spans: Mapping[str, int],
    tokens: Mapping[str, TokenReport],
    blocks: Sequence[ModelColumns] | None,
    moments: Mapping[str, SplitMoments],
    logged: bool = True,
) -> list[str]:
    """What a reader of a run's numbers should know, with the remedy (also logged, unless
    ``logged`` is false: a caller that runs LMD for its own ends words them)."""
    warnings: list[str] = []
    if (short := shortfall(config.spans.counts, spans)) is not None:
        warnings.append(short)
    target, width = _widest_basis(names, blocks)
    n_train = spans.get("train", 0)
    if width and n_train <= width:
        chosen = config.study.alpha_select
        warnings.append(
            f"{n_train} training spans for a group basis of {width} columns (the fit of "
            f"{target!r}): the fits can interpolate the training spans, so train R^2 says "
            "nothing and held-out R^2 depends strongly on alpha; use more spans than basis "
            + (
                f"columns, or let the data choose alpha: {_GCV}"
                if chosen == "fixed"
                else f"columns (alpha is chosen by {chosen} already)"
            )
        )
    for name, report in tokens.items():
        if report.truncated:
            warnings.append(
                f"{name}: {report.truncated} of {report.spans} spans were cut at the model's "
                f"maximum length, so it saw less text than the others; use a smaller "
                f"{SPAN_LENGTH} or check max_length"
            )
    warnings += _flat_held_out(blocks or (), moments)
    study = config.study
    over = sorted({s for s in study.train_sizes or () if s > n_train})
    if over and n_train:  # cut to the split by ``measure.train_edges``
        sizes = ", ".join(map(str, over))
        warnings.append(
            f"{_TRAIN_SIZES} {sizes}: more than the {n_train} training spans the text gave, so "
            f"cut to {n_train}, the whole split (the learning curve's point there is the main "
            f"fit); give sizes up to {n_train}, or more text"
        )
    least = math.ceil(2 / (1 - study.level))  # a replicate in each tail of the interval
    if 0 < study.bootstrap < least:
        warnings.append(
            f"{_bootstrap(study.bootstrap)}: an interval at level {study.level} needs "
            f"{least} replicates at least to hold one in each tail; with fewer, its ends are "
            "the extreme replicates (one replicate: an interval of width 0, which need not "
            f"hold the estimate); use {_bootstrap(least)} or more"
        )
    for text in warnings if logged else ():
        log.warning("%s", text)
    return warnings


def _flat_held_out(
    blocks: Sequence[ModelColumns], moments: Mapping[str, SplitMoments]
) -> list[str]:
    """A model whose embeddings are all the same on a held-out split (an embedding service that
    failed on the last requests, say): its R^2 there is 0/0, written blank (NaN in
    ``summary.json``), as are that split's means over the models. Constant on the training spans
    it is refused before any fit."""
    found = []
    for split, m in moments.items():
        if split == "train":
            continue
        flat = [b.name for b in blocks if np.trace(m.cov[b.start : b.stop, b.start : b.stop]) <= 0]
        if flat:
            its = "its" if len(flat) == 1 else "their"
            found.append(
                f"{', '.join(map(repr, flat))}: every {split} span has the same embedding, so "
                f"{its} {split} R^2 and the {split} means over the models are undefined (blank; "
                f"NaN in summary.json); check {its} embeddings of those spans"
            )
    return found
