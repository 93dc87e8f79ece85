"""The Python API called as documented: models as references, objects and arrays; texts as a list
or a path; labelled DataFrames; nothing written without ``out``; runs read back equal."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

import lmalgebra
from lmalgebra import Decomposition, UserInputError, decompose
from lmalgebra.core.splits import SPLITS
from tiny import documents

T = 8
SPANS = (60, 20, 20)
FITS_COLUMNS = ["kind", "target", "basis", "split", "r2", "ci_low", "ci_high", "adjusted_r2"]


@pytest.fixture(scope="module")
def texts() -> list[str]:
    return documents(120)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("api-cache")


@pytest.fixture(scope="module")
def by_path(bert_dir: Path, bert2_dir: Path, texts: list[str], cache: Path) -> Decomposition:
    """Two tiny BERTs named by directory, a list of strings, nothing written."""
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    return decompose(
        models, texts, spans={"length": T, "counts": SPANS}, cache_dir=cache, progress=False
    )


def _frames_equal(left: Decomposition, right: Decomposition, exact: bool = True) -> None:
    tol = {} if exact else {"check_exact": False, "rtol": 1e-4, "atol": 1e-4}
    for split in SPLITS:
        pd.testing.assert_frame_equal(left.pairwise(split), right.pairwise(split), **tol)
    pd.testing.assert_frame_equal(left.group, right.group, **tol)
    pd.testing.assert_frame_equal(left.fits, right.fits, **tol)
    pd.testing.assert_frame_equal(left.similarity, right.similarity, **tol)


def test_a_list_of_strings_gives_labelled_dataframes(by_path: Decomposition) -> None:
    assert by_path.names == ["a", "b"]
    pairwise = by_path.pairwise()  # test split by default
    assert list(pairwise.index) == ["a", "b"] and list(pairwise.columns) == ["a", "b"]
    assert (pairwise.index.name, pairwise.columns.name) == ("target", "basis")
    assert np.diag(pairwise.to_numpy()).tolist() == [1.0, 1.0]  # documented: not a fit
    assert math.isnan(by_path.pairwise("train", diagonal=math.nan).loc["a", "a"])
    fits = by_path.fits
    assert list(fits.columns) == FITS_COLUMNS
    row = fits[(fits.kind == "pairwise") & (fits.target == "a") & (fits.split == "test")]
    assert pairwise.loc["a", "b"] == row.r2.item()
    group = by_path.group
    assert list(group.index) == ["a", "b"] and list(group.columns) == list(SPLITS)
    groups = fits[(fits.kind == "group") & (fits.split == "validation")].set_index("target")
    assert group.loc["b", "validation"] == groups.loc["b", "r2"]
    assert set(by_path.similarity.columns) >= {"model_a", "model_b", "cka", "mean_cca"}
    assert by_path.spans == dict(zip(SPLITS, SPANS, strict=True))
    assert by_path.summary["group_r2"]["a"]["test"] == group.loc["a", "test"]
    assert "Decomposition: 2 models" in repr(by_path) and "a " in repr(by_path)
    assert "<table" in by_path._repr_html_()


def test_nothing_is_written_without_out(
    bert_dir: Path, bert2_dir: Path, texts: list[str], tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cache = tmp_path / "cache"
    decompose(
        {"a": str(bert_dir), "b": str(bert2_dir)},
        texts,
        spans={"length": T, "counts": SPANS},
        cache_dir=cache,
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no runs/, no stats/
    assert sorted(p.name for p in cache.iterdir()) == ["embeddings", "hashes", "spans"]


def test_out_writes_the_cli_files_and_load_reads_them_back(
    by_path: Decomposition, bert_dir: Path, bert2_dir: Path, texts: list[str], cache: Path, tmp_path
) -> None:
    out = tmp_path / "run"
    written = decompose(
        {"a": str(bert_dir), "b": str(bert2_dir)},
        texts,
        spans={"length": T, "counts": SPANS},
        cache_dir=cache,
        out=out,
        save_statistics=True,
    )
    names = {p.name for p in out.iterdir()}
    for split in SPLITS:
        assert f"pairwise_r2_{split}.csv" in names
        assert (out / "stats" / f"{split}.safetensors").is_file()
    assert {"fits.csv", "group_r2.csv", "summary.json", "config.yaml", "nulls.csv"} <= names
    assert written.run_dir == out
    seconds = json.loads((out / "summary.json").read_text())["seconds"]
    parts = {k: v for k, v in seconds.items() if k.startswith("analyse: ")}
    assert {"analyse: fits", "analyse: nulls", "analyse: similarity"} <= set(parts)
    rounding = 0.5e-3 * (len(parts) + 1)  # each figure rounded to the millisecond
    assert 0 < sum(parts.values()) <= seconds["analyse"] + rounding
    _frames_equal(written, by_path)
    loaded = Decomposition.load(out)
    _frames_equal(loaded, written)
    assert loaded.summary == written.summary
    with pytest.raises(UserInputError, match="give report"):
        by_path.report()  # no run directory to default to
    page = by_path.report(tmp_path / "page.html")  # drawn from a scratch copy of the run
    assert page.read_text(encoding="utf-8").startswith("<!doctype html>")
    assert by_path.run_dir is None
    saved = written.save(tmp_path / "saved")  # the result in memory, written afterwards
    assert sorted(p.name for p in saved.iterdir()) == sorted(
        p.name for p in out.iterdir() if not p.name.startswith(".")
    )
    _frames_equal(Decomposition.load(saved), by_path)
    plain = by_path.save(tmp_path / "plain")  # asked for no statistics: none written
    assert not (plain / "stats").exists() and (plain / "fits.csv").is_file()
    for split in SPLITS:  # written during the analysis (out) or after it (saved): the same bytes
        name = f"stats/{split}.safetensors"
        assert (out / name).read_bytes() == (saved / name).read_bytes()


def _failing_once_written(out: Path) -> Any:
    """An analysis that waits until the statistics files are written, then fails."""

    def analyse(*args: object) -> None:
        deadline = time.monotonic() + 120
        stats = [out / "stats" / f"{split}.safetensors" for split in SPLITS]
        while not all(p.is_file() for p in stats) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert all(p.is_file() for p in stats)
        raise UserInputError("the analysis failed")

    return analyse


def _with_statistics(
    bert_dir: Path, bert2_dir: Path, texts: list[str], cache: Path, out: Path
) -> Any:
    """A decomposition of the two test models into ``out`` that writes its statistics files."""
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    spans = {"length": T, "counts": SPANS}
    return decompose(models, texts, spans=spans, cache_dir=cache, out=out, save_statistics=True)


def test_a_run_failing_after_its_statistics_were_written_takes_them_back(
    bert_dir: Path, bert2_dir: Path, texts: list[str], cache: Path, tmp_path: Path, monkeypatch
) -> None:
    import lmalgebra.lmd.run.pipeline as pipeline

    out = tmp_path / "run"
    monkeypatch.setattr(pipeline, "analyse", _failing_once_written(out))
    with pytest.raises(UserInputError, match="the analysis failed"):
        _with_statistics(bert_dir, bert2_dir, texts, cache, out)
    assert not out.exists() or list(out.iterdir()) == []


def test_a_full_disk_while_the_statistics_are_written_is_named_and_leaves_no_summary(
    bert_dir: Path, bert2_dir: Path, texts: list[str], cache: Path, tmp_path: Path, monkeypatch
) -> None:
    import errno
    import os

    import lmalgebra.storage.safetensors_stream as stream
    from lmalgebra.storage.disk_space import OutOfSpaceError

    real, seen = stream._write_array, []

    def filling(handle: Any, array: np.ndarray, scale: float | None) -> None:
        seen.append(array.shape)
        if len(seen) == 6:  # the validation split's Gram, in the writer's thread
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(handle, array, scale)

    monkeypatch.setattr(stream, "_write_array", filling)
    out = tmp_path / "run"
    with pytest.raises(OutOfSpaceError, match=r"stats/validation\.safetensors"):
        _with_statistics(bert_dir, bert2_dir, texts, cache, out)
    assert not (out / "summary.json").exists()
    assert not (out / "stats" / "validation.safetensors").exists()
    assert [p.name for p in out.rglob(".*tmp-*")] == []


def test_load_of_a_cli_run_equals_the_api_on_the_same_corpus(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cache: Path, tmp_path, monkeypatch, capsys
) -> None:
    from lmalgebra.cli import main

    out = tmp_path / "cli-run"
    argv = ["lmalgebra", "decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    argv += [
        "--corpus.paths",
        str(corpus_txt),
        "-T",
        str(T),
        "--spans.counts",
        "60,20,20",
        "--out",
        str(out),
    ]
    argv += ["--cache_dir", str(cache), "--no-progress"]
    monkeypatch.setattr(sys, "argv", argv)
    main()
    capsys.readouterr()
    api = decompose(
        {"a": str(bert_dir), "b": str(bert2_dir)},
        corpus_txt,
        spans={"length": T, "counts": SPANS},
        cache_dir=cache,
    )
    cli = Decomposition.load(out)
    _frames_equal(cli, api)
    assert cli.summary["group_r2"] == api.summary["group_r2"]


def test_a_model_and_tokenizer_pair_equals_its_directory(
    by_path: Decomposition, bert_dir: Path, bert2_dir: Path, texts: list[str], cache: Path
) -> None:
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(bert_dir)
    model.train()  # embedded in eval mode, and handed back in the caller's mode
    pair = (model, AutoTokenizer.from_pretrained(bert_dir))
    result = decompose(
        {"a": pair, "b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}
    )
    assert model.training
    _frames_equal(result, by_path, exact=False)
    config = result.config["models"][0]
    assert config["kind"] == "memory" and config["path"] == "BertModel object"


def test_a_sentence_transformer_is_embedded_through_encode(
    by_path: Decomposition, bert_dir: Path, bert2_dir: Path, texts: list[str]
) -> None:
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    word = models.Transformer(str(bert_dir), max_seq_length=64)
    width = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    pooling = models.Pooling(width(), pooling_mode="mean")
    encoder = SentenceTransformer(modules=[word, pooling], device="cpu")
    result = decompose(
        {"a": encoder, "b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}
    )
    # mean pooling of the same weights: the numbers of the directory's run
    _frames_equal(result, by_path, exact=False)
    normalised = SentenceTransformer(modules=[word, pooling, models.Normalize()], device="cpu")
    other = decompose(
        {"a": normalised, "b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}
    )
    assert other.pairwise().loc["b", "a"] != pytest.approx(result.pairwise().loc["b", "a"])


def _mean_pooled(directory: Path, spans: list[str]) -> np.ndarray:
    """Reference embeddings, computed here without the toolkit: mean over real tokens."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    model, tokenizer = (
        AutoModel.from_pretrained(directory).eval(),
        AutoTokenizer.from_pretrained(directory),
    )
    out = []
    with torch.no_grad():
        for text in spans:
            batch = tokenizer([text], return_tensors="pt")
            hidden = model(**batch).last_hidden_state[0]
            out.append(hidden.mean(dim=0).numpy())
    return np.stack(out)


