"""Sequences defined once, as text, for every model.

Documents go to train/validation/test by a salted hash of their text (duplicates land together).
Each document is cut into consecutive spans of exactly ``T`` tokens of a reference tokenizer; a span
is the original text between its first token's start and last token's end character (no
lower-casing, no decode round trip). Spans are drawn across documents in hash order, at most
``per_doc`` from each, until a split has its count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.fingerprint import unit_hash
from lmalgebra.core.recipe_files import with_default
from lmalgebra.core.settings import Settings
from lmalgebra.core.splits import SPLITS


class TooLittleTextError(UserInputError):
    """The documents give no full span for a split: callers that can go on without this
    decomposition (an evaluation with other parts) catch it."""


class SpanSpec(Settings):
    """How documents become spans, and how many per split."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    length: int = Field(
        default=64,
        description="T: span length in reference-tokenizer tokens.",
        json_schema_extra={"short_flag": "-T"},  # T, as the method and every figure call it
    )
    fractions: tuple[float, float, float] = Field(
        default=(0.8, 0.1, 0.1), description="Share of documents for train, validation, test."
    )
    counts: tuple[int, int, int] = Field(
        default=(4000, 500, 500), description="Maximum spans for train, validation, test."
    )
    per_doc: int = Field(default=4, description="At most this many spans from one document.")
    seed: int = Field(default=0, description="Salt of the document hash that assigns splits.")

    @field_validator("length")
    @classmethod
    def _length(cls, length: int) -> int:
        if length < 1:
            raise PydanticCustomError("length", "span length T must be >= 1")
        return length

    @field_validator("fractions")
    @classmethod
    def _fractions(cls, fractions: tuple[float, float, float]) -> tuple[float, float, float]:
        if any(f < 0 for f in fractions) or abs(sum(fractions) - 1) > 1e-9:
            raise PydanticCustomError(
                "fractions", f"split fractions must be >= 0 and sum to 1, got {list(fractions)}"
            )
        if fractions[0] == 0:
            raise PydanticCustomError("fractions", "the training split needs a fraction > 0")
        empty = [s for s, f in zip(SPLITS[1:], fractions[1:], strict=True) if f == 0]
        if empty:  # no document, no span: draw_spans refuses the split once the text is read
            raise PydanticCustomError(
                "fractions",
                f"{list(fractions)} gives the {empty[0]} split no documents, so no span: give "
                "it a fraction > 0",
            )
        return fractions

    @field_validator("counts")
    @classmethod
    def _counts(cls, counts: tuple[int, int, int]) -> tuple[int, int, int]:
        if any(c < 2 for c in counts):  # one span has no variance: R^2 0 / 0
            raise PydanticCustomError(
                "counts",
                f"{list(counts)}: every split needs 2 spans at least (a split's R^2 is "
                "measured against its variance, which one span does not have)",
            )
        return counts

    @field_validator("per_doc")
    @classmethod
    def _per_doc(cls, per_doc: int) -> int:
        if per_doc < 1:
            raise PydanticCustomError("per_doc", "per_doc must be >= 1")
        return per_doc


class HeldOutSpans(SpanSpec):
    """Spans of held-out text, which is scarce: shorter spans, more per document and a larger
    test share than ``decompose``'s defaults."""

    length: int = with_default(SpanSpec, "length", 32)
    fractions: tuple[float, float, float] = with_default(SpanSpec, "fractions", (0.7, 0.1, 0.2))
    counts: tuple[int, int, int] = with_default(SpanSpec, "counts", (2000, 250, 500))
    per_doc: int = with_default(SpanSpec, "per_doc", 16)


@dataclass(frozen=True)
class Span:
    """A span of a document: ``doc`` index and character range ``[start, end)``."""

    doc: int
    start: int
    end: int


def assign_splits(docs: list[str], spec: SpanSpec) -> dict[str, list[int]]:
    """Document indices per split, each list in hash order (a deterministic shuffle)."""
    keyed = sorted(range(len(docs)), key=lambda i: (unit_hash(docs[i], f"order-{spec.seed}"), i))
    edges = (spec.fractions[0], spec.fractions[0] + spec.fractions[1])
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    for i in keyed:
        u = unit_hash(docs[i], f"split-{spec.seed}")
        out["train" if u < edges[0] else "validation" if u < edges[1] else "test"].append(i)
    return out


