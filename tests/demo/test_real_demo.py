"""``demo --real`` end to end at the quick plan's steps, on tiny teachers in place of the packaged
Gemma and SmolLM2 (the packaged pair: ``make demo-real``); the table against its definitions,
recomputed here from the bits per byte; ``MergeRun.bits_rdt``; ``steps: 0``."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from lmalgebra import MergeRun, UserInputError
from lmalgebra.demo.plan import REAL_FULL, REAL_QUICK, REAL_VARIANTS
from lmalgebra.demo.real_workflow import UNTRAINED, RealDemoResult, run_real_demo

VARIANTS = ("ce", "ce-smooth", "merge")


@pytest.fixture(scope="module")
def result(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> RealDemoResult:
    """Teachers 'gemma' (unigram) and 'smollm2' (byte-level BPE); the student both of the
    byte-level teacher's layers, so that untrained it is that teacher."""
    dirs = causal_teacher_dirs
    plan = replace(
        REAL_QUICK,
        teachers=(("gemma", str(dirs["uni"])), ("smollm2", str(dirs["bl"]))),
        student_init=str(dirs["bl"]),
        layers=(0, 1),
        docs_per_language=12,
        example_bytes=128,
        seeds=(0, 1),
        variants=VARIANTS,
    )
    return run_real_demo(tmp_path_factory.mktemp("real") / "out", progress=False, plan=plan)


def _bits(result: RealDemoResult) -> dict[tuple[str, str], float]:
    return {(r.language, r.model): r.bits_per_byte for r in result.bits.itertuples()}


def test_table_rows_and_the_untrained_student_is_its_source(result: RealDemoResult) -> None:
    table, bits = result.table, _bits(result)
    assert list(table.index) == ["gemma", "smollm2", UNTRAINED, *VARIANTS]
    assert list(table.columns[:3]) == ["en", "fr", "es"]
    for name in result.run.students:  # keep_checkpoints 0: no checkpoint left once saved
        assert not list((result.run.run_dir / name / "checkpoints").glob("step-*"))
    for lang in ("en", "fr", "es"):  # steps 0: the source's weights, so its very bits per byte
        assert bits[(lang, UNTRAINED)] == bits[(lang, "smollm2")]
        assert bits[(lang, "ce-seed0")] != bits[(lang, UNTRAINED)]  # trained ones moved


def test_table_figures_recomputed_from_the_bits(result: RealDemoResult) -> None:
    table, bits, langs = result.table, _bits(result), ("en", "fr", "es")

    def seeds(variant: str, lang: str) -> np.ndarray:
        return np.array([bits[(lang, f"{variant}-seed{s}")] for s in (0, 1)])

    def rdt(model: str) -> float:  # 100/n sum (B_T - B_S) / B_T over both teachers, per language
        per_lang = [
            100
            / 2
            * sum((bits[(x, t)] - bits[(x, model)]) / bits[(x, t)] for t in ("gemma", "smollm2"))
            for x in langs
        ]
        return float(np.mean(per_lang))

    for variant in VARIANTS:
        for lang in langs:
            assert table.loc[variant, lang] == pytest.approx(seeds(variant, lang).mean())
            assert table.loc[variant, f"{lang} sd"] == pytest.approx(
                seeds(variant, lang).std(ddof=1)
            )
        assert table.loc[variant, "RDT %"] == pytest.approx(
            np.mean([rdt(f"{variant}-seed{s}") for s in (0, 1)])
        )
        closed = []
        for lang in langs:
            ce, best = seeds("ce", lang).mean(), min(bits[(lang, t)] for t in ("gemma", "smollm2"))
            if ce > best:
                closed.append((ce - seeds(variant, lang).mean()) / (ce - best))
        expected = float(np.mean(closed)) if closed else math.nan
        assert table.loc[variant, "gap closed"] == pytest.approx(expected, nan_ok=True)
    assert table.loc[UNTRAINED, "RDT %"] == pytest.approx(rdt(UNTRAINED))
    assert math.isnan(table.loc["gemma", "en sd"])


