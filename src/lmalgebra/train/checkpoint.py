"""Checkpoints without pickle: model and optimizer tensors in safetensors, the rest in JSON.

A checkpoint directory ``step-NNNNNNN`` holds ``model.safetensors``, ``optimizer.safetensors``,
``rng.safetensors`` and ``state.json`` (step, optimizer hyper-parameters, sha256 of each file).
It is written under a temporary name and renamed, so a checkpoint either exists whole or not at
all (a failed write, a full disk included, removes the temporary directory); one whose files are
missing, truncated or fail their checksums is skipped with a warning naming the file, in favour of
the previous one, and with none intact training starts again from step 0.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.disk_space import naming_file

log = logging.getLogger(__name__)
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")


def _optimizer_tensors(
    optimizer: torch.optim.Optimizer,
) -> tuple[dict[str, torch.Tensor], list[Any]]:
    state = optimizer.state_dict()
    tensors = {
        f"{index}.{name}": value.detach().clone().contiguous()
        for index, entry in state["state"].items()
        for name, value in entry.items()
    }
    return tensors, state["param_groups"]


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Write ``root/step-{step}`` atomically and keep only the newest ``keep`` checkpoints."""
    final = root / f"step-{step:07d}"
    tmp = root / f".tmp-step-{step:07d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with naming_file(final / "model.safetensors"):
            save_model(model, str(tmp / "model.safetensors"))
        tensors, groups = _optimizer_tensors(optimizer)
        with naming_file(final / "optimizer.safetensors"):
            save_file(tensors, str(tmp / "optimizer.safetensors"))
        with naming_file(final / "rng.safetensors"):
            save_file({"torch": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
        state = {
            "step": step,
            "param_groups": groups,
            "extra": extra,
            "sha256": {name: sha256_file(tmp / name) for name in FILES},
        }
        write_json_atomic(tmp / "state.json", state)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def _intact(directory: Path) -> dict[str, Any] | None:
    """The checkpoint's state if every file matches its recorded sha256; else warn, naming it."""
    path = directory / "state.json"
    try:
        state = json.loads(path.read_text())
        for name in FILES:
            path = directory / name
            if sha256_file(path) != state["sha256"][name]:
                raise ValueError("checksum mismatch (truncated or altered)")
        return dict(state)
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = "missing" if isinstance(err, FileNotFoundError) else str(err) or type(err).__name__
        log.warning("checkpoint file %s is damaged (%s); skipping %s", path, reason, directory.name)
    return None


def load_latest(
    root: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> dict[str, Any] | None:
    """Restore the newest intact checkpoint into ``model``/``optimizer``; its state, or None."""
    for directory in sorted(root.glob("step-*"), reverse=True):
        state = _intact(directory)
        if state is None:
            continue
        load_model(model, str(directory / "model.safetensors"))
        tensors = load_file(str(directory / "optimizer.safetensors"))
        entries: dict[int, dict[str, torch.Tensor]] = {}
        for key, value in tensors.items():
            index, name = key.split(".", 1)
            entries.setdefault(int(index), {})[name] = value
        optimizer.load_state_dict({"state": entries, "param_groups": state["param_groups"]})
        torch.set_rng_state(load_file(str(directory / "rng.safetensors"))["torch"])
        return state
    if any(root.glob("step-*")):
        log.warning("no intact checkpoint in %s; training starts again from step 0", root)
    return None
