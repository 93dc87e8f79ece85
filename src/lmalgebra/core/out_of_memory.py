"""Memory the machine could not give, as numpy and torch report it, turned into one line.

numpy raises ``MemoryError`` (``Unable to allocate 7.28 TiB for an array ...``); torch raises a
``RuntimeError`` (``DefaultCPUAllocator: can't allocate memory``, ``CUDA out of memory``). Either
comes from a setting far beyond the machine that no check before it caught.
"""

from __future__ import annotations

_NO_MEMORY = ("can't allocate memory", "out of memory", "unable to allocate", "cannot allocate")


def refused_memory(err: BaseException) -> str | None:
    """The one line a user sees for an allocation the machine could not give; None for any
    other error."""
    if not isinstance(err, MemoryError | RuntimeError):
        return None
    text = str(err).strip()
    said = text.splitlines()[0] if text else type(err).__name__
    if not isinstance(err, MemoryError) and not any(s in said.lower() for s in _NO_MEMORY):
        return None
    said = said.split("] ", 1)[-1]  # torch's "[enforce fail at alloc_cpu.cpp:127]" prefix
    return (
        f"not enough memory: {said[:200]}; a setting asks for more than this machine has (a "
        "model's size, a batch size, span or example counts): make it smaller"
    )
