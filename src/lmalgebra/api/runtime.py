"""What every library entry point sets up, as the command line does: a pinned thread count (the
same bits in every process) and quiet third-party logging. Nothing happens at import time and
the root logger is never configured: lmalgebra's own messages follow the caller's logging set-up
(warnings reach stderr through Python's last-resort handler when there is none)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lmalgebra.core.threads import pin_thread_count


@contextmanager
def library_call() -> Iterator[None]:
    """Pin torch's thread count; silence transformers' load reports and progress bars for the
    duration of the call, then restore the caller's settings."""
    from transformers.utils import logging as hf_logging

    pin_thread_count()
    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
