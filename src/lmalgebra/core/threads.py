"""A fixed CPU thread count, so that the same computation gives the same bits in every process.

Intel MKL, which torch uses for CPU matrix products, starts in "dynamic" mode: it may run a
product on fewer threads than asked when the machine is busy, which changes how sums are split
and so the last bits of the result. A run resumed on a loaded machine would then recompute the
missing shards or steps slightly differently from an uninterrupted run. ``torch.set_num_threads``
turns that mode off (``mkl_set_dynamic(0)``); setting the current count again keeps every other
choice (``OMP_NUM_THREADS``, launchers' settings) as it was. Before torch is imported,
``MKL_DYNAMIC=FALSE`` in the environment has the same effect (MKL reads it when it starts), so a
command that never needs torch (``--help``, a refused recipe) never imports it.
"""

from __future__ import annotations

import os
import sys

MKL_DYNAMIC = "MKL_DYNAMIC"


def pin_thread_count() -> int:
    """Keep torch's current intra-op thread count fixed for MKL too; the count."""
    import torch

    count = torch.get_num_threads()
    torch.set_num_threads(count)
    return count


def pin_thread_count_when_imported() -> None:
    """:func:`pin_thread_count` now if torch is imported, else when it is (through
    ``MKL_DYNAMIC``), without importing it here."""
    if "torch" in sys.modules:
        pin_thread_count()
    else:
        os.environ[MKL_DYNAMIC] = "FALSE"
