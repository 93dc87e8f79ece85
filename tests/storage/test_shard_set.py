"""ShardSet over both payloads: damage, foreign manifests, parts left by an interrupted
multi-process run; completion stamps. The embedding cache and the teacher store are tested through
their users in test_embedding_cache.py, test_teacher_store.py and test_distributed.py."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.storage import shard_set
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.completion import CompletionStamp
from lmalgebra.storage.manifest_parts import part_path
from lmalgebra.storage.shard_formats import SAFETENSORS_ROWS, RowBlock
from lmalgebra.storage.shard_set import ShardSet

KEY = {"stage": "test"}
COUNT = 5


def block(index: int) -> RowBlock:
    values = np.arange(index * 6, index * 6 + 6, dtype=np.float32).reshape(3, 2)
    return RowBlock(index * 3, {"values": values})


def rows_set(directory: Path, rows: int = COUNT * 3) -> ShardSet:
    return ShardSet(directory, KEY, SAFETENSORS_ROWS, header={"rows": rows}, by_name=True)


def write_rows(directory: Path) -> ShardSet:
    shards = rows_set(directory)
    for index in shards.plan(COUNT):
        shards.write(index, block(index), note=index)
    shards.finish()
    return shards


def table(index: int) -> pa.Table:
    return pa.table({"x": np.arange(index * 4, index * 4 + 4, dtype=np.int64)})


def write_tables(directory: Path) -> ShardSet:
    shards = ShardSet(directory, KEY)
    for index in shards.plan(COUNT):
        shards.write(index, table(index))
    shards.finish(top_k=8)
    return shards


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_safetensors_records_by_name_with_row_ranges(tmp_path: Path) -> None:
    write_rows(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert list(manifest) == ["key", "rows", "shards", "complete", "manifest_sha256"]
    assert list(manifest["shards"]) == [f"shard-{i:05d}.safetensors" for i in range(COUNT)]
    first = manifest["shards"]["shard-00001.safetensors"]
    assert list(first) == ["rows", "sha256", "note"] and first["rows"] == [3, 6]
    again = rows_set(tmp_path)
    assert again.plan(COUNT) == [] and again.complete
    got = again.read(2)
    assert got.first == 6
    np.testing.assert_array_equal(got.arrays["values"], block(2).arrays["values"])


@pytest.mark.parametrize("write", [write_rows, write_tables])
def test_shards_are_hashed_from_the_bytes_written_and_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, write
) -> None:
    """Writing hashes the bytes it writes and reading the bytes it decodes: no file is read a
    second time just to be hashed."""

    def read_again(path: Path) -> str:
        raise AssertionError(f"{path} was read again to be hashed")

    monkeypatch.setattr(shard_set, "sha256_file", read_again)
    shards = write(tmp_path)
    for index, record in shards.records.items():
        assert record["sha256"] == hashlib.sha256(shards.path(index).read_bytes()).hexdigest()
        assert shards.read(index) is not None  # verified against the manifest on the way


def test_damaged_safetensors_shard_is_named_marked_and_redone_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_rows(tmp_path / "ref")
    write_rows(tmp_path / "set")
    victim = tmp_path / "set" / "shard-00003.safetensors"
    flip_byte(victim)
    with pytest.raises(UserInputError, match=r"shard-00003\.safetensors is corrupt"):
        rows_set(tmp_path / "set").read(3)
    assert rows_set(tmp_path / "set").problems() == [f"{victim}: corrupt (checksum mismatch)"]
    shards = rows_set(tmp_path / "set")
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        assert shards.plan(COUNT) == [3]
    assert str(victim) in caplog.text and "checksum" in caplog.text
    # marked incomplete on disk at once: a run killed now never leaves it looking complete
    assert not rows_set(tmp_path / "set").complete
    shards.write(3, block(3), note=3)
    shards.finish()
    assert files(tmp_path / "set") == files(tmp_path / "ref")


def test_tables_are_listed_in_order_and_written_in_order(tmp_path: Path) -> None:
    shards = ShardSet(tmp_path, KEY)
    shards.write(0, table(0))
    with pytest.raises(RuntimeError, match="shard 2 written out of order"):
        shards.write(2, table(2))
    assert [r["file"] for r in shards.manifest["shards"]] == ["shard-00000.arrow"]


@pytest.mark.parametrize("other", [{"key": {"stage": "other"}}, {"rows": COUNT * 3 + 1}])
def test_foreign_manifest_is_recomputed_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, other: dict
) -> None:
    write_rows(tmp_path)
    key, rows = other.get("key", KEY), other.get("rows", COUNT * 3)
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        shards = ShardSet(tmp_path, key, SAFETENSORS_ROWS, header={"rows": rows}, by_name=True)
        assert caplog.text == ""  # looking at a set is not recomputing it
        assert shards.plan(COUNT) == list(range(COUNT))
    assert f"{tmp_path} does not match its key; recomputing it" in caplog.text


def test_corrupt_manifest_is_recomputed_with_a_log_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_tables(tmp_path)
    (tmp_path / "manifest.json").write_text('{"key": ')
    shards = ShardSet(tmp_path, KEY)
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        assert shards.plan(COUNT) == list(range(COUNT))
    assert f"manifest {tmp_path / 'manifest.json'} is corrupt" in caplog.text
    damaged = f"{tmp_path / 'manifest.json'}: damaged (run the stage again to rebuild the set)"
    assert ShardSet.existing(tmp_path).problems() == [damaged]


def test_a_shard_record_edited_with_its_checksum_kept_is_recomputed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A record's fields beside the shard's sha256 (an embedding's token count, say) had been
    read as written: the manifest's checksum covers the records too."""
    write_rows(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    manifest["shards"]["shard-00001.safetensors"]["note"] = 99
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    shards = rows_set(tmp_path)
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        assert shards.plan(COUNT) == list(range(COUNT))
    assert "was edited since it was written" in caplog.text


def test_a_manifest_of_the_older_checksum_is_read_and_its_facts_still_checked(
    tmp_path: Path,
) -> None:
    """A manifest whose checksum (``facts_sha256``) covers ``complete`` and the summary alone is
    read as it is, not recomputed; an edit of those facts is still seen."""
    from lmalgebra.core.fingerprint import sha256_json

    write_tables(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    del manifest["manifest_sha256"]
    manifest["facts_sha256"] = sha256_json({"complete": True, "top_k": 8})
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    assert ShardSet(tmp_path, KEY).plan(COUNT) == []
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "top_k": 4}))
    assert ShardSet(tmp_path, KEY).plan(COUNT) == list(range(COUNT))