def test_files_and_a_rerun_resumes_every_step(result: RealDemoResult) -> None:
    out = result.run.run_dir.parent
    saved = json.loads((out / "real-demo.json").read_text())
    assert saved["table"]["ce"]["en"] == pytest.approx(result.table.loc["ce", "en"])
    text = (out / "real-demo.md").read_text()
    assert "| teacher gemma |" in text and "| ce |" in text and "(baseline)" in text
    saved = {
        n: (p / "model.safetensors").stat().st_mtime_ns for n, p in result.run.students.items()
    }
    again = run_real_demo(out, progress=False, plan=result.plan)
    kept = {n: (p / "model.safetensors").stat().st_mtime_ns for n, p in again.run.students.items()}
    assert kept == saved  # every student kept, none trained or written again
    pd.testing.assert_frame_equal(again.table, result.table)


@pytest.mark.parametrize(
    ("name", "first"), [("real_teachers.py", []), ("distillation_regimes.py", ["little-data"])]
)
def test_an_experiment_script_ends_bad_input_in_one_line(
    tmp_path: Path, name: str, first: list[str]
) -> None:
    """The experiment scripts answer as the command line does (``cli.run_command``)."""
    script = Path(__file__).resolve().parents[2] / "experiments" / name
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LMALGEBRA_CACHE": str(script)}  # a file
    args = [*first, "--quick", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    done = subprocess.run(
        [sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=300
    )
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert len(lines) == 1 and "LMALGEBRA_CACHE" in lines[0], done.stderr[-2000:]
    assert not (tmp_path / "out").exists()


def test_bits_rdt_refuses_a_table_it_cannot_read(result: RealDemoResult) -> None:
    run = MergeRun.load(result.run.run_dir)
    with pytest.raises(UserInputError, match="bits must be a DataFrame"):
        run.bits_rdt(result.bits.to_dict("records"))
    with pytest.raises(UserInputError, match="lacks bits_per_byte"):
        run.bits_rdt(result.bits.drop(columns="bits_per_byte"))
    students = result.bits[~result.bits["model"].isin(["gemma", "smollm2"])]
    with pytest.raises(UserInputError, match="none of the run's teachers"):
        run.bits_rdt(students)


def test_plans_use_the_packaged_pair_and_known_variants() -> None:
    for plan in (REAL_FULL, REAL_QUICK):
        assert dict(plan.teachers) == {
            "gemma": "package:gemma3-270m",
            "smollm2": "package:smollm2-135m",
        }
        assert plan.variants[0] == "ce" and set(plan.variants) <= set(REAL_VARIANTS)
    assert len(REAL_FULL.seeds) >= 2  # a standard deviation per variant


def test_two_demos_at_once_are_refused(tmp_path, monkeypatch, capsys) -> None:
    from hostile_helpers import assert_one_line, run_cli

    out = tmp_path / "out"
    code, stderr = run_cli(["demo", "--causal", "--real", "--out", str(out)], monkeypatch, capsys)
    assert_one_line(code, stderr, ["--causal", "--real"])
    assert not out.exists()


@pytest.mark.slow
def test_quick_real_demo_on_the_packaged_models(tmp_path, monkeypatch, capsys) -> None:
    """The packaged Gemma-3-270M and SmolLM2-135M (under 2 minutes with the models in the
    cache): the teachers read every language better than the student, untrained or not."""
    from hostile_helpers import run_cli

    code, _ = run_cli(
        ["demo", "--real", "--quick", "--out", str(tmp_path), "--no-progress"], monkeypatch, capsys
    )
    assert code == 0
    table = json.loads((tmp_path / "real-demo.json").read_text())["table"]
    for lang in ("en", "fr", "es"):
        teacher = min(table["gemma"][lang], table["smollm2"][lang])
        assert 0 < teacher < table["ce"][lang] < table["untrained"][lang] < 12
    assert "| teacher gemma |" in (tmp_path / "real-demo.md").read_text()
