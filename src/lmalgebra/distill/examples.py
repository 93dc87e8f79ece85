"""Each language's corpus as text examples with stable ids, and a held-out portion per language.

An example's id is ``<language>-<first 16 hex of sha256(text)>``: stable across runs and corpus
re-orderings, and identical texts collapse to one example. Whether an example is held out depends
only on its id.

A causal recipe cuts each document to its first ``causal.example_bytes`` UTF-8 bytes (at a
character boundary) and stores the cut text: every teacher tokenises exactly those bytes. The id
stays that of the whole document, so the held-out split is the same for both objectives and for
``lmalgebra pretrain``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import unit_hash
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.sources.corpus import read_documents


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    heldout: bool


def example_id(language: str, text: str) -> str:
    return f"{language}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def is_heldout(identifier: str, fraction: float) -> bool:
    return unit_hash(identifier, "heldout") < fraction


def cut_text(text: str, max_bytes: int) -> str:
    """``text``'s longest prefix of at most ``max_bytes`` UTF-8 bytes ending between characters."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")  # drops a character cut in two


def language_examples(recipe: MergeRecipe, language: str) -> list[Example]:
    """The language's examples in corpus order (first occurrence of each distinct text)."""
    spec = recipe.languages[language]
    seen: set[str] = set()
    out = []
    for text in read_documents(spec.corpus):
        text = text.strip()
        identifier = example_id(language, text)
        if identifier in seen:
            continue
        seen.add(identifier)
        if recipe.objective == "causal":
            text = cut_text(text, recipe.causal.example_bytes)
        out.append(Example(identifier, text, is_heldout(identifier, recipe.heldout_fraction)))
        if spec.max_examples is not None and len(out) == spec.max_examples:
            break
    if not any(not e.heldout for e in out):
        raise UserInputError(
            f"language {language!r}: no training example left after the held-out split"
        )
    return out
