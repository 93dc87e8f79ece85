"""Where two tokenizations of one text meet: byte offsets, shared boundaries, chunks, alignment.

Every token gets the byte range ``[start, end)`` it covers in the text's UTF-8 bytes. Fast
tokenizers report character offsets; several byte-level BPE tokens holding parts of one character
(``é`` = ``Ã`` + ``©``) all report that character, and a SentencePiece word-start ``▁`` the
tokenizer inserts reports the character after it. Tokens whose reported ranges overlap form a
group; within a group each token gets, in order, as many bytes as its surface spells (a leading
space only if the text holds one there), the last token the rest, so the group's bytes are tiled.
A token that spells a space the tokenizer trimmed from its offsets (``trim_offsets``) gets that
space back when no other token holds it. Unknown tokens keep the range reported for them.

A **shared boundary** is a byte position where a non-empty token ends in both tokenizations. A
**chunk** is the run of teacher tokens ``[a, b)`` and student tokens ``[c, d)`` between two
consecutive shared boundaries: both cover the same bytes, except bytes one tokenizer leaves to no
token (WordPiece drops spaces). A token belongs to the chunk of its first byte; an empty token to
the chunk that starts at its position. Tokens after the last shared boundary join the last chunk
unless both sides have some there.

**MinED sequence alignment** (FuseLLM, Wan et al. 2024): dynamic time warping of the two token
string sequences with the Levenshtein distance as the cost; a student position is aligned to the
teacher position the warping path pairs it with when the path pairs it with exactly one. The
strings compared are the bytes each token covers in the text, so that word markers (``▁``, ``Ġ``,
``##``) and lower-casing do not count as edits (FuseLLM strips the markers for the same reason).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.vocab.edit_distance import distance_matrix
from lmalgebra.distill.vocab.token_forms import (
    backend_of,
    detect_convention,
    token_surface,
    word_marker,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# ((a, b), (c, d)): teacher tokens [a, b) and student tokens [c, d)
Chunk = tuple[tuple[int, int], tuple[int, int]]


@dataclass(frozen=True)
class ByteTokens:
    """One tokenization of a text: ``ids (n,) int64``, byte ``offsets (n, 2) int32``, ``tokens``
    (the vocabulary strings)."""

    ids: np.ndarray
    offsets: np.ndarray
    tokens: list[str]


def char_to_byte(text: str) -> np.ndarray:
    """``(len(text) + 1,) int64``: the UTF-8 byte position of every character position."""
    widths = np.fromiter((len(c.encode()) for c in text), dtype=np.int64, count=len(text))
    return np.concatenate([[0], np.cumsum(widths)])


def byte_offsets(
    text: str,
    char_offsets: np.ndarray | Sequence[tuple[int, int]],
    surfaces: Sequence[bytes | None],
) -> np.ndarray:
    """Byte ranges of tokens from their character ranges and surfaces (None: unknown token).

    Args:
        text: the text that was tokenized.
        char_offsets: ``(n, 2)`` character ranges as the tokenizer reports them, in token order.
        surfaces: the bytes each token spells (``token_forms.token_surface``), None when unknown.

    Returns:
        ``(n, 2) int32`` byte ranges, non-decreasing and non-overlapping (see the module doc).
    """
    data = text.encode()
    chars = np.asarray(char_offsets, dtype=np.int64).reshape(-1, 2)
    if len(chars) != len(surfaces):
        raise ValueError(f"{len(chars)} offsets for {len(surfaces)} tokens")
    if chars.size and (chars.min() < 0 or chars.max() > len(text)):
        raise ValueError(
            f"token offsets {chars.min()}..{chars.max()} outside the text's {len(text)}"
        )
    spans = char_to_byte(text)[chars]
    out = np.zeros_like(spans)
    cursor, i = 0, 0
    while i < len(spans):
        j, group_end = i + 1, int(spans[i, 1])
        while j < len(spans) and spans[j, 0] < group_end:  # tokens sharing bytes: one group
            group_end = max(group_end, int(spans[j, 1]))
            j += 1
        start = _claim_space(data, int(spans[i, 0]), cursor, surfaces[i])
        for k in range(i, j):
            start = max(start, cursor)
            if k == j - 1:
                end = max(start, group_end)
            elif (surface := surfaces[k]) is None:
                end = min(max(start, int(spans[k, 1])), group_end)
            else:
                inserted = surface[:1] == b" " and data[start : start + 1] != b" "
                end = min(start + len(surface) - inserted, group_end)
            out[k] = start, end
            cursor = start = end
        i = j
    return out.astype(np.int32)


def _claim_space(data: bytes, start: int, cursor: int, surface: bytes | None) -> int:
    """``start - 1`` when the token spells a leading space that its offsets left out and that no
    earlier token holds; else ``start``."""
    if surface and surface[:1] == b" " and start > cursor and data[start - 1 : start] == b" ":
        return start - 1
    return start


def encode_with_offsets(
    tokenizer: PreTrainedTokenizerFast, text: str, name: str | None = None
) -> ByteTokens:
    """The tokenizer's tokens of ``text`` (no special tokens added) with their byte offsets.

    A tokenizer that reports no offsets (a slow, pure-Python one) is refused with a UserInputError
    naming it.
    """
    name = name or getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    if not getattr(tokenizer, "is_fast", False):
        raise UserInputError(
            f"tokenizer {name!r} reports no token offsets (a slow, pure-Python tokenizer); "
            "use its fast version (a tokenizer.json, or AutoTokenizer with use_fast=True)"
        )
    convention = detect_convention(tokenizer, name)
    marker = word_marker(backend_of(tokenizer, name), convention)
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    ids = np.asarray(encoded["input_ids"], dtype=np.int64)
    tokens = [str(t) for t in tokenizer.convert_ids_to_tokens(ids.tolist())]
    added = tokenizer.added_tokens_decoder
    unknown = tokenizer.unk_token_id
    surfaces: list[bytes | None] = []
    for token_id, token in zip(ids.tolist(), tokens, strict=True):
        if token_id == unknown:
            surfaces.append(None)
        elif token_id in added:
            surfaces.append(added[token_id].content.encode())
        else:
            surfaces.append(token_surface(token, convention, marker))
    offsets = byte_offsets(text, encoded["offset_mapping"], surfaces)
    return ByteTokens(ids, offsets, tokens)


def shared_boundaries(teacher: np.ndarray, student: np.ndarray) -> np.ndarray:
    """Sorted byte positions where a non-empty token ends on both sides: ``(n_shared,) int64``.

    ``teacher``/``student``: ``(n, 2)`` byte offsets.
    """
    ends = [np.unique(o[:, 1][o[:, 1] > o[:, 0]]).astype(np.int64) for o in (teacher, student)]
    return np.intersect1d(ends[0], ends[1])


def chunks(teacher: np.ndarray, student: np.ndarray) -> list[Chunk]:
    """Aligned chunks ``((a, b), (c, d))``: teacher tokens ``[a, b)`` and student tokens ``[c, d)``
    covering the same bytes, in text order; they cover every token of both sides.

    ``teacher``/``student``: ``(n, 2)`` byte offsets (:func:`byte_offsets`). Empty when either
    side has no token.
    """
    if len(teacher) == 0 or len(student) == 0:
        return []
    bounds = shared_boundaries(teacher, student)
    keys = [np.searchsorted(bounds, o[:, 0], side="right") for o in (teacher, student)]
    count = len(bounds) + 1
    firsts = [np.searchsorted(k, np.arange(count + 1)) for k in keys]  # run starts per key
    runs = [
        (int(firsts[0][c]), int(firsts[0][c + 1]), int(firsts[1][c]), int(firsts[1][c + 1]))
        for c in range(count)
    ]
    out: list[Chunk] = []
    for a, b, c, d in runs:
        if a < b and c < d:
            out.append(((a, b), (c, d)))
        elif out and (a < b or c < d):  # one-sided trailing tokens join the last chunk
            (a0, _), (c0, _) = out[-1]
            out[-1] = ((a0, max(b, out[-1][0][1])), (c0, max(d, out[-1][1][1])))
    return out


def chunk_ids(
    found: Sequence[Chunk], n_teacher: int, n_student: int
) -> tuple[np.ndarray, np.ndarray]:
    """Chunk index of every token: ``(n_teacher,) int64`` and ``(n_student,) int64``, -1 outside
    every chunk (the inputs of ``train.cross_tokenizer.alm.alm_loss``)."""
    teacher = np.full(n_teacher, -1, dtype=np.int64)
    student = np.full(n_student, -1, dtype=np.int64)
    for index, ((a, b), (c, d)) in enumerate(found):
        teacher[a:b] = index
        student[c:d] = index
    return teacher, student


def chunk_start_alignment(found: Sequence[Chunk], n_student: int) -> np.ndarray:
    """``(n_student,) int64``: at each chunk's first student token, the chunk's first teacher token
    (both predict what follows the same byte prefix); -1 elsewhere."""
    aligned = np.full(n_student, -1, dtype=np.int64)
    for (a, _), (c, _) in found:
        aligned[c] = a
    return aligned


def token_texts(text: str, offsets: np.ndarray) -> list[str]:
    """The bytes each token covers in ``text``, one character per byte (latin-1): the strings
    :func:`mined_alignment` compares, free of word markers, case folding and byte alphabets."""
    data = text.encode()
    return [data[start:end].decode("latin-1") for start, end in np.asarray(offsets).tolist()]


def mined_alignment(
    teacher_tokens: Sequence[str],
    student_tokens: Sequence[str],
    distances: Callable[[Sequence[str], Sequence[str]], np.ndarray] = distance_matrix,
) -> np.ndarray:
    """``(n_student,) int64``: the teacher position aligned to each student position, or -1.

    Dynamic time warping over the Levenshtein distances of the token strings (usually
    :func:`token_texts`); from the last pair back, the path steps to the cheapest of the diagonal,
    teacher-only and student-only predecessors (the diagonal on ties), as FuseLLM does. A student
    position the path pairs with several teacher positions is left unaligned. ``distances``:
    the token strings' distance matrix (``edit_distance.distance_matrix``).
    """
    return mined_alignments([(teacher_tokens, student_tokens)], distances)[0]


def mined_alignments(
    pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
    distances: Callable[[Sequence[str], Sequence[str]], np.ndarray] = distance_matrix,
) -> list[np.ndarray]:
    """:func:`mined_alignment` of each ``(teacher_tokens, student_tokens)`` pair (a batch's
    examples): the warping costs of all of them in one pass over rows (``_warping_costs``), the
    same numbers as one at a time."""
    out = [np.full(len(s), -1, dtype=np.int64) for _, s in pairs]
    live = [b for b, (t, s) in enumerate(pairs) if len(t) and len(s)]
    if not live:
        return out
    n = max(len(pairs[b][0]) for b in live)
    m = max(len(pairs[b][1]) for b in live)
    cost = np.zeros((len(live), n, m))  # padding: ignored, no cell of a pair depends on it
    for slot, b in enumerate(live):
        teacher, student = pairs[b]
        cost[slot, : len(teacher), : len(student)] = distances(teacher, student)
    total = _warping_costs(cost)
    for slot, b in enumerate(live):
        out[b][:] = _walk_back(total[slot], len(pairs[b][0]), len(pairs[b][1]))
    return out


def _walk_back(total: np.ndarray, n: int, m: int) -> np.ndarray:
    """``(m,) int64``: the path's teacher position of each student position, -1 where it pairs
    several, from the cumulative costs ``total[:n, :m]`` (cells read one at a time)."""
    cell = total.item
    partners, partner = [0] * m, [-1] * m
    i, j = n - 1, m - 1
    while True:
        partners[j] += 1
        partner[j] = i
        if i == 0 and j == 0:
            break
        diagonal = cell(i - 1, j - 1) if i and j else math.inf
        up = cell(i - 1, j) if i else math.inf
        left = cell(i, j - 1) if j else math.inf
        if diagonal <= up and diagonal <= left:  # the first of the cheapest, diagonal on ties
            i, j = i - 1, j - 1
        elif up <= left:
            i -= 1
        else:
            j -= 1
    aligned = np.array(partner, dtype=np.int64)
    aligned[np.array(partners) > 1] = -1
    return aligned


def _warping_costs(cost: np.ndarray) -> np.ndarray:
    """``(..., n, m)`` cumulative DTW costs ``T[i, j] = cost[i, j] + min(T[i-1, j-1], T[i-1, j],
    T[i, j-1])`` of non-negative integer ``cost`` (as float64), one row at a time (for every
    leading index at once).

    Within row ``i``, with ``a[j] = min(T[i-1, j-1], T[i-1, j])`` and ``S`` the running sum of
    ``cost[i]``, the chain ``T[i, j] = cost[i, j] + min(a[j], T[i, j-1])`` unrolls to
    ``T[i, j] = S[j] + min_{k <= j} (a[k] - S[k-1])``: a running minimum. Sums of integers are
    exact in float64, so this equals the cell-by-cell recurrence bit for bit, and cells past a
    pair's own rows or columns (a batch's padding) change none of its cells.
    """
    n, m = cost.shape[-2:]
    total = np.empty(cost.shape)
    total[..., 0, :] = np.cumsum(cost[..., 0, :], axis=-1)
    before = np.empty((*cost.shape[:-2], m))  # a[k] - S[k-1]
    for i in range(1, n):
        running = np.cumsum(cost[..., i, :], axis=-1)
        above = total[..., i - 1, :]
        before[..., 0] = above[..., 0]
        np.minimum(above[..., 1:], above[..., :-1], out=before[..., 1:])
        before[..., 1:] -= running[..., :-1]
        total[..., i, :] = running + np.minimum.accumulate(before, axis=-1)
    return total
