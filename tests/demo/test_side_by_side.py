"""``demo.side_by_side``: independent demo steps in processes sharing out torch's threads."""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmalgebra.demo.side_by_side import processes, side_by_side, torch_threads


def test_jobs_run_in_processes_of_their_share_of_the_threads() -> None:
    results = side_by_side(
        {
            "threads": (torch_threads, ()),
            "pid": (os.getpid, ()),
            "sum": (operator.add, (2, 3)),
        },
        threads=2,
    )
    assert list(results) == ["threads", "pid", "sum"]  # the order the jobs were given
    assert results["threads"] == 1  # two threads shared by two processes
    assert results["pid"] != os.getpid()
    assert results["sum"] == 5
    assert processes(3, threads=2) == 2 and processes(3, threads=8) == 3


def test_one_thread_or_one_job_runs_here() -> None:
    assert side_by_side({"pid": (os.getpid, ())}, threads=4) == {"pid": os.getpid()}
    both = side_by_side({"a": (os.getpid, ()), "b": (os.getpid, ())}, threads=1)
    assert both == {"a": os.getpid(), "b": os.getpid()}
    assert processes(2, threads=1) == 1


def test_a_failing_job_raises_its_own_error_here() -> None:
    jobs = {"fine": (operator.add, (1, 1)), "broken": (operator.truediv, (1, 0))}
    with pytest.raises(ZeroDivisionError):
        side_by_side(jobs, threads=2)


PARENT = """
import time
from lmalgebra.demo.side_by_side import side_by_side
side_by_side({"a": (time.sleep, (120,)), "b": (time.sleep, (120,))}, threads=2)
"""


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        found |= {int(p) for p in (task / "children").read_text().split()}
    return found


def _ready_workers(pid: int) -> set[int]:
    """Job processes of ``pid`` past their initializer: it imports torch right after asking
    to end with the parent, so a worker with torch's library mapped has asked (the resource
    tracker, also a child, never maps it)."""
    ready = set()
    for child in _children(pid):
        try:
            command = Path(f"/proc/{child}/cmdline").read_bytes()
            maps = Path(f"/proc/{child}/maps").read_text()
        except OSError:
            continue
        if b"spawn_main" in command and "libtorch" in maps:
            ready.add(child)
    return ready


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(
    not Path(f"/proc/self/task/{os.getpid()}/children").is_file(),
    reason="needs Linux /proc with each task's children",
)
def test_job_processes_end_with_their_parent() -> None:
    """A demo killed outright leaves no training running behind it."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT])
    try:
        deadline = time.monotonic() + 180
        while len(_ready_workers(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = _ready_workers(parent.pid)
        assert len(workers) == 2, "the job processes did not start"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in workers)


def test_students_of_a_run_train_side_by_side_as_in_turn(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """The demo's students of one run train in two one-thread processes under the run's lock,
    held here: the same bytes as trained here one after the other on one thread."""
    import torch
    import yaml

    from lmalgebra.demo.workflow import merge_and_train
    from lmalgebra.storage.output_paths import LOCK_NAME
    from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

    students = {"distilled": False, "gold": True}
    saved: dict[str, dict[str, bytes]] = {}
    for where, threads in (("apart", 2), ("in-turn", 1)):
        (tmp_path / where).mkdir()
        path = write_recipe(tmp_path / where, teacher_dirs, student=TINY_STUDENT)
        recipe = {**yaml.safe_load(path.read_text()), "training": TINY_TRAINING}
        previous = torch.get_num_threads()
        torch.set_num_threads(1)  # in turn here on the one thread each job process has
        try:
            run = merge_and_train(recipe, students, progress=False, threads=threads)
        finally:
            torch.set_num_threads(previous)
        assert run.scores is not None and set(students) <= set(run.scores["model"])
        models = {name: run.run_dir / name / "model" / "model.safetensors" for name in students}
        saved[where] = {name: p.read_bytes() for name, p in models.items()}
        assert not (run.run_dir / LOCK_NAME).exists()  # released
    assert saved["apart"] == saved["in-turn"]


def test_a_process_whose_parent_holds_no_lock_is_refused(tmp_path: Path) -> None:
    from lmalgebra.storage.lockfile import held_by_parent, holder_record, run_directory_lock

    def refused() -> pytest.RaisesExc[RuntimeError]:
        return pytest.raises(RuntimeError, match="not held by this process's parent")

    with refused(), held_by_parent(tmp_path):
        pass
    # held here, by this process, not by its parent
    with run_directory_lock(tmp_path, "merge train"), refused(), held_by_parent(tmp_path):
        pass
    # a parent on a file system without locks leaves no lock file: nested calls run unlocked
    with held_by_parent(tmp_path, recorded=False), run_directory_lock(tmp_path, "merge train"):
        assert holder_record(tmp_path) is None
    locked = run_directory_lock(tmp_path, "merge train")
    with locked, refused(), held_by_parent(tmp_path, recorded=False):
        pass
