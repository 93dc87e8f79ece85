"""The plan of a wide decomposition, its refusal, spilled covariances and float32 statistics."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import lmalgebra
from lmalgebra.core.errors import UserInputError
from lmalgebra.lmd.plan.estimate import GIB, OVERHEAD, Layout, exact_phases
from lmalgebra.lmd.statistics.passes import spill_covariance
from lmalgebra.stats.moments import SecondMoments, layout
from lmalgebra.stats.solver import SplitMoments
from tiny import documents

SHAPE = {"spans": {"length": 8, "counts": (60, 12, 12)}}


def sparse_npy(path: Path, rows: int, width: int) -> Path:
    """A ``.npy`` of that shape whose data are never written (a sparse file): a header to plan."""
    np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(rows, width))
    return path


def test_plan_reads_widths_from_headers_and_configs_without_loading_a_model(
    tmp_path: Path, bert_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import PreTrainedModel

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("the plan loaded a model")

    # every model class loads through this classmethod; a local directory keeps its weight
    # files (a directory without any is refused by the plan, as by the run)
    monkeypatch.setattr(PreTrainedModel, "from_pretrained", classmethod(refused))
    weightless = tmp_path / "bert"
    shutil.copytree(bert_dir, weightless)
    files = {f"f{i}": sparse_npy(tmp_path / f"f{i}.npy", 120_000, 4096) for i in range(3)}
    models = {"bert": str(weightless), **{n: f"precomputed:{p}" for n, p in files.items()}}
    frame = lmalgebra.decompose_plan(
        models,
        spans={"length": 16, "counts": (100_000, 10_000, 10_000)},
        timed=False,
        scale={"memory_gib": 1000},
    )
    widths = frame.attrs["models"].set_index("model")["width"].to_dict()
    assert widths == {"bert": 32, "f0": 4096, "f1": 4096, "f2": 4096}
    cache = frame.attrs["models"].set_index("model")["cache_gib"]
    assert cache["bert"] == pytest.approx(120_000 * 32 * 4 / GIB)  # float32 rows it embeds
    assert cache["f0"] == 0  # a file is read as it is
    totals = frame[frame["phase"].str.startswith("total")].set_index(["method", "precision"])
    assert totals.loc[("exact", "float64"), "chosen"]
    dim = 32 + 3 * 4096
    # the exact method's peak, in its group fits: three float64 covariances, the inverse, the
    # widest target's operator and its product, and every group fit's weights
    weights = sum(b * (dim - b) for b in (32, 4096, 4096, 4096))
    expected = (OVERHEAD + (4 * dim * dim + 2 * 4096 * dim + weights) * 8) / GIB
    assert totals.loc[("exact", "float64"), "peak_gib"] == pytest.approx(expected, rel=0.05)
    # half the bytes for the statistics and the inverse; the pairwise fits stay float64
    assert totals.loc[("exact", "float32"), "peak_gib"] < 0.7 * expected
    reduced = totals.loc[("reduced", "float64"), "peak_gib"]
    assert reduced < 0.25 * expected  # k = 1024 of 4096 per model
    assert frame["seconds"].isna().all()  # not timed


def test_timed_plan_has_a_time_for_every_phase(tmp_path: Path) -> None:
    files = {f"f{i}": f"precomputed:{sparse_npy(tmp_path / f'f{i}.npy', 1000, 64)}" for i in "ab"}
    frame = lmalgebra.decompose_plan(files, spans={"counts": (800, 100, 100)})
    assert (frame["seconds"] >= 0).all()
    assert frame.attrs["available_gib"] > 0


@pytest.fixture(scope="module")
def wide_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    folder = tmp_path_factory.mktemp("wide")
    return [sparse_npy(folder / f"w{i}.npy", 1000, 2048) for i in range(3)]


def test_a_run_that_cannot_fit_is_refused_in_one_line_before_any_work(
    tmp_path: Path, wide_files: list[Path], corpus_txt: Path, bert_dir: Path
) -> None:
    models = [f"--models=w{i}={p}" for i, p in enumerate(wide_files)]
    models = [m.replace("=/", "=precomputed:/", 1) for m in models]
    out = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    done = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "lmalgebra",
                "decompose",
                *models,
                "--corpus.paths",
                str(corpus_txt),
            ),
            *("--reference_tokenizer", str(bert_dir), "--spans.counts", "100000,10000,10000"),
            *("--spans.length", "8"),
            *("--scale.memory_gib", "1.0", "--out", str(out), "--cache_dir", str(tmp_path / "c")),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert "exact method with float64 statistics needs" in lines[0]
    assert "1.0 GiB are available" in lines[0] and "--scale.method reduced" in lines[0]
    assert "Traceback" not in done.stderr
    assert not (out / "summary.json").exists()
    assert not (tmp_path / "c" / "embeddings").exists()  # refused before anything was embedded


def test_spilled_covariance_is_the_covariance_mapped_from_a_file_removed_at_once(
    tmp_path: Path,
) -> None:
    rows = np.random.default_rng(0).normal(size=(300, 10)) + 4
    blocks = layout(["a", "b"], [4, 6])
    whole, other = SecondMoments(blocks), SecondMoments(blocks)
    whole.update(rows)
    other.update(rows)
    spilled = spill_covariance(whole, tmp_path / "train.npy")
    expected = SplitMoments.of(other)
    np.testing.assert_array_equal(spilled.cov, expected.cov)
    np.testing.assert_array_equal(spilled.mean, expected.mean)
    assert isinstance(spilled.cov, np.memmap) and not (tmp_path / "train.npy").exists()
    with pytest.raises(RuntimeError, match="spent"):
        whole.mean()


def run(texts: list[str], tmp_path: Path, **options: object) -> lmalgebra.Decomposition:
    rng = np.random.default_rng(1)
    table = lmalgebra.spans({}, texts, **SHAPE, reference_tokenizer=str(options["tokenizer"]))
    latent = rng.normal(size=(len(table), 6))
    arrays = {
        name: (latent @ rng.normal(size=(6, 20)) + 0.3 * rng.normal(size=(len(table), 20)) + 7)
        for name in ("a", "b", "c")
    }
    extra = {k: v for k, v in options.items() if k != "tokenizer"}
    return lmalgebra.decompose(
        arrays,
        texts,
        **SHAPE,
        reference_tokenizer=str(options["tokenizer"]),
        cache_dir=tmp_path / "cache",
        progress=False,
        **extra,
    )


def test_covariances_spilled_when_memory_is_short_give_the_same_fits(
    tmp_path: Path, bert_dir: Path
) -> None:
    texts = documents(120)
    plain = run(texts, tmp_path, tokenizer=bert_dir)
    shape = Layout(
        [20, 20, 20],
        dict(zip(("train", "validation", "test"), SHAPE["spans"]["counts"], strict=True)),
        {},
    )
    in_memory = OVERHEAD + max(p.peak for p in exact_phases(shape, "float64", False))
    spilled = OVERHEAD + max(p.peak for p in exact_phases(shape, "float64", True))
    assert spilled < in_memory
    memory = (spilled + in_memory) / 2 / GIB  # room for one split's statistics, not three
    spill = run(texts, tmp_path, tokenizer=bert_dir, scale={"memory_gib": memory})
    assert (spill.group - plain.group).abs().max().max() < 1e-12
    assert not any((tmp_path / "cache" / "scratch").glob("*"))  # nothing left behind


def test_float32_statistics_move_r2_within_the_stated_tolerance(
    tmp_path: Path, bert_dir: Path
) -> None:
    texts = documents(120)
    plain = run(texts, tmp_path, tokenizer=bert_dir)
    single = run(texts, tmp_path, tokenizer=bert_dir, scale={"precision": "float32"})
    assert single.method["precision"] == "float32"
    assert (single.group - plain.group).abs().max().max() < 1e-4
    difference = single.pairwise("test") - plain.pairwise("test")
    assert float(np.nanmax(np.abs(difference.to_numpy()))) < 1e-4


def test_reduced_run_records_its_method_and_k(tmp_path: Path, bert_dir: Path) -> None:
    texts = documents(120)
    reduced = run(texts, tmp_path, tokenizer=bert_dir, scale={"method": "reduced", "components": 8})
    method = reduced.method
    assert method["name"] == "reduced" and method["components"] == {"a": 8, "b": 8, "c": 8}
    assert set(method["error_estimate"]) == {"train", "validation", "test"}
    table = reduced.reduction
    assert set(table["model"]) == {"a", "b", "c"} and (table["components"] == 8).all()
    assert ((table["retained_variance"] > 0) & (table["retained_variance"] <= 1)).all()
    assert "reduced, k 8" in repr(reduced)
    saved = reduced.save(tmp_path / "saved")
    summary = json.loads((saved / "summary.json").read_text())
    assert summary["method"]["components"] == {"a": 8, "b": 8, "c": 8}
    assert lmalgebra.Decomposition.load(saved).reduction.shape == table.shape
    page = Path(reduced.report(tmp_path / "report.html")).read_text(encoding="utf-8")
    assert "reduced (float64): a k 8" in page and "estimated error" in page


def test_a_need_just_above_the_memory_is_told_apart_from_it(tmp_path: Path, bert_dir: Path) -> None:
    """Held to the plan's floor, a run needs a little more than it: the refusal had read
    "needs 0.6 GiB ... but 0.6 GiB are available" (both to one decimal)."""
    models = {"a": str(bert_dir), "b": f"random:{bert_dir}"}
    with pytest.raises(UserInputError) as refused:
        lmalgebra.decompose(
            models, documents(20), scale={"memory_gib": OVERHEAD / GIB}, out=tmp_path / "run"
        )
    assert "needs 0.6 GiB" not in str(refused.value)
    assert "but 0.600 GiB are available" in str(refused.value)
    # reached from Python as from the command line: the memory setting in both forms
    assert '--scale.memory_gib (scale={"memory_gib": GIB})' in str(refused.value)


def test_sketch_without_components_is_refused() -> None:
    with pytest.raises(UserInputError, match=r"sketch method needs scale\.components"):
        lmalgebra.decompose_plan({"a": np.eye(3, 2)}, scale={"method": "sketch"})


def test_the_dry_run_prints_the_plan_writes_nothing_and_refuses_what_the_run_would(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``decompose --dry-run``: the models' table and each method's phases, exit 0, no output
    directory and no cache; a corpus the run would refuse is refused by the dry run too."""
    from hostile_helpers import ANSI, assert_one_line, run_cli
    from lmalgebra.cli import main

    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--out", str(tmp_path / "run"), "--cache_dir", str(tmp_path / "cache"), "--dry-run"]
    monkeypatch.setattr(sys, "argv", ["lmalgebra", *args, "--corpus.paths", str(corpus_txt)])
    main()  # returns: exit status 0
    out = ANSI.sub("", capsys.readouterr().out)
    assert "Models (sizes from their configurations" in out and "exact (float64)" in out
    assert "group fits" in out and "reduced (float64" in out
    assert list(tmp_path.iterdir()) == []  # nothing written: no run, no cache
    missing = tmp_path / "nope.txt"
    code, stderr = run_cli([*args, "--corpus.paths", str(missing)], monkeypatch, capsys)
    assert_one_line(code, stderr, ["corpus", str(missing), "does not exist"])
    with pytest.raises(UserInputError, match="does not exist"):
        lmalgebra.decompose_plan({"a": str(bert_dir), "b": str(bert2_dir)}, str(missing))


