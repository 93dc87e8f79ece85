"""The demo's report page from a demo result (the shape ``run_demo`` returns), without running the
demo: sentences and rounded tables, no Python dump, and SM1's rows that are not comparable marked
and kept out of every average."""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from lmalgebra.demo.plan import QUICK
from lmalgebra.demo.workflow import findings
from lmalgebra.distill.masked.comparability import is_comparable
from lmalgebra.distill.masked.scores import Score, score_rdt
from lmalgebra.lmd.figures.heatmaps import pairwise_heatmap
from lmalgebra.report.demo_page import finding_lines, number, render

LANGUAGES = ("en", "fr", "es")
TRAINED_ON = {f"teacher-{lang}": frozenset({lang}) for lang in LANGUAGES}


def _score(lang: str, teacher: str, model: str, accuracy: float) -> Score:
    """A score row with 15-decimal floats, as a run produces them."""
    return Score(
        lang,
        teacher,
        model,
        62,
        430,
        accuracy + 1 / 3e4,
        6.285820678223011,
        536.9047359054475,
        0.958139534883721,
        0.6255813953488372,
        comparable=is_comparable(lang, TRAINED_ON[teacher]),
    )


def _union_scores() -> list[Score]:
    accuracy = {"teacher": 0.15, "sm3-distilled": 0.18, "sm2-gold": 0.14}
    return [
        _score(lang, f"teacher-{lang}", f"teacher-{lang}" if m == "teacher" else m, a)
        for lang in LANGUAGES
        for m, a in accuracy.items()
    ]


def _sm1_scores() -> list[Score]:
    """SM1: every language in the English teacher's tokenisation; on French and Spanish the
    English teacher is poor, so a student 'beats' it by far."""
    accuracy = {"en": (0.15, 0.12), "fr": (0.02, 0.10), "es": (0.02, 0.09)}
    return [
        _score(lang, "teacher-en", model, a)
        for lang, pair in accuracy.items()
        for model, a in zip(("teacher-en", "sm1-gold"), pair, strict=True)
    ]


def _result(tmp_path: Path) -> dict[str, Any]:
    union, sm1 = _union_scores(), _sm1_scores()
    deviations = {n: score_rdt(union, n) for n in ("sm3-distilled", "sm2-gold")}
    deviations["sm1-gold"] = score_rdt(sm1, "sm1-gold")
    found = findings([asdict(s) for s in union], [asdict(s) for s in sm1], deviations)
    found["union_vocabulary"].update(
        sm2_pos_accuracy=0.6067482241515391, sm1_pos_accuracy=0.5930372148859544, holds=True
    )
    names = ["minilm", "teacher-en", "sm3-distilled"]
    pairwise = np.array(
        [[np.nan, -0.13010143025533782, 0.2], [0.1, np.nan, 0.5], [0.3, 0.6, np.nan]]
    )
    heatmap = pairwise_heatmap(pairwise, names, tmp_path / "lmd" / "pairwise_r2_test.png")
    pair = {"teacher_from_student": 0.3188978027746808, "student_from_teacher": 0.5469392913085263}
    store = {"examples": 1500, "masked_tokens": 10436, "store_bytes_per_masked_token": None}
    return {
        "plan": QUICK.as_dict(),
        "quick": True,
        "inspect": {
            "pairs": [{"language": "en", "teacher": "teacher-en", **store}],
        },
        "scores": [asdict(s) for s in union + sm1],
        "rdt": deviations,
        "findings": found,
        "pos": [
            {
                "model": "sm2-gold",
                "accuracy": 0.6067482241515391,
                "macro_f1": 0.4511358050795679,
                "majority_accuracy": 0.2355958958168903,
                "train_sentences": 400,
                "test_words": 5068,
            }
        ],
        "lmd": {
            "models": names,
            "group_r2_test": {"minilm": 0.4053635642035811, "teacher-en": -0.1363370852065211},
            "pairwise_r2_test": {
                t: {b: float(pairwise[i, j]) for j, b in enumerate(names) if i != j}
                for i, t in enumerate(names)
            },
            "heatmap": str(heatmap),
            "coverage": {"en": {"sm3-distilled": pair, "test_spans": 100}},
        },
        "seconds": {"pretrain teachers": 217.0, "evaluate": 4.8},
    }


