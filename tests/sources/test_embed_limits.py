"""A ``max_length`` above what a model reads is cut to it, and said once, naming both: the run
records the value asked for, which had done nothing unsaid (a 128-position model given 1000)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from transformers import AutoModel, AutoTokenizer

from lmalgebra.sources.embed import max_tokens


def test_a_max_length_above_the_models_positions_is_cut_and_said_once(
    bert_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model, tokenizer = AutoModel.from_pretrained(bert_dir), AutoTokenizer.from_pretrained(bert_dir)
    positions = model.config.max_position_embeddings
    with caplog.at_level(logging.WARNING, logger="lmalgebra.sources.embed"):
        assert max_tokens(model, tokenizer, positions - 1, "model 'small'") == positions - 1
        assert caplog.records == []  # within what it reads: nothing to say
        for _ in range(3):  # each split embeds: one line
            assert max_tokens(model, tokenizer, 10 * positions, "model 'cut'") == positions
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1
    assert f"model 'cut' reads at most {positions} tokens" in said[0]
    assert f"--max_length {10 * positions} (max_length={10 * positions})" in said[0]
    assert max_tokens(model, tokenizer, None) == positions  # none asked: the model's own
