"""Verification of what a MergeDistill run holds besides its shard sets: the student vocabulary
(id maps and tokenizer against the checksums in ``vocab_union.json``) and every student's
checkpoints (each file against the sha256 in its ``state.json``, the state against its own)."""

from __future__ import annotations

from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.vocab.union import META_FILE, UnionVocab
from lmalgebra.train.checkpoint import damage


def vocabulary_problems(run_dir: Path) -> list[str]:
    """The vocabulary's problem, if a vocabulary was written (``merge vocab``) and is damaged."""
    directory = run_dir / "vocab"
    if not (directory / "complete.json").is_file() and not (directory / META_FILE).is_file():
        return []
    try:
        UnionVocab.load(directory)
    except UserInputError as err:
        return [str(err)]
    except (OSError, ValueError, KeyError, TypeError) as err:  # a damaged tokenizer.json
        return [f"{directory}: cannot be read ({type(err).__name__}: {err})"]
    return []


def checkpoint_problems(run_dir: Path) -> list[str]:
    """Every damaged checkpoint of every student of the run, naming the file and why."""
    problems = []
    for checkpoint in sorted(run_dir.glob("*/checkpoints/step-*")):
        path, reason, state = damage(checkpoint)
        if state is None:
            problems.append(f"checkpoint file {path} is damaged ({reason})")
    return problems
