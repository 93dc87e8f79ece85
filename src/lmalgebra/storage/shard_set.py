"""Checksummed, resumable shard sets: the one implementation behind every kill -9 safe store.

A shard set is a directory of ``shard-NNNNN<suffix>`` files (Arrow tables for the teacher store,
safetensors row blocks for the embedding cache: ``lmalgebra.storage.shard_formats``) and a
``manifest.json`` holding the key that produced them, one record per shard (what the payload and
the caller describe, and the file's sha256) and whether the set is complete. Each shard is written
to a temporary file, fsynced and renamed, and only then recorded, so a run killed at any point
resumes with the shards it recorded, and a finished set is byte-for-byte what an uninterrupted run
writes. A shard failing its checksum is reported and recomputed, never returned.

Under several processes (``lmalgebra.distributed``) ``plan`` gives each rank the missing shards it
owns (``index % size == rank``); a rank records what it writes in its own manifest part
(``lmalgebra.storage.manifest_parts``), and ``finish`` has the main rank assemble the manifest from
the parts after a barrier, so no two processes ever write one file. Parts left by an interrupted
run are read back on resumption, whatever the number of processes then.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_file, sha256_json
from lmalgebra.distributed import all_reduce_sum, barrier, world
from lmalgebra.storage.atomic import make_directories, write_bytes_atomic, write_json_atomic
from lmalgebra.storage.manifest_parts import MANIFEST, part_path, read_parts, remove_parts
from lmalgebra.storage.shard_formats import ARROW_TABLES, ShardFormat

log = logging.getLogger(__name__)

SHARD_PREFIX = "shard-"  # shard-NNNNN<suffix>
_OWN_FIELDS = ("key", "shards", "complete")
_CHECK = "manifest_sha256"  # of the shard records, ``complete`` and the summary (counts, top_k...)
_FACTS_CHECK = "facts_sha256"  # written before it, of ``complete`` and the summary alone


class ShardSet:
    """Shards of one payload under ``directory``, produced by ``key`` (a JSON-able description).

    Args:
        directory: where the shards and the manifest live.
        key: everything that changes the shards; a manifest under another key is not used.
        payload: the shard files' format.
        header: manifest fields written after the key that must also match (e.g. a row count).
        by_name: the manifest maps file names to records (else it lists records in shard order,
            so a set is recorded front to back).
        label: what the set is called in messages ("store", "cache").
    """

    def __init__(
        self,
        directory: Path,
        key: Any,
        payload: ShardFormat = ARROW_TABLES,
        *,
        header: dict[str, Any] | None = None,
        by_name: bool = False,
        label: str = "store",
    ):
        self.directory = directory
        self.key = key
        self.payload = payload
        self.header = dict(header or {})
        self.by_name = by_name
        self.label = label
        self._part: dict[str, Any] | None = None  # this rank's records, in a multi-process run
        self._planned = 0  # shards in the set, as ``plan`` was told
        self._load()

    @classmethod
    def existing(cls, directory: Path, payload: ShardFormat = ARROW_TABLES) -> ShardSet:
        """The shard set in ``directory`` as its manifest describes it, whatever its key."""
        return cls(directory, None, payload)

    @property
    def manifest_path(self) -> Path:
        return self.directory / MANIFEST

    def path(self, index: int) -> Path:
        return self.directory / f"{SHARD_PREFIX}{index:05d}{self.payload.suffix}"

    # ------------------------------------------------------------------ the manifest

    def _load(self) -> None:
        """State from the manifest on disk; a foreign or unreadable one leaves a fresh set."""
        self.records: dict[int, dict[str, Any]] = {}
        self.complete = False
        self.summary: dict[str, Any] = {}  # fields ``finish`` was given
        self._stale: str | None = None  # why the manifest on disk was not used
        self.manifest_damaged = False  # its manifest is unreadable or not as it was written
        path = self.manifest_path
        if not path.is_file():
            return
        try:
            manifest = json.loads(path.read_text())
        except ValueError:  # not JSON, or not text
            manifest = None
        if not isinstance(manifest, dict):
            self._stale = f"manifest {path} is corrupt; recomputing its shards"
            self.manifest_damaged = True
            return
        if self.key is None:  # inspection: take the set as it is
            self.key = manifest.get("key")
        elif any(manifest.get(f) != v for f, v in self._identity().items()):
            self._stale = f"{self.label} {self.directory} does not match its key; recomputing it"
            return
        records = self._parse(manifest.get("shards", []))
        if records is None:
            self._stale = f"manifest {path} lists damaged shard records; recomputing its shards"
            self.manifest_damaged = True
            return
        own = (*_OWN_FIELDS, _CHECK, _FACTS_CHECK, *self.header)
        summary = {f: v for f, v in manifest.items() if f not in own}
        facts = {"complete": manifest.get("complete"), **summary}
        if _CHECK in manifest:
            intact = manifest[_CHECK] == sha256_json({"shards": manifest.get("shards"), **facts})
        else:  # an older form: of the facts alone, or (older still) none, read as it is
            intact = manifest.get(_FACTS_CHECK, sha256_json(facts)) == sha256_json(facts)
        if not intact:
            self._stale = f"manifest {path} was edited since it was written; recomputing its shards"
            self.manifest_damaged = True
            return
        self.records = records
        self.complete = manifest.get("complete") is True  # not a truthy string, say
        self.summary = summary

    def _identity(self) -> dict[str, Any]:
        return {"key": self.key, **self.header}

    def _name(self, index: int) -> str:
        return self.path(index).name

    def _label(self, index: int) -> str:
        """How shard ``index`` is named in manifest parts (and, ``by_name``, in the manifest)."""
        return self._name(index) if self.by_name else str(index)

    def _index(self, label: str) -> int | None:
        pattern = (
            rf"{SHARD_PREFIX}(\d+){re.escape(self.payload.suffix)}" if self.by_name else r"(\d+)"
        )
        found = re.fullmatch(pattern, label)
        return int(found.group(1)) if found else None

    def _parse(self, shards: Any) -> dict[int, dict[str, Any]] | None:
        """The shard records of a manifest's ``shards``; None when they are damaged (not a
        list or mapping of records that each hold a sha256)."""
        if isinstance(shards, list):
            parsed = dict(enumerate(shards))
        elif isinstance(shards, dict):
            labelled = {self._index(str(label)): record for label, record in shards.items()}
            parsed = {i: r for i, r in labelled.items() if i is not None}
        else:
            return None
        intact = all(
            isinstance(r, dict) and isinstance(r.get("sha256"), str) for r in parsed.values()
        )
        return parsed if intact else None

    def _listing(self) -> list[dict[str, Any]] | dict[str, dict[str, Any]]:
        if self.by_name:
            return {self._name(i): self.records[i] for i in sorted(self.records)}
        return [self.records[i] for i in range(self._front())]

    @property
    def manifest(self) -> dict[str, Any]:
        """The manifest as written: key, header, shard records, completeness, summary."""
        listing = self._listing()
        facts = {"complete": self.complete, **self.summary}
        check = sha256_json({"shards": listing, **facts})  # a record's tokens, rows, dim too
        return {**self._identity(), "shards": listing, **facts, _CHECK: check}

    def _save_manifest(self) -> None:
        write_json_atomic(self.manifest_path, self.manifest)

    def _front(self) -> int:
        """How many shards are recorded without a gap from shard 0."""
        return next(i for i in range(len(self.records) + 1) if i not in self.records)

    def _keep_front(self) -> None:
        """A listed manifest cannot hold a gap: records after the first missing shard go."""
        if not self.by_name:
            self.records = {i: self.records[i] for i in range(self._front())}

    # ------------------------------------------------------------------ planning and writing

    def _intact(self, index: int, record: dict[str, Any]) -> bool:
        path = self.path(index)
        return path.is_file() and sha256_file(path) == record["sha256"]

    def damaged(self, among: Iterable[int] | None = None) -> list[int]:
        """Recorded shards (``among`` these) whose file is missing or fails its checksum."""
        indices = sorted(self.records) if among is None else [i for i in among if i in self.records]
        return [i for i in indices if not self._intact(i, self.records[i])]

    def _found_damaged(self, among: Iterable[int] | None = None) -> list[int]:
        damaged = self.damaged(among)
        for index in damaged:
            log.warning(
                "%s shard %s is missing or fails its checksum; recomputing it",
                self.label,
                self.path(index),
            )
        return damaged

    def _part_records(self) -> dict[int, dict[str, Any]]:
        """Records in the manifest parts of an interrupted multi-process run (any rank count)."""
        records: dict[int, dict[str, Any]] = {}
        for part in read_parts(self.manifest_path, self._identity()):
            for label, record in part["shards"].items():
                index = self._index(label)
                if index is not None:
                    records[index] = record
        return records

    def plan(self, count: int, shared: bool = True) -> list[int]:
        """Indices of the shards of ``range(count)`` this process must (re)compute, in order.

        Empty, with ``complete`` True, when the set is complete and intact. In one process (or
        with ``shared`` False, for a stage the main rank runs alone) this is every missing or
        damaged shard, after folding in parts an interrupted multi-process run left; intact ones
        are kept. Under several processes it is collective: each rank verifies and lists only the
        shards it owns, and later ``write``s go to its manifest part.
        """
        if self._stale is not None:
            log.warning(self._stale)
            self._stale = None
        rank, size = world() if shared else (0, 1)
        found = self._part_records()
        if size == 1:
            if found:  # fold them in: the manifest alone must describe the set from here on
                self.records.update(found)
                self._keep_front()
                self._save_manifest()
                remove_parts(self.manifest_path)
            return self._damaged_and_missing(count)
        self.records.update(found)
        mine = range(rank, count, size)
        damaged = set(self._found_damaged(mine))
        kept = {i: self.records[i] for i in mine if i in self.records and i not in damaged}
        missing, parts = all_reduce_sum(np.array([len(mine) - len(kept), len(found)]))
        if self.complete and missing == 0 and parts == 0:
            return []
        self.complete = False
        make_directories(self.directory)
        barrier()  # every rank has read the old parts before any part is rewritten
        self._part = {**self._identity(), "shards": {self._label(i): r for i, r in kept.items()}}
        self._planned = count
        write_json_atomic(part_path(self.manifest_path, rank), self._part)
        return [i for i in mine if i not in kept]

    def _damaged_and_missing(self, count: int) -> list[int]:
        """One process: recorded shards that are missing or fail their checksum, then the rest.

        A damaged set is marked incomplete on disk at once, so it never looks complete again
        until every damaged shard is redone; intact shards are kept as they are. Records of
        shards beyond ``count`` (a manifest listing more shards than the set has) are dropped,
        with their files, and the set is marked incomplete until ``finish``.
        """
        beyond = sorted(i for i in self.records if i >= count)
        for index in beyond:
            log.warning(
                "%s %s lists shard %d of a set of %d; dropping it",
                self.label,
                self.manifest_path,
                index,
                count,
            )
            del self.records[index]
            self.path(index).unlink(missing_ok=True)
        missing = [i for i in range(count) if i not in self.records]
        todo = sorted({*self._found_damaged(), *missing})
        if (todo or beyond) and self.complete:
            self.complete = False
            self._save_manifest()
        elif beyond:
            self._save_manifest()
        return todo

    def intact(self) -> bool:
        """The set is complete and every recorded shard passes its checksum."""
        return self.complete and not self.damaged()

    def restart(self) -> None:
        """Forget every record (not yet on disk: the next ``write`` records the new start)."""
        self.records, self.complete = {}, False

    def write(self, index: int, payload: Any, **fields: Any) -> None:
        """Write shard ``index`` atomically, then record it with ``fields`` after its sha256.

        In one process shards go straight into the manifest (in order, unless ``by_name``);
        after ``plan`` in a multi-process run, any shard this rank owns, recorded in its part.
        """
        if self._part is None and not self.by_name and index > self._front():
            raise RuntimeError(f"shard {index} written out of order")
        path = self.path(index)
        data = self.payload.encode(payload)  # hashed as written: the file is not read back
        write_bytes_atomic(path, data)
        digest = hashlib.sha256(memoryview(data)).hexdigest()
        record = {**self.payload.describe(path, payload), "sha256": digest, **fields}
        if self._part is not None:
            self._part["shards"][self._label(index)] = record
            write_json_atomic(part_path(self.manifest_path, world()[0]), self._part)
            return
        self.records[index] = record  # a damaged shard is redone in place
        self._save_manifest()

    def finish(self, **summary: Any) -> None:
        """Mark the set complete, with ``summary`` in its manifest (collective after ``plan``)."""
        if self._part is not None:
            self._finish_shared(summary)
            return
        self.summary.update(summary)
        self.complete = True
        self._save_manifest()
        remove_parts(self.manifest_path)

    def _finish_shared(self, summary: dict[str, Any]) -> None:
        rank, size = world()
        barrier()  # every rank has recorded its shards
        if rank == 0:
            parts = [
                json.loads(part_path(self.manifest_path, r).read_text())["shards"]
                for r in range(size)
            ]
            self.records = {i: parts[i % size][self._label(i)] for i in range(self._planned)}
            self.summary.update(summary)
            self.complete = True
            self._save_manifest()
            remove_parts(self.manifest_path)
        barrier()  # the manifest is written
        self._part = None
        self._load()

    # ------------------------------------------------------------------ reading and checking

    def read(self, index: int, verify: bool = True, again: str = "run again") -> Any:
        """Shard ``index``'s payload; raises naming the shard if it is missing or corrupt, and
        ``again``: how it is written again (the command of the stage that writes it).

        ``verify=False`` skips the checksum, not the check: a shard of another size than its
        record, or one that does not decode, is still refused naming the file."""
        path = self.path(index)
        record = self.records[index]
        if not path.is_file():
            if path.exists() or path.is_symlink():  # a directory or special file in its place
                raise UserInputError(f"{self.label} shard {path} {_not_a_file(path)}")
            raise UserInputError(f"{self.label} shard {path} is missing; {again} to recompute it")
        data = self.payload.read(path)  # one read serves the checksum and the payload
        if verify and hashlib.sha256(memoryview(data)).hexdigest() != record["sha256"]:
            raise self._corrupt(path, "checksum mismatch", again)
        if record.get("bytes", len(data)) != len(data):
            why = f"{len(data)} bytes, its manifest records {record['bytes']}"
            raise self._corrupt(path, why, again)
        try:
            return self.payload.decode(data, record)
        except (ValueError, OSError, TypeError, KeyError) as err:  # pyarrow's errors among them
            why = f"{type(err).__name__}: {err}".splitlines()[0]
            raise self._corrupt(path, why, again) from None

    def _corrupt(self, path: Path, why: str, again: str) -> UserInputError:
        return UserInputError(
            f"{self.label} shard {path} is corrupt ({why}); {again} to recompute it"
        )

    def tables(self, verify: bool = True, again: str = "run again") -> list[Any]:
        """Every recorded shard's payload, in order (named for the store's Arrow tables)."""
        return [self.read(i, verify, again) for i in sorted(self.records)]

    def problems(self, again: str = "run the stage again") -> list[str]:
        """Every missing or corrupt shard, and an incomplete set, as messages naming the file;
        ``again``: how the set is written again (the command of the stage that writes it)."""
        if not self.manifest_path.is_file():
            return [
                f"{self.directory}: no {MANIFEST}, so its shards cannot be checked "
                f"({again} to rebuild the set)"
            ]
        if self._stale is not None:
            return [f"{self.manifest_path}: damaged ({again} to rebuild the set)"]
        if self.complete and not self.records:
            return [
                f"{self.manifest_path}: marked complete but lists no shards ({again} to rebuild "
                "the set)"
            ]
        issues = [
            f"{path}: corrupt (checksum mismatch)"
            if path.is_file()
            else f"{path} {_not_a_file(path)}"
            if path.exists() or path.is_symlink()
            else f"{path}: missing"
            for path in map(self.path, self.damaged())
        ]
        if not self.complete:
            issues.append(f"{self.directory}: incomplete ({again} to finish it)")
        return issues

    @property
    def rows(self) -> int:
        """Rows over all shards, for payloads whose records count them (Arrow tables)."""
        return sum(int(r["rows"]) for r in self.records.values())

    @property
    def nbytes(self) -> int:
        """Bytes over all shards, for payloads whose records hold them (Arrow tables)."""
        return sum(int(r["bytes"]) for r in self.records.values())


def _not_a_file(path: Path) -> str:
    """What stands where a shard file should be, for a message (a directory, a link, a FIFO)."""
    if path.is_symlink():
        return "is a symbolic link, not the shard: remove it, then run again"
    kind = "a directory" if path.is_dir() else "a FIFO, socket or device"
    return f"is {kind}, not a file: remove it, then run again"
