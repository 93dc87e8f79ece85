"""Causal student training data: the student's tokens of each stored example and, per teacher, the
teacher's record aligned to them.

The student tokenizes each example's stored text with byte offsets
(``byte_alignment.encode_with_offsets``); its input is ``[start] + tokens[:-1]`` so that output
row ``s`` predicts token ``s``. Against the record of the teacher the batch slot was drawn for:

- chunks (``byte_alignment.chunks``) give both sides' chunk indices (ALM);
- the chunk-start alignment (each chunk's first student token -> the chunk's first teacher token:
  both predict the continuation of the same byte prefix) places ULD;
- the MinED sequence alignment (``byte_alignment.mined_alignments``, a batch's examples at once)
  places MinED-KL and the sampled-token loss;
- the teacher's top-k and drawn ids are carried into the student vocabulary by the MinED map
  (``distill.vocab.mined_map``) here, so the losses see student ids only, whatever the teacher;
  the top-k also by the prefix map (``distill.vocab.prefix_map``) where a loss reads it, and
  a target at every student position (``distill.vocab.position_targets``) where one does.

Alignments are computed on the CPU when a batch is built, only those the loss mix reads
(``train.cross_tokenizer.needs_of``); batch ``i`` depends on ``(seed, i)`` alone
(``student_data.SampledLanguages``), as the masked path's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.store import CausalStore, load_causal_store
from lmalgebra.distill.examples import is_written
from lmalgebra.distill.sampling import SampledLanguages, language_pool
from lmalgebra.distill.vocab.byte_alignment import (
    ByteTokens,
    chunk_ids,
    chunk_start_alignment,
    chunks,
    encode_with_offsets,
    mined_alignments,
    token_texts,
)
from lmalgebra.distill.vocab.mined_map import mined_map
from lmalgebra.distill.vocab.position_targets import PositionTargets, vocabulary_surfaces
from lmalgebra.distill.vocab.prefix_map import prefix_map
from lmalgebra.train.cross_tokenizer import NEEDS


@dataclass
class CausalBatch:
    """One micro-batch of ``B`` examples, ``S`` student and ``T`` teacher positions (padded).

    Attributes:
        input_ids, attention_mask: ``(B, S) int64`` the student's inputs (start token first).
        targets: ``(B, S) int64`` the student's tokens; mask ``(B, S) bool`` the real ones.
        student_chunk, chunk_start, mined: ``(B, S) int64`` chunk index, chunk-start and MinED
            aligned teacher row of each student position (-1: none).
        teacher_chunk: ``(B, T) int64``; next_logprob ``(B, T) float32`` (NaN: padding).
        topk_ids: ``(B, T, k) int64`` in student ids; topk_logprobs ``(B, T, k) float32``.
        prefix_ids: ``(B, T, k) int64`` the top-k in student ids by the prefix map, or None.
        position_ids, position_logprobs: ``(B, S, k)`` each student position's target
            (``PositionTargets``; -1 and NaN: none), or None.
        sample_ids: ``(B, T, K) int64`` in student ids (-1: padding), or None.
        tokens: ``(n_languages,) int64`` student tokens per language (throughput logs).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    student_chunk: torch.Tensor
    chunk_start: torch.Tensor
    mined: torch.Tensor
    teacher_chunk: torch.Tensor
    next_logprob: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    prefix_ids: torch.Tensor | None
    position_ids: torch.Tensor | None
    position_logprobs: torch.Tensor | None
    sample_ids: torch.Tensor | None
    tokens: torch.Tensor

    def to(self, device: torch.device) -> CausalBatch:
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = None if value is None else value.to(device)
        return CausalBatch(**moved)

    def examples(self, lo: int, hi: int) -> CausalBatch:
        """Examples ``[lo, hi)`` at the batch's padded widths; ``tokens`` stays the batch's."""
        part: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            part[f.name] = value if value is None or f.name == "tokens" else value[lo:hi]
        return CausalBatch(**part)


