"""Code shipped with a model (``trust_remote_code``) runs only when asked for, and never silently.

The switch is off unless a user turns it on for a model (``--trust-remote-code`` or a recipe's
``trust_remote_code: true``); every load that passes it on says so in the log first.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def announce_remote_code(name: str, directory: Path | str) -> None:
    """Log, before loading, that code shipped with model ``name`` (from ``directory``) will run."""
    log.warning("running code shipped with model %r from %s (--trust-remote-code)", name, directory)


def load_failure(err: BaseException) -> str:
    """One line saying why a model, tokenizer or configuration did not load.

    When the model needs its own code, the loaders' advice names their ``trust_remote_code``
    argument; a user sets it with ``--trust-remote-code`` (or ``trust_remote_code: true`` for a
    teacher in a recipe), so that is what the line names."""
    text = str(err)
    if "trust_remote_code" in text or "custom code" in text:
        return (
            "the model needs its own code to load; allow it with --trust-remote-code "
            "(for a teacher in a recipe: trust_remote_code: true) if you trust its source"
        )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__
