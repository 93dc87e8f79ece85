"""Smoke test of the whole offline demo at its quick size (the same command a user runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_quick_demo_runs_every_stage_and_writes_one_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "lmalgebra", "demo", "--quick", "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "report:" in proc.stdout
    report = (out / "report.html").read_text(encoding="utf-8")
    assert report.count("data:image/png;base64,") >= 2  # self-contained figures
    result = json.loads((out / "demo.json").read_text())
    assert len(result["findings"]) == 3
    assert all("holds" in f for f in result["findings"].values())
    models = {s["model"] for s in result["scores"]}
    assert {
        "teacher-en",
        "teacher-fr",
        "teacher-es",
        "teacher-en-head",  # package:minilm, frozen, with a fitted masked-LM head
        "sm3-distilled",
        "sm2-gold",
        "sm1-gold",
    } <= models
    assert {row["model"] for row in result["pos"]} >= {"sm1-gold", "sm2-gold", "sm3-distilled"}
    assert set(result["lmd"]["coverage"]) == {"en", "fr", "es"}
    for name in ("sm3-distilled", "sm2-gold"):
        assert (out / "merge" / name / "model" / "config.json").is_file()
    assert (out / "merge" / "evaluation" / "scores.csv").is_file()
    head = json.loads((out / "teachers" / "teacher-en-head" / "lmalgebra.json").read_text())
    assert head["kind"] == "head-only-teacher" and head["encoder"]["reference"] == "package:minilm"
