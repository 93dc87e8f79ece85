"""``core.allocator``: with freed memory reused, a large temporary allocated again is not faulted
in again (counted in minor page faults, not timed), where with the switch off (the allocator left
alone) it is every time. Each case runs in a fresh interpreter: the setting is the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmalgebra.core.allocator import _glibc

pytestmark = pytest.mark.skipif(_glibc() is None, reason="glibc's allocator only")

SCRIPT = """
import json, resource, sys
import torch
from lmalgebra.core.allocator import release_free_memory, reuse_freed_memory
applied = reuse_freed_memory() if sys.argv[1] == "reuse" else False
again = reuse_freed_memory() if sys.argv[1] == "reuse" else False
faults = []
for _ in range(24):  # 42 MB, above glibc's largest dynamic mmap threshold
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    logits = torch.empty(304, 34150).fill_(1.0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    del logits
release_free_memory()
print(json.dumps({"applied": applied, "again": again, "faults": faults}))
"""


def _run(mode: str, **env: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, mode],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_large_temporary_is_faulted_in_once_not_on_every_allocation() -> None:
    # the switch off: the allocator as it is, each block mapped afresh and faulted in each time
    # (10,141 faults of 4 KiB pages; fewer with huge pages)
    default = _run("reuse", LMALGEBRA_REUSE_FREED_MEMORY="0")
    assert not default["applied"]
    each_time = min(default["faults"])
    assert each_time >= 10
    reused = _run("reuse")
    assert reused["applied"] and reused["again"]
    # the heap grows while glibc's free blocks settle (a few allocations), then the blocks are
    # reused: no page faulted in again
    assert all(f <= each_time // 10 for f in reused["faults"][-8:])


def test_teacher_inference_hands_freed_memory_back_once_its_shards_are_written(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``infer_shards`` (the teach stages) releases the memory kept for reuse once, after the
    model's last shard, and not at all when every shard was already there (no model loaded)."""
    import pyarrow as pa

    from lmalgebra.distill import teachers
    from lmalgebra.storage.shard_set import ShardSet

    events: list[str] = []
    monkeypatch.setattr(teachers, "release_free_memory", lambda: events.append("release"))
    source = ShardSet(tmp_path / "source", {"kind": "source"})
    source.plan(3)
    for index in range(3):
        source.write(index, pa.table({"x": [index]}))
    source.finish()

    def load() -> str:
        events.append("load")
        return "model"

    def infer(model: str, part: pa.Table) -> pa.Table:
        events.append(f"shard {part.column('x')[0].as_py()}")
        return part

    target = ShardSet(tmp_path / "target", {"kind": "target"})
    teachers.infer_shards(source, target, "teach", load, infer, False)
    assert events == ["load", "shard 0", "shard 1", "shard 2", "release"]
    events.clear()
    teachers.infer_shards(
        source, ShardSet(tmp_path / "target", {"kind": "target"}), "teach", load, infer, False
    )
    assert events == []
