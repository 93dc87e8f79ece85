"""``bench/bench_wide.py --quick``: the wide-LMD benchmark end to end at a toy size.

Precomputed files are written, and exact, reduced, sketch and float32 decompositions run on them
(in the script's own interpreter at this size; in a fresh one each at the recorded sizes); the
script itself fails when the reduced and sketch fits with every component kept, or float32
statistics, move an R^2 by more than 1e-4 from the exact float64 fits.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_wide_quick_runs_and_checks_itself(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HF_HUB_OFFLINE": "1"}
    script = [sys.executable, str(ROOT / "bench" / "bench_wide.py"), "--quick", "--no-write"]
    options = ["--idle-timeout", "0", "--parts", "accuracy", "--workdir", str(tmp_path / "work")]
    done = subprocess.run(
        [*script, *options],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for method in ("reduced k=48", "sketch k=48", "exact float32"):
        assert f"{method}: largest |R^2 difference| from exact" in done.stdout
    assert "FAILED" not in done.stdout
    assert not (tmp_path / "work").exists()  # its files are removed
