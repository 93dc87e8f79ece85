"""Large temporaries reused in the heap instead of mapped afresh each time (glibc's malloc).

glibc serves an allocation above its mmap threshold (128 KiB, raised as blocks are freed, at most
32 MiB) with a fresh mapping, handed back to the kernel when freed; its pages are faulted in again
on the next first touch. A training step's largest temporaries are above that: a demo union
student's logits at the masked rows and their gradient are 304 x 34,150 float32 each (42 MB), and
every step mapped and faulted them anew. On a 2-core KVM guest a 42 MB copy took 28 ms where the
same copy into reused memory took 8 ms, a softmax over those logits 40 ms instead of 13, and the
student's whole step on one thread 298-341 ms instead of 230-235 ms (``bench/bench_allocator.py``;
causal teacher inference of Gemma-3-270M, whose chunks of logits are up to 256 MB: 1.35x).

:func:`reuse_freed_memory` raises the mmap threshold to 1 GiB and the trim threshold past it, for
the rest of the process: freed blocks up to that size stay in the heap and are reused, so a
step's temporaries are faulted in once (after the first few steps, while glibc's free blocks
settle: the heap grows by a few of them). Memory the process freed is then kept rather than handed
back; :func:`release_free_memory` hands it back (``malloc_trim``), which the training loop does
when a run ends and teacher inference (``distill.teachers.infer_shards``) once a teacher's shards
are written. Nothing changes the arithmetic. Off glibc (musl, macOS), or with
``LMALGEBRA_REUSE_FREED_MEMORY=0``, nothing is changed.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
from functools import cache
from typing import Any

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt(3) parameters
MMAP_THRESHOLD = 1 << 30
TRIM_THRESHOLD = (1 << 31) - 1  # mallopt takes an int
SWITCH = "LMALGEBRA_REUSE_FREED_MEMORY"


@cache
def _glibc() -> Any | None:
    """glibc's ``mallopt`` and ``malloc_trim``, or None where the C library is another."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
        if libc.gnu_get_libc_version() and hasattr(libc, "mallopt"):
            return libc
    return None


_applied: list[bool] = []


def reuse_freed_memory() -> bool:
    """Keep freed blocks up to 1 GiB in the heap for reuse, for the rest of the process (see the
    module); True where that is now so. Idempotent."""
    if _applied:
        return _applied[0]
    libc = _glibc()
    wanted = os.environ.get(SWITCH, "1").strip() not in ("0", "false", "no", "off")
    done = bool(
        wanted
        and libc is not None
        and libc.mallopt(M_MMAP_THRESHOLD, ctypes.c_int(MMAP_THRESHOLD)) == 1
        and libc.mallopt(M_TRIM_THRESHOLD, ctypes.c_int(TRIM_THRESHOLD)) == 1
    )
    if wanted and not done:
        log.debug("the C library's allocator is left as it is (not glibc, or refused)")
    _applied.append(done)
    return done


def release_free_memory() -> None:
    """Hand the memory the process holds free back to the kernel (glibc ``malloc_trim``)."""
    libc = _glibc()
    if libc is not None and _applied and _applied[0]:
        libc.malloc_trim(ctypes.c_size_t(0))
