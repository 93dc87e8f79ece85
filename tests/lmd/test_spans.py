"""Spans: original text by character offsets, split by document, capped per document."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.settings.spans import SpanSpec, assign_splits, draw_spans, span_texts
from tiny import documents

DOCS = documents(200, seed=2) + ["Exactly the SAME Document, Twice."] * 2


@pytest.fixture(scope="module")
def tok(bert_dir: Path):
    return AutoTokenizer.from_pretrained(bert_dir)


def test_spans_are_original_text_of_exactly_t_tokens(tok) -> None:
    spec = SpanSpec(length=8, counts=(100, 20, 20), per_doc=3)
    spans = draw_spans(DOCS, tok, spec)
    for split in SPLITS:
        for span, text in zip(spans[split], span_texts(DOCS, spans[split]), strict=True):
            assert text == DOCS[span.doc][span.start : span.end]
            offsets = tok(DOCS[span.doc], add_special_tokens=False, return_offsets_mapping=True)
            starts = [a for a, _ in offsets["offset_mapping"]]
            ends = [b for _, b in offsets["offset_mapping"]]
            assert span.start in starts and span.end in ends
            assert ends.index(span.end) - starts.index(span.start) + 1 == 8
    # case is preserved although the tokenizer lower-cases
    assert any(any(c.isupper() for c in t) for t in span_texts(DOCS, spans["train"]))


def test_batched_tokenization_draws_the_spans_of_one_document_at_a_time(tok, monkeypatch) -> None:
    """Documents are tokenized in batches; the spans are those of a per-document reference."""
    from lmalgebra.lmd.settings import spans as spans_module

    spec = SpanSpec(length=5, counts=(120, 30, 30), per_doc=2)
    reference: dict[str, list[tuple[int, int, int]]] = {}
    for split, count in zip(SPLITS, spec.counts, strict=True):
        chosen: list[tuple[int, int, int]] = []
        for index in assign_splits(DOCS, spec)[split]:
            found = tok(DOCS[index], add_special_tokens=False, return_offsets_mapping=True)
            offsets = [(a, b) for a, b in found["offset_mapping"] if b > a]
            for k in range(min(spec.per_doc, len(offsets) // 5)):
                if len(chosen) < count:
                    chosen.append((index, offsets[5 * k][0], offsets[5 * k + 4][1]))
        reference[split] = chosen
    for batch in (1, 7, 1000):  # batches ending mid-split, and one batch for everything
        monkeypatch.setattr(spans_module, "TOKENIZE_BATCH", batch)
        drawn = draw_spans(DOCS, tok, spec)
        assert {s: [(x.doc, x.start, x.end) for x in drawn[s]] for s in SPLITS} == reference


def test_splits_are_by_document_and_deterministic(tok) -> None:
    spec = SpanSpec(length=6, counts=(150, 25, 25), per_doc=2)
    first, second = draw_spans(DOCS, tok, spec), draw_spans(DOCS, tok, spec)
    assert first == second
    docs = {s: {sp.doc for sp in first[s]} for s in SPLITS}
    assert not docs["train"] & docs["validation"] and not docs["train"] & docs["test"]
    assert not docs["validation"] & docs["test"]
    for split, count in zip(SPLITS, spec.counts, strict=True):
        assert len(first[split]) == count
        per_doc = [sum(sp.doc == d for sp in first[split]) for d in docs[split]]
        assert max(per_doc) <= 2
    assignment = assign_splits(DOCS, spec)
    twins = [s for s in SPLITS if len(DOCS) - 1 in assignment[s] or len(DOCS) - 2 in assignment[s]]
    assert len(twins) == 1  # identical texts land in the same split
    other = draw_spans(DOCS, tok, spec.model_copy(update={"seed": 7}))
    assert other != first


def test_fractions_are_respected() -> None:
    assignment = assign_splits(
        [f"document {i}" for i in range(5000)], SpanSpec(fractions=(0.6, 0.3, 0.1))
    )
    shares = [len(assignment[s]) / 5000 for s in SPLITS]
    assert shares == pytest.approx([0.6, 0.3, 0.1], abs=0.03)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"length": 0}, "span length T must be >= 1"),
        ({"fractions": (0.5, 0.5, 0.5)}, "sum to 1"),
        ({"fractions": (0.0, 0.5, 0.5)}, "training split"),
        ({"fractions": (0.9, 0.1, 0.0)}, "gives the test split no documents"),
        ({"fractions": (1.0, 0.0, 0.0)}, "gives the validation split no documents"),
        ({"per_doc": 0}, "per_doc"),
    ],
)
def test_bad_span_specs(kwargs: dict, message: str) -> None:
    with pytest.raises(UserInputError, match=message):
        SpanSpec(**kwargs)


def test_too_little_text_is_an_error(tok) -> None:
    with pytest.raises(UserInputError, match="no training span of 500 tokens"):
        draw_spans(DOCS, tok, SpanSpec(length=500))