@dataclass
class TeacherCopy:
    """One teacher's records of a language, its MinED map (and prefix map, where a loss reads
    it) into the student vocabulary, and its loss on each example (nats per byte: the ``best``
    copy is the lowest)."""

    name: str
    store: CausalStore
    vocab_map: np.ndarray  # (V_teacher,) int64
    heldout: np.ndarray  # (rows,) bool
    loss: np.ndarray  # (rows,) float64
    prefix: np.ndarray | None = None  # (V_teacher,) int64
    positions: PositionTargets | None = None


# a teacher's MinED map, prefix map and position targets into the student's vocabulary
TeacherMaps = tuple[np.ndarray, np.ndarray | None, PositionTargets | None]


def _nats_per_byte(store: CausalStore) -> np.ndarray:
    lengths = np.array([max(len(t.encode("utf-8")), 1) for t in store.texts], dtype=np.float64)
    nats = np.add.reduceat(
        -np.nan_to_num(store.next_logprob.astype(np.float64)), store.token_offsets[:-1]
    )
    empty = store.token_offsets[1:] == store.token_offsets[:-1]
    return np.where(empty, np.nan, nats) / lengths


class CausalStoreBatches(SampledLanguages):
    """Student batches from a run directory's causal store.

    Args:
        run_dir: the run directory. teachers_of: language -> its teachers' names.
        tokenizers: teacher name -> its tokenizer; student: the student's tokenizer.
        start_id: the student's start token; positions: its longest input.
        batch_size, alpha, mode, seed: as ``student_data.StoreBatches``.
        needs: what batches carry (``train.cross_tokenizer.NEEDS``, as the loss mix reads
            them: ``needs_of``): ``chunks`` (chunk indices and chunk starts), ``mined`` (the
            MinED alignment), ``samples`` (the drawn tokens; refused when a store has none),
            ``prefix`` (the top-k by the prefix map), ``positions`` (a target at every
            student position: ``distill.vocab.position_targets``). An alignment not asked for
            stays -1 (a CE-only student needs none, and the MinED alignment is the costly part
            of a batch).
        validation_fraction: the share of each language's training examples kept out of the
            batches for validation (``validation_rows``); their texts: ``validation``.
    """

    def __init__(
        self,
        run_dir: Path,
        teachers_of: dict[str, list[str]],
        tokenizers: dict[str, Any],
        student: Any,
        start_id: int,
        positions: int,
        batch_size: int,
        alpha: float,
        mode: Literal["all", "best"],
        seed: int,
        needs: frozenset[str] = NEEDS - {"samples"},
        validation_fraction: float = 0.0,
    ):
        self.start_id, self.needs = start_id, needs
        self.samples = "samples" in needs
        self.pad_id = student.pad_token_id if student.pad_token_id is not None else 0
        self._student_surfaces: list[bytes | None] | None = None
        self._maps: dict[str, TeacherMaps] = {}
        pools, self.encoded = [], []
        self.validation: dict[str, list[str]] = {}
        for lang, teachers in teachers_of.items():
            copies = [self._copy(run_dir, lang, t, tokenizers[t], student) for t in teachers]
            store = copies[0].store
            kept = validation_rows(store.example_ids, store.heldout, validation_fraction, lang)
            for copy in copies:  # row-aligned: the same examples for every teacher
                copy.heldout = copy.heldout | kept
            self.validation[lang] = [str(store.texts[r]) for r in np.flatnonzero(kept)]
            pools.append(language_pool(copies, mode, lang))
            self.encoded.append(_encode_all(student, copies[0].store, positions, lang))
        super().__init__(list(teachers_of), pools, batch_size, alpha, seed)

    def _copy(self, run_dir: Path, lang: str, name: str, tokenizer: Any, student: Any) -> Any:
        store = load_causal_store(run_dir, lang, name)
        if self.samples and store.sample_ids is None:
            raise UserInputError(
                f"training.objective_mix: sampled needs drawn tokens, and the store of "
                f"{lang}/{name} has none (set causal.samples > 0 and run `merge teach` again)"
            )
        if name not in self._maps:  # a teacher of several languages: its maps once
            self._maps[name] = self._maps_of(name, tokenizer, student)
        mined, prefix, positions = self._maps[name]
        copy = TeacherCopy(name, store, mined, store.heldout, _nats_per_byte(store), prefix)
        copy.positions = positions
        return copy

    def _maps_of(self, name: str, tokenizer: Any, student: Any) -> TeacherMaps:
        """Teacher ``name``'s MinED map, and its prefix map and position targets where
        ``needs`` reads them."""
        mined = mined_map(tokenizer, student, name, "student").student_ids.astype(np.int64)
        if not self.needs & {"prefix", "positions"}:
            return mined, None, None
        prefix = prefix_map(tokenizer, student, mined, name)
        if "positions" not in self.needs:
            return mined, prefix, None
        if self._student_surfaces is None:
            self._student_surfaces = vocabulary_surfaces(student, "student")
        teacher = vocabulary_surfaces(tokenizer, name)
        return mined, prefix, PositionTargets(teacher, self._student_surfaces, prefix)

    def batch(self, index: int) -> CausalBatch:
        slots = []
        for lang, item in self.draw(index):
            pool = self.pools[lang]
            copy, row = pool.copies[pool.source[item]], int(pool.row[item])
            slots.append((lang, copy, row, self.encoded[lang][row]))
        return self._collate(slots)

    def _collate(self, slots: list[tuple[int, TeacherCopy, int, ByteTokens]]) -> CausalBatch:
        parts = [_example(copy, row, tokens, self.needs) for _, copy, row, tokens in slots]
        if "mined" in self.needs:
            aligned = mined_alignments([part.pop("mined_texts") for part in parts])
            for part, mined in zip(parts, aligned, strict=True):
                part["mined"] = mined
        width = max(len(t.ids) for *_, t in slots)
        depth = max(len(p["next_logprob"]) for p in parts)
        k = slots[0][1].store.topk_ids.shape[1]
        out = _empty(len(slots), width, depth, k, slots[0][1], self.needs)
        out["input_ids"].fill_(self.pad_id)
        tokens = torch.zeros(len(self.languages), dtype=torch.long)
        for b, ((lang, _, _, student), part) in enumerate(zip(slots, parts, strict=True)):
            n, t = len(student.ids), len(part["next_logprob"])
            ids = torch.from_numpy(student.ids)
            out["input_ids"][b, 0] = self.start_id
            out["input_ids"][b, 1:n] = ids[: n - 1]
            out["attention_mask"][b, :n] = 1
            out["targets"][b, :n] = ids
            out["mask"][b, :n] = True
            for key in ("student_chunk", "chunk_start", "mined"):
                if key in part:
                    out[key][b, :n] = torch.from_numpy(part[key])
            for key in ("position_ids", "position_logprobs"):
                if out[key] is not None:
                    out[key][b, :n] = torch.from_numpy(part[key])
            for key in ("teacher_chunk", "next_logprob", "topk_ids", "topk_logprobs"):
                if key in part:
                    out[key][b, :t] = torch.from_numpy(part[key])
            for key in ("sample_ids", "prefix_ids"):
                if out[key] is not None:
                    out[key][b, :t] = torch.from_numpy(part[key])
            tokens[lang] += n
        return CausalBatch(**out, tokens=tokens)


