"""lmalgebra: how much of one language model is contained in others, and merging several into one.

The Python API (imported on first use, so ``import lmalgebra`` stays light):

- ``decompose(models, texts, ...)`` -> ``Decomposition``: Language Model Decomposition, results as
  labelled pandas DataFrames; ``Decomposition.load(run_dir)`` reads a run back; ``spans(...)``
  lists a run's spans in the row order precomputed embeddings follow; ``decompose_recipe`` runs
  a recipe (a YAML path or a ``DecomposeConfig``) as ``lmalgebra decompose`` does;
- ``LinearDecomposition``: the decomposition's ridge fit as a scikit-learn estimator;
- ``merge(recipe, stages=...)`` -> ``MergeRun``: MergeDistill stages on a ``MergeRecipe``,
  evaluation as DataFrames; ``merge_plan`` is its dry run; ``TrainingSpec`` the student's training;
- ``quiet()``: the silencing of third-party load reports and progress bars every call applies.

Features whose recorded evidence misses their targets live in ``lmalgebra.experimental``
(``select_teachers``, among others).

Pipeline stages, one subpackage or module each: ``sources`` (models and corpora), ``lmd``
(spans -> embeddings -> second moments -> ridge fits), ``stats``, ``distill``, ``train``,
``evaluate``, ``report``, ``experimental`` (teacher selection among them); ``api`` is the
Python API, ``cli`` the command line over it.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "decompose": "lmalgebra.api.decompose",
    "decompose_plan": "lmalgebra.api.decompose",
    "decompose_recipe": "lmalgebra.api.decompose",
    "spans": "lmalgebra.api.decompose",
    "read_texts": "lmalgebra.api.decompose",
    "Decomposition": "lmalgebra.api.decomposition",
    "DecomposeConfig": "lmalgebra.lmd.settings.recipe",
    "LinearDecomposition": "lmalgebra.stats.linear_decomposition",
    "merge": "lmalgebra.api.merge",
    "merge_plan": "lmalgebra.api.merge",
    "MergeRun": "lmalgebra.api.merge",
    "RunInspection": "lmalgebra.distill.run.inspection",
    "MergeRecipe": "lmalgebra.distill.recipe",
    "TrainingSpec": "lmalgebra.train.config",
    "quiet": "lmalgebra.api.runtime",
    "UserInputError": "lmalgebra.core.errors",
    "TrainingDivergedError": "lmalgebra.core.errors",
}
# names that moved to lmalgebra.experimental: their evidence misses its targets
_EXPERIMENTAL = ("select_teachers", "TeacherSelection")
# reachable as attributes without their own import: `lmalgebra.api.pretrain.pretrain(spec)`,
# `lmalgebra.experimental.select_teachers` (which the refusal below names),
# `lmalgebra.demo.workflow.run_demo(out)`
_SUBPACKAGES = ("api", "experimental", "demo")

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPERIMENTAL:
        raise AttributeError(
            f"lmalgebra.{name} is experimental (its recorded evidence misses its target): "
            f"use lmalgebra.experimental.{name}"
        )
    from lmalgebra.core.interrupt import imports_whole

    # a Ctrl-C during the first import of the API (numpy, pandas, ...) raised once it is done
    with imports_whole(sys._getframe().f_code):
        if name in _SUBPACKAGES:  # as the documentation spells them, after `import lmalgebra`
            return importlib.import_module(f"{__name__}.{name}")
        if name not in _EXPORTS:
            raise AttributeError(f"module 'lmalgebra' has no attribute {name!r}")
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
