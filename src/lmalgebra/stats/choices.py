"""The statistics' settings as configs and the command line name them: the choices of precision
and ridge strength, the tail probes of a reduced model and the default alpha grid.

They live apart from the numerical modules that use them so that a recipe is read, and the
command line parses and refuses bad input, without importing torch.
"""

from __future__ import annotations

from typing import Literal

Products = Literal["float32", "float64"]  # the dtype of the Gram products (``stats.moments``)
Precision = Literal["float64", "float32"]  # the dtype the Gram matrix is kept in
AlphaMode = Literal["relative", "absolute"]  # ridge strength per unit of variance, or as given
PROBES = 32  # tail probes per reduced model (see ``stats.principal``)
EXACT_SHAPLEY = 8  # basis models up to which Shapley values are exact, unseeded (``attribution``)
# bootstrap replicates at most: a percentile interval is settled long before (more had ended in a
# traceback allocating the draws, or run for weeks)
MAX_REPLICATES = 100_000


def default_alpha_grid() -> list[float]:
    """50 relative strengths, log-spaced from 1e-5 to 1e2 (``10 ** e`` in Python: the same
    floats on every host, where numpy's vectorised power differs in the last bit between CPUs;
    and no numpy import for the command line's help)."""
    low, high, count = -5.0, 2.0, 50
    step = (high - low) / (count - 1)
    return [10.0 ** (low + i * step) for i in range(count - 1)] + [10.0**high]
