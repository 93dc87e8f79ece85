"""Teachers: masked LMs with a trained head, loaded from a hub id, a directory or a package."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.remote_code import announce_remote_code
from lmalgebra.sources.models import ModelRef, fingerprint, load_tokenizer, resolve_directory

log = logging.getLogger(__name__)


@dataclass
class Teacher:
    name: str
    directory: Path
    hashes: dict[str, str]
    tokenizer: Any


def open_teacher(ref: ModelRef, memo_dir: Path | None = None) -> Teacher:
    """Resolve and fingerprint a teacher and load its tokenizer (which must have a mask token)."""
    directory = resolve_directory(ref)
    tokenizer = load_tokenizer(ref, directory)
    if tokenizer.mask_token_id is None:
        raise UserInputError(f"teacher {ref.name!r}: tokenizer in {directory} has no mask token")
    return Teacher(ref.name, directory, fingerprint(ref, directory, memo_dir), tokenizer)


def load_masked_lm(ref: ModelRef, directory: Path) -> Any:
    """``AutoModelForMaskedLM`` in eval mode; refused when head weights are missing from the files.

    A model saved without its masked-LM head (an encoder-only checkpoint) would otherwise load with
    a randomly initialised head and produce confident nonsense.
    """
    from transformers import AutoModelForMaskedLM

    if ref.trust_remote_code:
        announce_remote_code(ref.name, directory)
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(
            directory, output_loading_info=True, trust_remote_code=ref.trust_remote_code
        )
    except Exception as err:
        raise UserInputError(
            f"teacher {ref.name!r}: cannot load a masked LM from {directory}: {err}"
        ) from err
    missing = sorted(info.get("missing_keys", []))
    if missing:
        shown = ", ".join(missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise UserInputError(
            f"teacher {ref.name!r}: {directory} has no trained masked-LM head "
            f"(missing weights: {shown}); pre-train one with `lmalgebra pretrain` or use another"
        )
    return model.eval()
