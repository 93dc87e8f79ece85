"""Features whose own recorded evidence misses the targets they were built to meet.

They work and are tested, but what was measured does not yet support relying on them; each
returns to the main namespace when its evidence does. ``FEATURES`` lists them with the
evidence and the documentation's section that records it; the command-line help and the recipe field
descriptions of each say "experimental" too.

- ``select_teachers(recipe, size=...)`` -> ``TeacherSelection`` (``lmalgebra merge select``):
  LMD ranks sets of teachers. Recorded: Spearman 0.24 (95% interval [-0.30, 0.66]) between its
  score and the distilled students' accuracy, for a target of 0.5.
- ``student.init_embeddings: teachers`` (a recipe setting): the student's token embeddings
  seeded from its teachers'. Recorded: gold MLM loss at step 0 12.7% lower and 22% fewer
  steps to the random student's final loss, for targets of 20% and 30%.
- the ``mined_kl`` and ``uld`` losses of ``training.objective_mix`` (causal students): worse
  than CE alone in the recorded causal demo (80 steps) and at four times its budget.
"""

from __future__ import annotations

from dataclasses import dataclass

from lmalgebra.api.select import TeacherSelection, select_teachers


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


FEATURES = (
    ExperimentalFeature(
        "select_teachers (lmalgebra merge select)",
        "Spearman 0.24 (interval [-0.30, 0.66]) between its score and student accuracy; target 0.5",
        "Does the score predict anything?",
    ),
    ExperimentalFeature(
        "student.init_embeddings: teachers",
        "gold MLM loss at step 0 12.7% lower, 22% fewer steps; targets 20% and 30%",
        "Benchmarks",
    ),
    ExperimentalFeature(
        "training.objective_mix: mined_kl, uld",
        "students worse than CE alone at 80 and 320 steps",
        "Recorded causal demo run",
    ),
)

__all__ = ["FEATURES", "ExperimentalFeature", "TeacherSelection", "select_teachers"]
