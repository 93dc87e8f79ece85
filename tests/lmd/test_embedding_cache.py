"""EmbeddingCache: resumable, checksummed shards; damage is detected and never returned silently."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.sources.embed import TokenReport

DIM = 6
TEXTS = [f"span number {i} of the corpus" + " word" * (i % 4) for i in range(11)]
KEY = {"model": "tiny", "fingerprint": {"weights": "w0"}, "layer": -1, "pooling": "mean"}
SHARD_ROWS = 3  # 11 rows -> shards [0,3) [3,6) [6,9) [9,11)


def vector(text: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    return np.random.default_rng(seed).standard_normal(DIM).astype(np.float32)


def expected(texts: list[str]) -> np.ndarray:
    return np.stack([vector(t) for t in texts])


class FakeModel:
    """Deterministic embeddings from the text; records every batch it is asked for."""

    def __init__(self, fail_on_call: int | None = None, nan_on_call: int | None = None):
        self.batches: list[list[str]] = []
        self.fail_on_call = fail_on_call
        self.nan_on_call = nan_on_call

    @property
    def calls(self) -> int:
        return len(self.batches)

    def __call__(self, texts: list[str]) -> tuple[np.ndarray, TokenReport]:
        self.batches.append(list(texts))
        if self.calls == self.fail_on_call:
            raise KeyboardInterrupt("simulated interruption")
        vectors = expected(texts)
        if self.calls == self.nan_on_call:
            vectors[len(texts) // 2, 1] = np.nan
        tokens = [len(t.split()) for t in texts]
        return vectors, TokenReport(float(np.mean(tokens)), sum(n > 7 for n in tokens), len(texts))


def make(root: Path, key: dict | None = None, texts: list[str] | None = None) -> EmbeddingCache:
    return EmbeddingCache(root, key or KEY, texts or TEXTS, shard_rows=SHARD_ROWS)


def read_all(cache: EmbeddingCache) -> np.ndarray:
    return np.vstack(list(cache.chunks()))


def manifest(cache: EmbeddingCache) -> dict:
    return json.loads(cache.manifest_path.read_text())


def flip_byte(path: Path, offset: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def shard(cache: EmbeddingCache, index: int) -> Path:
    return cache.dir / f"shard-{index:05d}.safetensors"


@pytest.fixture
def complete(tmp_path: Path) -> EmbeddingCache:
    cache = make(tmp_path)
    cache.ensure(FakeModel())
    return cache


def test_first_ensure_computes_every_shard_once(tmp_path: Path) -> None:
    model = FakeModel()
    cache = make(tmp_path)
    report = cache.ensure(model)
    assert model.batches == [TEXTS[0:3], TEXTS[3:6], TEXTS[6:9], TEXTS[9:11]]
    chunks = list(cache.chunks())
    assert [c.shape for c in chunks] == [(3, DIM), (3, DIM), (3, DIM), (2, DIM)]
    assert all(c.dtype == np.float32 for c in chunks)
    np.testing.assert_array_equal(np.vstack(chunks), expected(TEXTS))
    tokens = [len(t.split()) for t in TEXTS]
    assert report.spans == len(TEXTS)
    assert report.mean_tokens == pytest.approx(np.mean(tokens))
    assert report.truncated == sum(n > 7 for n in tokens)
    saved = manifest(cache)
    assert saved["complete"] is True
    assert saved["rows"] == len(TEXTS)
    assert sorted(saved["shards"]) == [f"shard-{i:05d}.safetensors" for i in range(4)]


def test_second_ensure_computes_nothing(complete: EmbeddingCache, tmp_path: Path) -> None:
    first = complete.ensure(FakeModel())
    again = FakeModel()
    seen: list[int] = []
    # a new object over the same directory, as in a second process
    report = make(tmp_path).ensure(again, seen.append)
    assert again.calls == 0
    assert sum(seen) == len(TEXTS)  # progress still reaches the total
    assert report == first
    np.testing.assert_array_equal(read_all(make(tmp_path)), expected(TEXTS))


@pytest.mark.parametrize(
    "change",
    [
        {"layer": -2},
        {"pooling": "first"},
        {"fingerprint": {"weights": "w1"}},
        {"model": "other"},
        {"max_length": 16},
    ],
)
def test_changing_the_key_gives_a_new_entry(
    complete: EmbeddingCache, tmp_path: Path, change: dict
) -> None:
    other = make(tmp_path, {**KEY, **change})
    assert other.dir != complete.dir
    model = FakeModel()
    other.ensure(model)
    assert model.calls == 4
    # the old entry is untouched and still served without computing
    untouched = FakeModel()
    make(tmp_path).ensure(untouched)
    assert untouched.calls == 0


def test_changing_the_texts_gives_a_new_entry(complete: EmbeddingCache, tmp_path: Path) -> None:
    texts = [*TEXTS[:-1], "a different last span"]
    model = FakeModel()
    other = make(tmp_path, {**KEY, "spans": "hash of other texts"}, texts)
    other.ensure(model)
    assert model.calls == 4
    np.testing.assert_array_equal(read_all(other), expected(texts))


def test_same_key_with_other_row_count_is_recomputed(
    complete: EmbeddingCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    texts = TEXTS[:7]
    model = FakeModel()
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        make(tmp_path, texts=texts).ensure(model)
    assert model.calls == 3
    assert "does not match" in caplog.text
    np.testing.assert_array_equal(read_all(make(tmp_path, texts=texts)), expected(texts))


def test_interrupted_run_resumes_with_only_missing_shards(tmp_path: Path) -> None:
    interrupted = make(tmp_path / "resumed")
    with pytest.raises(KeyboardInterrupt):
        interrupted.ensure(FakeModel(fail_on_call=3))  # dies after the 2nd shard is written
    saved = manifest(interrupted)
    assert saved["complete"] is False
    assert sorted(saved["shards"]) == ["shard-00000.safetensors", "shard-00001.safetensors"]
    with pytest.raises(RuntimeError, match="incomplete"):
        next(interrupted.chunks())

    resumed = FakeModel()
    report = make(tmp_path / "resumed").ensure(resumed)
    assert resumed.batches == [TEXTS[6:9], TEXTS[9:11]]

    straight = make(tmp_path / "straight")
    straight_report = straight.ensure(FakeModel())
    np.testing.assert_array_equal(read_all(interrupted), read_all(straight))
    np.testing.assert_array_equal(read_all(interrupted), expected(TEXTS))
    assert report == straight_report
    assert manifest(interrupted)["complete"] is True


def test_leftover_temporary_file_does_not_break_resume(tmp_path: Path) -> None:
    cache = make(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        cache.ensure(FakeModel(fail_on_call=2))
    # a crash mid-write leaves a partial temporary file next to the shards
    (cache.dir / ".shard-00001.safetensors.tmp-99999").write_bytes(b"partial")
    model = FakeModel()
    cache.ensure(model)
    assert model.batches == [TEXTS[3:6], TEXTS[6:9], TEXTS[9:11]]
    np.testing.assert_array_equal(read_all(cache), expected(TEXTS))


@pytest.mark.parametrize("offset", [-1, -7, 40])
def test_corrupted_shard_is_detected_logged_and_recomputed(
    complete: EmbeddingCache, tmp_path: Path, caplog: pytest.LogCaptureFixture, offset: int
) -> None:
    damaged = shard(complete, 1)
    flip_byte(damaged, offset)
    model = FakeModel()
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        make(tmp_path).ensure(model)
    assert model.batches == [TEXTS[3:6]]  # only the damaged shard
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings
    assert all(str(damaged) in r.getMessage() for r in warnings)
    assert "checksum" in warnings[0].getMessage()
    np.testing.assert_array_equal(read_all(make(tmp_path)), expected(TEXTS))


def test_deleted_shard_is_recomputed(complete: EmbeddingCache, tmp_path: Path) -> None:
    shard(complete, 3).unlink()
    model = FakeModel()
    make(tmp_path).ensure(model)
    assert model.batches == [TEXTS[9:11]]
    np.testing.assert_array_equal(read_all(complete), expected(TEXTS))


def test_corrupt_manifest_recomputes_the_entry(
    complete: EmbeddingCache, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    complete.manifest_path.write_text('{"key": ', encoding="utf-8")
    model = FakeModel()
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        make(tmp_path).ensure(model)
    assert model.calls == 4
    assert str(complete.manifest_path) in caplog.text
    np.testing.assert_array_equal(read_all(complete), expected(TEXTS))


@pytest.mark.parametrize("index", [0, 2, 3])
def test_chunks_of_a_damaged_complete_entry_names_the_shard(
    complete: EmbeddingCache, index: int
) -> None:
    flip_byte(shard(complete, index))
    with pytest.raises(UserInputError) as info:
        list(complete.chunks())
    message = str(info.value)
    assert f"shard-{index:05d}.safetensors" in message
    assert str(complete.dir) in message
    assert "corrupt" in message


def test_chunks_never_yield_a_damaged_shard(complete: EmbeddingCache) -> None:
    flip_byte(shard(complete, 1))
    stream = complete.chunks()
    np.testing.assert_array_equal(next(stream), expected(TEXTS[0:3]))
    with pytest.raises(UserInputError, match="shard-00001"):
        next(stream)


@pytest.mark.parametrize("nan_on_call", [1, 2])
def test_nan_embeddings_are_refused(tmp_path: Path, nan_on_call: int) -> None:
    cache = make(tmp_path)
    with pytest.raises(UserInputError) as info:
        cache.ensure(FakeModel(nan_on_call=nan_on_call))
    message = str(info.value)
    assert "NaN" in message
    assert "tiny" in message  # the model named in the key
    a = (nan_on_call - 1) * SHARD_ROWS
    assert f"rows {a}..{a + SHARD_ROWS}" in message
    assert not cache.manifest_path.exists() or manifest(cache)["complete"] is False
    if cache.manifest_path.exists():
        assert len(manifest(cache)["shards"]) == nan_on_call - 1
    with pytest.raises(RuntimeError, match="incomplete"):
        next(cache.chunks())
    # a later run with a healthy model finishes the entry
    healthy = FakeModel()
    make(tmp_path).ensure(healthy)
    assert healthy.calls == 4 - (nan_on_call - 1)
    np.testing.assert_array_equal(read_all(cache), expected(TEXTS))


def test_infinite_embeddings_are_refused(tmp_path: Path) -> None:
    def infinite(texts: list[str]) -> tuple[np.ndarray, TokenReport]:
        vectors = expected(texts)
        vectors[0, 0] = np.inf
        return vectors, TokenReport(1.0, 0, len(texts))

    cache = make(tmp_path)
    with pytest.raises(UserInputError, match="non-finite"):
        cache.ensure(infinite)
    assert not cache.manifest_path.exists() or manifest(cache)["complete"] is False


def test_nan_while_repairing_a_complete_entry_never_serves_it(complete: EmbeddingCache) -> None:
    flip_byte(shard(complete, 2))
    with pytest.raises(UserInputError, match="NaN"):
        complete.ensure(FakeModel(nan_on_call=1))
    with pytest.raises(UserInputError, match="shard-00002"):
        list(complete.chunks())


@pytest.mark.parametrize("interrupted", [False, True])
def test_progress_reaches_the_total(tmp_path: Path, interrupted: bool) -> None:
    if interrupted:
        with pytest.raises(KeyboardInterrupt):
            make(tmp_path).ensure(FakeModel(fail_on_call=3))
    seen: list[int] = []
    make(tmp_path).ensure(FakeModel(), seen.append)
    assert sum(seen) == len(TEXTS)


def test_other_shard_size_never_returns_wrong_rows(
    complete: EmbeddingCache, tmp_path: Path
) -> None:
    wider = EmbeddingCache(tmp_path, KEY, TEXTS, shard_rows=5)
    wider.ensure(FakeModel())
    np.testing.assert_array_equal(read_all(wider), expected(TEXTS))
