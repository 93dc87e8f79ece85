"""``tidy_on_failure``: what a failing command takes back, and what it never touches."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmalgebra.storage.output_paths import LOCK_NAME, tidy_on_failure


def tree(root: Path) -> set[str]:
    """Every file and directory under ``root`` (relative; lock files left out)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.name != LOCK_NAME}


def test_success_keeps_everything_and_failure_only_what_it_did_not_create(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "kept").mkdir(parents=True)
    (old / "recipe.yaml").write_text("the user's\n", encoding="utf-8")
    with tidy_on_failure(old, tmp_path / "a" / "b", scratch=("recipe.yaml", "memo/*")):
        (old / "made" / "deeper").mkdir(parents=True)
        (tmp_path / "a" / "b").mkdir(parents=True)
    assert (old / "made" / "deeper").is_dir() and (tmp_path / "a" / "b").is_dir()
    with pytest.raises(RuntimeError), tidy_on_failure(old, tmp_path / "x" / "y"):
        (old / "new" / "deeper").mkdir(parents=True)
        (tmp_path / "x" / "y" / "z").mkdir(parents=True)
        raise RuntimeError("late failure")
    assert not (old / "new").exists() and not (tmp_path / "x").exists()
    assert (old / "kept").is_dir() and (old / "recipe.yaml").read_text() == "the user's\n"


def test_scratch_goes_only_when_it_is_all_that_was_written(tmp_path: Path) -> None:
    run = tmp_path / "run"
    scratch = ("recipe.yaml", "memo/*")
    with pytest.raises(KeyboardInterrupt), tidy_on_failure(run, scratch=scratch):
        (run / "memo").mkdir(parents=True)
        (run / "memo" / "a.hash").write_text("0" * 64)
        (run / "recipe.yaml").write_text("copy\n")
        raise KeyboardInterrupt
    assert not run.exists()
    with pytest.raises(RuntimeError), tidy_on_failure(run, scratch=scratch):
        (run / "memo").mkdir(parents=True)
        (run / "recipe.yaml").write_text("copy\n")
        (run / "shard-00000.arrow").write_bytes(b"finished work")
        raise RuntimeError("late failure")
    assert tree(run) == {"recipe.yaml", "shard-00000.arrow"}  # empty memo/ went, work stayed
