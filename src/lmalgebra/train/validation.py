"""Validation during a run: the model scored on examples kept out of its training every few steps;
the best-scoring weights are kept and are the run's result, and the run stops early once the
score has not improved for ``patience`` checks.

The score never reads the text a run is evaluated on afterwards: the caller builds it from a
validation split carved out of the training examples (``distill.causal.student_data``). The best
weights go to ``<run>/best/model.safetensors`` with ``best.json`` (step, score, the file's
sha256, and a checksum of itself); what the tracker knows is recorded in every checkpoint, so a
resumed run goes on with the same best, the same count of checks without improvement, and stays
stopped once stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from safetensors.torch import load_model, save_model

from lmalgebra.core.errors import RESTART, UserInputError
from lmalgebra.core.fingerprint import sealed, sha256_file, unseal
from lmalgebra.core.text_files import read_record
from lmalgebra.storage.atomic import write_atomic, write_json_atomic
from lmalgebra.storage.stale_temporaries import remove_stale_of
from lmalgebra.train.checkpoint import latest_state

log = logging.getLogger(__name__)
BEST = "best"
# beside best/: the run's checkpoints (distill.layout names it too, without importing torch)
CHECKPOINTS = "checkpoints"
RECORD_SHA256 = "record_sha256"  # best.json's checksum of itself


@dataclass(frozen=True)
class Validation:
    """``score(model) -> float`` (lower is better) every ``every`` steps and at the last step;
    stop once ``patience`` checks in a row have not improved on the best (0: never stop)."""

    score: Callable[[Any], float]
    every: int
    patience: int = 0


class ValidationTracker:
    """The best score so far, its step and weights, and the checks since it (``state`` goes into
    each checkpoint; ``saved`` is a checkpoint's, to resume)."""

    def __init__(
        self,
        validation: Validation,
        out: Path,
        saved: dict[str, Any] | None = None,
        start: int | None = None,
    ):
        self.validation, self.folder = validation, out / BEST
        saved = saved or {}
        best = saved.get("best")  # null (JSON's infinity) before the first validation
        self.best = math.inf if best is None else float(best)
        self.best_step = int(saved.get("best_step", 0))
        self.misses = int(saved.get("misses", 0))
        self.stopped = bool(saved.get("stopped", False))
        # the sha256 of the best weights (a checkpoint of an older release records none)
        self.best_sha256: str | None = _text(saved.get("best_sha256"))
        self._kept: dict[str, Any] | None = None  # the record this process wrote last
        self._refuse_unrestorable(start)  # at the start: training to the end had ended refused
        for name in ("model.safetensors", "best.json"):  # a killed writer's temporaries, left
            remove_stale_of(self.folder / name)  # where no better weights are written again

    def due(self, step: int, steps: int) -> bool:
        """Whether step ``step`` (counted from 1) is checked."""
        return step % self.validation.every == 0 or step == steps

    def check(self, model: Any, step: int, write: bool) -> float:
        """Score ``model`` after step ``step``; keep its weights (where ``write``) if it is the
        best so far; returns the score."""
        was_training = model.training
        model.eval()
        score = float(self.validation.score(model))
        model.train(was_training)
        if score < self.best:
            self.best, self.best_step, self.misses = score, step, 0
            if write:
                self._keep(model, step, score)
        else:
            self.misses += 1
        patience = self.validation.patience
        self.stopped = patience > 0 and self.misses >= patience
        if self.stopped:
            log.info(
                "validation: no improvement in %d checks; stopping at step %d (best %.4f at "
                "step %d)",
                patience,
                step,
                self.best,
                self.best_step,
            )
        return score

    def state(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_step": self.best_step,
            "misses": self.misses,
            "stopped": self.stopped,
            **({"best_sha256": self.best_sha256} if self.best_sha256 else {}),
        }

    def _keep(self, model: Any, step: int, score: float) -> None:
        """The weights and their record: the record first, naming the weights it replaces
        too (``previous``), then the weights, then the record alone, so that a run killed
        between two of them finds weights its record names (it had found weights of no record,
        or a record of a step after its checkpoint, and refused to resume)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        kept = self._kept or _intact_record(self.folder)  # the weights hashed once a process
        record: dict[str, Any] = {"step": step, "score": score}

        def save(tmp: Path) -> None:
            save_model(model, str(tmp))
            record["sha256"] = sha256_file(tmp)
            self._record({**record, **({"previous": kept} if kept else {})})

        write_atomic(self.folder / "model.safetensors", save)
        self._record(record)
        self._kept = record
        self.best_sha256 = record["sha256"]

    def _record(self, record: dict[str, Any]) -> None:
        write_json_atomic(self.folder / "best.json", sealed(record, RECORD_SHA256))

    def restore(self, model: Any) -> None:
        """Load the best weights into ``model`` (nothing when no check has run); refuses weights
        that are not the ones this run recorded as its best."""
        if self.best_step:
            self._refuse_unrestorable()
            load_model(model, str(self.folder / "model.safetensors"))

    def _refuse_unrestorable(self, start: int | None = None) -> None:
        """Refuse best weights, once a check has kept some, that are not those this run
        recorded as its best (``unrestorable``)."""
        # the weights' sha256 at the start alone: a rank that keeps no weights knows no new one
        sha256 = self.best_sha256 if start is not None else None
        if unrestorable(self.folder, self.best_step, start, sha256):
            raise UserInputError(_unrestorable_message(self.folder, self.best_step))


def unrestorable(
    folder: Path, best_step: int, start: int | None = None, sha256: str | None = None
) -> bool:
    """Whether the best weights in ``folder`` are not those a run that recorded step
    ``best_step`` as its best (0: none kept yet), of ``sha256`` where it recorded it, can
    restore: their record damaged or edited, the weights gone, another step's or another run's
    (copied from another ``lambda_candidates`` run). Resuming from step ``start``, weights kept
    after it pass (a run killed before its next checkpoint kept them; training them again
    keeps them again)."""
    record: dict[str, Any] | None = {"step": 0, "sha256": sha256}
    if best_step:
        record = _intact_record(folder)
    if record is None:
        return True
    if start is not None and record.get("step", 0) > start:
        return False
    other = sha256 is not None and record.get("sha256") != sha256
    return record.get("step") != best_step or other


def _unrestorable_message(folder: Path, best_step: int) -> str:
    return (
        f"{folder}: the best validation weights (step {best_step}) are missing or not the ones "
        f"this run recorded; train again with {RESTART}"
    )


def resume_refusal(out: Path, state: dict[str, Any] | None) -> str | None:
    """What resuming the run in ``out`` from its checkpoint ``state`` (the newest intact one;
    None: none) refuses of its best validation weights, before any step (``ValidationTracker``
    at its start), or None: for ``merge verify`` and the dry run, which had passed best weights
    deleted, edited or of another step, that training then refused."""
    saved = (state or {}).get("extra", {}).get("validation")
    if state is None or not isinstance(saved, dict):
        return None  # no checkpoint, or a run that validates nothing: best/ is not read
    try:
        best_step, start = int(saved.get("best_step", 0)), int(state["step"])
    except (KeyError, TypeError, ValueError):
        return None  # a state of no step is a damaged checkpoint, named as such
    if unrestorable(out / BEST, best_step, start, _text(saved.get("best_sha256"))):
        return _unrestorable_message(out / BEST, best_step)
    return None


def best_damage(out: Path) -> str | None:
    """Why ``out``'s best validation weights cannot be restored (their record unreadable, or the
    weights not of the sha256 it records), or None (intact, or none kept)."""
    folder = out / BEST
    kept = [folder / n for n in ("best.json", "model.safetensors")]
    if not any(p.exists() or p.is_symlink() for p in kept) or _intact_record(folder) is not None:
        return None  # none kept (a user's file left in best/ by --restart is not a record)
    return (
        f"{folder}: the best validation weights are missing or not the ones their best.json "
        f"records, or best.json is damaged or edited since; train again with {RESTART}"
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def refuse_unrestorable_best(out: Path) -> None:
    """Refuse, as resuming the run in ``out`` refuses them before any step, best validation
    weights its newest intact checkpoint does not find (``resume_refusal``): for a dry run."""
    found = latest_state(out / CHECKPOINTS)
    refusal = resume_refusal(out, None if found is None else found[1])
    if refusal is not None:
        raise UserInputError(refusal)


def _intact_record(folder: Path) -> dict[str, Any] | None:
    """``folder``'s ``best.json`` when it reads, matches its checksum (a record of an older
    release has none) and its weights are of the sha256 it records, or of the weights it
    replaces (``previous``: the record of those); None otherwise (an edited ``step`` had passed
    ``merge verify``, then training refused it)."""
    try:
        record = json.loads(read_record(folder / "best.json"))
        if unseal(record, RECORD_SHA256) is False:
            return None
        found = sha256_file(folder / "model.safetensors")
        # killed between the record and its weights: the weights it replaces are still there
        kept = next(r for r in (record, record.get("previous") or {}) if r["sha256"] == found)
        return {k: kept[k] for k in ("step", "score", "sha256")}
    except (OSError, ValueError, KeyError, TypeError, AttributeError, StopIteration):
        return None


def clear_best(out: Path) -> None:
    """Remove ``out``'s best validation weights (once the model saved from them is written)."""
    for name in ("best.json", "model.safetensors"):
        (out / BEST / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (out / BEST).rmdir()
