"""Temporaries a killed writer left: removed where their file is written again, by every call
of a process that runs several (a notebook's, a test's), not by its first alone."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lmalgebra.storage import stale_temporaries
from lmalgebra.storage.atomic import write_text_atomic


def _dead_pid() -> int:
    """The pid of a process that has ended (and been waited for)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_temporary_left_after_a_calls_first_write_is_removed_by_the_next_call(
    tmp_path: Path,
) -> None:
    target = tmp_path / "best.json"
    stale_temporaries.new_call()
    write_text_atomic(target, "{}")  # the directory listed, no temporary in it yet
    left = tmp_path / f".best.json.tmp-{_dead_pid()}"  # a writer killed since
    left.write_text("{")
    write_text_atomic(target, "{}")
    assert left.exists()  # the same call keeps its listing: one per directory, not per write
    stale_temporaries.new_call()  # the next command or library call
    write_text_atomic(target, "{}")
    assert not left.exists()
    assert target.read_text() == "{}"


def test_a_library_call_begins_a_new_listing(tmp_path: Path) -> None:
    from lmalgebra.api.runtime import library_call

    stale_temporaries.new_call()
    write_text_atomic(tmp_path / "a.txt", "x")
    left = tmp_path / f".a.txt.tmp-{_dead_pid()}"
    left.write_text("y")
    with library_call():
        write_text_atomic(tmp_path / "a.txt", "x")
    assert not left.exists()
