"""Saved second moments (``decompose --save_statistics``, read back with ``SecondMoments.load``
for fits of one's own): a path that is no file of them is refused in one line naming it, never
opened when it is a FIFO (which waited for a writer), and arrays that do not fit the file's
block layout or hold NaN are refused as a damaged file, not returned to fail in a later fit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from lmalgebra.core.errors import UserInputError, UserTypeError
from lmalgebra.stats.moments import ModelColumns, SecondMoments


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    moments = SecondMoments([ModelColumns("a", 0, 3), ModelColumns("b", 3, 5)])
    moments.update(np.random.default_rng(0).standard_normal((20, 5)))
    path = tmp_path / "train.safetensors"
    moments.save(path)
    return path


def _rewritten(saved: Path, name: str, change) -> Path:
    with safe_open(str(saved), framework="numpy") as handle:
        tensors = {key: handle.get_tensor(key) for key in handle.keys()}  # noqa: SIM118
        metadata = handle.metadata()
    tensors[name] = change(tensors[name].copy())
    path = saved.with_name(f"{name}.safetensors")
    save_file(tensors, str(path), metadata=metadata)
    return path


def test_a_fifo_is_named_not_opened(tmp_path: Path) -> None:
    """In a process of its own: the read of a FIFO blocks holding the interpreter's lock."""
    fifo = tmp_path / "train.safetensors"
    os.mkfifo(fifo)
    code = (
        "import sys\n"
        "from lmalgebra.stats.moments import SecondMoments\n"
        "try:\n"
        "    SecondMoments.load(sys.argv[1])\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code, str(fifo)], capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        pytest.fail("SecondMoments.load waited on a FIFO")
    assert done.stdout.strip() == (
        f"UserInputError statistics file {fifo} is not a regular file (a FIFO, socket or device)"
    )


def test_a_directory_and_no_path_are_named(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"statistics file .* is a directory, not a file"):
        SecondMoments.load(tmp_path)
    with pytest.raises(UserTypeError, match=r"SecondMoments.load\(\): path must be .*got None"):
        SecondMoments.load(None)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "change", "said"),
    [
        ("gram", lambda a: a[:2, :2], "'gram' is [2, 2], but its block layout has 5 columns"),
        ("sums", lambda a: a[:4], "'sums' is [4], but its block layout has 5 columns"),
        ("gram", lambda a: np.where(np.eye(5, dtype=bool), np.nan, a), "'gram' holds NaN or inf"),
    ],
)
def test_arrays_that_do_not_fit_the_layout_are_a_damaged_file(
    name: str, change, said: str, saved: Path
) -> None:
    path = _rewritten(saved, name, change)
    with pytest.raises(
        UserInputError, match=re.escape(f"statistics file {path} is corrupt: {said}")
    ):
        SecondMoments.load(path)


def test_a_safetensors_file_of_other_arrays_is_named(saved: Path) -> None:
    other = saved.with_name("other.safetensors")
    save_file({"x": np.zeros(3)}, str(other))
    with pytest.raises(UserInputError, match="no block layout in its metadata"):
        SecondMoments.load(other)
    back = SecondMoments.load(str(saved))  # and the file it names is read as written
    assert back.n == 20 and back.dim == 5