# Documents tokenized per call: one call per batch runs the fast tokenizer's parallel batch
# encoder, and at most a batch less one is tokenized past the last document a split needs.
TOKENIZE_BATCH = 64


def _offsets(
    docs: list[str], order: list[int], tokenizer: Any
) -> Iterator[tuple[int, list[tuple[int, int]]]]:
    """``(document index, token character offsets)`` for the documents ``order``, in order."""
    for first in range(0, len(order), TOKENIZE_BATCH):
        batch = order[first : first + TOKENIZE_BATCH]
        encoded = tokenizer(
            [docs[i] for i in batch],
            add_special_tokens=False,
            return_offsets_mapping=True,
            truncation=False,
            verbose=False,
        )["offset_mapping"]
        yield from zip(batch, encoded, strict=True)


def _spans_of(offsets: list[tuple[int, int]], index: int, length: int) -> Iterator[Span]:
    offsets = [(a, b) for a, b in offsets if b > a]
    for first in range(0, len(offsets) - length + 1, length):
        yield Span(index, offsets[first][0], offsets[first + length - 1][1])


def draw_spans(docs: list[str], tokenizer: Any, spec: SpanSpec) -> dict[str, list[Span]]:
    """Spans per split: full spans of ``spec.length`` tokens, ``per_doc`` at most per document."""
    out = {}
    assignment = assign_splits(docs, spec)
    for split, count in zip(SPLITS, spec.counts, strict=True):
        chosen: list[Span] = []
        for index, offsets in _offsets(docs, assignment[split], tokenizer):
            for k, span in enumerate(_spans_of(offsets, index, spec.length)):
                if k == spec.per_doc or len(chosen) == count:
                    break
                chosen.append(span)
            if len(chosen) == count:
                break
        out[split] = chosen
    for split in SPLITS:
        _refuse_too_few(split, len(out[split]), spec)
    return out


def refuse_unfillable(docs: list[str], spec: SpanSpec) -> None:
    """Refuse, without a tokenizer (a dry run), spans that no tokenizer can cut from ``docs``
    as ``draw_spans`` would refuse them: a span's tokens cover text (empty ones are skipped),
    and no tokenizer cuts more than two tokens from one UTF-8 byte (a byte-level one, one; a
    word-marker token beside its word's first character, two), so a document of ``n`` bytes holds
    at most ``2 n // length`` spans."""
    for split, most in most_spans(docs, spec).items():
        _refuse_too_few(split, most, spec)


def most_spans(docs: list[str] | None, spec: SpanSpec) -> dict[str, int]:
    """The most spans of each split any tokenizer cuts from ``docs`` (see
    ``refuse_unfillable``), at most its count; None: documents not known, the counts."""
    if docs is None:
        return dict(zip(SPLITS, spec.counts, strict=True))
    assignment = assign_splits(docs, spec)
    return {
        split: min(
            count,
            sum(
                min(spec.per_doc, 2 * len(docs[i].encode("utf-8")) // spec.length)
                for i in assignment[split]
            ),
        )
        for split, count in zip(SPLITS, spec.counts, strict=True)
    }


def _refuse_too_few(split: str, found: int, spec: SpanSpec) -> None:
    """Refuse a split of fewer spans than R^2 needs: one span has no variance (a model constant
    over it, an R^2 of 0 / 0); a validation span alone is kept (LMD coverage reads no
    validation R^2, and would lose its row)."""
    if found < (1 if split == "validation" else 2):
        many = "no" if not found else "only one"
        name, why = ("training", "") if split == "train" else (split, " for that split")
        shorter = either("--spans.length", 'spans={"length": N}')
        raise TooLittleTextError(
            f"{many} {name} span of {spec.length} tokens (R^2 needs two at least): give "
            f"more text, a larger fraction{why}, or shorter spans ({shorter})"
        )


def span_texts(docs: list[str], spans: list[Span]) -> list[str]:
    return [docs[s.doc][s.start : s.end] for s in spans]