def _leave_parts(directory: Path, owners: dict[int, list[int]]) -> None:
    """What a run of ``len(owners)`` ranks killed midway leaves: parts, no manifest."""
    records = rows_set(directory).manifest["shards"]
    (directory / "manifest.json").unlink()
    for rank, indices in owners.items():
        shards = {
            f"shard-{i:05d}.safetensors": records[f"shard-{i:05d}.safetensors"] for i in indices
        }
        part = {"key": KEY, "rows": COUNT * 3, "shards": shards}
        write_json_atomic(part_path(directory / "manifest.json", rank), part)


def test_parts_left_by_three_ranks_are_read_by_one(tmp_path: Path) -> None:
    write_rows(tmp_path / "ref")
    write_rows(tmp_path / "set")
    # ranks 0, 1, 2 owned shards {0, 3}, {1, 4}, {2}; rank 1 died before recording shard 4
    _leave_parts(tmp_path / "set", {0: [0, 3], 1: [1], 2: [2]})
    (tmp_path / "set" / "shard-00004.safetensors").unlink()
    shards = rows_set(tmp_path / "set")
    assert shards.plan(COUNT) == [4]
    assert not list((tmp_path / "set").glob("*.rank-*"))  # folded into the manifest
    shards.write(4, block(4), note=4)
    shards.finish()
    assert files(tmp_path / "set") == files(tmp_path / "ref")


