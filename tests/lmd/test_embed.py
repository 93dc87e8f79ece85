"""The embedding loop vs a manual computation from ``output_hidden_states``, one span at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from lmalgebra.sources.embed import EmbedSpec, embed, pool
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from tiny import sentences

TEXTS = [*sentences(23, seed=5), "Short.", "river " * 40]


def manual(texts: list[str], directory: Path, layer: int, pooling: str, exclude_special: bool):
    """Each text alone (no padding at all), pooled by hand."""
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModel.from_pretrained(directory).eval()
    out = []
    for text in texts:
        enc = tok(text, return_tensors="pt", return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask")[0]
        with torch.no_grad():
            hidden = model(**enc, output_hidden_states=True).hidden_states[layer][0]
        if pooling == "first":
            out.append(hidden[0])
        elif pooling == "last":
            out.append(hidden[-1])
        else:
            keep = (special == 0) if exclude_special else torch.ones(len(hidden), dtype=torch.bool)
            out.append(hidden[keep].mean(0))
    return torch.stack(out).numpy()


@pytest.mark.parametrize(
    ("layer", "pooling", "exclude_special"),
    [
        (-1, "mean", False),
        (-1, "mean", True),
        (1, "mean", False),
        (-1, "first", False),
        (0, "mean", True),
    ],
)
def test_encoder_pooling_matches_manual(
    bert_dir: Path, layer: int, pooling: str, exclude_special: bool
):
    model = AutoModel.from_pretrained(bert_dir).eval()
    tok = AutoTokenizer.from_pretrained(bert_dir)
    spec = EmbedSpec(layer=layer, pooling=pooling, exclude_special=exclude_special, batch_size=4)  # type: ignore[arg-type]
    got, report = embed(TEXTS, model, tok, spec)
    want = manual(TEXTS, bert_dir, layer, pooling, exclude_special)
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert report.spans == len(TEXTS) and report.truncated == 0


def test_decoder_last_token_matches_manual(gpt2_dir: Path):
    model = AutoModel.from_pretrained(gpt2_dir).eval()
    tok = AutoTokenizer.from_pretrained(gpt2_dir)  # no pad token: the loop must not need one
    got, _ = embed(TEXTS, model, tok, EmbedSpec(pooling="last", batch_size=5))
    np.testing.assert_allclose(got, manual(TEXTS, gpt2_dir, -1, "last", False), atol=1e-5)
    mean, _ = embed(TEXTS, model, tok, EmbedSpec(pooling="mean", batch_size=5))
    np.testing.assert_allclose(mean, manual(TEXTS, gpt2_dir, -1, "mean", False), atol=1e-5)


def test_batching_and_order_do_not_change_vectors(bert_dir: Path):
    model = AutoModel.from_pretrained(bert_dir).eval()
    tok = AutoTokenizer.from_pretrained(bert_dir)
    one, _ = embed(TEXTS, model, tok, EmbedSpec(batch_size=1))
    many, _ = embed(TEXTS, model, tok, EmbedSpec(batch_size=16))
    np.testing.assert_allclose(one, many, atol=1e-5)
    reversed_, _ = embed(TEXTS[::-1], model, tok, EmbedSpec(batch_size=7))
    np.testing.assert_allclose(reversed_[::-1], many, atol=1e-5)
    again, _ = embed(TEXTS, model, tok, EmbedSpec(batch_size=16))
    np.testing.assert_array_equal(again, many)  # deterministic


def test_truncation_is_reported_and_keeps_closing_special(bert_dir: Path):
    model = AutoModel.from_pretrained(bert_dir).eval()
    tok = AutoTokenizer.from_pretrained(bert_dir)
    got, report = embed(TEXTS, model, tok, EmbedSpec(max_length=12))
    lengths = [len(tok(t)["input_ids"]) for t in TEXTS]
    assert report.truncated == sum(n > 12 for n in lengths)
    assert report.mean_tokens == pytest.approx(np.mean([min(n, 12) for n in lengths]))
    # the truncated span is embedded as [CLS] first-10-tokens [SEP]
    ids = tok(TEXTS[-1])["input_ids"]
    cut = ids[:11] + ids[-1:]
    with torch.no_grad():
        ref = model(input_ids=torch.tensor([cut])).last_hidden_state[0].mean(0).numpy()
    np.testing.assert_allclose(got[-1], ref, atol=1e-5)


def test_bfloat16_runs_under_autocast_and_agrees_with_float32(
    bert_dir: Path, slow_bf16_allowed: None
):
    tok = AutoTokenizer.from_pretrained(bert_dir)
    model = source_of(ModelRef(name="a", path=str(bert_dir)), bert_dir).load()
    full, _ = embed(TEXTS, model, tok, EmbedSpec())
    half, _ = embed(TEXTS, model, tok, EmbedSpec(dtype="bfloat16"))
    assert half.dtype == np.float32
    assert all(p.dtype == torch.float32 for p in model.parameters())  # weights stay float32
    assert not np.array_equal(half, full)  # the forward pass did run in bfloat16
    cosine = (half * full).sum(1) / np.linalg.norm(half, axis=1) / np.linalg.norm(full, axis=1)
    assert cosine.min() > 0.999  # measured 1 - 6e-8 on the tiny model
    np.testing.assert_allclose(half, full, rtol=0, atol=0.01 * np.abs(full).max())


def test_pool_excludes_padding():
    hidden = torch.arange(12, dtype=torch.float32).reshape(1, 4, 3).repeat(2, 1, 1)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_allclose(pool(hidden, mask, "mean")[0], [1.5, 2.5, 3.5])
    np.testing.assert_allclose(pool(hidden, mask, "last")[0], [3, 4, 5])
    np.testing.assert_allclose(pool(hidden, mask, "last")[1], [9, 10, 11])


def test_every_layer_in_one_pass_matches_manual_per_layer(bert_dir: Path):
    model = AutoModel.from_pretrained(bert_dir).eval()
    tok = AutoTokenizer.from_pretrained(bert_dir)
    depth = model.config.num_hidden_layers
    spec = EmbedSpec(layers=tuple(range(depth + 1)), batch_size=5)
    got, _ = embed(TEXTS, model, tok, spec)
    width = model.config.hidden_size
    assert got.shape == (len(TEXTS), (depth + 1) * width)
    for layer in range(depth + 1):
        want = manual(TEXTS, bert_dir, layer, "mean", False)
        np.testing.assert_allclose(got[:, layer * width : (layer + 1) * width], want, atol=1e-5)
