"""Bits per byte (and per character) of causal LMs: a measure that does not depend on tokenizers.

For each document, the model's total negative log-likelihood of its own tokenisation, in nats:
every token from the first, the first predicted after the start token (beginning-of-sequence, or
the end-of-text token of tokenizers that have only that one, as GPT-2's). Per language::

    bits per byte = sum of documents' NLL / (ln 2 * sum of their UTF-8 bytes)
    bits per char = sum of documents' NLL / (ln 2 * sum of their characters)

A document longer than the model's context is scored with a sliding window: windows of
``context`` input tokens start every ``stride`` tokens (default half the context), and each
token is scored once, in the first window that predicts it, so every token after the first
window sees at least ``context - stride`` tokens before it. Tokens a tokenizer cannot represent
(``unknown_tokens``) cost what the model gives its unknown token: a tokenizer that maps much text
to it scores better than it deserves, so the count is reported with the figures.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.fingerprint import sha256_json, sha256_texts
from lmalgebra.core.settings import home_expanded
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.examples import heldout_texts, require_examples
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import causal_only, run_recipe
from lmalgebra.distill.teachers import load_lm, max_positions, refuse_other_head
from lmalgebra.sources.embed import refuse_foreign_ids
from lmalgebra.sources.gguf_models import GGUF_PREFIX
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.atomic import refuse_unwritable
from lmalgebra.storage.csv_tables import Table, read_table, write_table
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.storage.output_paths import check_directory
from lmalgebra.train.causal_head import body_states, target_logprobs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TextScore:
    """What a model gives a set of documents: NLL in nats, what it is divided by, and the
    input tokens per window it was scored with (``context``)."""

    documents: int
    tokens: int
    unknown_tokens: int
    nats: float
    bytes: int
    chars: int
    context: int

    @property
    def bits_per_byte(self) -> float:
        return self.nats / (math.log(2) * self.bytes) if self.bytes else math.nan

    @property
    def bits_per_char(self) -> float:
        return self.nats / (math.log(2) * self.chars) if self.chars else math.nan


@dataclass(frozen=True)
class _Window:
    document: int
    inputs: np.ndarray  # (w,) int64 tokens read
    targets: np.ndarray  # (w,) int64 the token each position predicts
    first: int  # positions before this one were scored by an earlier window


def check_context(context: int | None) -> None:
    """Refuse a context (tokens per window) below one, naming it; None: the model's."""
    if context is not None and context < 1:
        raise UserInputError(f"context must be at least 1 token per window, got {context}")


def windows(sequence: np.ndarray, context: int, stride: int) -> list[tuple[int, int, int]]:
    """``(begin, end, first)`` of each window over ``sequence`` (start token included): inputs
    ``sequence[begin:end - 1]``, targets ``sequence[begin + 1:end]``, scored from target index
    ``first`` (relative to the window) on."""
    if not 1 <= stride <= context:
        raise UserInputError(f"stride must be between 1 and the context ({context}), got {stride}")
    out, begin, scored_to = [], 0, 1  # targets before index scored_to are done
    while True:
        end = min(begin + context + 1, len(sequence))
        out.append((begin, end, scored_to - begin - 1))
        scored_to = end
        if end == len(sequence):
            return out
        begin += stride


