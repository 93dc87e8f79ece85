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
