"""The output-directory lock: holder details, refusal, re-entry, stale locks, stale temporaries."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from lmalgebra.storage.lockfile import (
    LOCK_NAME,
    DirectoryInUseError,
    holder_record,
    holding_lock,
    remove_stale_temporaries,
    run_directory_lock,
)

HOLDER = """
import sys, time
from pathlib import Path
from lmalgebra.storage.lockfile import run_directory_lock
with run_directory_lock(Path(sys.argv[1]), "holder command"):
    print("held", flush=True)
    time.sleep(120)
"""


@pytest.fixture
def holder(tmp_path: Path):
    """Another process holding the lock of ``tmp_path / 'out'``."""
    process = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path / "out")], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "held"
    yield process
    process.kill()
    process.wait()


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_lock_names_its_holder_and_is_removed_on_release(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with run_directory_lock(out, "merge teach"):
        record = holder_record(out)
        assert record is not None
        assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
        assert record["command"] == "merge teach" and record["argv"] == sys.argv
    assert not (out / LOCK_NAME).exists()
    with run_directory_lock(out, "again"):  # free again
        pass


def test_a_failed_run_is_tidied_before_its_lock_is_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed run's scratch files and empty sub-directories had been removed after its lock
    was released: a run that took the lock in between could lose its fresh ``recipe.yaml``.
    They go under the lock now; the run's own new directory, empty once the lock file is gone,
    after it."""
    from lmalgebra.storage import lockfile

    out = tmp_path / "out"
    left_at_release: list[list[str]] = []
    release = lockfile._release

    def watched(directory: Path, fd: int | None) -> None:
        left_at_release.append(sorted(p.name for p in directory.rglob("*") if p.name != LOCK_NAME))
        release(directory, fd)

    monkeypatch.setattr(lockfile, "_release", watched)
    with pytest.raises(RuntimeError), run_directory_lock(out, "merge prepare", ["recipe.yaml"]):
        (out / "recipe.yaml").write_text("a: 1\n", encoding="utf-8")
        (out / "examples").mkdir()
        raise RuntimeError("stopped")
    assert left_at_release == [[]]
    assert not out.exists()


def test_lock_is_reentrant_within_a_process(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with run_directory_lock(out, "outer"), run_directory_lock(out, "inner"):
        assert holder_record(out)["command"] == "outer"  # type: ignore[index]
    assert not (out / LOCK_NAME).exists()


def test_second_run_is_refused_naming_directory_and_holder(tmp_path: Path, holder) -> None:
    out = (tmp_path / "out").resolve()
    expected = (
        f"{out} is in use by another lmalgebra run: pid {holder.pid} on {socket.gethostname()}"
    )
    with pytest.raises(DirectoryInUseError, match=re.escape(expected)) as caught:
        run_directory_lock(out, "second").__enter__()
    assert "(holder command, since" in str(caught.value)


def test_entry_points_take_the_lock(tmp_path: Path, holder) -> None:
    @holding_lock("merge teach", lambda out, **_: out)
    def entry(out: Path, progress: bool = True) -> str:
        return "ran"

    with pytest.raises(DirectoryInUseError, match=f"pid {holder.pid}"):
        entry(tmp_path / "out")
    assert entry(tmp_path / "elsewhere", progress=False) == "ran"


def test_lock_of_a_killed_holder_does_not_block(tmp_path: Path, holder) -> None:
    out = tmp_path / "out"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    stale = json.loads((out / LOCK_NAME).read_text())
    assert stale["pid"] == holder.pid  # the file is still there, naming a dead process
    with run_directory_lock(out, "after the crash"):
        assert holder_record(out)["pid"] == os.getpid()  # type: ignore[index]


def test_a_stale_temporary_is_removed_where_its_file_is_written_again(tmp_path: Path) -> None:
    """Taking a run's lock had removed every ``.NAME.tmp-PID`` of a dead pid under the run, at
    any depth: a user's own files named so too. A dead writer's temporary is removed as its
    file is written again in its directory, and nothing else is."""
    from lmalgebra.storage.atomic import write_text_atomic

    dead, run = _dead_pid(), tmp_path / "run"
    (run / "notes").mkdir(parents=True)
    stale = run / f".summary.json.tmp-{dead}"
    users = [run / "notes" / f".draft.txt.tmp-{dead}", run / f".todo.tmp-{dead}"]
    for path in [stale, *users]:
        path.write_text("x", encoding="utf-8")
    with run_directory_lock(run, "merge teach"):
        assert all(p.exists() for p in [stale, *users])
        write_text_atomic(run / "summary.json", "{}")
    assert not stale.exists() and all(p.read_text(encoding="utf-8") == "x" for p in users)


def test_only_temporaries_of_dead_writers_are_removed(tmp_path: Path) -> None:
    dead, alive = _dead_pid(), os.getppid()
    (tmp_path / "topk" / "xx").mkdir(parents=True)
    stale = tmp_path / "topk" / "xx" / f".shard-00003.arrow.tmp-{dead}"
    kept = [
        tmp_path / f".manifest.json.tmp-{alive}",  # a live writer's
        tmp_path / f".summary.json.tmp-{os.getpid()}",  # our own
        tmp_path / "shard-00001.arrow",  # not a temporary
        tmp_path / f"notes.tmp-{dead}",  # not one of ours (no leading dot)
    ]
    for path in [stale, *kept]:
        path.write_bytes(b"x")
    assert remove_stale_temporaries(tmp_path) == [stale]
    assert all(p.exists() for p in kept) and not stale.exists()
