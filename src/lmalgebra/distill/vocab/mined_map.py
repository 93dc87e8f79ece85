"""Teacher vocabulary -> student vocabulary by minimum edit distance of the token strings (MinED).

FuseLLM (Wan et al., ICLR 2024, arXiv 2401.10491) carries a teacher's next-token distribution into
a student vocabulary by mapping each teacher token to the student token whose string is closest in
Levenshtein distance. Both vocabularies are compared in the canonical (WordPiece) form of
``distill.vocab.token_forms`` (``play``/``##ing``), lower-cased on the teacher side when the student
lower-cases; role tokens compare as the student roles (``[CLS]``, ``[SEP]``, ...). Special tokens
map only to special tokens and ordinary tokens only to ordinary tokens.

The choice is exact: for each teacher token the student token with the smallest
``(distance, |length difference|, student id)``. Exact matches are found by a dictionary; the others
by a search over student tokens in order of length difference ``Δ = 0, 1, 2, ...``, stopping as soon
as the best distance found is at most ``Δ`` (no string of a length farther off can be closer,
since the distance is at least the length difference). Distances of a length bucket against
another are computed at once on torch's thread count, each pair stopping once it is farther than
every query's best so far (``distill.vocab.edit_distance``).

A map is computed once per tokenizer pair and cached as safetensors under the name of a hash of
both canonical vocabularies (so any change of tokens, conventions, specials or case changes it).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json, sha256_texts
from lmalgebra.distill.vocab.edit_distance import by_length, distance_matrix
from lmalgebra.distill.vocab.union import CanonicalVocabulary, canonical_vocabulary
from lmalgebra.storage.atomic import write_atomic
from lmalgebra.storage.output_paths import MINED_MAPS, cache_directory
from lmalgebra.storage.split_archive import clear_misplaced

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)
FORMAT = 1
CACHE_SUBDIR = MINED_MAPS


@dataclass(frozen=True)
class MinedMap:
    """``student_ids (teacher_vocab,) int64``: the student id of each teacher id;
    ``distances (teacher_vocab,) int32``: the edit distance of that pair (0: exact match)."""

    student_ids: np.ndarray
    distances: np.ndarray
    key: str  # hash of both canonical vocabularies and the format: the cache file's name

    @property
    def exact_fraction(self) -> float:
        return float((self.distances == 0).mean()) if self.distances.size else 0.0


def nearest_strings(
    queries: Sequence[str], pool: Sequence[str], workers: int = 1
) -> tuple[np.ndarray, np.ndarray]:
    """For each query, the pool index minimising ``(distance, |length difference|, index)``,
    distances computed on ``workers`` threads.

    Returns ``(indices (len(queries),) int64, distances (len(queries),) int32)``.
    """
    if not pool:
        raise UserInputError("cannot map tokens onto an empty vocabulary")
    best = np.full(len(queries), np.iinfo(np.int32).max, dtype=np.int64)
    found = np.full((2, len(queries)), -1, dtype=np.int64)  # (index, Δ) of the best so far
    first: dict[str, int] = {}
    for index, text in enumerate(pool):
        first.setdefault(text, index)
    for q, text in enumerate(queries):
        if text in first:
            best[q], found[:, q] = 0, (first[text], 0)
    rest = np.asarray([q for q in range(len(queries)) if best[q] > 0], dtype=np.int64)
    buckets = {n: (rows, [pool[i] for i in rows]) for n, rows in by_length(pool).items()}
    longest = max(buckets)
    for length, members in by_length([queries[q] for q in rest]).items():
        rows = rest[members]
        for delta in range(max(length, longest) + 1):
            open_ = best[rows] > delta  # a candidate Δ off in length is at least Δ away
            if not open_.any():
                break
            for other in sorted({length - delta, length + delta}):
                if other in buckets:
                    _improve(best, found, rows[open_], queries, buckets[other], delta, workers)
    return found[0], best.astype(np.int32)


def _improve(
    best: np.ndarray,
    found: np.ndarray,
    rows: np.ndarray,
    queries: Sequence[str],
    bucket: tuple[np.ndarray, list[str]],
    delta: int,
    workers: int,
) -> None:
    """Update ``best``/``found`` at ``rows`` with the nearest string of one pool length bucket,
    ``delta`` off in length.

    Within a bucket ``argmin`` takes the smallest pool index among ties (buckets are in index
    order); across the two buckets of one ``Δ`` the smaller index wins a tie, and a tie with a
    string found at a smaller ``Δ`` keeps that one. A pair farther apart than every row's best
    so far cannot change anything, so the distances stop there (``cutoff``).
    """
    pool_rows, pool_strings = bucket
    known = int(best[rows].max())
    cutoff = known if known < np.iinfo(np.int32).max else None
    distances = distance_matrix([queries[q] for q in rows], pool_strings, workers, cutoff)
    nearest = distances.argmin(axis=1)
    d = distances[np.arange(len(rows)), nearest].astype(np.int64)
    index = pool_rows[nearest]
    tie = (d == best[rows]) & (found[1, rows] == delta) & (index < found[0, rows])
    better = (d < best[rows]) | tie
    best[rows[better]] = d[better]
    found[0, rows[better]] = index[better]
    found[1, rows[better]] = delta


def vocabulary_forms(vocab: CanonicalVocabulary, lowercase: bool) -> tuple[list[str], list[bool]]:
    """Canonical strings and special flags of every id; ordinary tokens lower-cased if asked."""
    special = [i in vocab.special_ids for i in range(len(vocab.canonical))]
    forms = [
        t if s or not lowercase else t.lower()
        for t, s in zip(vocab.canonical, special, strict=True)
    ]
    return forms, special


def compute_map(
    teacher_forms: Sequence[str],
    teacher_special: Sequence[bool],
    student_forms: Sequence[str],
    student_special: Sequence[bool],
    workers: int = 1,
) -> tuple[np.ndarray, np.ndarray]:
    """``(student_ids (teacher_vocab,) int64, distances int32)``: specials onto specials (onto
    ordinary tokens when the student has no special token), ordinary tokens onto ordinary ones;
    distances on ``workers`` threads."""
    ids = np.zeros(len(teacher_forms), dtype=np.int64)
    distances = np.zeros(len(teacher_forms), dtype=np.int32)
    for is_special in (False, True):
        queries = [i for i, s in enumerate(teacher_special) if s == is_special]
        pool = [i for i, s in enumerate(student_special) if s == is_special]
        if not pool:  # a student without specials (or only specials): use every token
            pool = list(range(len(student_forms)))
        if not queries:
            continue
        found, d = nearest_strings(
            [teacher_forms[i] for i in queries], [student_forms[i] for i in pool], workers
        )
        ids[queries] = np.asarray(pool, dtype=np.int64)[found]
        distances[queries] = d
    return ids, distances


def mined_map(
    teacher: PreTrainedTokenizerFast,
    student: PreTrainedTokenizerFast,
    teacher_name: str = "teacher",
    student_name: str = "student",
    cache_dir: Path | None = None,
) -> MinedMap:
    """The MinED map of ``teacher``'s ids onto ``student``'s, read from the cache or computed.

    ``cache_dir`` defaults to ``$LMALGEBRA_CACHE/mined-maps``; a cache file that does not load or
    does not fit the teacher vocabulary is recomputed and replaced.
    """
    student_vocab = canonical_vocabulary(student_name, student)
    student_forms, student_special = vocabulary_forms(student_vocab, lowercase=False)
    teacher_vocab = canonical_vocabulary(teacher_name, teacher)
    teacher_forms, teacher_special = vocabulary_forms(teacher_vocab, student_vocab.lowercase)
    key = sha256_json(
        {
            "format": FORMAT,
            "teacher": [sha256_texts(teacher_forms), sha256_json(teacher_special)],
            "student": [sha256_texts(student_forms), sha256_json(student_special)],
        }
    )
    path = (cache_dir or cache_directory() / CACHE_SUBDIR) / f"mined-{key[:32]}.safetensors"
    clear_misplaced(path, False, "cached MinED map")  # a FIFO, a directory: computed again
    if (cached := _load(path, key, len(teacher_forms), len(student_forms))) is not None:
        return MinedMap(*cached, key=key)
    import torch  # its thread count: the share of the CPU this process was given

    started = time.perf_counter()
    ids, distances = compute_map(
        teacher_forms, teacher_special, student_forms, student_special, torch.get_num_threads()
    )
    log.info(
        "MinED map %s -> %s: %d x %d tokens in %.1f s, %.1f%% exact",
        teacher_name,
        student_name,
        len(teacher_forms),
        len(student_forms),
        time.perf_counter() - started,
        100 * float((distances == 0).mean()) if distances.size else 0.0,
    )
    arrays = {"student_ids": ids.astype(np.int32), "distances": distances}
    meta = {"key": key, "sha256": _checksum(key, arrays["student_ids"], distances)}
    write_atomic(path, lambda tmp: save_file(arrays, str(tmp), metadata=meta))
    return MinedMap(ids, distances, key=key)


def _checksum(key: str, ids: np.ndarray, distances: np.ndarray) -> str:
    """What a cached map records of itself: its key and its arrays' bytes."""
    return hashlib.sha256(key.encode() + ids.tobytes() + distances.tobytes()).hexdigest()


def _load(
    path: Path, key: str, teacher_size: int, student_size: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """A cached map, or None when there is none, it was edited since it was written (its
    checksum) or it does not fit (then it is recomputed)."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="numpy") as handle:
            recorded = (handle.metadata() or {}).get("sha256")
            ids, distances = handle.get_tensor("student_ids"), handle.get_tensor("distances")
    except (SafetensorError, KeyError, OSError) as err:
        log.warning("cached MinED map %s is unreadable (%s); recomputing it", path, err)
        return None
    if recorded != _checksum(key, ids, distances):
        log.warning("cached MinED map %s does not match its checksum; recomputing it", path)
        return None
    ids = ids.astype(np.int64)
    fits = ids.shape == distances.shape == (teacher_size,)
    if not fits or (ids.size and (ids.min() < 0 or ids.max() >= student_size)):
        log.warning("cached MinED map %s does not fit these tokenizers; recomputing it", path)
        return None
    return ids, distances.astype(np.int32)
