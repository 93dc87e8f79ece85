"""Files the toolkit writes take the mode the process's umask gives (as ``open()`` does), also
where a library makes its own (safetensors creates ``0600`` files whatever the umask): a model
directory, a run or a cache shared by a team is readable by its other members."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import save_file
from transformers import AutoModelForMaskedLM, AutoTokenizer

from lmalgebra.distill.layout import write_model_directory
from lmalgebra.storage.atomic import created_mode, write_atomic
from lmalgebra.train.checkpoint import FILES, save_checkpoint
from tiny import build_bert_mlm


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    before = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(before)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_created_mode_is_what_open_gives(umask: int, tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    assert created_mode() == mode(tmp_path / "plain") == 0o666 & ~umask


def test_an_atomic_safetensors_file_takes_the_umask(umask: int, tmp_path: Path) -> None:
    path = tmp_path / "maps.safetensors"
    write_atomic(path, lambda tmp: save_file({"a": np.zeros(3)}, str(tmp)))
    assert mode(path) == 0o666 & ~umask


def test_a_checkpoint_takes_the_umask(umask: int, tmp_path: Path) -> None:
    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    written = save_checkpoint(tmp_path / "checkpoints", 1, model, optimizer, {})
    assert {name: mode(written / name) for name in FILES} == dict.fromkeys(FILES, 0o666 & ~umask)


def test_a_model_directory_takes_the_umask(umask: int, tmp_path: Path) -> None:
    source = build_bert_mlm(tmp_path / "bert")
    model = AutoModelForMaskedLM.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    target = write_model_directory(tmp_path / "model", model, tokenizer, {"kind": "test"})
    weights = sorted(target.glob("*.safetensors"))
    assert weights
    assert {p.name: mode(p) for p in weights} == {p.name: 0o666 & ~umask for p in weights}
