"""What every library entry point sets up, as the command line does: a pinned thread count (the
same bits in every process) and quiet third-party logging. Nothing happens at import time and
the root logger is never configured: lmalgebra's own messages follow the caller's logging set-up
(warnings reach stderr through Python's last-resort handler when there is none)."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from lmalgebra.core.threads import pin_thread_count

Call = TypeVar("Call", bound=Callable[..., Any])
# Loggers of the libraries that load and run the models a user hands over, outside transformers'
# own verbosity setting (sentence-transformers logs under its package name).
THIRD_PARTY_LOGGERS = ("sentence_transformers",)
ENTRY_POINT = "__lmalgebra_entry_point__"  # set on every function `library_entry` wraps


@contextmanager
def quiet() -> Iterator[None]:
    """Silence transformers' load reports and progress bars (``Loading weights``), the model
    hub's progress bars and sentence-transformers' log messages for the duration; the caller's
    settings come back afterwards. Every API call runs inside it; wrap your own model loading
    in it to keep a notebook quiet too."""
    import huggingface_hub.utils as hub_utils
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hub_bars_off = hub_utils.are_progress_bars_disabled()
    levels = {name: logging.getLogger(name).level for name in THIRD_PARTY_LOGGERS}
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()  # transformers' tqdm, and the hub's
    for name in THIRD_PARTY_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
        if hub_bars_off:  # transformers' switch drives the hub's too: set it back on its own
            hub_utils.disable_progress_bars()
        else:
            hub_utils.enable_progress_bars()
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


@contextmanager
def library_call() -> Iterator[None]:
    """Pin torch's thread count and run :func:`quiet` for the duration of the call."""
    pin_thread_count()
    with quiet():
        yield


def library_entry(function: Call) -> Call:
    """``function`` run inside :func:`library_call`: every public API function and method."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        with library_call():
            return function(*args, **kwargs)

    setattr(call, ENTRY_POINT, True)
    return cast(Call, call)
