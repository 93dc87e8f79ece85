"""Checkpoints without pickle: model and optimizer tensors in safetensors, the rest in JSON.

A checkpoint directory ``step-NNNNNNN`` holds ``model.safetensors``, ``optimizer.safetensors``,
``rng.safetensors`` and ``state.json`` (step, optimizer hyper-parameters, sha256 of each file,
the run's fingerprint, see ``run_fingerprint``, and a sha256 of the state itself). It is written
under a temporary name and renamed, so a checkpoint either exists whole or not at all (a failed
write, a full disk included, removes the temporary directory); one whose files are missing,
truncated or fail their checksums (``state.json`` edited by hand included) is skipped with a
warning naming the file, in favour of the previous one, and with none intact training starts
again from step 0. A checkpoint written for other inputs or settings is refused.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model

from lmalgebra.core.errors import RESTART, UserInputError
from lmalgebra.core.fingerprint import sealed, sha256_file, sha256_json
from lmalgebra.core.text_files import read_record
from lmalgebra.storage.atomic import as_created, write_json_atomic
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.train.run_fingerprint import as_json, check_fingerprint

log = logging.getLogger(__name__)
FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")
STATE_SUM = "state_sha256"
OWN = (*FILES, "state.json")  # what a checkpoint directory holds: it is removed only with these
STEP_NAME = re.compile(r"step-(\d+)")  # step-0000004; a user's step-0000004.bak is not the run's


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
    fingerprint: dict[str, Any] | None = None,
) -> Path:
    """Write ``root/step-{step}`` atomically and keep only the newest ``keep`` checkpoints.

    ``fingerprint`` (what the run depends on) is recorded for ``load_latest`` to compare."""
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
        as_created(tmp / name for name in FILES)  # safetensors makes them 0600
        state: dict[str, Any] = {
            "step": step,
            "param_groups": groups,
            "extra": extra,
            "sha256": {name: sha256_file(tmp / name) for name in FILES},
        }
        if fingerprint is not None:
            state["fingerprint"] = fingerprint
        # its checksum covers the state as the file holds it (an infinity as null: the best
        # validation score before the first validation), or it never matched when read back
        write_json_atomic(tmp / "state.json", sealed(state, STATE_SUM))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if final.exists():  # a damaged checkpoint of this step, skipped when the run resumed
        _remove(final, "to save this step's checkpoint in its place")
    tmp.rename(final)
    for old in checkpoint_dirs(root)[:-keep]:
        _prune(old)
    return final


def _prune(old: Path) -> None:
    """Remove an older checkpoint the run keeps no more; one holding files a checkpoint does
    not write is kept whole, with a warning naming them (they are not the run's to remove)."""
    foreign = _foreign(old)
    if foreign:
        log.warning(
            "checkpoint %s is kept: it holds files a checkpoint does not write (%s)",
            old,
            ", ".join(foreign),
        )
        return
    shutil.rmtree(old, ignore_errors=True)


def _foreign(checkpoint: Path) -> list[str]:
    """The entries of ``checkpoint`` that it does not write (its files, and the temporary file
    of an atomic write of one, aside), a few of them; none for what is no directory."""
    if checkpoint.is_symlink() or not checkpoint.is_dir():
        return []
    found = sorted(
        p.name
        for p in checkpoint.iterdir()
        if p.name not in OWN and p.name.split(".tmp-")[0].removeprefix(".") not in OWN
    )
    return found[:3] + ([f"... {len(found) - 3} more"] if len(found) > 3 else [])


def _state_sum(state: dict[str, Any]) -> str:
    """sha256 of the state as JSON (itself left out): a hand-edited step or rate shows."""
    return sha256_json({k: v for k, v in state.items() if k != STATE_SUM})


def damage(directory: Path) -> tuple[Path, str, dict[str, Any] | None]:
    """Check a checkpoint: ``(file, "" , state)`` when whole, else the first damaged file and
    why (missing, truncated, altered or edited)."""
    path = directory / "state.json"
    try:
        state = json.loads(read_record(path))
        _check_state(state)
        _check_step(directory, state)
        for name in FILES:
            path = directory / name
            if sha256_file(path) != state["sha256"][name]:
                raise ValueError("checksum mismatch (truncated or altered)")
        return path, "", dict(state)
    except (OSError, ValueError, KeyError, TypeError) as err:
        reason = "missing" if isinstance(err, FileNotFoundError) else str(err) or type(err).__name__
        return path, reason, None


def _check_state(state: Any) -> None:
    """Refuse (``ValueError``) a checkpoint's ``state.json`` that is no record of one: not a
    mapping, without the sha256 of each of its files (``{}`` had been taken for a record, and
    the checkpoint's model named damaged, as ``'sha256'``), or not matching its checksum."""
    sums = state.get("sha256") if isinstance(state, dict) else None
    if not isinstance(sums, dict) or not all(isinstance(sums.get(n), str) for n in FILES):
        raise ValueError(
            "it records no sha256 of each of the checkpoint's files (edited or damaged)"
        )
    if STATE_SUM in state and state[STATE_SUM] != _state_sum(state):
        raise ValueError("its content does not match its checksum (edited or damaged)")


def _check_step(directory: Path, state: dict[str, Any]) -> None:
    """Refuse (``ValueError``) a checkpoint whose state records another step than its directory
    is named for (renamed, or copied under another name): the run's step count is read from the
    names, and one renamed had passed ``merge verify``, been taken for a run of more steps, and
    been resumed from the step it holds and then replaced."""
    if state.get("step") != _step(directory):
        raise ValueError(
            f"it records step {state.get('step')}, not the step {_step(directory)} its "
            "directory is named for (renamed or copied since)"
        )


def _intact(directory: Path) -> dict[str, Any] | None:
    """The checkpoint's state if every file matches its recorded sha256; else warn, naming it."""
    path, reason, state = damage(directory)
    if state is None:
        log.warning("checkpoint file %s is damaged (%s); skipping %s", path, reason, directory.name)
    return state


def load_latest(
    root: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    fingerprint: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Restore the newest intact checkpoint into ``model``/``optimizer``; its state, or None.

    With ``fingerprint``, a checkpoint recorded with another one raises
    ``CheckpointMismatchError`` (a ``UserInputError``) naming what changed."""
    for directory in reversed(checkpoint_dirs(root)):
        state = _intact(directory)
        if state is None:
            continue
        if fingerprint is not None:
            check_fingerprint(state.get("fingerprint"), fingerprint, str(directory), str(root))
        try:
            _restore(directory, state, model, optimizer)
        except (RuntimeError, ValueError, KeyError) as err:  # a checkpoint of another shape
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise UserInputError(
                f"checkpoint {directory} does not fit this model ({first}); {RESTART} starts "
                f"afresh from step 0 (or remove {root})"
            ) from None
        return state
    if checkpoint_dirs(root):
        log.warning("no intact checkpoint in %s; training starts again from step 0", root)
    return None


def _restore(
    directory: Path, state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    load_model(model, str(directory / "model.safetensors"))
    tensors = load_file(str(directory / "optimizer.safetensors"))
    entries: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        index, name = key.split(".", 1)
        entries.setdefault(int(index), {})[name] = value
    optimizer.load_state_dict({"state": entries, "param_groups": state["param_groups"]})
    torch.set_rng_state(load_file(str(directory / "rng.safetensors"))["torch"])


def latest_state(root: Path) -> tuple[Path, dict[str, Any]] | None:
    """The newest intact checkpoint under ``root`` and its state (the one ``load_latest``
    resumes from; damaged ones are skipped, as it skips them), read without loading it; None
    where there is none."""
    for directory in reversed(checkpoint_dirs(root)):
        state = damage(directory)[2]
        if state is not None:
            return directory, state
    return None


def refuse_other_inputs(root: Path, parts: dict[str, Any]) -> None:
    """What ``load_latest`` refuses of the newest intact checkpoint under ``root``, for the
    fingerprint's ``parts`` given alone (a dry run gives those it computes without reading
    weights; a dotted key, one leaf of a part: a student tokenizer's name, not its vocabulary)."""
    found = latest_state(root)
    if found is None:
        return
    directory, state = found
    recorded = state.get("fingerprint")
    if isinstance(recorded, dict):
        shown = {k: v for k in parts if (v := _leaf(recorded, k)) is not _ABSENT}
        check_fingerprint(shown, as_json(parts), str(directory), str(root))


def checkpointed_step(root: Path) -> int:
    """The step of the newest checkpoint under ``root`` (0: none), by its name alone."""
    return max((_step(p) for p in checkpoint_dirs(root) if p.is_dir()), default=0)


def checkpoint_dirs(root: Path) -> list[Path]:
    """The checkpoints under ``root`` (``step-NNNNNNN``), oldest first: a directory of another
    name (a user's ``step-0000004.bak``) is not the run's to read, prune or remove (its step
    had been read from its name, a traceback)."""
    return sorted((p for p in root.glob("step-*") if STEP_NAME.fullmatch(p.name)), key=_step)


def _step(checkpoint: Path) -> int:
    return int(checkpoint.name.removeprefix("step-"))


def clear_checkpoints(root: Path) -> None:
    """Remove every checkpoint under ``root`` (a run asked to start afresh); one that will not
    go (a directory made read-only) is one line naming it: the run would resume from it."""
    refuse_uncleared(root)  # all checked before any is removed
    for checkpoint in checkpoint_dirs(root) + sorted(root.glob(".tmp-step-*")):
        _remove(checkpoint, f"to train from step 0 with {RESTART}: the run would resume from it")


def refuse_uncleared(root: Path) -> None:
    """Refuse, removing nothing, what :func:`clear_checkpoints` would refuse to remove: a
    checkpoint under ``root`` holding files a checkpoint does not write (a dry run's check)."""
    for checkpoint in checkpoint_dirs(root):
        _refuse_foreign(checkpoint, f"to train from step 0 with {RESTART}")


def _refuse_foreign(checkpoint: Path, purpose: str) -> None:
    """Refuse removing ``checkpoint`` (for ``purpose``) while it holds files a checkpoint does
    not write, naming them: a user's file kept there had been removed with it."""
    foreign = _foreign(checkpoint)
    if foreign:
        raise UserInputError(
            f"checkpoint {checkpoint} holds files a checkpoint does not write "
            f"({', '.join(foreign)}), which removing it {purpose} would take with it: move "
            "them away, then run again"
        )


def _remove(checkpoint: Path, why: str) -> None:
    """Remove ``checkpoint``; one line naming it and ``why`` it had to go if it will not."""
    _refuse_foreign(checkpoint, why.split(":")[0])
    try:
        shutil.rmtree(checkpoint)
    except OSError as err:
        raise UserInputError(
            f"cannot remove checkpoint {checkpoint} {why} ({err.strerror or err})"
        ) from err


_ABSENT = object()


def _leaf(recorded: Any, key: str) -> Any:
    """The part of ``recorded`` that ``key`` names (dotted: a leaf within one), or ``_ABSENT``."""
    for name in key.split("."):
        if not isinstance(recorded, dict) or name not in recorded:
            return _ABSENT
        recorded = recorded[name]
    return recorded
