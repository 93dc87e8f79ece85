"""lmalgebra: how much of one language model is contained in others, and merging several into one.

The Python API (imported on first use, so ``import lmalgebra`` stays light):

- ``decompose(models, texts, ...)`` -> ``Decomposition``: Language Model Decomposition, results as
  labelled pandas DataFrames; ``Decomposition.load(run_dir)`` reads a run back; ``spans(...)``
  lists a run's spans in the row order precomputed embeddings follow;
- ``LinearDecomposition``: the decomposition's ridge fit as a scikit-learn style estimator;
- ``merge(recipe, stages=...)`` -> ``MergeRun``: MergeDistill stages, evaluation as DataFrames;
- ``select_teachers(recipe, size=...)`` -> ``TeacherSelection``: LMD ranks sets of teachers.

Pipeline stages, one subpackage or module each: ``sources`` (models and corpora), ``lmd``
(spans -> embeddings -> second moments -> ridge fits), ``stats``, ``distill``, ``train``,
``selection``, ``evaluate``, ``report``; ``api`` is the Python API, ``cli`` the command line
over it.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    "decompose": "lmalgebra.api.decompose",
    "decompose_plan": "lmalgebra.api.decompose",
    "spans": "lmalgebra.api.decompose",
    "read_texts": "lmalgebra.api.decompose",
    "Decomposition": "lmalgebra.api.decomposition",
    "LinearDecomposition": "lmalgebra.stats.linear_decomposition",
    "merge": "lmalgebra.api.merge",
    "MergeRun": "lmalgebra.api.merge",
    "select_teachers": "lmalgebra.api.select",
    "TeacherSelection": "lmalgebra.api.select",
    "MergeRecipe": "lmalgebra.distill.recipe",
    "UserInputError": "lmalgebra.core.errors",
}

__all__ = [
    "Decomposition",
    "LinearDecomposition",
    "MergeRecipe",
    "MergeRun",
    "TeacherSelection",
    "UserInputError",
    "__version__",
    "decompose",
    "decompose_plan",
    "merge",
    "read_texts",
    "select_teachers",
    "spans",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'lmalgebra' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