@torch.inference_mode()
def score_texts(
    model: Any,
    tokenizer: Any,
    texts: Sequence[str],
    context: int,
    stride: int | None = None,
    batch_size: int = 8,
    owner: str = "the model",
) -> TextScore:
    """NLL of ``texts`` under ``model`` (tokenised by ``tokenizer``), windows of ``context``
    input tokens every ``stride`` (default ``context // 2``); ``owner`` names the model when
    the tokenizer gives ids past its token embeddings."""
    start = start_token_id(tokenizer)
    if start is None:
        raise UserInputError(
            "the tokenizer has neither a beginning-of-sequence nor an end-of-text token to "
            "predict a document's first token after"
        )
    stride = stride or max(1, context // 2)
    encoded = tokenizer(list(texts), add_special_tokens=False, verbose=False)["input_ids"]
    refuse_foreign_ids(owner, model, [*encoded, [start]])  # the start token leads each window
    parts: list[_Window] = []
    for doc, ids in enumerate(encoded):
        sequence = np.asarray([start, *ids], dtype=np.int64)
        for begin, end, first in windows(sequence, context, stride) if ids else []:
            parts.append(_Window(doc, sequence[begin : end - 1], sequence[begin + 1 : end], first))
    nats = _window_nats(model, parts, batch_size)
    unk = tokenizer.unk_token_id
    return TextScore(
        documents=len(texts),
        tokens=sum(len(ids) for ids in encoded),
        unknown_tokens=sum(int(np.sum(np.asarray(ids) == unk)) for ids in encoded)
        if unk is not None
        else 0,
        nats=float(nats),
        bytes=sum(len(t.encode("utf-8")) for t in texts),
        chars=sum(len(t) for t in texts),
        context=context,
    )


def _window_nats(model: Any, parts: list[_Window], batch_size: int) -> float:
    """Sum over windows of the NLL of their scored targets (float64), batched by length; the
    output head runs on the scored positions alone, a chunk at a time (``causal_head``)."""
    order = sorted(range(len(parts)), key=lambda i: -len(parts[i].inputs))
    total = 0.0
    for lo in range(0, len(order), batch_size):
        chosen = [parts[i] for i in order[lo : lo + batch_size]]
        width = len(chosen[0].inputs)
        ids = torch.zeros((len(chosen), width), dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, part in enumerate(chosen):
            ids[row, : len(part.inputs)] = torch.from_numpy(part.inputs)
            mask[row, : len(part.inputs)] = 1
        hidden = body_states(model, ids, mask)
        rows = torch.cat([hidden[r, p.first : len(p.targets)] for r, p in enumerate(chosen)])
        targets = np.concatenate([p.targets[p.first :] for p in chosen])
        total -= float(target_logprobs(model, rows, targets).astype(np.float64).sum())
    return total


def bits_per_byte(
    model: ModelRef | Path | str,
    texts: Mapping[str, Sequence[str]],
    context: int | None = None,
    stride: int | None = None,
    batch_size: int = 8,
) -> dict[str, TextScore]:
    """Per language, the scores of a causal LM (a reference, or a directory or hub id) on
    ``texts`` (language -> its documents). ``context``: input tokens per window, default the
    model's positions."""
    ref = model if isinstance(model, ModelRef) else ModelRef(name=Path(model).name, path=str(model))
    if not ref.source.pretrained:  # random: had scored the trained weights, recorded as random
        given = f"random:{ref.path}" if ref.random_init else f"{ref.kind}:{ref.path}"
        raise UserInputError(
            f"model {ref.name!r} ({given}) must name a causal LM with weights to score (a "
            "directory, hub id, package:NAME or gguf:FILE), not random weights, an ONNX graph "
            "or precomputed embeddings"
        )
    directory = ref.source.resolve()
    refuse_other_head(f"model {ref.name!r}", directory, "causal", shown=ref.shown(directory))
    tokenizer = source_of(ref, directory).load_tokenizer()
    if start_token_id(tokenizer) is None:
        raise UserInputError(
            f"model {ref.name!r}: the tokenizer in {directory} has neither a beginning-of-sequence "
            "nor an end-of-text token to predict a document's first token after"
        )
    check_context(context)
    limit = max_positions(directory)
    context = limit if context is None else context
    if context is None:
        raise UserInputError(
            f"model {ref.name!r} ({ref.path}): its config.json gives no context length; pass one"
        )
    if limit is not None and context > limit:
        raise UserInputError(
            f"context {context} exceeds the {limit} positions of model {ref.name!r} ({ref.path})"
        )
    network = load_lm(ref, directory, "causal", role="model")
    return {
        lang: score_texts(
            network, tokenizer, docs, context, stride, batch_size, f"model {ref.name!r}"
        )
        for lang, docs in texts.items()
    }


@dataclass(frozen=True)
class BitsRow:
    """One model on one language's held-out documents."""

    language: str
    model: str
    documents: int
    tokens: int
    unknown_tokens: int
    bytes: int
    chars: int
    nats: float
    bits_per_byte: float
    bits_per_char: float


@dataclass(frozen=True)
class ReferencedRow(BitsRow):
    """A row of ``merge bits-per-byte``'s own table: with the model the name stood for
    (``reference``: its kind, path as resolved, revision), so that a row a later call keeps is
    known to be of the model that call gives the name to."""

    reference: str = ""


@dataclass(frozen=True)
class ScoredRow(ReferencedRow):
    """A row of ``merge bits-per-byte``'s own table as this release writes it: with the digest
    of the held-out texts it was scored on (``heldout``; empty in a row of an earlier release),
    so that a row a later call keeps is known to be of the run's held-out text as it is, and
    the input tokens per window it was scored with (``context``; None: an earlier release's),
    so that rows of one table scored with other windows are told apart."""

    heldout: str = ""
    context: int | None = None


BITS = Table("bits_per_byte.csv", BitsRow, nan="nan")  # merge evaluate's: teachers, students
# merge bits-per-byte's, of the models it was given: beside merge evaluate's table, whose RDT
# (rdt.csv) was computed from it, never over it
SCORED = Table("scored_bits_per_byte.csv", ScoredRow, nan="nan")
# the same table as earlier releases wrote it: without the held-out texts' digest, and before
# that without the models' references too
REFERENCED_SCORED = Table("scored_bits_per_byte.csv", ReferencedRow, nan="nan")
OLDER_SCORED = Table("scored_bits_per_byte.csv", BitsRow, nan="nan")


DIGEST = "#sha256="  # in a reference, before the digest of the model's files


def reference_of(ref: ModelRef, hashes: Mapping[str, str] | None = None) -> str:
    """The model ``ref`` names, as a scored row records it: its kind, path as resolved here
    and revision, and with ``hashes`` (its fingerprint: weights, tokenizer, configuration) a
    digest of them, so that a model trained again or edited at the same path is another."""
    named = f"{ref.kind}:{_resolved(ref)}" + (f"@{ref.revision}" if ref.revision else "")
    return named if hashes is None else f"{named}{DIGEST}{sha256_json(dict(hashes))[:16]}"


def _same_reference(recorded: str, now: str) -> bool:
    """Whether a row recorded as ``recorded`` is of the model now referenced ``now``; a row
    of an older release, which recorded no digest, by its kind, path and revision alone."""
    return recorded == now or (DIGEST not in recorded and now.partition(DIGEST)[0] == recorded)


def _resolved(ref: ModelRef) -> str:
    """``ref``'s path as resolved here, a GGUF file's behind its ``gguf:`` (which had made
    ``gguf:m.gguf`` and ``gguf:/abs/m.gguf`` two models); a hub id as given."""
    prefix = GGUF_PREFIX if ref.path.startswith(GGUF_PREFIX) else ""
    local = home_expanded(Path(ref.path.removeprefix(prefix)))
    return prefix + str(local.resolve()) if local.exists() else ref.path


@holding_lock("merge bits-per-byte", lambda run_dir, **_: run_dir)
def evaluate_bits(
    run_dir: Path,
    models: Sequence[ModelRef],
    languages: Sequence[str] | None = None,
    context: int | None = None,
    table: Table | None = SCORED,
) -> list[BitsRow]:
    """Bits per byte of each model on each language's held-out examples of a merge run, written
    to ``run_dir/evaluation/`` under the run's lock as ``table`` (None: not written; ``merge
    evaluate`` writes its rows with the rest of its evaluation); the rows."""
    check_context(context)  # before any model is read
    refuse_names(run_dir, models)
    if table is not None:  # where it writes, before any model is scored, not after
        check_directory(RunLayout(run_dir).evaluation, "evaluation directory")
        refuse_unwritable(RunLayout(run_dir).evaluation / table.file)
    texts = heldout_texts(run_dir, languages)
    rows, contexts = [], {}
    for ref in models:
        for lang, score in bits_per_byte(ref, texts, context).items():
            contexts[ref.name] = score.context
            rows.append(
                BitsRow(
                    lang,
                    ref.name,
                    score.documents,
                    score.tokens,
                    score.unknown_tokens,
                    score.bytes,
                    score.chars,
                    score.nats,
                    score.bits_per_byte,
                    score.bits_per_char,
                )
            )
    if table is SCORED:
        memo = RunLayout(run_dir).hashes
        prints = {ref.name: source_of(ref).fingerprint(memo) for ref in models}
        digests = {lang: sha256_texts(docs) for lang, docs in texts.items()}
        scored = _scored_rows(rows, models, prints, digests, contexts)
        write_table(
            RunLayout(run_dir).evaluation, SCORED, [*_earlier_rows(run_dir, scored), *scored]
        )
    elif table is not None:
        write_table(RunLayout(run_dir).evaluation, table, rows)
    return rows


def _scored_rows(
    rows: Sequence[BitsRow],
    models: Sequence[ModelRef],
    prints: Mapping[str, Mapping[str, str]],
    heldout: Mapping[str, str],
    contexts: Mapping[str, int],
) -> list[ScoredRow]:
    """``rows`` as the table records them: with the model each name stood for, the digest of
    the held-out texts (``heldout``: language -> digest) and the context (``contexts``: model
    -> tokens per window) it was scored with."""
    references = {ref.name: reference_of(ref, prints[ref.name]) for ref in models}
    return [
        ScoredRow(
            **asdict(row),
            reference=references[row.model],
            heldout=heldout[row.language],
            context=contexts[row.model],
        )
        for row in rows
    ]


def refuse_names(run_dir: Path, models: Sequence[ModelRef]) -> None:
    """Refuse two models of one name (their rows would be one model's), and a model named as a
    teacher or a saved student of the run that is not that model (its rows would be taken for
    the teacher's or the student's, in RDT too)."""
    names = [ref.name for ref in models]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise UserInputError(
            f"model names must be unique; repeated: {', '.join(repeated)} (name each model: "
            f"{either('--models NAME=REFERENCE', 'models={NAME: REFERENCE}')})"
        )
    teachers = run_recipe(run_dir).teachers
    for ref in models:
        spec = teachers.get(ref.name)
        if spec is not None and not _same_model(ref, spec.ref(ref.name)):
            raise UserInputError(
                f"model {ref.name!r} ({ref.path}) has the name of the run's teacher "
                f"{ref.name!r} ({spec.path}), whose scores its rows would be taken for: name it "
                f"otherwise (the teacher is scored by its own: {_named(ref.name, spec.path)})"
            )
    students = RunLayout(run_dir).saved_students()
    for ref in models:
        model = students.get(ref.name)
        if model is not None and _resolved(ref) != str(model.resolve()):
            raise UserInputError(
                f"model {ref.name!r} ({ref.path}) has the name of the run's student {ref.name!r} "
                f"({model}), whose scores its rows would be taken for: name it otherwise (the "
                f"student is scored by its model: {_named(ref.name, model)})"
            )


def _named(name: str, path: object) -> str:
    """Model ``name`` at ``path``, as the command line and Python name it."""
    return either(f"--models {name}={path}", f"models={{{name!r}: {str(path)!r}}}")


def _same_model(a: ModelRef, b: ModelRef) -> bool:
    """Whether two references name one model (its kind, path as resolved here, revision)."""
    return a.kind == b.kind and _resolved(a) == _resolved(b) and a.revision == b.revision


def _earlier_rows(run_dir: Path, rows: Sequence[ScoredRow]) -> list[ScoredRow]:
    """The rows an earlier ``merge bits-per-byte`` wrote of other models or languages than
    ``rows``, kept beside them (a later call of other models had replaced the table): those of
    a language whose held-out text is still what they were scored on (its digest; a row of an
    earlier release, which recorded none, by its documents, bytes and characters, which an edit
    of a letter keeps); the others are dropped, and said so, as is a table that cannot be
    read."""
    directory = RunLayout(run_dir).evaluation
    try:
        earlier = _read_scored(directory)
    except UserInputError as err:
        log.warning("%s; it is written again from this call's rows alone", err)
        return []
    scored = {(r.language, r.model) for r in rows}
    earlier = [r for r in earlier if (r.language, r.model) not in scored]
    earlier = _of_the_same_models(directory / SCORED.file, earlier, rows)
    if not earlier:
        return []
    texts = heldout_texts(
        run_dir, sorted(set(require_examples(run_dir)) & {r.language for r in earlier})
    )
    digests = {lang: sha256_texts(docs) for lang, docs in texts.items()}
    held = {
        lang: (len(docs), sum(len(t.encode("utf-8")) for t in docs), sum(len(t) for t in docs))
        for lang, docs in texts.items()
    }
    kept = [
        r
        for r in earlier
        if (digests.get(r.language) == r.heldout)
        or (not r.heldout and held.get(r.language) == (r.documents, r.bytes, r.chars))
    ]
    if len(kept) < len(earlier):
        gone = sorted({f"{r.model} ({r.language})" for r in earlier if r not in kept})
        log.warning(
            "%s: dropped the rows of %s, scored on held-out text the run no longer holds",
            directory / SCORED.file,
            ", ".join(gone),
        )
    return kept


def _read_scored(directory: Path) -> list[ScoredRow]:
    """The rows of ``merge bits-per-byte``'s table; one an earlier release wrote, without the
    ``heldout`` column (or the ``reference`` column too), read with nothing recorded there."""
    try:
        return read_table(directory, SCORED) or []
    except UserInputError:
        pass
    try:
        return [ScoredRow(**asdict(r)) for r in read_table(directory, REFERENCED_SCORED) or []]
    except UserInputError:  # a damaged table: raised again
        return [ScoredRow(**asdict(r)) for r in read_table(directory, OLDER_SCORED) or []]


def _of_the_same_models(
    path: Path, earlier: list[ScoredRow], rows: Sequence[ScoredRow]
) -> list[ScoredRow]:
    """The earlier rows of names this call gives to the model that scored them: those of a
    name now given to another model (or written by an older release, which did not record
    the model) are dropped, and said so, since the table would hold two models under one name:
    a model trained again or edited at the same path is another (``reference_of``)."""
    now = {r.model: r.reference for r in rows}
    kept = [r for r in earlier if _same_reference(r.reference, now.get(r.model, r.reference))]
    if len(kept) < len(earlier):
        gone = sorted({f"{r.model} ({r.language})" for r in earlier if r not in kept})
        log.warning(
            "%s: dropped the rows of %s, scored as another model than this call names so (at "
            "another path, or its files changed since)",
            path,
            ", ".join(gone),
        )
    return kept


def run_teachers(run_dir: Path) -> list[ModelRef]:
    """The causal teachers of the run in ``run_dir`` (what ``merge bits-per-byte`` scores when
    given no model); refused for a masked-LM run, whose teachers are no causal LMs."""
    recipe = causal_only(
        run_recipe(run_dir),
        f"{run_dir} is a masked-LM run: name the causal LMs to score with "
        f"{either('--models', 'models=')}",
    )
    return [spec.ref(name) for name, spec in recipe.teachers.items()]
