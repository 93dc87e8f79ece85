"""Loading models too large for one device: bfloat16 weights and ``device_map`` placement."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import lmalgebra
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import device_share
from lmalgebra.sources.embed import EmbedSpec, embed, input_device
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from tiny import documents, sentences

SHAPE = {"spans": {"length": 8, "counts": (40, 8, 8)}}


@pytest.fixture
def slow_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 allowed on any CPU (emulated where it is not native)."""
    monkeypatch.setenv("LMALGEBRA_ALLOW_SLOW_BF16", "1")


def _embed(model_dir: Path, **loading: str) -> np.ndarray:
    ref = ModelRef.parse(str(model_dir))
    model = source_of(ref, model_dir).load("cpu", **loading)
    vectors, _ = embed(
        sentences(24), model, source_of(ref, model_dir).load_tokenizer(), EmbedSpec()
    )
    return vectors


def test_bfloat16_weights_halve_the_model_and_keep_the_embeddings(
    bert_dir: Path, slow_bf16: None
) -> None:
    ref = ModelRef.parse(str(bert_dir))
    model = source_of(ref, bert_dir).load("cpu", weights_dtype="bfloat16")
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    full, half = _embed(bert_dir), _embed(bert_dir, weights_dtype="bfloat16")
    assert half.dtype == np.float32  # pooled in float32
    cosine = (full * half).sum(1) / np.linalg.norm(full, axis=1) / np.linalg.norm(half, axis=1)
    assert cosine.min() > 0.999
    assert np.abs(full - half).max() > 0  # the bfloat16 forward pass did run


def test_a_model_placed_by_device_map_embeds_as_one_on_a_device(bert_dir: Path) -> None:
    # without GPUs Accelerate places every layer on the CPU: the same embeddings
    np.testing.assert_allclose(_embed(bert_dir, device_map="auto"), _embed(bert_dir), atol=1e-6)


def test_inputs_go_to_the_device_of_a_spread_models_first_layer() -> None:
    embeddings = torch.nn.Embedding(4, 2)
    spread = SimpleNamespace(hf_device_map={"embeddings": "cpu"})
    spread.get_input_embeddings = lambda: embeddings  # type: ignore[attr-defined]
    assert input_device(spread, torch.device("meta")) == torch.device("cpu")
    assert input_device(SimpleNamespace(), torch.device("meta")) == torch.device("meta")


def test_each_local_process_takes_an_equal_share_of_the_gpus() -> None:
    assert device_share(0, 2, 4) == [0, 1]
    assert device_share(1, 2, 4) == [2, 3]
    assert device_share(2, 4, 8) == [4, 5]
    assert device_share(1, 4, 2) == [0, 1]  # fewer GPUs than processes: all of them, shared


def test_bfloat16_weights_are_a_cache_key_and_a_run_setting(
    bert_dir: Path, bert2_dir: Path, tmp_path: Path, slow_bf16: None
) -> None:
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    common = {**SHAPE, "cache_dir": tmp_path / "cache", "progress": False}
    texts = documents(60)
    cache = tmp_path / "cache" / "embeddings"  # an entry's directory: <first 2 hex>/<digest>
    full = lmalgebra.decompose(models, texts, **common)
    entries = len(list(cache.glob("*/*")))
    half = lmalgebra.decompose(models, texts, weights_dtype="bfloat16", **common)
    assert len(list(cache.glob("*/*"))) == 2 * entries  # (two digests may share a prefix)
    assert half.config["weights_dtype"] == "bfloat16"
    assert (half.group - full.group).abs().max().max() < 0.05
    frame = lmalgebra.decompose_plan(models, texts, weights_dtype="bfloat16", timed=False, **SHAPE)
    single = lmalgebra.decompose_plan(models, texts, timed=False, **SHAPE)
    embedded = frame[frame["phase"] == "embed"]["peak_gib"].to_numpy()
    assert (embedded < single[single["phase"] == "embed"]["peak_gib"].to_numpy()).all()


def test_bfloat16_weights_without_native_support_are_refused(
    bert_dir: Path, bert2_dir: Path, tmp_path: Path, cpu_without_bf16: Path
) -> None:
    with pytest.raises(UserInputError, match="weights_dtype: bfloat16 is not native"):
        lmalgebra.decompose(
            {"a": str(bert_dir), "b": str(bert2_dir)},
            documents(30),
            **SHAPE,
            weights_dtype="bfloat16",
            cache_dir=tmp_path / "cache",
            progress=False,
        )
