"""Schedules as pure functions of the step: learning rate and the KD weight lambda.

No scheduler object holds state, so a resumed run needs only the step number.
"""

from __future__ import annotations

import math
from typing import Literal

LambdaSchedule = Literal["constant", "linear", "cosine"]


def learning_rate(step: int, total: int, peak: float, warmup: int) -> float:
    """Linear warm-up to ``peak`` over ``warmup`` steps, then linear decay to 0 at ``total``."""
    if warmup > 0 and step < warmup:
        return peak * (step + 1) / warmup
    remaining = max(total - warmup, 1)
    return peak * max(0.0, (total - step) / remaining)


def kd_weight(step: int, total: int, schedule: LambdaSchedule, value: float) -> float:
    """Lambda at ``step``: ``value`` (constant), or annealed from 1 to 0 linearly or by a cosine."""
    if schedule == "constant":
        return value
    progress = min(step / max(total - 1, 1), 1.0)
    if schedule == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))
