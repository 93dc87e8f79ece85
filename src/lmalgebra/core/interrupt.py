"""Ctrl-C that is never lost.

Python turns SIGINT into a ``KeyboardInterrupt`` raised in whatever Python code the main thread
runs next. When that code is a finaliser or a callback whose exceptions are printed and ignored
(a ``__del__``, a weakref callback, a garbage-collector hook), the interrupt is swallowed and the
command runs on. ``install`` records each SIGINT before raising it, and long loops call
``check`` between their steps, which raises it again if it was swallowed.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import CodeType, FrameType

_REQUESTED = threading.Event()
_TERMINATED = threading.Event()  # the signal was SIGTERM (a scheduler, ``timeout``, ``kill``)
# A signal this soon after the one being acted upon is a copy of it: a terminal's Ctrl-C reaches
# every process of its group, and torchrun forwards it to its workers as well. Raised again, it
# had landed in the first one's handling (a traceback, the clean-up cut short); a later one is
# the user's insisting, and is raised.
REPEAT_S = 2.0
_FIRST: list[float] = []


def _handler(signum: int, frame: FrameType | None) -> None:
    now = time.monotonic()
    if _REQUESTED.is_set() and _FIRST and now - _FIRST[0] < REPEAT_S:
        return
    _FIRST[:] = [now]
    _REQUESTED.set()
    if signum == signal.SIGTERM:
        _TERMINATED.set()
    signal.default_int_handler(signum, frame)  # raises KeyboardInterrupt


def install() -> None:
    """Record every SIGINT of this process before raising it, from now on (main thread only; the
    command line calls it as each command starts), and take SIGTERM as a Ctrl-C: the command
    takes back what it left unfinished and names the signal in its one line, where SIGTERM
    had ended it at once. A signal the parent set to be ignored stays ignored."""
    _REQUESTED.clear()
    _TERMINATED.clear()
    _FIRST.clear()
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _handler)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _handler)


def terminated() -> bool:
    """Whether the interrupt was a SIGTERM, not a Ctrl-C."""
    return _TERMINATED.is_set()


def requested() -> bool:
    """Whether a SIGINT came (under :func:`install` or :func:`imports_whole`)."""
    return _REQUESTED.is_set()


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT came and was not acted upon."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt


# how long a Ctrl-C that landed in an import waits before it is raised again
IMPORT_RETRY_S = 0.05


@contextmanager
def imports_whole(boundary: CodeType) -> Iterator[None]:
    """A Ctrl-C that lands while a module is being imported below a frame running ``boundary``
    (an API call: torch and transformers are imported on first use) raised once the import is
    done, not inside it. A third-party import cut half way leaves its modules half set up in
    ``sys.modules`` (``partially initialized module 'torch'``, an operator registered twice):
    every later call of the process had failed until a restart. Main thread under Python's
    own handler (or :func:`install`'s) only; an import the caller itself is running is not the
    call's. The Ctrl-C is recorded (:func:`requested`), so an error a library made of it is
    known for what it is."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or (
        previous is not signal.default_int_handler and previous is not _handler
    ):
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if _importing(frame, boundary):  # asked again once the import is done
            threading.Timer(IMPORT_RETRY_S, os.kill, (os.getpid(), signum)).start()
            return
        if previous is signal.default_int_handler:
            _REQUESTED.set()
        previous(signum, frame)

    _REQUESTED.clear()
    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _importing(frame: FrameType | None, boundary: CodeType) -> bool:
    """Whether ``frame`` runs inside an import begun below a frame running ``boundary``."""
    importing = False
    while frame is not None and frame.f_code is not boundary:
        importing = importing or frame.f_code.co_filename.startswith("<frozen importlib")
        frame = frame.f_back
    return importing and frame is not None
