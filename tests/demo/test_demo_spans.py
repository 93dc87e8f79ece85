"""The full demo's decompositions draw the spans its report states, from every language's text."""

from __future__ import annotations

from pathlib import Path

import pytest

import lmalgebra
from lmalgebra.demo.analyses import SPANS
from lmalgebra.demo.plan import FULL, LANGUAGES
from lmalgebra.demo.workflow import write_corpora


@pytest.mark.parametrize("lang", LANGUAGES)
def test_full_demo_text_fills_its_span_counts(lang: str, tmp_path: Path) -> None:
    # the demo's teachers cut the spans; MiniLM's tokenizer stands in for them (the teachers are
    # trained by the demo; the Spanish text, the fewest documents, had filled 1,833 / 210 / 221)
    write_corpora(tmp_path, FULL)
    drawn = lmalgebra.spans(
        {"minilm": "package:minilm"},
        str(tmp_path / f"unseen-{lang}.txt"),
        corpus={"doc_sep": "line"},
        spans={**SPANS, "counts": FULL.lmd_spans},
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    counts = drawn["split"].value_counts()
    assert tuple(int(counts[s]) for s in ("train", "validation", "test")) == FULL.lmd_spans