def validation_rows(
    example_ids: Any, heldout: np.ndarray, fraction: float, lang: str
) -> np.ndarray:
    """``(rows,) bool``: the ``round(fraction * n)`` (at least one) of a language's ``n``
    training rows (not ``heldout``, nor text a teacher wrote: ``examples.is_written``) whose
    ``sha256(lang/example_id)`` is smallest, so that every student of a run, whatever its seed
    or teachers, validates on the same examples and none of them is an example held out for
    evaluation. None kept where ``fraction`` is 0."""
    kept = np.zeros(len(heldout), dtype=bool)
    if fraction <= 0:
        return kept
    written = np.array([is_written(i, lang) for i in example_ids], dtype=bool)
    train = np.flatnonzero(~heldout & ~written)  # a teacher's text never validates
    count = validation_count(len(train), fraction, lang)
    digests = [hashlib.sha256(f"{lang}/{example_ids[r]}".encode()).digest() for r in train]
    kept[train[sorted(range(len(train)), key=digests.__getitem__)[:count]]] = True
    return kept


def validation_count(train: int, fraction: float, lang: str) -> int:
    """How many of a language's ``train`` training examples validate (``round(fraction *
    train)``, at least one); refused, naming the language, when none would be left to train on
    (by the dry run too, from the examples it makes)."""
    count = max(1, round(fraction * train))
    if count >= train:
        raise UserInputError(
            f"training.validation_fraction {fraction:g} leaves language {lang!r} no training "
            f"example ({train} in all): lower it or give the language more text"
        )
    return count


