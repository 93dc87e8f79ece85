"""``demo --causal``: the table (seed means and deviations, gap closed) on hand-made figures, the
plans, and the quick demo end to end, its last writes stopped and resumed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmalgebra.demo.causal_table import causal_markdown, causal_table, student_name
from lmalgebra.demo.plan import CAUSAL_FULL, CAUSAL_LOSSES, CAUSAL_QUICK
from lmalgebra.distill.vocab.tokenizer_choice import TOKENIZER_KINDS

TEACHERS = {"en": "teacher-en", "fr": "teacher-fr"}


def _bits() -> list[tuple[str, str, float]]:
    """CE 3.0/4.0 on every seed; ALM 2.5 +- 0.1 (en) and 3.5 (fr); MinED no better than CE on
    en, worse on fr; teachers 2.0 and 3.0: ALM closes 50% on both languages."""
    rows = [("en", "teacher-en", 2.0), ("fr", "teacher-fr", 3.0)]
    for seed, alm_en in zip((0, 1, 2), (2.4, 2.5, 2.6), strict=True):
        rows += [
            ("en", student_name("ce", seed), 3.0),
            ("fr", student_name("ce", seed), 4.0),
            ("en", student_name("alm", seed), alm_en),
            ("fr", student_name("alm", seed), 3.5),
            ("en", student_name("mined", seed), 3.0),
            ("fr", student_name("mined", seed), 4.2),
        ]
    return rows


def test_table_means_deviations_and_gap_closed() -> None:
    table = causal_table(_bits(), TEACHERS, ["ce", "mined", "alm"], [0, 1, 2])
    alm = table["students"]["alm"]
    assert alm["bits_per_byte"]["en"]["mean"] == pytest.approx(2.5)
    assert alm["bits_per_byte"]["en"]["std"] == pytest.approx(0.1)  # sample deviation, ddof 1
    assert alm["gap_closed"] == pytest.approx({"en": 0.5, "fr": 0.5})
    assert table["students"]["mined"]["gap_closed_mean"] == pytest.approx((0.0 - 0.2) / 2)
    assert table["students"]["ce"]["gap_closed_mean"] == pytest.approx(0.0)
    assert (table["best_loss"], table["target_met"]) == ("alm", True)
    text = causal_markdown(table)
    assert "| alm | 2.500 ± 0.100 | 3.500 ± 0.000 | 50.0% |" in text
    assert "| teachers | 2.000 | 3.000 | 100% |" in text


def test_gap_undefined_where_the_teacher_is_not_better() -> None:
    rows = [r if r[1] != "teacher-fr" else ("fr", "teacher-fr", 4.5) for r in _bits()]
    table = causal_table(rows, TEACHERS, ["ce", "alm"], [0])
    assert math.isnan(table["students"]["alm"]["gap_closed"]["fr"])
    assert table["students"]["alm"]["gap_closed_mean"] == pytest.approx(0.6)  # en alone, seed 0
    assert "2.400 |" in causal_markdown(table)  # one seed: no deviation shown


def test_no_gap_anywhere_names_no_best_loss() -> None:
    """Where no language's teacher is better than CE only, no loss closes a gap: the table had
    shown "nan%" and named the first loss best ("Best: mined (nan%; ...)")."""
    rows = [r if not r[1].startswith("teacher") else (r[0], r[1], 9.0) for r in _bits()]
    text = causal_markdown(causal_table(rows, TEACHERS, ["ce", "mined", "alm"], [0]))
    assert "nan" not in text
    assert "| alm | 2.400 | 3.500 | n/a |" in text
    assert "Best: none: no language's teacher is better than CE only (target 25%: not met)." in text


def test_plans_name_three_tokenizer_kinds_and_every_loss() -> None:
    for plan in (CAUSAL_FULL, CAUSAL_QUICK):
        kinds = [kind for _, kind, _ in plan.teachers]
        assert len(set(kinds)) == 3 and set(kinds) <= set(TOKENIZER_KINDS)
        assert len({size for *_, size in plan.teachers}) == 3
        assert [lang for lang, *_ in plan.teachers] == ["en", "fr", "es"]
    assert len(CAUSAL_FULL.seeds) == 3 and len(CAUSAL_QUICK.seeds) == 1
    assert set(CAUSAL_LOSSES) == {"ce", "mined", "uld", "alm"}
    assert CAUSAL_LOSSES["ce"] == {"ce": 1.0}


def test_quick_causal_demo_and_its_last_writes_stopped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The quick demo end to end: a table of every loss against the teachers, and the write
    that ends it (its JSON record, after its table) stopped and resumed
    (``kill_helpers.check_resumes`` with ``last=1``: a Ctrl-C before it, the table written, and
    a ``kill -9`` after it, then the same command again, must leave what the uninterrupted run
    leaves, file for file). The demos
    stopped anywhere are ``slow`` (``test_kill_points.py::test_demo``: each trial runs a demo).
    The figures are read from what the last resumed run left, which the check found equal to
    the uninterrupted run's."""
    from kill_helpers import check_resumes, demo_steady

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out" / "demo"
    args = ["demo", "--causal", "--quick", "--out", str(out), "--no-progress"]
    found = check_resumes(
        args,
        [tmp_path / "out", tmp_path / "cache"],
        tmp_path,
        monkeypatch,
        capsys,
        normalise=demo_steady,
        last=1,
    )
    print(f"demo --causal: {found['points']} write points, tried {found['tried']}")
    result = json.loads((out / "causal-demo.json").read_text(), parse_constant=_not_json)
    assert set(result["students"]) == set(CAUSAL_LOSSES)
    for lang in ("en", "fr", "es"):
        teacher = result["teachers"][lang]["bits_per_byte"]
        assert 0 < teacher < result["students"]["ce"]["bits_per_byte"][lang]["mean"] < 8
    assert "| teachers |" in (out / "causal-demo.md").read_text()
    assert (out / "merge" / "alm-seed0" / "model" / "config.json").is_file()


def _not_json(name: str) -> None:
    """A strict JSON reader's refusal of ``NaN`` and the infinities (a browser's JSON.parse)."""
    raise ValueError(f"{name} is not JSON")
