"""One canonical form for the tokens of WordPiece, SentencePiece and byte-level BPE tokenizers.

Teacher tokens are compared in one canonical form, the WordPiece convention: a word-start token is
its plain text, a continuation is ``##`` + its text. SentencePiece ``▁play``/``ing`` and byte-level
``Ġplay``/``ing`` both become ``play``/``##ing``. Byte-level tokens are decoded from the GPT-2
byte alphabet to text; bytes that are not valid UTF-8 become ``<0xE2>``-style tokens, the notation
of SentencePiece byte fallback, so nothing is lost and the two conventions agree. In byte-level
BPE a token without ``Ġ`` is a continuation, the first word of a text included. A bare ``▁`` or
``Ġ`` is the empty word start ``""``. Non-special added tokens are word starts, verbatim. WordPiece
storage cannot tell a word start spelt ``##x`` from the continuation ``x``; such tokens merge.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Literal

from lmalgebra.core.errors import UserInputError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)
Convention = Literal["wordpiece", "sentencepiece", "bytelevel"]


def _spec(component: Any) -> Any:
    """JSON description of a tokenizers component (normalizer, pre-tokenizer, decoder)."""
    return None if component is None else json.loads(component.__getstate__())


def _nodes(spec: Any) -> Iterator[dict[str, Any]]:
    """Every object in a component description, nested Sequences included."""
    if isinstance(spec, dict):
        yield spec
        for value in spec.values():
            yield from _nodes(value)
    elif isinstance(spec, list):
        for value in spec:
            yield from _nodes(value)


def backend_of(tokenizer: PreTrainedTokenizerFast, name: str) -> Any:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise UserInputError(f"tokenizer {name!r} is not a fast (tokenizers-backed) tokenizer")
    return backend


def detect_convention(tokenizer: PreTrainedTokenizerFast, name: str | None = None) -> Convention:
    """The vocabulary convention of a fast tokenizer, read from its backend's model and parts."""
    name = name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    backend = backend_of(tokenizer, name)
    model = type(backend.model).__name__
    parts = [_spec(backend.normalizer), _spec(backend.pre_tokenizer), _spec(backend.decoder)]
    types = {str(node.get("type")) for node in _nodes(parts[1:]) if "type" in node}
    if model == "WordPiece":
        return "wordpiece"
    if model == "BPE" and "ByteLevel" in types:
        return "bytelevel"
    # Llama-style SentencePiece has no Metaspace: a normalizer or decoder writes the ▁ itself.
    if model == "Unigram" or (model == "BPE" and "▁" in json.dumps(parts, ensure_ascii=False)):
        return "sentencepiece"
    raise UserInputError(
        f"tokenizer {name!r} has an unknown vocabulary convention (model {model}, pre-tokenizer/"
        f"decoder {sorted(types) or 'none'}); expected WordPiece, SentencePiece or byte-level BPE"
    )


def lowercases(tokenizer: PreTrainedTokenizerFast) -> bool:
    """Whether the tokenizer's normalizer lower-cases (Lowercase, or BertNormalizer lowercase)."""
    return any(
        node.get("type") == "Lowercase"
        or (node.get("type") == "BertNormalizer" and bool(node.get("lowercase")))
        for node in _nodes(_spec(tokenizer.backend_tokenizer.normalizer))
    )


def word_marker(backend: Any, convention: Convention) -> str:
    """The continuation prefix (WordPiece) or word-start replacement character (SentencePiece)."""
    if convention == "wordpiece":
        return str(getattr(backend.model, "continuing_subword_prefix", "##") or "##")
    specs = [_spec(backend.pre_tokenizer), _spec(backend.decoder)]
    metaspace = (node for node in _nodes(specs) if node.get("type") == "Metaspace")
    return str(next(metaspace, {}).get("replacement", "▁"))


@functools.cache
def byte_alphabet() -> tuple[str, ...]:
    """The GPT-2 bytes-to-unicode alphabet: the character that stands for each byte, in byte order
    (printable latin-1 bytes stand for themselves, the others for characters from U+0100)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    shifted = [b for b in range(256) if b not in printable]
    table = {b: b for b in printable} | {b: 256 + k for k, b in enumerate(shifted)}
    return tuple(chr(table[b]) for b in range(256))


@functools.cache
def _byte_decoder() -> dict[int, int]:
    """``str.translate`` table from the GPT-2 bytes-to-unicode alphabet back to latin-1 bytes."""
    return {ord(char): byte for byte, char in enumerate(byte_alphabet())}


def _bytes_to_text(data: bytes) -> str:
    """UTF-8 text; each byte of an invalid or truncated sequence becomes ``<0xHH>``."""
    pieces: list[str] = []
    while True:
        try:
            pieces.append(data.decode("utf-8"))
            return "".join(pieces)
        except UnicodeDecodeError as err:
            pieces.append(data[: err.start].decode("utf-8"))
            pieces.extend(f"<0x{byte:02X}>" for byte in data[err.start : err.end])
            data = data[err.end :]


def canonical_token(token: str, convention: Convention, marker: str | None = None) -> str:
    """A teacher token in canonical (WordPiece) form: ``play``/``##ing``.

    ``marker`` is the WordPiece continuation prefix (default ``##``) or the SentencePiece word-start
    character (default ``▁``); byte-level BPE needs none. A word-start marker inside a
    SentencePiece token stands for a space; byte-level tokens are decoded to UTF-8 text.
    """
    if convention == "wordpiece":
        prefix = marker or "##"
        return "##" + token[len(prefix) :] if token.startswith(prefix) else token
    if convention == "sentencepiece":
        space = marker or "▁"
        if token.startswith(space):
            return token[len(space) :].replace(space, " ")
        return "##" + token.replace(space, " ")
    try:
        data = token.translate(_byte_decoder()).encode("latin-1")
    except UnicodeEncodeError:  # not in the byte alphabet (a stray added token): keep it as is
        log.debug("byte-level token %r is outside the byte alphabet; kept verbatim", token)
        return token
    text = _bytes_to_text(data)
    return text[1:] if text.startswith(" ") else "##" + text


def token_surface(token: str, convention: Convention, marker: str | None = None) -> bytes:
    """The UTF-8 bytes a token spells: byte-level tokens decoded from the GPT-2 byte alphabet
    (possibly part of a character), a SentencePiece word-start marker as a space and a byte
    fallback token ``<0xHH>`` as its byte, a WordPiece token without its ``##`` prefix.

    A space a tokenizer inserts (a word-start marker at the start of a text) is part of the
    surface: the caller decides whether the text holds it.
    """
    if convention == "wordpiece":
        prefix = marker or "##"
        return (token[len(prefix) :] if token.startswith(prefix) else token).encode()
    if convention == "sentencepiece":
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                return bytes([int(token[3:5], 16)])
            except ValueError:
                pass
        return token.replace(marker or "▁", " ").encode()
    try:
        return token.translate(_byte_decoder()).encode("latin-1")
    except UnicodeEncodeError:  # not in the byte alphabet (a stray added token): its own text
        return token.encode()
