"""What a training run depends on, recorded in each checkpoint and compared on resume.

A checkpoint is only a valid starting point for the run that wrote it: the same model
configuration, the same optimisation settings and the same data (recipe, teacher store,
vocabulary, or corpus and tokenizer). Each checkpoint's ``state.json`` records these as a
*fingerprint*, a JSON object of named parts; a resumed run computes its own and refuses a
checkpoint whose fingerprint differs, naming what changed, unless asked to start afresh.
"""

from __future__ import annotations

import json
from typing import Any

from lmalgebra.core.errors import RESTART, UserInputError

# Settings a run may change between invocations without invalidating its checkpoints: how long it
# runs (and so its warm-up, which the command line derives from the length) and its bookkeeping.
RESUMABLE_SETTINGS = frozenset(
    {"steps", "warmup_steps", "log_every", "checkpoint_every", "keep_checkpoints"}
)
_PARTS = {
    "model": "the model configuration",
    "training": "the training settings",
    "recipe": "the recipe",
    "store": "the teacher store",
    "vocabulary": "the student vocabulary",
    "corpus": "the corpus",
    "tokenizer": "the tokenizer",
    "data": "the data settings",
    "init_embeddings": "the embedding initialisation",
    "student_init": "the model the student starts from",
    "student_tokenizer": "the student tokenizer",
}
_MISSING = object()


class CheckpointMismatchError(UserInputError):
    """The newest checkpoint was written by a run with other inputs or settings."""


def as_json(value: Any) -> Any:
    """``value`` as it reads back from ``state.json`` (tuples as lists, other objects as text)."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def model_part(model: Any) -> dict[str, Any]:
    """The model's configuration (Hugging Face ``config``), without loader bookkeeping."""
    return config_part(model.config)


def config_part(config: Any) -> dict[str, Any]:
    """:func:`model_part` of a configuration alone (a dry run builds no model)."""
    config = config.to_dict()
    return {
        k: v
        for k, v in sorted(config.items())
        if not k.startswith("_") and k not in ("transformers_version", "dtype", "torch_dtype")
    }


def training_part(spec: Any) -> dict[str, Any]:
    """The optimisation settings that shape every step (``TrainingSpec``, run length excluded)."""
    return training_fields(spec.model_dump(mode="json"))


def training_fields(dumped: dict[str, Any]) -> dict[str, Any]:
    """:func:`training_part` of settings already dumped (a saved model's record of them)."""
    dumped = dict(dumped)
    if dumped.get("teachers", ()) is None:  # every teacher: as runs recorded before the setting
        del dumped["teachers"]
    if dumped.get("dropout_masks") == "torch":  # as runs recorded before the setting drew them
        del dumped["dropout_masks"]
    return {k: v for k, v in dumped.items() if k not in RESUMABLE_SETTINGS}


def _short(value: Any) -> str:
    if value is _MISSING:
        return "(absent)"
    text = repr(value)
    if isinstance(value, str) and len(value) == 64:  # a sha256: its head is enough to tell
        text = repr(value[:12] + "...")
    return text if len(text) <= 60 else text[:57] + "..."


def differences(old: Any, new: Any, where: str = "") -> list[str]:
    """``"key.sub OLD -> NEW"`` for every leaf that differs between two JSON values."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            path = f"{where}.{key}" if where else str(key)
            found += differences(old.get(key, _MISSING), new.get(key, _MISSING), path)
        return found
    if old == new:
        return []
    return [f"{where} {_short(old)} -> {_short(new)}"]


def check_fingerprint(
    recorded: dict[str, Any] | None, current: dict[str, Any], checkpoint: str, root: str
) -> None:
    """Raise ``CheckpointMismatchError`` naming what changed when ``recorded`` (the checkpoint's
    fingerprint) differs from ``current`` (this run's); a checkpoint without one is accepted."""
    if recorded is None:
        return
    changed = differences(recorded, current)
    if not changed:
        return
    parts = sorted({c.split(" ", 1)[0].split(".", 1)[0] for c in changed})
    named = ", ".join(_PARTS.get(p, p) for p in parts)
    shown = "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
    raise CheckpointMismatchError(
        f"checkpoint {checkpoint} was written by a run with other inputs: {named} changed "
        f"({shown}); {RESTART} starts afresh from step 0 (or remove {root})"
    )
