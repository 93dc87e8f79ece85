"""The student vocabulary: the union of the teachers' vocabularies, and teacher -> student id maps.

Teacher tokens are compared in one canonical form (``distill.vocab.token_forms``).

The student has one set of special tokens, ``[PAD] [UNK] [CLS] [SEP] [MASK]`` at ids 0..4. Each
teacher's pad/unk/cls/sep/mask/bos/eos token maps to the student's equivalent role (bos -> [CLS],
eos -> [SEP]). Other special tokens a teacher declares (``<extra_id_0>``, ``<|im_start|>``) keep
their own student entry, verbatim, and are special tokens of the student tokenizer too: mapping
them to [UNK] would merge distinct teacher predictions into one class.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.numpy import load_file, save_file

from lmalgebra.core.errors import UserInputError, merge_stage
from lmalgebra.core.fingerprint import sealed, sha256_file, sha256_texts, unseal
from lmalgebra.core.text_files import read_json_object, read_record
from lmalgebra.distill.vocab.token_forms import (
    Convention,
    backend_of,
    canonical_token,
    detect_convention,
    lowercases,
    word_marker,
)
from lmalgebra.storage.atomic import write_atomic, write_json_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

STUDENT_SPECIALS: tuple[str, ...] = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Teacher role -> student special. When one token holds several roles (GPT-2's <|endoftext|> is
# bos, eos and unk) the first role listed here wins.
ROLES: tuple[tuple[str, str], ...] = (
    ("mask_token", "[MASK]"),
    ("pad_token", "[PAD]"),
    ("cls_token", "[CLS]"),
    ("sep_token", "[SEP]"),
    ("bos_token", "[CLS]"),
    ("eos_token", "[SEP]"),
    ("unk_token", "[UNK]"),
)
MAPS_FILE = "vocab_maps.safetensors"
META_FILE = "vocab_union.json"
REPORT = "report.json"  # in vocab/: what ``merge inspect`` shows of the vocabulary
META_CHECK = "meta_sha256"  # in META_FILE: of the rest of it
REPORT_CHECK = "report_sha256"  # in REPORT: of the rest of it
REPORT_OF = "vocabulary_sha256"  # in REPORT: the META_CHECK of the vocabulary it describes
STAGING = ".student-tokenizer.staging"  # the student tokenizer's files before they are in place
FORMAT = 1


def _tokens_by_id(tokenizer: PreTrainedTokenizerFast) -> list[str | None]:
    """Each teacher id's token string, added tokens included; None where an id has no token."""
    vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
    size = max(len(tokenizer), max(vocab.values(), default=-1) + 1)
    by_id: list[str | None] = [None] * size
    for token, index in vocab.items():
        by_id[index] = token
    return by_id


def _vocab_sha256(by_id: list[str | None]) -> str:
    return sha256_texts(token or "" for token in by_id)


@dataclass
class CanonicalVocabulary:
    """A tokenizer's vocabulary in canonical form, id by id."""

    canonical: list[str]  # student token string of each id
    extra_specials: list[str]
    convention: Convention
    lowercase: bool
    sha256: str
    special_ids: frozenset[int]  # ids of role tokens and other special tokens


def canonical_vocabulary(name: str, tokenizer: PreTrainedTokenizerFast) -> CanonicalVocabulary:
    """Canonical form of every id: roles -> student specials, other specials verbatim."""
    convention = detect_convention(tokenizer, name)
    backend = backend_of(tokenizer, name)
    by_id = _tokens_by_id(tokenizer)
    model_vocab = backend.get_vocab(with_added_tokens=False)
    roles: dict[int, str] = {}
    for attribute, student in reversed(ROLES):  # reversed: the first role listed wins
        token = getattr(tokenizer, attribute, None)
        if token is not None and (role_id := backend.token_to_id(str(token))) is not None:
            roles[role_id] = student
    added = tokenizer.added_tokens_decoder
    marker = word_marker(backend, convention)
    canonical: list[str] = []
    extras: list[str] = []
    for i, token in enumerate(by_id):
        if i in roles:
            canonical.append(roles[i])
        elif token is None:
            canonical.append("[UNK]")
        elif i in added and added[i].special:
            extras.append(token)
            canonical.append(token)
        elif i in added and model_vocab.get(token) != i:  # a user-added word, matched verbatim
            canonical.append(token)
        else:
            canonical.append(canonical_token(token, convention, marker))
    if (holes := by_id.count(None)) > 0:
        log.warning("teacher %s has %d ids without a token; they map to [UNK]", name, holes)
    specials = frozenset(roles) | {i for i, t in added.items() if t.special}
    return CanonicalVocabulary(
        canonical, extras, convention, lowercases(tokenizer), _vocab_sha256(by_id), specials
    )


