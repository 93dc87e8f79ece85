"""A fixed CPU thread count, so that the same computation gives the same bits in every process.

Intel MKL, which torch uses for CPU matrix products, starts in "dynamic" mode: it may run a
product on fewer threads than asked when the machine is busy, which changes how sums are split
and so the last bits of the result. A run resumed on a loaded machine would then recompute the
missing shards or steps slightly differently from an uninterrupted run. ``torch.set_num_threads``
turns that mode off (``mkl_set_dynamic(0)``); setting the current count again keeps every other
choice (``OMP_NUM_THREADS``, launchers' settings) as it was.
"""

from __future__ import annotations


def pin_thread_count() -> int:
    """Keep torch's current intra-op thread count fixed for MKL too; the count."""
    import torch

    count = torch.get_num_threads()
    torch.set_num_threads(count)
    return count
