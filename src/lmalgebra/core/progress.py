"""Progress of long loops: a bar (rich) on a terminal, a log line now and then elsewhere.

Output sent to a file or a pipe (``nohup``, a scheduler, CI) gets no bar; a loop there logs where
it is every ``HEARTBEAT`` seconds, so a command of minutes is never silent until its end.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from lmalgebra.core import interrupt

log = logging.getLogger(__name__)

# Seconds between two log lines of a loop whose output is not a terminal.
HEARTBEAT = 60.0


class Advance(Protocol):
    def __call__(self, n: int, status: str = "") -> None: ...


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Advance]:
    """Yield ``advance(n, status="")``; draws a bar on stderr only when enabled and attached to a
    terminal, and logs a line every ``HEARTBEAT`` seconds when enabled and not. ``status`` (e.g.
    the training loss and tokens/s) is shown after the bar. Each ``advance`` raises a Ctrl-C
    that Python dropped in a finaliser (``interrupt.check``): every long loop advances a bar,
    shown or not."""
    if not enabled:
        yield lambda n, status="": interrupt.check()
    elif not sys.stderr.isatty():
        yield _heartbeat(label, total)
    else:
        with _bar(label, total) as advance:
            yield advance


def duration(seconds: float) -> str:
    """``12.3 s`` under two minutes, ``4.5 min`` above; ``-`` for NaN (not timed)."""
    if seconds != seconds:
        return "-"
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _heartbeat(label: str, total: int) -> Advance:
    start = last = time.monotonic()
    done = 0

    def advance(n: int, status: str = "") -> None:
        nonlocal done, last
        interrupt.check()
        done += n
        now = time.monotonic()
        if now - last >= HEARTBEAT:
            last = now
            log.info("%s", progress_line(label, done, total, now - start, status))

    return advance


def progress_line(label: str, done: int, total: int, elapsed: float, status: str = "") -> str:
    """``embed a: 1,200/4,000 (30%) in 1.0 min, about 2.3 min left; loss 3.1``."""
    line = f"{label or 'progress'}: {done:,}/{total:,}"
    if 0 < done <= total:
        left = elapsed * (total - done) / done
        line += f" ({done / total:.0%}) in {duration(elapsed)}, about {duration(left)} left"
    return f"{line}; {status}" if status else line


@contextmanager
def _bar(label: str, total: int) -> Iterator[Advance]:
    from rich import progress as rich  # a terminal only: not imported by a command under a log

    with rich.Progress(
        rich.TextColumn("{task.description}"),
        rich.BarColumn(),
        rich.MofNCompleteColumn(),
        rich.TimeRemainingColumn(),
        rich.TextColumn("{task.fields[status]}"),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=total, status="")

        def advance(n: int, status: str = "") -> None:
            interrupt.check()
            if status:
                bar.update(task, advance=n, status=status)
            else:
                bar.update(task, advance=n)

        yield advance
