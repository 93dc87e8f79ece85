"""The span cache: a run's spans are cut once per corpus, tokenizer and settings, then read back."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.measure import ModelPool, draw_texts
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.spans.draw import SpanPlanSpec, draw_run_spans
from lmalgebra.sources.corpus import read_documents
from lmalgebra.sources.kinds.transformers import TransformersModel


def _config(tmp_path: Path, model: Path, corpus: Path, **change: Any) -> DecomposeConfig:
    first = {"name": "a", "path": str(model), **change.pop("first", {})}
    raw = {
        # the spans are the first model's; the second, its random-weights copy, a model apart
        "models": [first, {"name": "b", "path": str(model), "random_init": True}],
        "corpus": {"paths": [str(corpus)]},
        "spans": {"length": 8, "counts": [60, 12, 12], **change.pop("spans", {})},
        "cache_dir": str(tmp_path / "cache"),
        **change,
    }
    return DecomposeConfig.model_validate(raw)


def _draw(config: DecomposeConfig) -> tuple[dict[str, list[str]], dict[str, str]]:
    return draw_texts(ModelPool(config), read_documents(config.corpus), config.spans)


def _reference(config: DecomposeConfig) -> dict[str, list[str]]:
    """The spans `lmalgebra spans` exports: cut by the tokenizer, no cache involved."""
    spec = SpanPlanSpec(models=config.models[:1], corpus=config.corpus, spans=config.spans)
    return draw_run_spans(spec).texts


def _no_tokenizer(*args: object) -> None:
    pytest.fail("tokenizer loaded")


def _entries(config: DecomposeConfig) -> list[Path]:
    return sorted((config.cache_dir / "spans").glob("*.safetensors"))


def test_a_second_run_reads_the_spans_without_loading_the_tokenizer(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = _config(tmp_path, bert_dir, corpus_txt)
    texts, hashes = _draw(config)
    assert texts == _reference(config)
    assert len(_entries(config)) == 1
    with monkeypatch.context() as patch:
        patch.setattr(TransformersModel, "load_tokenizer", _no_tokenizer)
        again, again_hashes = _draw(config)
    assert again == texts and again_hashes == hashes


def test_other_span_settings_or_another_tokenizer_make_another_entry(
    tmp_path: Path, bert_dir: Path, gpt2_dir: Path, corpus_txt: Path
) -> None:
    _draw(_config(tmp_path, bert_dir, corpus_txt))
    longer = _config(tmp_path, bert_dir, corpus_txt, spans={"length": 6})
    assert _draw(longer)[0] == _reference(longer)
    other = _config(tmp_path, bert_dir, corpus_txt, first={"path": str(gpt2_dir)})
    assert _draw(other)[0] == _reference(other)
    assert len(_entries(other)) == 3


def _damage_bytes(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:40] + b"\0" * 16)


def _rewrite(path: Path, change: Any) -> None:
    """Save ``path`` again as a sound safetensors file after ``change(rows, metadata)``."""
    with safe_open(str(path), framework="numpy") as handle:
        meta = dict(handle.metadata())
    rows = load_file(str(path))
    change(rows, meta)
    save_file(rows, str(path), metadata=meta)


def _shift_one_span(path: Path) -> None:
    """Rows that no longer give the texts the metadata vouches for."""

    def change(rows: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        rows["train"][0, 2] -= 1

    _rewrite(path, change)


def _point_outside(path: Path) -> None:
    def change(rows: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        rows["test"][-1, 0] = 10**9

    _rewrite(path, change)


def _drop_a_split(path: Path) -> None:
    _rewrite(path, lambda rows, meta: rows.pop(SPLITS[2]))


def _foreign_key(path: Path) -> None:
    def change(rows: dict[str, np.ndarray], meta: dict[str, str]) -> None:
        meta["key"] = json.dumps({**json.loads(meta["key"]), "corpus": "0" * 64}, sort_keys=True)

    _rewrite(path, change)


@pytest.mark.parametrize(
    "damage", [_damage_bytes, _shift_one_span, _point_outside, _drop_a_split, _foreign_key]
)
def test_a_damaged_entry_is_cut_again_and_rewritten(
    tmp_path: Path,
    bert_dir: Path,
    corpus_txt: Path,
    damage: Any,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(tmp_path, bert_dir, corpus_txt)
    texts, hashes = _draw(config)
    (entry,) = _entries(config)
    damage(entry)
    with caplog.at_level(logging.WARNING):
        again, again_hashes = _draw(config)
    assert again == texts and again_hashes == hashes
    assert "does not reproduce its spans" in caplog.text and str(entry) in caplog.text
    monkeypatch.setattr(TransformersModel, "load_tokenizer", _no_tokenizer)
    assert _draw(config) == (texts, hashes)  # the rewritten entry is sound


def test_rows_are_int64_triples_of_document_and_characters(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path
) -> None:
    config = _config(tmp_path, bert_dir, corpus_txt)
    texts, _ = _draw(config)
    rows = load_file(str(_entries(config)[0]))
    docs = read_documents(config.corpus)
    for split in SPLITS:
        assert rows[split].dtype == np.int64 and rows[split].shape == (len(texts[split]), 3)
        assert [docs[d][a:b] for d, a, b in rows[split].tolist()] == texts[split]


def test_a_tokenizer_running_remote_code_is_never_remembered(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path
) -> None:
    config = _config(tmp_path, bert_dir, corpus_txt, first={"trust_remote_code": True})
    assert _draw(config)[0] == _reference(config)
    assert _entries(config) == []


def test_a_changed_tokenizer_file_makes_another_entry(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path
) -> None:
    """Same model config, other tokenizer files (a cased vocabulary): the spans are cut again."""
    from tiny import _wordpiece

    cased = tmp_path / "cased"
    shutil.copytree(bert_dir, cased)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        (cased / name).unlink(missing_ok=True)
    _wordpiece(cased, lowercase=False)
    _draw(_config(tmp_path, bert_dir, corpus_txt))
    config = _config(tmp_path, cased, corpus_txt)
    texts, _ = _draw(config)
    assert texts == _reference(config) and texts != _reference(
        _config(tmp_path, bert_dir, corpus_txt)
    )
    assert len(_entries(config)) == 2
