"""Code shipped with a model (``trust_remote_code``) runs only when asked for, and never silently.

The switch is off unless a user turns it on for a model (``--trust-remote-code`` or a recipe's
``trust_remote_code: true``); every load that passes it on says so in the log first, and says
when the model ships no code, so the switch has nothing to run.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from lmalgebra.core.errors import TRUST_REMOTE_CODE, UserInputError
from lmalgebra.core.text_files import read_record

log = logging.getLogger(__name__)
# files whose ``auto_map`` points transformers at code shipped beside them
AUTO_MAP_FILES = ("config.json", "tokenizer_config.json", "processor_config.json")


def ships_code(directory: Path | str) -> bool:
    """Whether the model in ``directory`` ships code that loading it runs: an ``auto_map``
    naming classes of its own (transformers imports nothing else from a model's files). True
    when ``directory`` is not a local directory, where this cannot be told."""
    root = Path(directory)
    if not root.is_dir():
        return True
    for name in AUTO_MAP_FILES:
        try:
            data = json.loads(read_record(root / name))
        except (OSError, ValueError):
            continue
        if isinstance(data, dict) and data.get("auto_map"):
            return True
    return False


def refuse_code_replaced(owner: str, shown: str, directory: Path, auto: str) -> None:
    """Refuse a model whose ``config.json`` maps ``auto`` (``AutoModel``) to a class of code it
    ships, loaded without ``trust_remote_code``: transformers then builds its own class of the
    configuration's ``model_type`` in its place, without a word, and the model's own code
    (another forward pass, other weights) never runs. ``shown`` names the model."""
    try:
        data = json.loads(read_record(Path(directory) / "config.json"))
    except (OSError, ValueError):
        return  # named by the configuration's reader
    auto_map = data.get("auto_map") if isinstance(data, dict) else None
    if not isinstance(auto_map, dict) or auto not in auto_map:
        return
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if data.get("model_type") in CONFIG_MAPPING:  # else transformers refuses it, naming the flag
        raise UserInputError(
            f"{owner}: {shown} ships its own code for {auto} ({auto_map[auto]}, its "
            f"config.json's auto_map), which runs only with {TRUST_REMOTE_CODE} (for a teacher "
            "in a recipe: trust_remote_code: true); without it transformers would run its own "
            f"{data.get('model_type')!r} model in its place"
        )


def shipped_code(directory: Path | str) -> list[Path]:
    """The Python files beside a model that ships code (``ships_code``), which loading it with
    ``trust_remote_code`` imports: part of what the model computes, so part of its identity (an
    edit of them changes its outputs as an edit of its weights does). Empty for a model that
    ships none."""
    root = Path(directory)
    if not ships_code(root) or not root.is_dir():
        return []
    return sorted(p for p in root.glob("*.py") if p.is_file())


_NO_CODE_SAID: set[tuple[str, str]] = set()  # (model, directory) said to ship no code


def announce_remote_code(name: str, directory: Path | str) -> None:
    """Log, before loading, that code shipped with model ``name`` (from ``directory``) will run,
    or, once per call (:func:`new_call`), that it ships none (a run opens a model several
    times: its tokenizer, its fingerprint, its weights, and had said so at each)."""
    if ships_code(directory):
        log.warning(
            "running code shipped with model %r from %s (--trust-remote-code)", name, directory
        )
    elif (name, str(directory)) not in _NO_CODE_SAID:
        _NO_CODE_SAID.add((name, str(directory)))
        log.info(
            "model %r from %s ships no code of its own: --trust-remote-code runs nothing for it",
            name,
            directory,
        )


def new_call() -> None:
    """A library call begins: each model that ships no code is said to again, once."""
    _NO_CODE_SAID.clear()


def load_failure(err: BaseException) -> str:
    """One line saying why a model, tokenizer or configuration did not load.

    When the model needs its own code, the loaders' advice names their ``trust_remote_code``
    argument; a user sets it with ``--trust-remote-code`` (or ``trust_remote_code: true`` for a
    teacher in a recipe), so that is what the line names."""
    text = str(err)
    if "trust_remote_code" in text or "custom code" in text:
        return (
            f"the model needs its own code to load; allow it with {TRUST_REMOTE_CODE} "
            "(for a teacher in a recipe: trust_remote_code: true) if you trust its source"
        )
    if "Weights only load failed" in text:  # torch's advice would run the file's code
        return (
            "torch cannot read its .bin weights as plain tensors: the file is damaged, or a "
            "pickle that would run code; use safetensors weights"
        )
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if lines and lines[0].endswith(":"):  # the first line announces the rest: one line of all
        return " ".join(lines)
    return lines[0] if lines else type(err).__name__
