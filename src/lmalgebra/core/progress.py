"""Progress bars (rich) that switch off when asked or when output is not a terminal."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from lmalgebra.core import interrupt


class Advance(Protocol):
    def __call__(self, n: int, status: str = "") -> None: ...


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True) -> Iterator[Advance]:
    """Yield ``advance(n, status="")``; draws a bar on stderr only when enabled and attached to a
    terminal. ``status`` (e.g. the training loss and tokens/s) is shown after the bar. Each
    ``advance`` raises a Ctrl-C that Python dropped in a finaliser (``interrupt.check``): every
    long loop advances a bar, shown or not."""
    if not enabled or not sys.stderr.isatty():
        yield lambda n, status="": interrupt.check()
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[status]}"),
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
