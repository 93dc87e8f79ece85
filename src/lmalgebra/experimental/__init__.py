"""Features whose own recorded evidence misses the targets they were built to meet.

They work and are tested, but what was measured does not yet support relying on them; each
returns to the main namespace when its evidence does. ``FEATURES`` lists them with the
evidence and the documentation's section that records it; the command-line help and the recipe
field descriptions of each say "experimental" too. Importing this package warns once
(``ExperimentalWarning``; the command line, which reads the settings of ``experimental select`` to
build its flags, imports it silently and warns when that command runs); the package loads its
features on first use; no stable module imports it (an import-linter contract), so removing a
feature that failed is removing its folder here. Teacher selection lives here whole
(``selection/``, ``select.py``); the seeded embeddings (``seeding.py``) and the experimental
losses (``losses/``) join the stable code's extension points as entry points
(``core.plugins``), declared in ``pyproject.toml``: deleting a feature is deleting its module
and its entry-point line.

- ``select_teachers(recipe, size=...)`` -> ``TeacherSelection`` (``lmalgebra experimental select``):
  LMD ranks sets of teachers. Recorded: Spearman 0.24 (95% interval [-0.30, 0.66]) between its
  score and the distilled students' accuracy, for a target of 0.5.
- ``student.init_embeddings: teachers`` (a recipe setting): the student's token embeddings
  seeded from its teachers'. Recorded: gold MLM loss at step 0 12.7% lower and 22% fewer
  steps to the random student's final loss, for targets of 20% and 30%.
- the ``mined_kl`` and ``uld`` losses of ``training.objective_mix`` (causal students): worse
  than CE alone in the recorded causal demo (80 steps) and at four times its budget.
- the ``prefix_all_kl`` loss (the prefix projection at every student position): behind
  ``prefix_kl`` (chunk starts alone) in a one-seed pilot of the merge on real models.
"""

from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any


class ExperimentalWarning(UserWarning):
    """A feature whose recorded evidence misses its target was imported or used."""


def warn(stacklevel: int = 2) -> None:
    """The warning this package gives on import (and the command line when a command runs)."""
    warnings.warn(
        "lmalgebra.experimental: these features' recorded evidence misses their targets "
        "(lmalgebra.experimental.FEATURES says which and why)",
        ExperimentalWarning,
        stacklevel=stacklevel + 1,
    )


warn()


def warn_feature(name: str) -> None:
    """The warning feature ``name`` (as a user sets it) gives when a run first loads it: a recipe
    names it where the package itself was imported silently (the command line)."""
    warnings.warn(
        f"{name} is experimental: its recorded evidence misses its target "
        "(lmalgebra.experimental.FEATURES says which and why)",
        ExperimentalWarning,
        stacklevel=2,
    )


@dataclass(frozen=True)
class ExperimentalFeature:
    """One experimental feature: where a user reaches it and why it is experimental.

    Attributes:
        name: the Python name or recipe setting.
        evidence: what was recorded, against which target.
        section: the documentation's section with the record (docs/).
    """

    name: str
    evidence: str
    section: str


def _features() -> tuple[ExperimentalFeature, ...]:
    from lmalgebra.core import plugins

    here = __name__ + "."
    group = plugins.declared(plugins.CAUSAL_LOSSES)
    ours = [n for n, point in group.items() if point.value.startswith(here)]
    losses = ", ".join(n for n in ours if n not in _BEHIND_PREFIX_KL)
    return (
        ExperimentalFeature(
            "select_teachers (lmalgebra experimental select)",
            "Spearman 0.24 (interval [-0.30, 0.66]) between its score and student accuracy; "
            "target 0.5",
            "Does the score predict anything?",
        ),
        ExperimentalFeature(
            "student.init_embeddings: teachers",
            "gold MLM loss at step 0 12.7% lower, 22% fewer steps; targets 20% and 30%",
            "Benchmarks",
        ),
        ExperimentalFeature(
            f"training.objective_mix: {losses}",
            "students worse than CE alone at 80 and 320 steps",
            "Recorded causal demo run",
        ),
        *(
            ExperimentalFeature(f"training.objective_mix: {name}", evidence, "The merge")
            for name, evidence in _BEHIND_PREFIX_KL.items()
            if name in ours
        ),
    )


# the losses a run found behind prefix_kl (not behind CE alone), with what was recorded
_BEHIND_PREFIX_KL = {
    "prefix_all_kl": "the merge's student behind prefix_kl's in a one-seed pilot: validation "
    "1.186 against 1.166 bits per byte, development leads' gap to Gemma closed 10.9% against "
    "13.4% (Spanish); target: ahead of prefix_kl",
}


_LAZY = {
    "select_teachers": "lmalgebra.experimental.select",
    "TeacherSelection": "lmalgebra.experimental.select",
}


def __getattr__(name: str) -> Any:
    if name == "FEATURES":
        value: Any = _features()
    elif name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    else:
        raise AttributeError(f"module 'lmalgebra.experimental' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


__all__ = [
    "FEATURES",
    "ExperimentalFeature",
    "ExperimentalWarning",
    "TeacherSelection",
    "select_teachers",
    "warn_feature",
]
