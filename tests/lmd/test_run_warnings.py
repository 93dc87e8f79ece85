"""Small runs must not mislead: what could, is said in the log, summary.json, the terminal table
and the report, each with its remedy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hostile_helpers import run_cli


@pytest.fixture
def decompose(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
):
    """``decompose`` of the two tiny models with extra flags; the run's summary.json."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"

    def run(*flags: str) -> dict[str, Any]:
        args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
        args += ["--corpus.paths", str(corpus_txt), "-T", "8", *flags, "--no-progress"]
        code, err = run_cli([*args, "--out", str(out), "--overwrite"], monkeypatch, capsys)
        assert code == 0, err
        return dict(json.loads((out / "summary.json").read_text()))

    run.out = out  # type: ignore[attr-defined]
    return run


def test_small_run_warns_with_remedies(
    decompose: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    summary = decompose("--spans.counts", "100000,5,5", "--max_length", "6")
    warnings, spans = summary["warnings"], summary["spans"]
    assert spans["train"] < 100000
    fewer, *cut = warnings
    assert fewer.startswith("fewer spans than requested")
    assert f"train {spans['train']} of 100000" in fewer
    # each remedy as the command line and the Python API (which both reach it) name it
    assert '--spans.length (spans={"length": N})' in fewer
    assert [w.split(":")[0] for w in cut] == ["a", "b"]  # max_length 6 < 8 tokens: both cut
    assert all("maximum length" in w and "spans.length" in w for w in cut)
    code, _ = run_cli(["report", str(decompose.out)], monkeypatch, capsys)
    page = (decompose.out / "report.html").read_text(encoding="utf-8")
    assert code == 0 and page.count("Warning: ") == len(warnings)


def test_fewer_training_spans_than_basis_columns_is_named(
    decompose: Any, caplog: pytest.LogCaptureFixture
) -> None:
    (warning,) = decompose("--spans.counts", "20,5,5")["warnings"]
    # the tiny models are 32 and 24 wide: fitting the narrower one uses 32 basis columns
    assert warning.startswith("20 training spans for a group basis of 32 columns")
    assert warning.endswith('--study.alpha_select gcv (study={"alpha_select": "gcv"})')
    # one line, not one more per basis from the solver (each pairwise fit had warned too)
    assert caplog.text.count("can interpolate") == 1
    (chosen,) = decompose("--spans.counts", "20,5,5", "--study.alpha_select", "gcv")["warnings"]
    assert chosen.endswith("use more spans than basis columns (alpha is chosen by gcv already)")


def test_a_sweeps_small_sizes_are_named_in_one_line(
    decompose: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """A train-size sweep (and a span-length one) whose small settings have fewer training
    spans than basis columns warned once per basis and setting from the solver (four lines for
    two sizes of two models): one line per sweep names the settings."""
    decompose("--spans.counts", "60,5,5", "--study.train_sizes", "10,20,40", "--study.lengths", "4")
    assert "has dimension" not in caplog.text
    (curve,) = [r.getMessage() for r in caplog.records if "train-size sweep" in r.getMessage()]
    assert curve.startswith("train-size sweep: size 10, size 20: fewer training spans than the ")
    assert "widest basis's 32 columns" in curve and "size 40" not in curve
    assert caplog.text.count("can interpolate") == 1  # 60 spans at T=4: the length sweep's fit


def test_too_few_bootstrap_replicates_for_the_level_are_named(decompose: Any) -> None:
    """``--study.bootstrap 1`` had written intervals of width 0 around one replicate (which
    need not hold the estimate), with nothing said: fewer replicates than the level needs for
    one in each tail are named, with the count it needs."""
    summary = decompose("--spans.counts", "60,10,10", "--study.bootstrap", "3")
    (warning,) = [w for w in summary["warnings"] if "--study.bootstrap" in w]
    said = '--study.bootstrap 3 (study={"bootstrap": 3}): an interval at level 0.95 needs 40'
    assert warning.startswith(said)
    assert warning.endswith('use --study.bootstrap 40 (study={"bootstrap": 40}) or more')
    assert not [
        w
        for w in decompose("--spans.counts", "60,10,10", "--study.bootstrap", "40", "--overwrite")[
            "warnings"
        ]
        if "--study.bootstrap" in w
    ]


def _flat_test_split(tmp_path: Path, **options: Any) -> Any:
    """The decomposition of two arrays, the second's test rows all the same (an embedding
    service that failed on the last requests): its test R^2 cannot be computed."""
    import numpy as np

    import lmalgebra
    from tiny import build_tokenizer, documents

    tokenizer = build_tokenizer(tmp_path / "tokenizer")
    texts, shape = documents(120), {"spans": {"length": 8, "counts": (60, 12, 12)}}
    rows = len(lmalgebra.spans({}, texts, **shape, reference_tokenizer=str(tokenizer)))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, 6)).astype(np.float32)
    b = (a @ rng.standard_normal((6, 4))).astype(np.float32)
    b[-12:] = b[-1]  # the test split's rows: one embedding
    return lmalgebra.decompose(
        {"a": a, "b": b},
        texts,
        **shape,
        reference_tokenizer=str(tokenizer),
        cache_dir=tmp_path / "cache",
        progress=False,
        **options,
    )