def _encode_all(student: Any, store: CausalStore, positions: int, lang: str) -> list[ByteTokens]:
    """The student's tokens of every example; refuses one longer than the student's positions."""
    encoded = []
    for text, example in zip(store.texts, store.example_ids, strict=True):
        tokens = encode_with_offsets(student, str(text), "student")
        refuse_longer(str(example), lang, len(tokens.ids), positions)
        encoded.append(tokens)
    return encoded


def refuse_longer(example: str, lang: str, tokens: int, positions: int) -> None:
    """Refuse an example of more student tokens than the student's positions (training and
    its dry run alike)."""
    if tokens > positions:
        raise UserInputError(
            f"example {example} of {lang!r} is {tokens} student tokens, more than "
            f"the student's {positions} positions (student.max_position_embeddings, or "
            "the student.init model's): raise them or lower causal.example_bytes"
        )


def _example(
    copy: TeacherCopy, row: int, student: ByteTokens, needs: frozenset[str]
) -> dict[str, Any]:
    """One example's teacher arrays (ids in student ids) and what else ``needs`` asks for."""
    record = copy.store.record(row)
    n_t, n_s = len(record.token_ids), len(student.ids)
    part = {
        "next_logprob": record.next_logprob,
        "topk_ids": copy.vocab_map[record.topk_ids],
        "topk_logprobs": record.topk_logprobs,
    }
    if needs & {"chunks", "positions"}:
        found = chunks(record.offsets, student.offsets)
        chunk_start = chunk_start_alignment(found, n_s)
    if "chunks" in needs:
        part["teacher_chunk"], part["student_chunk"] = chunk_ids(found, n_t, n_s)
        part["chunk_start"] = chunk_start
    if "positions" in needs and copy.positions is not None:
        part["position_ids"], part["position_logprobs"] = copy.positions.of_example(
            record.text.encode(),
            record.token_ids,
            record.offsets,
            record.topk_ids,
            record.topk_logprobs,
            student.offsets,
            chunk_start,
        )
    if "mined" in needs:  # aligned for the whole batch at once (``_collate``)
        part["mined_texts"] = (
            token_texts(record.text, record.offsets),
            token_texts(record.text, student.offsets),
        )
    if "samples" in needs and record.sample_ids is not None:
        part["sample_ids"] = copy.vocab_map[record.sample_ids]
    if "prefix" in needs and copy.prefix is not None:
        part["prefix_ids"] = copy.prefix[record.topk_ids]
    return part


def _empty(
    batch: int, width: int, depth: int, k: int, copy: TeacherCopy, needs: frozenset[str]
) -> dict[str, Any]:
    def ints(*shape: int) -> torch.Tensor:
        return torch.full(shape, -1, dtype=torch.long)

    def nans(*shape: int) -> torch.Tensor:
        return torch.full(shape, float("nan"), dtype=torch.float32)

    drawn = copy.store.sample_ids
    return {
        "input_ids": torch.zeros((batch, width), dtype=torch.long),
        "attention_mask": torch.zeros((batch, width), dtype=torch.long),
        "targets": torch.zeros((batch, width), dtype=torch.long),
        "mask": torch.zeros((batch, width), dtype=torch.bool),
        "student_chunk": ints(batch, width),
        "chunk_start": ints(batch, width),
        "mined": ints(batch, width),
        "teacher_chunk": ints(batch, depth),
        "next_logprob": nans(batch, depth),
        "topk_ids": torch.zeros((batch, depth, k), dtype=torch.long),
        "topk_logprobs": nans(batch, depth, k),
        "prefix_ids": ints(batch, depth, k) if "prefix" in needs else None,
        "position_ids": ints(batch, width, k) if "positions" in needs else None,
        "position_logprobs": nans(batch, width, k) if "positions" in needs else None,
        "sample_ids": (
            ints(batch, depth, drawn.shape[1]) if "samples" in needs and drawn is not None else None
        ),
    }
