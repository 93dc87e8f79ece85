"""The directory lock's own file: anything but a regular file at ``OUT/.lmalgebra.lock`` is
refused in one line naming it, never opened as a FIFO (which waits for a writer), written through
as a link (which replaces the user's file it names) nor taken for a directory's traceback."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hostile_helpers import deadline, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.storage.lockfile import LOCK_NAME, run_directory_lock
from lmalgebra.storage.output_paths import lock_holder


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _link_to_users_file(path: Path) -> None:
    target = path.parent.parent / "notes.txt"
    target.write_text("the user's notes\n")
    path.symlink_to(target)


def _hard_link_to_users_file(path: Path) -> None:
    """A regular file, with another name: the lock's record had been written over the notes."""
    target = path.parent.parent / "notes.txt"
    target.write_text("the user's notes\n")
    os.link(target, path)


SPECIAL: dict[str, tuple[Callable[[Path], None], str]] = {
    "fifo": (_fifo, "is a FIFO, socket or device"),
    "directory": (_directory, "is a directory"),
    "link": (_link_to_users_file, "is a symbolic link to"),
    "hard-link": (_hard_link_to_users_file, r"is a hard link \(2 names\)"),
}


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_a_lock_file_that_is_no_regular_file_is_refused(tmp_path: Path, kind: str) -> None:
    out = tmp_path / "out"
    out.mkdir()
    make, words = SPECIAL[kind]
    make(out / LOCK_NAME)
    refusal = f"lock file {out / LOCK_NAME} {words}"
    with (
        deadline(30),
        pytest.raises(UserInputError, match=refusal),
        run_directory_lock(out, "merge train"),
    ):
        pass
    assert (out / LOCK_NAME).is_symlink() or (out / LOCK_NAME).exists()  # left as it was
    if kind in ("link", "hard-link"):
        assert (tmp_path / "notes.txt").read_text() == "the user's notes\n"


def test_a_fifo_lock_file_beside_a_file_output_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A file output whose directory's lock file is a FIFO: nothing holds that directory (a FIFO
    names no holder), so the output is written, without waiting on the FIFO."""
    folder = tmp_path / "folder"
    folder.mkdir()
    os.mkfifo(folder / LOCK_NAME)
    with deadline(30):
        assert lock_holder(folder) is None
        code, stderr = run_cli(["merge", "init", str(folder / "recipe.yaml")], monkeypatch, capsys)
    assert code == 0, stderr
    assert (folder / "recipe.yaml").is_file()


def test_a_stale_lock_naming_a_live_process_does_not_hold_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run killed with ``kill -9`` leaves its lock file, naming its pid; once another process
    has that pid, the file is no lock (the kernel holds none on it), and a file output inside the
    directory had been refused as going into a directory in use by that process."""
    import json
    import socket
    import subprocess
    import sys

    folder = tmp_path / "killed-run"
    folder.mkdir()
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record = {"pid": other.pid, "host": socket.gethostname(), "command": "decompose"}
        (folder / LOCK_NAME).write_text(json.dumps(record) + "\n")
        assert lock_holder(folder) is None
        code, stderr = run_cli(["merge", "init", str(folder / "merge.yaml")], monkeypatch, capsys)
        assert code == 0, stderr
        with run_directory_lock(folder, "decompose"):  # held now: named as in use
            assert lock_holder(folder) is None  # this process's own
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("kind", sorted(SPECIAL))
def test_a_lock_file_the_run_refuses_is_refused_by_its_dry_run_too(
    kind: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A lock file that is no regular file in the output directory: every writer refuses it as
    it takes the lock; ``decompose --dry-run`` and ``decompose_plan(out=...)``, which take none,
    had planned the run (and so had the merge dry runs and ``merge_plan``)."""
    import lmalgebra
    from hostile_helpers import assert_one_line
    from merge_fixtures import write_recipe

    out = tmp_path / "out"
    out.mkdir()
    make, words = SPECIAL[kind]
    make(out / LOCK_NAME)
    needles = [f"lock file {out / LOCK_NAME}"]
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}", "--dry-run"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--out", str(out)]
    assert_one_line(*run_cli(args, monkeypatch, capsys), needles)
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    with pytest.raises(UserInputError, match=f"lock file {out / LOCK_NAME} {words}"):
        lmalgebra.decompose_plan(models, str(corpus_txt), out=out, spans={"length": 8})
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(out))
    code, stderr = run_cli(["merge", "prepare", str(recipe), "--dry-run"], monkeypatch, capsys)
    assert_one_line(code, stderr, needles)
    assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]