def test_a_model_that_does_not_vary_on_a_held_out_split_is_named(tmp_path: Path) -> None:
    """Arrays whose test rows are all the same (an embedding service that failed on the last
    requests): the test R^2 of that model, and the test means, had been blank and NaN with
    nothing said."""
    import numpy as np

    result = _flat_test_split(tmp_path)
    (warning,) = [w for w in result.summary["warnings"] if "same embedding" in w]
    assert warning.startswith("'b': every test span has the same embedding, so its test R^2")
    assert np.isnan(result.pairwise("test").loc["b", "a"])
    assert not np.isnan(result.pairwise("validation").loc["b", "a"])


def _strict(text: str) -> Any:
    """JSON as a strict reader (a browser's ``JSON.parse``, Go, Rust) takes it: no NaN."""

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_an_r2_that_cannot_be_computed_is_written_as_strict_json(tmp_path: Path) -> None:
    """A test R^2 that is NaN had been written as ``NaN`` into ``summary.json``, which strict
    JSON readers refuse: it is null now, read back as None by ``Decomposition.load``, shown as
    ``n/a`` by the command's table and the report."""
    import numpy as np

    import lmalgebra
    from lmalgebra.cli.lmd import _group_table

    result = _flat_test_split(tmp_path, out=tmp_path / "run")
    written = _strict((tmp_path / "run" / "summary.json").read_text())
    assert written["group_r2"]["b"]["test"] is None
    loaded = lmalgebra.Decomposition.load(tmp_path / "run")
    assert loaded.summary == result.summary
    assert np.isnan(loaded.group.loc["b", "test"])
    rendered = str(_group_table(loaded).columns[3]._cells)
    assert "n/a" in rendered
    lmalgebra.Decomposition.load(tmp_path / "run").report(tmp_path / "page.html")
    assert "test n/a" in (tmp_path / "page.html").read_text()


def test_spans_short_of_the_counts_asked_for_are_said_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``lmalgebra spans`` (and ``lmalgebra.spans``) of more spans than the corpus holds had
    exported fewer, exit 0 and nothing said: a decomposition of the same spans warns, and so
    do they now, with the same line, naming the short splits alone."""
    import logging

    import lmalgebra
    from hostile_helpers import run_main
    from tiny import build_tokenizer, documents

    tokenizer = build_tokenizer(tmp_path / "tokenizer")
    corpus = tmp_path / "docs.txt"
    texts = documents(120)
    corpus.write_text("\n\n".join(texts) + "\n", encoding="utf-8")
    shape = {"spans": {"length": 8, "counts": (5000, 12, 12)}}
    with caplog.at_level(logging.WARNING):
        table = lmalgebra.spans({}, texts, **shape, reference_tokenizer=str(tokenizer))
    said = [
        r.getMessage() for r in caplog.records if "fewer spans than requested" in r.getMessage()
    ]
    assert said == [
        f"fewer spans than requested (train {len(table) - 24} of 5000): the corpus has too "
        "few documents or tokens for these counts at this span length; use a larger corpus, "
        'a smaller --spans.length (spans={"length": N}) or a larger --spans.per_doc '
        '(spans={"per_doc": N})'
    ]
    caplog.clear()
    args = ["spans", "--corpus.paths", str(corpus), "--reference_tokenizer", str(tokenizer)]
    args += ["-T", "8", "--spans.counts", "5000,12,12", "--out", str(tmp_path / "s.jsonl")]
    code, _, _ = run_main(args, monkeypatch, capsys)
    assert code == 0
    assert any("fewer spans than requested (train" in r.getMessage() for r in caplog.records)
