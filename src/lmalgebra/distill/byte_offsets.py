"""Token offsets in UTF-8 bytes, from a fast tokenizer's character offsets.

Fast tokenizers report ``[start, end)`` in characters of the Python string. Cross-tokenizer
alignment compares positions in bytes, so each character offset becomes the byte offset of that
character (a prefix sum of the characters' UTF-8 lengths). Byte-level BPE and byte-fallback pieces
may hold part of a character: the tokenizer then gives every such piece the whole character's
span. A run of tokens whose spans overlap is split back into the bytes each contributes when
their byte lengths are known (byte-level alphabet, ``<0xNN>`` pieces) and add up to the run's
span; otherwise the run's last token covers its span and the others none (a lone ``▁`` that
SentencePiece-style tokenizers put before a word's first piece is given that piece's span).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError

_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")


@lru_cache(maxsize=1)
def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte -> printable character table, inverted: character -> byte."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, extra = list(printable), 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _mentions(component: Any, kind: str) -> bool:
    """Whether a tokenizer.json component (possibly a Sequence) holds a ``kind`` step."""
    if isinstance(component, dict):
        return component.get("type") == kind or any(
            _mentions(v, kind) for v in component.values() if isinstance(v, (dict, list))
        )
    if isinstance(component, list):
        return any(_mentions(v, kind) for v in component)
    return False


def is_byte_level(tokenizer: Any) -> bool:
    """Whether the fast tokenizer writes tokens in GPT-2's byte-level alphabet."""
    data = json.loads(tokenizer.backend_tokenizer.to_str())
    return _mentions(data.get("pre_tokenizer"), "ByteLevel") or _mentions(
        data.get("decoder"), "ByteLevel"
    )


def token_byte_lengths(tokens: Sequence[str], byte_level: bool) -> list[int | None]:
    """UTF-8 bytes each token string stands for, where the string says it exactly; else None."""
    alphabet = _byte_level_alphabet() if byte_level else {}
    lengths: list[int | None] = []
    for token in tokens:
        if _BYTE_PIECE.fullmatch(token):
            lengths.append(1)
        elif byte_level and token and all(c in alphabet for c in token):
            lengths.append(len(token))
        else:
            lengths.append(None)
    return lengths


def char_to_byte_offsets(text: str, offsets: np.ndarray) -> np.ndarray:
    """``(n, 2)`` character offsets into ``text`` -> ``(n, 2) int64`` UTF-8 byte offsets."""
    sizes = np.fromiter((len(c.encode("utf-8")) for c in text), dtype=np.int64, count=len(text))
    starts = np.zeros(len(text) + 1, dtype=np.int64)
    np.cumsum(sizes, out=starts[1:])
    return starts[np.asarray(offsets, dtype=np.int64).reshape(-1, 2)]


def _split_runs(spans: np.ndarray, lengths: list[int | None]) -> np.ndarray:
    """Spans with every run of overlapping tokens split into the bytes each contributes."""
    out = spans.copy()
    i, n = 0, len(spans)
    while i < n:
        j, stop = i + 1, spans[i, 1]
        while j < n and spans[j, 0] < stop:  # token j starts inside the run
            stop = max(stop, spans[j, 1])
            j += 1
        run = [n for n in lengths[i:j] if n is not None]  # the known lengths
        if j - i > 1 and len(run) == j - i and sum(run) == stop - spans[i, 0]:
            ends = spans[i, 0] + np.cumsum(np.asarray(run, dtype=np.int64))
            out[i:j, 1] = ends
            out[i:j, 0] = np.concatenate([[spans[i, 0]], ends[:-1]])
        elif j - i > 1:  # the last token takes the bytes (a Metaspace "▁" before it takes none)
            out[i:j] = spans[i, 0]
            out[j - 1, 1] = stop
        i = j
    return out


class ByteOffsets:
    """Byte offsets of one fast tokenizer's tokens (what it needs is worked out once).

    Args:
        tokenizer: a fast tokenizer.
        owner: who the tokenizer belongs to, for messages (``teacher 'gpt2'``).
    """

    def __init__(self, tokenizer: Any, owner: str):
        if not getattr(tokenizer, "is_fast", False):
            raise UserInputError(
                f"{owner}: the tokenizer is not a fast (Rust) tokenizer, "
                "so it reports no token offsets"
            )
        self.tokenizer, self.owner = tokenizer, owner
        self.byte_level = is_byte_level(tokenizer)

    def __call__(
        self, text: str, ids: Sequence[int] | np.ndarray, char_offsets: np.ndarray
    ) -> np.ndarray:
        """``(n, 2) int32`` byte offsets ``[start, end)`` in ``text.encode()`` of tokens ``ids``.

        ``char_offsets``: ``(n, 2)`` the tokenizer's character offsets of the same tokens.
        Refuses a tokenizer that reports no offsets for a non-empty text.
        """
        offsets = np.asarray(char_offsets, dtype=np.int64).reshape(-1, 2)
        if len(ids) and text and not offsets.any():
            raise UserInputError(f"{self.owner}: the tokenizer reports no token offsets")
        spans = char_to_byte_offsets(text, offsets)
        tokens = self.tokenizer.convert_ids_to_tokens([int(i) for i in ids])
        lengths = token_byte_lengths(tokens, self.byte_level)
        return _split_runs(spans, lengths).astype(np.int32)