def apply_map(ids: np.ndarray, mapping: np.ndarray) -> np.ndarray:
    """Teacher ids -> student ids, for an integer array of any shape.

    Args:
        ids: teacher token ids, any shape, integer; negative values (-100 ignore labels) are kept.
        mapping: ``(teacher_vocab,) int32`` student id of each teacher id (``UnionVocab.maps``).

    Returns:
        Student ids, same shape as ``ids``, dtype the wider of ``ids`` and ``mapping``.
    """
    ids = np.asarray(ids)
    if not np.issubdtype(ids.dtype, np.integer):
        raise UserInputError(f"token ids must be integers, got dtype {ids.dtype}")
    if ids.size and int(ids.max()) >= len(mapping):
        raise UserInputError(
            f"token id {int(ids.max())} is outside the teacher vocabulary of {len(mapping)} ids"
        )
    keep = ids < 0
    mapped = mapping[np.where(keep, 0, ids)]
    return np.where(keep, ids, mapped).astype(np.result_type(ids.dtype, mapping.dtype))


@dataclass
class UnionVocab:
    """The student vocabulary and each teacher's id map.

    Attributes:
        tokens: student tokens in id order, WordPiece convention; ``STUDENT_SPECIALS`` first.
        maps: per teacher, in build order, ``(len(teacher tokenizer),) int32`` student ids.
        lowercase: whether the student tokenizer lower-cases its input.
        conventions: per teacher, ``wordpiece``, ``sentencepiece`` or ``bytelevel``.
        vocab_sha256: per teacher, the hash of its token strings in id order.
        extra_specials: teacher special tokens without a student role, kept as their own entries.
    """

    tokens: list[str]
    maps: dict[str, np.ndarray]
    lowercase: bool
    conventions: dict[str, str]
    vocab_sha256: dict[str, str] = field(default_factory=dict)
    extra_specials: list[str] = field(default_factory=list)

    def student_tokenizer(self, model_max_length: int = 512) -> PreTrainedTokenizerFast:
        """A WordPiece tokenizer over ``tokens``: [CLS] $A [SEP], lowercase only if ``lowercase``.

        Accents are never stripped and CJK characters are split as in BERT.
        """
        from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
        from transformers import PreTrainedTokenizerFast

        vocab = {token: i for i, token in enumerate(self.tokens)}
        tok = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]", continuing_subword_prefix="##"))
        tok.normalizer = normalizers.BertNormalizer(strip_accents=False, lowercase=self.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        roles = zip(("pad", "unk", "cls", "sep", "mask"), STUDENT_SPECIALS, strict=True)
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            additional_special_tokens=list(self.extra_specials),
            model_max_length=model_max_length,
            **{f"{role}_token": token for role, token in roles},
        )

    def save(self, directory: Path | str) -> str:
        """Student tokenizer files, ``vocab_maps.safetensors`` and ``vocab_union.json`` (last);
        the checksum ``vocab_union.json`` carries (what a report of it records)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        # one staging directory of a fixed name, so that the one a killed run left is removed
        # here (the run directory's lock is held: no other writer uses it)
        staging = directory / STAGING
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        try:
            self.student_tokenizer().save_pretrained(staging)
            for source in sorted(staging.iterdir()):
                write_atomic(directory / source.name, functools.partial(shutil.copyfile, source))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        arrays = {name: np.ascontiguousarray(m, dtype=np.int32) for name, m in self.maps.items()}
        write_atomic(directory / MAPS_FILE, lambda tmp: save_file(arrays, str(tmp)))
        meta = {
            "format": FORMAT,
            "teachers": list(self.maps),
            "conventions": self.conventions,
            "vocab_sha256": self.vocab_sha256,
            "lowercase": self.lowercase,
            "extra_specials": self.extra_specials,
            "student_size": len(self.tokens),
            "maps_sha256": sha256_file(directory / MAPS_FILE),
            "tokenizer_sha256": sha256_file(directory / "tokenizer.json"),
        }
        meta = sealed(meta, META_CHECK)
        write_json_atomic(directory / META_FILE, meta)
        return str(meta[META_CHECK])

    @classmethod
    def load(cls, directory: Path | str) -> UnionVocab:
        """Read what ``save`` wrote; a missing or altered file raises UserInputError."""
        from tokenizers import Tokenizer

        directory = Path(directory)
        paths = [directory / META_FILE, directory / MAPS_FILE, directory / "tokenizer.json"]
        if missing := [p.name for p in paths if not p.is_file()]:
            raise UserInputError(f"{directory} is not a saved student vocabulary: no {missing}")
        try:
            meta = json.loads(paths[0].read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise UserInputError(f"{paths[0]} is not valid JSON: {err}") from None
        if isinstance(meta, dict) and unseal(meta, META_CHECK) is False:  # None: older release
            raise UserInputError(
                f"{paths[0]} was edited since it was written (its {META_CHECK}): run "
                f"{merge_stage('vocab')} again"
            )
        sums = {paths[1]: meta.get("maps_sha256"), paths[2]: meta.get("tokenizer_sha256")}
        for path, recorded in sums.items():  # no tokenizer sum in vocabularies of before
            if (recorded is not None or path == paths[1]) and sha256_file(path) != recorded:
                raise UserInputError(
                    f"{path} does not match the checksum in {paths[0].name} "
                    f"(run {merge_stage('vocab')} again)"
                )
        vocab = Tokenizer.from_file(str(paths[2])).get_vocab(with_added_tokens=False)
        tokens = sorted(vocab, key=vocab.__getitem__)
        if len(tokens) != meta.get("student_size") or vocab.get(tokens[-1]) != len(tokens) - 1:
            raise UserInputError(f"{paths[2]} does not hold the saved student vocabulary")
        arrays = load_file(str(paths[1]))
        return cls(
            tokens=tokens,
            maps={name: arrays[name] for name in meta["teachers"]},
            lowercase=bool(meta["lowercase"]),
            conventions=dict(meta["conventions"]),
            vocab_sha256=dict(meta["vocab_sha256"]),
            extra_specials=list(meta["extra_specials"]),
        )

    def report(self, tokenizers: Mapping[str, PreTrainedTokenizerFast]) -> dict[str, Any]:
        """Union size, per-teacher sizes and new tokens, pairwise overlap between teachers.

        Overlaps count distinct canonical tokens other than the five student specials. A teacher's
        ``new_fraction`` is the share of its ids whose student entry it added to the union (not
        a special, not already brought by an earlier teacher in build order).
        """
        if set(tokenizers) != set(self.maps):
            raise UserInputError(
                f"report needs the teachers {list(self.maps)}, got {list(tokenizers)}"
            )
        for name, tokenizer in tokenizers.items():
            if _vocab_sha256(_tokens_by_id(tokenizer)) != self.vocab_sha256.get(name):
                raise UserInputError(f"tokenizer {name!r} is not the one this union was built from")
        floor = len(STUDENT_SPECIALS)
        sets = {name: np.unique(m[m >= floor]) for name, m in self.maps.items()}
        seen = np.arange(floor)
        teachers: dict[str, dict[str, Any]] = {}
        for name, mapping in self.maps.items():
            new = ~np.isin(mapping, seen)
            teachers[name] = {
                "convention": self.conventions[name],
                "vocab_size": len(tokenizers[name]),
                "canonical_tokens": int(sets[name].size),
                "new_tokens": int(new.sum()),
                "new_fraction": float(new.mean()) if new.size else 0.0,
            }
            seen = np.union1d(seen, mapping)
        overlap = []
        for a, b in itertools.combinations(self.maps, 2):
            shared = int(np.intersect1d(sets[a], sets[b]).size)
            union = int(np.union1d(sets[a], sets[b]).size)
            jaccard = shared / union if union else 0.0
            overlap.append({"a": a, "b": b, "shared": shared, "jaccard": jaccard})
        return {"union_size": len(self.tokens), "teachers": teachers, "overlap": overlap}


def build_union(
    tokenizers: Mapping[str, PreTrainedTokenizerFast], lowercase: bool | None = None
) -> UnionVocab:
    """The student vocabulary of the teachers' tokenizers, in a deterministic order.

    Order: ``STUDENT_SPECIALS``, then each teacher in the given order, its tokens in id order,
    each canonical token once (at its first appearance). ``lowercase=None`` lower-cases the
    student only if every teacher's normalizer lower-cases. Cased tokens stay distinct entries
    either way: the maps are exact, whatever the student tokenizer can produce.
    """
    if not tokenizers:
        raise UserInputError("build_union needs at least one teacher tokenizer")
    teachers = {name: canonical_vocabulary(name, tok) for name, tok in tokenizers.items()}
    if lowercase is None:
        lowercase = all(teacher.lowercase for teacher in teachers.values())
    index = {token: i for i, token in enumerate(STUDENT_SPECIALS)}
    extras: dict[str, None] = {}
    maps: dict[str, np.ndarray] = {}
    for name, teacher in teachers.items():
        for token in teacher.canonical:
            index.setdefault(token, len(index))
        maps[name] = np.array([index[t] for t in teacher.canonical], dtype=np.int32)
        extras.update((t, None) for t in teacher.extra_specials if t not in STUDENT_SPECIALS)
        log.info("teacher %s (%s): %d ids", name, teacher.convention, len(teacher.canonical))
    log.info("student vocabulary: %d tokens from %d teachers", len(index), len(teachers))
    return UnionVocab(
        tokens=list(index),
        maps=maps,
        lowercase=lowercase,
        conventions={name: teacher.convention for name, teacher in teachers.items()},
        vocab_sha256={name: teacher.sha256 for name, teacher in teachers.items()},
        extra_specials=list(extras),
    )


def tokens_per_language(
    texts_by_language: Mapping[str, list[str]], tokenizer: PreTrainedTokenizerFast
) -> dict[str, float]:
    """Mean tokens per whitespace-separated word (fertility), per language, specials not counted.

    Lower is better covered; 1.0 means every word is one token. Works for the student or a teacher.
    """
    fertility: dict[str, float] = {}
    for language, texts in texts_by_language.items():
        words = sum(len(text.split()) for text in texts)
        if words == 0:
            raise UserInputError(f"language {language!r} has no words to count tokens over")
        encoded = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
        fertility[language] = sum(len(ids) for ids in encoded) / words
    return fertility


def sealed_report(report: Mapping[str, Any], vocabulary: str) -> dict[str, Any]:
    """``report`` as ``merge vocab`` writes it: with the checksum of the ``vocab_union.json``
    it describes (``vocabulary``) and a checksum of itself, which :func:`read_report` checks."""
    return sealed({**report, REPORT_OF: vocabulary}, REPORT_CHECK)


def read_report(directory: Path) -> dict[str, Any] | None:
    """The vocabulary's report in ``directory`` (None when none was written); UserInputError
    naming it when it is damaged, edited since it was written or written for another
    vocabulary than ``vocab_union.json``'s, which ``merge vocab`` mends. A report of an older
    release, without its checksums, is read as it is."""
    path = directory / REPORT
    if not (path.exists() or path.is_symlink()):
        return None
    again = f"run {merge_stage('vocab')} again"
    try:
        report = read_json_object(path, "vocabulary report")
    except UserInputError as err:
        raise UserInputError(f"{err}; {again}") from None
    if unseal(report, REPORT_CHECK) is False:
        raise UserInputError(f"{path} is damaged: edited since it was written; {again}")
    made_for = report.pop(REPORT_OF, None)
    if made_for is not None and made_for != _vocabulary_check(directory):
        raise UserInputError(f"{path} describes another vocabulary than {META_FILE}; {again}")
    if not isinstance(report.get("union_size"), int):
        raise UserInputError(f"{path} is damaged (no union_size); {again}")
    return report


def _vocabulary_check(directory: Path) -> object:
    """The checksum ``vocab_union.json`` in ``directory`` carries (None if it carries none or
    cannot be read)."""
    try:
        meta = json.loads(read_record(directory / META_FILE))
    except (OSError, ValueError):
        return None
    return meta.get(META_CHECK) if isinstance(meta, dict) else None