def test_parts_of_another_key_or_row_count_are_not_used(tmp_path: Path) -> None:
    write_rows(tmp_path)
    records = rows_set(tmp_path).manifest["shards"]
    (tmp_path / "manifest.json").unlink()
    part = {"key": KEY, "rows": 99, "shards": records}
    write_json_atomic(part_path(tmp_path / "manifest.json", 0), part)
    write_json_atomic(part_path(tmp_path / "manifest.json", 1), {**part, "rows": 15, "key": {}})
    assert rows_set(tmp_path).plan(COUNT) == list(range(COUNT))


def test_completion_stamp(tmp_path: Path) -> None:
    stamp = CompletionStamp(tmp_path, "abc")
    assert stamp.recorded() is None and not stamp.done()
    stamp.mark()
    assert (tmp_path / "complete.json").read_text() == '"abc"\n'
    assert stamp.done() and CompletionStamp(tmp_path, "abc").done()
    assert not CompletionStamp(tmp_path, "other").done()
    assert CompletionStamp(tmp_path, "other").recorded() == "abc"
    (tmp_path / "complete.json").write_text('"ab')  # not JSON: as good as no stamp
    assert stamp.recorded() is None and not stamp.done()
    stamp.clear()
    assert not (tmp_path / "complete.json").exists()
    stamp.clear()  # nothing to clear is fine


def test_records_beyond_the_planned_count_are_dropped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A complete set whose manifest lists more shards than the set has now (its source holds
    fewer rows) is not kept as complete: the stage run again leaves the set an uninterrupted
    run of that size writes, which ``merge verify`` had sent the user to run."""
    write_tables(tmp_path / "short")
    write_tables(tmp_path / "long")
    shards = ShardSet(tmp_path / "long", KEY)
    with caplog.at_level(logging.WARNING, logger="lmalgebra"):
        assert shards.plan(COUNT - 2) == []
    assert "lists shard 3 of a set of 3" in caplog.text
    assert not ShardSet(tmp_path / "long", KEY).complete  # on disk too
    shards.finish(top_k=8)
    short = ShardSet(tmp_path / "short", KEY)
    assert short.plan(COUNT) == [] and short.complete  # as many as planned: nothing changes
    reference = ShardSet(tmp_path / "ref", KEY)
    for index in reference.plan(COUNT - 2):
        reference.write(index, table(index))
    reference.finish(top_k=8)
    assert files(tmp_path / "long") == files(tmp_path / "ref")


def test_a_sealed_record_tells_an_edit_from_an_older_form() -> None:
    from lmalgebra.core.fingerprint import sealed, unseal

    record = sealed({"top_k": 8, "files": {"a": 1}}, "sha256")
    assert unseal(dict(record), "sha256") is True
    assert unseal({**record, "top_k": 4}, "sha256") is False
    older = {"top_k": 8, "files": {"a": 1}}
    assert unseal(older, "sha256") is None and older == {"top_k": 8, "files": {"a": 1}}


def test_a_directory_in_place_of_a_shard_is_named_as_such(tmp_path: Path) -> None:
    """A shard file made a directory had been called missing ("run again to recompute it"),
    while the stage that writes it refuses the directory: verify and the reader say what it
    is, as the writer does."""
    write_tables(tmp_path)
    (tmp_path / "shard-00001.arrow").unlink()
    (tmp_path / "shard-00001.arrow").mkdir()
    shards = ShardSet.existing(tmp_path)
    assert shards.problems() == [
        f"{tmp_path / 'shard-00001.arrow'} is a directory, not a file: remove it, then run again"
    ]
    with pytest.raises(UserInputError, match="is a directory, not a file"):
        shards.read(1)
