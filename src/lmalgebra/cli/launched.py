"""Commands started as several processes (``torchrun``, ``accelerate launch``).

The commands of ``SPLIT`` share their work out over the processes (docs/scale.md); only the main
rank prints their summary. Every other command runs in one process: on rank 0, as if launched
alone, while the other ranks end at once (they had each repeated the whole command and written
the same files).
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

from lmalgebra.core.precision import LAUNCH_VARIABLES, launch_count

log = logging.getLogger(__name__)

SPLIT = frozenset(
    {
        "decompose",
        "merge prepare",
        "merge teach",
        "merge vocab",
        "merge run",
        "merge train",
        "pretrain masked",
        "pretrain causal",
        "pretrain head-only",
    }
)


def placed_on_processes(command: Any, path: tuple[str, ...] = ()) -> Any:
    """``command`` (a click group, as typer builds it) with each of its commands' callbacks run
    as ``SPLIT`` says when launched as several processes; returns it."""
    subs = getattr(command, "commands", None)
    for name, sub in (subs or {}).items():
        placed_on_processes(sub, (*path, name))
    if subs is None and path and command.callback is not None:
        command.callback = _placed(" ".join(path), command.callback)
    return command


def _placed(name: str, callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def run(*args: Any, **kwargs: Any) -> Any:
        if launch_count("WORLD_SIZE", 1) <= 1:
            return callback(*args, **kwargs)
        rank = launch_count("RANK", 0)
        if name in SPLIT:
            from lmalgebra.cli.app import console

            before = console.quiet
            console.quiet = before or rank > 0  # one summary: the main rank's, once it is written
            try:
                return callback(*args, **kwargs)
            finally:
                console.quiet = before
        if rank:
            log.info("`lmalgebra %s` runs in one process (rank 0); rank %d ends here", name, rank)
            return None
        for variable in LAUNCH_VARIABLES:
            os.environ.pop(variable, None)  # the process group is never set up
        log.info("`lmalgebra %s` runs in one process: rank 0, as if launched alone", name)
        return callback(*args, **kwargs)

    return run
