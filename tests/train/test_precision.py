"""Devices and bfloat16 where it is safe: the support check, ``auto``, refusals, and the
decomposition computed in bfloat16 against float32 (R^2, cache keys, the command line)."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from hostile_helpers import assert_one_line, run_cli
from lmalgebra import Decomposition, decompose
from lmalgebra.core import precision
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import bf16_support, resolve_device, resolve_dtype
from tiny import documents

T = 8
SPANS = (60, 20, 20)


def _cpuinfo(tmp_path: Path, flags: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nflags\t\t: {flags}\n\nprocessor\t: 1\n", encoding="utf-8")
    return path


def test_cpu_support_is_read_from_the_instruction_flags(tmp_path: Path) -> None:
    cpu = torch.device("cpu")
    native, why = bf16_support(cpu, _cpuinfo(tmp_path, "fpu avx512f avx512_bf16"))
    assert native and "avx512_bf16" in why
    native, why = bf16_support(cpu, _cpuinfo(tmp_path, "fpu amx_tile amx_bf16"))
    assert native and "amx_bf16" in why
    native, why = bf16_support(cpu, _cpuinfo(tmp_path, "fpu avx2 avx512f"))
    assert not native and "avx512_bf16" in why and "amx_bf16" in why
    native, why = bf16_support(cpu, tmp_path / "missing")
    assert not native and "unreadable" in why


def test_auto_takes_bfloat16_where_native_and_float32_elsewhere_saying_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "CPUINFO", _cpuinfo(tmp_path, "avx512_bf16"))
    with caplog.at_level(logging.INFO, logger="lmalgebra.core.precision"):
        assert resolve_dtype("auto", cpu, "decompose dtype") == torch.bfloat16
    monkeypatch.setattr(precision, "CPUINFO", _cpuinfo(tmp_path, "avx2"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="lmalgebra.core.precision"):
        assert resolve_dtype("auto", cpu, "decompose dtype") == torch.float32
    [record] = caplog.records
    assert "decompose dtype auto: float32" in record.message
    assert "neither avx512_bf16 nor amx_bf16" in record.message
    assert resolve_dtype("float32", cpu, "decompose dtype") == torch.float32


def test_explicit_bfloat16_without_the_flags_is_refused_in_one_line(cpu_without_bf16) -> None:
    with pytest.raises(UserInputError) as caught:
        resolve_dtype("bfloat16", torch.device("cpu"), "merge recipe dtype")
    message = str(caught.value)
    assert "\n" not in message
    for needle in ("merge recipe dtype", "avx512_bf16", "amx_bf16", "use float32 or auto"):
        assert needle in message
    assert precision.ALLOW_SLOW_BF16 in message
    with pytest.raises(UserInputError, match="'float16' is not a dtype"):
        resolve_dtype("float16", torch.device("cpu"), "decompose dtype")


def test_the_override_lets_bfloat16_run_emulated(
    cpu_without_bf16, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(precision.ALLOW_SLOW_BF16, "1")
    with caplog.at_level(logging.WARNING, logger="lmalgebra.core.precision"):
        assert resolve_dtype("bfloat16", torch.device("cpu"), "d") == torch.bfloat16
    assert "emulated" in caplog.text
    # auto does not take the override: emulated bfloat16 is never chosen for speed
    assert resolve_dtype("auto", torch.device("cpu"), "d") == torch.float32


def test_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(UserInputError, match="decompose device: cuda asked for"):
        resolve_device("cuda", "decompose device")
    with pytest.raises(UserInputError, match="'tpu' is not a device"):
        resolve_device("tpu")


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return documents(120)


def _entries(cache: Path) -> set[Path]:
    return {p.parent for p in (cache / "embeddings").glob("*/*/manifest.json")}


def test_bfloat16_decomposition_matches_float32_and_has_its_own_cache_entries(
    bert_dir: Path,
    bert2_dir: Path,
    texts: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    slow_bf16_allowed: None,
) -> None:
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    cache = tmp_path / "cache"

    def run(**options: object) -> Decomposition:
        return decompose(
            models,
            texts,
            spans={"length": T, "counts": SPANS},
            cache_dir=cache,
            progress=False,
            **options,
        )

    full = run(dtype="float32")
    after_full = _entries(cache)
    half = run(dtype="bfloat16")
    after_half = _entries(cache)
    assert len(after_full) == 6 and len(after_half) == 12  # 2 models x 3 splits, per dtype
    for split in ("train", "test"):
        gap = (full.pairwise(split) - half.pairwise(split)).abs().to_numpy().max()
        assert gap < 0.01, split  # measured 6e-5 on the tiny models
    # auto on a CPU with the flags resolves to bfloat16: the key holds that, not "auto"
    monkeypatch.setattr(precision, "CPUINFO", _cpuinfo(tmp_path, "amx_bf16"))
    auto = run(dtype="auto", device="auto" if not torch.cuda.is_available() else "cpu")
    assert _entries(cache) == after_half  # same entries, whatever the device option says
    assert auto.config["dtype"] == "bfloat16"  # the run records what auto resolved to


def test_bfloat16_refused_on_the_command_line_with_exit_2(
    cpu_without_bf16,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--out", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    code, err = run_cli([*args, "--dtype", "bfloat16"], monkeypatch, capsys)
    assert_one_line(code, err, ["decompose dtype", "avx512_bf16", "use float32 or auto"])
    assert not _entries(tmp_path / "cache")
    if not torch.cuda.is_available():
        code, err = run_cli([*args, "--device", "cuda"], monkeypatch, capsys)
        assert_one_line(code, err, ["decompose device", "cuda"])


@pytest.mark.gpu
def test_cuda_embedding_matches_cpu(
    bert_dir: Path, bert2_dir: Path, texts: list[str], tmp_path: Path
) -> None:
    from transformers import AutoTokenizer

    from lmalgebra.sources.embed import EmbedSpec, embed
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef

    ref, tok = ModelRef(name="a", path=str(bert_dir)), AutoTokenizer.from_pretrained(bert_dir)
    spans = texts[:40]
    want, _ = embed(spans, source_of(ref, bert_dir).load(), tok, EmbedSpec())
    on_gpu = source_of(ref, bert_dir).load("cuda:0")
    got, _ = embed(spans, on_gpu, tok, EmbedSpec(device="cuda:0"))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    if bf16_support(torch.device("cuda:0"))[0]:
        half, _ = embed(spans, on_gpu, tok, EmbedSpec(dtype="bfloat16", device="cuda:0"))
        cosine = (half * want).sum(1) / np.linalg.norm(half, axis=1) / np.linalg.norm(want, axis=1)
        assert cosine.min() > 0.999
    # a model given as an object goes to the GPU for the run and back to where it was
    from transformers import AutoModel

    given = AutoModel.from_pretrained(bert_dir)
    options = {"spans": {"length": T, "counts": SPANS}, "cache_dir": tmp_path, "progress": False}
    gpu = decompose({"a": (given, tok), "b": str(bert2_dir)}, texts, device="cuda", **options)
    assert next(given.parameters()).device.type == "cpu"
    cpu = decompose({"a": (given, tok), "b": str(bert2_dir)}, texts, **options)
    gap = (gpu.pairwise("train") - cpu.pairwise("train")).abs().to_numpy().max()
    assert gap < 1e-3
