"""Ctrl-C that is never lost.

Python turns SIGINT into a ``KeyboardInterrupt`` raised in whatever Python code the main thread
runs next. When that code is a finaliser or a callback whose exceptions are printed and ignored
(a ``__del__``, a weakref callback, a garbage-collector hook), the interrupt is swallowed and the
command runs on. ``install`` records each SIGINT before raising it, and long loops call
``check`` between their steps, which raises it again if it was swallowed.
"""

from __future__ import annotations

import signal
import threading
import time
from types import FrameType

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


def check() -> None:
    """Raise ``KeyboardInterrupt`` if a SIGINT came and was not acted upon."""
    if _REQUESTED.is_set():
        raise KeyboardInterrupt
