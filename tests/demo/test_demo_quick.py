"""Smoke test of the whole offline demo at its quick size (the same command a user runs)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd


def _env() -> dict[str, str]:
    """The suite's thread count (on a shared machine, torch's default of one thread per core is
    many times slower) and the sources under test (a checkout beside the installed one)."""
    import lmalgebra

    threads = {k: os.environ[k] for k in ("OMP_NUM_THREADS",) if k in os.environ}
    source = str(Path(lmalgebra.__file__).resolve().parents[1])
    return {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "PYTHONPATH": source, **threads}


def test_quick_demo_runs_every_stage_and_writes_one_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = subprocess.run(
        [sys.executable, "-m", "lmalgebra", "demo", "--quick", "--out", str(out), "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env=_env(),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "report:" in proc.stdout
    report = (out / "report.html").read_text(encoding="utf-8")
    assert report.count("data:image/png;base64,") >= 2  # self-contained figures
    # a report, not a dump: sentences and tables with rounded numbers
    text = re.sub(r"<style>.*?</style>|data:image/png;base64,[^\"]*", "", report, flags=re.S)
    assert not re.search(r"\d\.\d{4,}", text) and "{" not in text and "None" not in text
    # SM1 on French and Spanish, against the English-only teacher: marked, not averaged
    sm1 = pd.read_csv(out / "merge-en-vocabulary" / "evaluation" / "scores.csv")
    assert set(sm1.loc[~sm1["comparable"], "language"]) == {"fr", "es"}
    assert report.count("not comparable</td>") == 2
    result = json.loads((out / "demo.json").read_text(), parse_constant=_not_json)
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


def _not_json(name: str) -> None:
    """A strict JSON reader's refusal of ``NaN`` and the infinities (a browser's JSON.parse)."""
    raise ValueError(f"{name} is not JSON")
