"""Ranks of a data-parallel run: who am I, how many are we, and the few collectives the stages use.

A command launched by ``torchrun`` or ``accelerate launch`` runs once per process. Every stage asks
this module (and nothing else) for its rank: the process group is set up through Accelerate's
``PartialState`` (gloo without GPUs, NCCL with them) the first time it is needed. A plain run,
with no launcher, never touches ``torch.distributed`` and sees rank 0 of 1.

Ranks share work by fixed shards: shard ``i`` belongs to rank ``i % size`` (``owned``). How the
shards are written and recorded without two ranks writing one file is ``lmalgebra.storage``'s.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import functools
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import TIMEOUT_VARIABLE, launch_count, wait_limit

if TYPE_CHECKING:  # imported where used: the command line parses without them
    import numpy as np
    import torch

P = ParamSpec("P")
T = TypeVar("T")
_alone = False  # within ``alone()``: this process runs as if launched alone


def _group() -> Any:
    """``torch.distributed`` once a process group exists (set up here when launched), else None.
    A process not launched as several, where torch is not imported, holds no group: torch is
    left unimported (a cached decomposition never needs it)."""
    if _alone:
        return None
    launched = launch_count("WORLD_SIZE", 1) > 1
    if not launched and "torch" not in sys.modules:
        return None
    if launched and launch_count("RANK", -1) < 0:  # it would wait for the other ranks for hours
        raise UserInputError(f"{_unlaunched()}: $RANK is not set")
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return None
    if not dist.is_initialized():
        if not launched:
            return None
        from accelerate import PartialState

        # Accelerate picks gloo for CPU processes only when told so (``accelerate launch --cpu``
        # sets ACCELERATE_USE_CPU); with GPUs it picks NCCL
        forced = os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes")
        limit = datetime.timedelta(seconds=wait_limit())  # the main rank may work alone for hours
        try:
            PartialState(cpu=forced or not torch.cuda.is_available(), timeout=limit)
        except ValueError as err:  # a variable the launcher sets is missing (MASTER_ADDR, ...)
            raise UserInputError(f"{_unlaunched()}: {err}") from None
        # leave the group before the interpreter tears down the backend's threads: a process that
        # exits with the group alive can abort ("terminate called without an active exception")
        atexit.register(_leave)
    return dist


def _unlaunched() -> str:
    return (
        f"$WORLD_SIZE is {launch_count('WORLD_SIZE', 1)}, but this process was not started as one "
        "of several by a launcher (torchrun, accelerate launch); unset WORLD_SIZE to run in one "
        "process"
    )


def _leave() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def world() -> tuple[int, int]:
    """``(rank, size)`` of this process; ``(0, 1)`` when not launched as several processes."""
    dist = _group()
    if dist is None:
        return 0, 1
    return int(dist.get_rank()), int(dist.get_world_size())


def is_main() -> bool:
    """True on rank 0 (the only rank that writes manifests, statistics and reports)."""
    return world()[0] == 0


def barrier() -> None:
    """Wait until every rank gets here (nothing to wait for in a single process); one line
    naming ``$LMALGEBRA_DIST_TIMEOUT`` where the wait outlasts it."""
    dist = _group()
    if dist is not None and dist.get_world_size() > 1:
        try:
            dist.barrier()
        except RuntimeError as err:
            if "timed out" not in str(err).lower():
                raise
            waited = f"${TIMEOUT_VARIABLE} ({wait_limit():g} s)"
            raise UserInputError(
                f"rank {dist.get_rank()} waited longer than {waited} for the other ranks: set it "
                "higher, or run `merge prepare` in one process first (it runs on the main rank "
                "alone)"
            ) from None


def owned(count: int) -> range:
    """Indices in ``range(count)`` that this rank computes: ``i % size == rank``."""
    rank, size = world()
    return range(rank, count, size)


def _device(dist: Any) -> torch.device:
    import torch

    if dist.get_backend() in ("gloo", "mpi"):
        return torch.device("cpu")
    from accelerate import PartialState

    return torch.device(PartialState().device)


def sum_in_place(values: np.ndarray) -> None:
    """All-reduce (sum) a contiguous float64 array in place; every rank ends with the same bits."""
    dist = _group()
    if dist is None or dist.get_world_size() == 1:
        return
    import torch

    tensor = torch.from_numpy(values)  # shares memory with ``values``
    device = _device(dist)
    if device.type == "cpu":
        dist.all_reduce(tensor)
        return
    moved = tensor.to(device)
    dist.all_reduce(moved)
    tensor.copy_(moved.cpu())


def all_reduce_sum(array: np.ndarray) -> np.ndarray:
    """Element-wise sum over ranks, as a new ``float64`` array of ``array``'s shape.

    Sums are taken in float64 by the backend; every rank receives the same result.
    """
    import numpy as np

    values = np.array(array, dtype=np.float64, order="C", copy=True)
    sum_in_place(values)
    return values


def main_rank_only(fn: Callable[P, None]) -> Callable[P, None]:
    """Run ``fn`` on the main rank only; the other ranks wait for it at a barrier."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> None:
        if is_main():
            fn(*args, **kwargs)
        barrier()

    return wrapper


@contextlib.contextmanager
def alone() -> Iterator[None]:
    """Run the block as rank 0 of 1: no collective in it waits for the other ranks."""
    global _alone
    before, _alone = _alone, True
    try:
        yield
    finally:
        _alone = before


def on_main_rank(compute: Callable[[], T], read_back: Callable[[], T], what: str) -> T:
    """``compute()`` on the main rank alone (``alone``: as one process), while the other ranks
    wait, then ``read_back()`` on them (what the main rank wrote); just ``compute()`` in one
    process. A failure on the main rank ends the others too, in one line naming ``what``."""
    rank, size = world()
    if size == 1:
        return compute()
    error: Exception | None = None
    if rank == 0:
        try:
            with alone():
                found = compute()
        except Exception as err:  # the others are told, not left waiting
            error = err
    if any_rank(error is not None):
        raise error or UserInputError(f"{what} failed on the main rank (its message says why)")
    return found if rank == 0 else read_back()


def any_rank(flag: bool) -> bool:
    """Whether ``flag`` is true on any rank (collective; ``flag`` itself in one process)."""
    if world()[1] == 1:
        return flag
    import numpy as np

    return bool(all_reduce_sum(np.array([1.0 if flag else 0.0]))[0] > 0)


def same_on_every_rank(digest: str) -> bool:
    """Whether every rank holds the same hex ``digest`` (collective; True in one process).

    Its first 48 bits as three 16-bit numbers ``v``: sums of ``v`` and ``v^2`` are exact in
    float64, and ``size * sum(v^2) == sum(v)^2`` holds only when every rank's ``v`` is the same.
    """
    size = world()[1]
    if size == 1:
        return True
    import numpy as np

    parts = np.array([int(digest[i : i + 4], 16) for i in (0, 4, 8)], dtype=np.float64)
    sums = all_reduce_sum(np.concatenate([parts, parts**2]))
    return bool(np.all(size * sums[3:] == sums[:3] ** 2))