def _text(page: Path) -> str:
    """The page less its style sheet and embedded images: what a reader reads."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"<style>.*?</style>", "", text, flags=re.S)
    return re.sub(r'src="data:image/png;base64,[^"]*"', 'src=""', text)


def test_the_demo_page_reads_as_a_report(tmp_path: Path) -> None:
    text = _text(render(_result(tmp_path), tmp_path))
    assert not re.search(r"\d\.\d{4,}", text), re.findall(r".{40}\d\.\d{4,}.{10}", text)
    for dump in ("{", "}", "[", "]", "': ", "None", "True", "False", "nan"):
        assert dump not in text, dump
    spans = " / ".join(str(n) for n in QUICK.lmd_spans)
    assert f"{QUICK.docs_per_language:,} documents per language" in text
    assert f"{spans} spans" in text
    assert (
        '<b>1. Student within 5% RDT of each teacher</b>: <span class="yes">reproduced</span>. '
        "RDT of SM3 en +20.0%, es +20.0%, fr +20.0%.</p>"
    ) in text
    assert "Mean held-out accuracy of SM3 0.180; of SM2 0.140." in text
    assert "UPOS probe accuracy of SM2 0.607; of SM1 0.593." in text
    assert "<td>0.180</td><td>536.9</td><td>0.958</td><td>0.626</td>" in text
    assert "<th>macro-F1</th>" in text and "<td>5,068</td>" in text
    assert "teacher-en from all the others (-0.14)" in text  # negative R^2 explained
    assert "worse than their mean" in text
    assert "<td>4.8</td>" in text and "<td>221.8</td>" in text  # seconds, and their total
    # whose time: a resumed demo's steps had shown as the demo's cost, unsaid
    assert "a step whose work an earlier run finished" in text


def test_sm1_rows_off_the_teacher_language_are_marked_and_not_averaged(tmp_path: Path) -> None:
    result = _result(tmp_path)
    sm1 = result["rdt"]["sm1-gold"]
    assert sm1["en"] == pytest.approx(100 * (0.12 - 0.15) / (0.15 + 1 / 3e4), rel=1e-3)
    assert math.isnan(sm1["fr"]) and math.isnan(sm1["es"])
    assert sm1["average"] == sm1["en"]  # not pulled up by +400% on French
    measured = result["findings"]["union_vocabulary"]
    assert measured["sm1_masked_accuracy_comparable"] == pytest.approx(0.12, abs=1e-4)
    text = _text(render(result, tmp_path))
    rdt_row = re.search(r"<tr><td class=\"text\">sm1-gold</td>.*?</tr>", text.split("RDT on")[1])
    assert rdt_row is not None
    assert rdt_row.group(0).count("not comparable") == 2 and "-20.0%" in rdt_row.group(0)
    assert "<th>average (comparable languages)</th>" in text
    assert text.count("<td>no</td>") == 4  # fr and es, teacher and SM1
    assert "teacher teacher-en was not trained on es, fr" in text


def test_findings_in_words() -> None:
    lines = finding_lines(
        {
            "distilled_beats_gold_only": {
                "claim": "Distilled beats gold-only",
                "sm3_accuracy": 0.1873,
                "sm2_accuracy": 0.14,
                "holds": False,
            },
            "extra": {"claim": "Extra", "some_ratio": 12.345678, "per_lang": {"en": 0.123456}},
            "not_run": {"claim": "Not run", "holds": None},
        }
    )
    assert lines == [
        (
            "1. Distilled beats gold-only",
            "not reproduced",
            "Mean held-out accuracy of SM3 0.187; of SM2 0.140.",
        ),
        ("2. Extra", "not measured", "Some ratio 12.3; per lang en 0.123."),
        ("3. Not run", "not measured", ""),
    ]
    assert [number(v) for v in (0.123456, 1234.56, 3, True, math.nan, None)] == [
        "0.123",
        "1,234.6",
        "3",
        "yes",
        "",
        "",
    ]