def test_arrays_in_the_order_spans_lists_them(
    by_path: Decomposition, bert_dir: Path, bert2_dir: Path, texts: list[str]
) -> None:
    table = lmalgebra.spans({"b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS})
    assert list(table.columns) == ["row", "split", "index", "sha256", "text"]
    # called with decompose's arguments (overwrite had been an unknown option), the same table
    same = {"out": "not/written", "overwrite": True, "alpha": 3.0}
    again = lmalgebra.spans(
        {"b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}, **same
    )
    assert again.equals(table) and not Path("not").exists()
    assert table.split.tolist() == [s for s, n in zip(SPLITS, SPANS, strict=True) for _ in range(n)]
    assert len(table.attrs["spans_sha256"]) == 64
    vectors = _mean_pooled(bert_dir, table.text.tolist())
    # the array's model comes first: the spans are cut by the first model with a tokenizer
    result = decompose(
        {"a": vectors, "b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}
    )
    _frames_equal(result, by_path, exact=False)
    import torch

    tensor = torch.from_numpy(vectors)  # a torch tensor is an array too
    as_tensor = decompose(
        {"a": tensor, "b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}
    )
    _frames_equal(as_tensor, result)
    with pytest.raises(UserInputError, match=r"'a'.*59 rows.*lmalgebra\.spans\(\)"):
        decompose(
            {"a": vectors[:59], "b": str(bert2_dir)}, texts, spans={"length": T, "counts": SPANS}
        )


def _bad(models: Any, texts: Any, **options: Any) -> str:
    with pytest.raises(UserInputError) as caught:
        decompose(models, texts, spans={"length": T, "counts": SPANS}, **options)
    return str(caught.value)


def test_bad_input_is_one_user_input_error_naming_the_culprit(
    bert_dir: Path, bert2_dir: Path, texts: list[str]
) -> None:
    from transformers import AutoModel

    two = {"a": str(bert_dir), "b": str(bert2_dir)}
    assert "mapping of name -> model" in _bad([str(bert_dir)], texts)
    assert "'b'" in _bad({"a": str(bert_dir), "b": 3.5}, texts)
    assert "needs its tokenizer" in _bad({**two, "c": AutoModel.from_pretrained(bert_dir)}, texts)
    assert "(PreTrainedModel, tokenizer)" in _bad({**two, "c": (1, 2, 3)}, texts)
    assert "texts[1] is a int" in _bad(two, ["a text", 7])
    assert "give a corpus path alone" in _bad(two, [Path("x.txt")])
    assert "hold no text" in _bad(two, ["", "  "])
    assert "unknown option 'bootstrapp'" in _bad(two, texts, bootstrapp=10)
    # a rule across the arguments names the call too, as an argument's refusal does
    assert _bad({"a": str(bert_dir)}, texts).startswith("decompose(): decomposition needs at")
    with pytest.raises(UserInputError, match=r"^decompose_plan\(\): decomposition needs at"):
        lmalgebra.decompose_plan({"a": np.eye(3, 2)})
    assert "'study.bootstrap'" in _bad(two, texts, study={"bootstrap": -1})
    assert "2-D" in _bad({**two, "c": np.zeros(5)}, texts)
    assert "list of strings" in _bad(two, texts, study={"languages": True})
    # a hub id, offline (HF_HUB_OFFLINE=1 in the tests): one line naming it, no hub traceback
    offline = _bad({**two, "c": "some-org/some-model"}, texts)
    assert offline.startswith("model 'c': 'some-org/some-model' could not be reached"), offline
    assert "hub is offline" in offline and "`lmalgebra packaged`" in offline


def test_merge_runs_stages_from_python_and_returns_the_evaluation(
    teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    from dataclasses import asdict

    import yaml

    from lmalgebra.distill.masked.scores import SCORES
    from lmalgebra.storage.csv_tables import read_table
    from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

    path = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)
    first = lmalgebra.merge(path, stages=["prepare", "teach", "vocab"])
    assert first.scores is None and first.students == {}
    assert (first.run_dir / "vocab" / "vocab_union.json").is_file()
    # the same recipe built in Python: the later stages resume from the run directory
    recipe = lmalgebra.MergeRecipe.model_validate(yaml.safe_load(path.read_text()))
    run = lmalgebra.merge(recipe, stages=["train", "evaluate"], students={"student": {"steps": 4}})
    assert run.students == {"student": first.run_dir / "student" / "model"}
    assert run.scores is not None and run.rdt is not None
    written = read_table(run.run_dir / "evaluation", SCORES)
    assert written is not None
    frame = pd.DataFrame([asdict(s) for s in written], columns=list(SCORES.columns))
    pd.testing.assert_frame_equal(run.scores, frame)
    assert set(run.scores.model) == {"wp", "sp", "student"}
    assert list(run.rdt.index) == ["student"]
    assert list(run.rdt.columns) == ["xx", "yy", "average"]
    on_disk = pd.read_csv(run.run_dir / "evaluation" / "rdt.csv", index_col="student")
    pd.testing.assert_frame_equal(run.rdt, on_disk, check_exact=False, atol=1e-3)
    # the students a call scores are its students too (evaluate alone had left them {}, and
    # bits_rdt's hint, bits_per_byte(run.students), had then scored the teachers alone)
    assert lmalgebra.merge(recipe, "evaluate").students == run.students
    with pytest.raises(UserInputError, match="unknown stage 'distil'"):
        lmalgebra.merge(recipe, stages=["distil"])
    with pytest.raises(UserInputError, match="unknown key 'teacher'"):
        lmalgebra.merge({**recipe.model_dump(mode="json"), "teacher": {}}, stages=["vocab"])


def test_import_is_light_and_calls_set_up_threads_and_quiet_logging() -> None:
    import subprocess

    code = (
        "import sys, lmalgebra; heavy = {'torch', 'pandas', 'transformers'} & set(sys.modules); "
        "assert not heavy, heavy; assert callable(lmalgebra.decompose); "
        "assert 'lmalgebra.api.decompose' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
    # under the environment the command line sets, a call imports no transformers to quiet it,
    # and transformers imported during the call starts quiet
    code = (
        "import os, sys\n"
        "from lmalgebra.api.runtime import QUIET_ENVIRONMENT, library_call\n"
        "os.environ.update(QUIET_ENVIRONMENT)\n"
        "with library_call():\n"
        "    assert 'transformers' not in sys.modules\n"
        "    from transformers.utils import logging as hf\n"
        "    assert hf.get_verbosity() == hf.ERROR and not hf.is_progress_bar_enabled()\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)

    from transformers.utils import logging as hf_logging

    from lmalgebra.api.runtime import library_call

    hf_logging.set_verbosity_info()
    with library_call():
        assert hf_logging.get_verbosity() == hf_logging.ERROR
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.get_verbosity() == hf_logging.INFO  # the caller's setting comes back
    hf_logging.set_verbosity_warning()


def test_the_documented_example_runs(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    """The README's Python example (its first ``python`` block), with tiny models and corpus in
    place of packaged ones."""
    import re

    text = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", text, flags=re.S)[0]
    swaps = {
        '"package:minilm-sre"': repr(str(bert2_dir)),
        '"package:minilm"': repr(str(bert_dir)),
        # a text file has no fields: the packaged Parquet corpus's column goes with it
        '"package:wiki-en", text_column="extract"': repr(str(corpus_txt)),
        '"length": 32': f'"length": {T}',
        '"counts": (1000, 200, 200)': f'"counts": {SPANS}',
    }
    for old, new in swaps.items():
        assert old in code, old  # the example still says what this test replaces
        code = code.replace(old, new)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    namespace: dict[str, Any] = {}
    exec(compile(code, "README.md", "exec"), namespace)
    result = namespace["result"]
    assert isinstance(result, Decomposition)
    assert list(result.group.index) == ["minilm", "minilm-sre"]
    assert "target" in capsys.readouterr().out