@pytest.mark.parametrize("where", ["a file", "a merge run", "a merge run, --overwrite"])
def test_an_output_directory_the_run_refuses_the_dry_run_refuses_in_the_same_line(
    where: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from hostile_helpers import assert_one_line, digests, run_cli

    out = tmp_path / "out"
    if where == "a file":
        out.write_text("mine\n", encoding="utf-8")
    else:
        out.mkdir()
        (out / "recipe.yaml").write_text("objective: masked\n", encoding="utf-8")
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--out", str(out), "--cache_dir", str(tmp_path / "cache"), "--no-progress"]
    args += ["--overwrite"] if "overwrite" in where else []
    before = digests(tmp_path)
    lines = [
        assert_one_line(*run_cli([*args, *dry], monkeypatch, capsys), [str(out)])
        for dry in (["--dry-run"], [])
    ]
    assert lines[0] == lines[1]
    assert digests(tmp_path) == before


def test_the_dry_run_says_when_other_work_shares_the_machine(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The times are FLOPs over rates probed in a few seconds: on a loaded machine the run had
    taken 3-5x longer than the plan showed, without a word; a quiet one gets no note."""
    import os

    from hostile_helpers import ANSI
    from lmalgebra.cli import main

    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "run"), "--dry-run"]
    monkeypatch.setattr(sys, "argv", ["lmalgebra", *args, "--cache_dir", str(tmp_path / "c")])
    cores = len(os.sched_getaffinity(0))
    for load, said in ((4.0 * cores, True), (0.0, False)):
        monkeypatch.setattr(os, "getloadavg", lambda load=load: (load, load, load))
        main()
        out = " ".join(ANSI.sub("", capsys.readouterr().out).split())
        assert (f"the load average is {4.0 * cores:.1f} on {cores} cores" in out) is said
        assert ("may be several times short" in out) is said
