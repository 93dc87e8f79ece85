"""Completion stamps: a directory of files written as one unit, marked done by the key it was
built from.

The stamp (``complete.json``, the key as a JSON string) is removed before the files are rebuilt
and written atomically after the last of them, so a run killed in between leaves no stamp and the
directory is rebuilt; a stamp under another key means the files were built from other inputs.
Shard sets keep the same mark in their manifest (``complete`` beside ``key``).
"""

from __future__ import annotations

import json
from pathlib import Path

from lmalgebra.core.text_files import read_record
from lmalgebra.storage.atomic import remove_file, write_json_atomic

STAMP = "complete.json"


class CompletionStamp:
    """The completion mark of ``directory``, valid for ``key`` (e.g. a hash of the inputs)."""

    def __init__(self, directory: Path, key: str):
        self.directory = directory
        self.key = key
        self.path = directory / STAMP

    def recorded(self) -> str | None:
        """The key the directory was completed under; None if it never was (or the stamp is
        unreadable, which a killed run cannot leave: it is written atomically)."""
        try:
            found = json.loads(read_record(self.path))
        except (OSError, json.JSONDecodeError):
            return None
        return found if isinstance(found, str) else None

    def damaged(self) -> bool:
        """The stamp is there but holds no key (edited or damaged since it was written)."""
        return (self.path.exists() or self.path.is_symlink()) and self.recorded() is None

    def done(self) -> bool:
        """The directory was completed under this key."""
        return self.recorded() == self.key

    def clear(self) -> None:
        """Remove the mark before the directory's files are rewritten."""
        remove_file(self.path)

    def mark(self) -> None:
        """Mark the directory complete under this key (after its last file is written)."""
        write_json_atomic(self.path, self.key)
