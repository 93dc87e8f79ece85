"""A finished decomposition run damaged afterwards (a table cut short at a line break, a file
deleted or edited, moments cut short): ``report`` and ``Decomposition.load`` refuse it with one
line naming the file, instead of reading what is left as if it were the run (an empty group
table, a report without its group section)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hostile_helpers import assert_one_line, digests, run_cli
from lmalgebra import Decomposition, UserInputError, decompose
from lmalgebra.lmd.rundir.schema import FILES
from tiny import documents


@pytest.fixture(scope="module")
def finished(bert_dir: Path, bert2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("finished")
    decompose(
        {"a": str(bert_dir), "b": str(bert2_dir)},
        documents(60),
        spans={"length": 8, "counts": (40, 10, 10)},
        cache_dir=root / "cache",
        out=root / "run",
        progress=False,
        save_statistics=True,
    )
    return root / "run"


def _half_lines(path: Path) -> None:
    """Keep the header and the first half of the rows: still a valid CSV, silently short."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    path.write_text("".join(lines[: max(1, len(lines) // 2)]), encoding="utf-8")


def _cut_bytes(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _edit_one_digit(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    at = next(i for i, c in enumerate(text) if c in "12345678")
    path.write_text(text[:at] + str(int(text[at]) + 1) + text[at + 1 :], encoding="utf-8")


DAMAGE: dict[str, tuple[str, Callable[[Path], None], str]] = {
    "fits_cut_at_a_line": ("fits.csv", _half_lines, "bytes where summary.json records"),
    "group_cut_at_a_line": ("group_r2.csv", _half_lines, "bytes where summary.json records"),
    "fits_one_digit_changed": ("fits.csv", _edit_one_digit, "other contents"),
    "config_cut": ("config.yaml", _cut_bytes, "bytes where summary.json records"),
    "moments_cut": ("stats/test.safetensors", _cut_bytes, "bytes where summary.json records"),
    "nulls_deleted": ("nulls.csv", lambda p: p.unlink(), "is missing (summary.json records it)"),
    # what stands in a recorded file's place is named, not called missing
    "fits_a_fifo": (
        "fits.csv",
        lambda p: _replaced(p, os.mkfifo),
        "is not a regular file (a FIFO, socket or device)",
    ),
    "moments_a_directory": (
        "stats/test.safetensors",
        lambda p: _replaced(p, Path.mkdir),
        "is a directory",
    ),
    "config_a_dangling_link": (
        "config.yaml",
        lambda p: _replaced(p, lambda q: q.symlink_to(q.parent / "gone")),
        "is a symbolic link to",
    ),
}


def _replaced(path: Path, make: Callable[[Path], object]) -> None:
    path.unlink()
    make(path)


@pytest.fixture
def damaged(request: pytest.FixtureRequest, finished: Path, tmp_path: Path) -> tuple[Path, str]:
    name, damage, said = DAMAGE[request.param]
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    damage(run / name)
    return run / name, said


@pytest.mark.parametrize("damaged", list(DAMAGE), indirect=True)
def test_report_refuses_a_damaged_run(
    damaged: tuple[Path, str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path, said = damaged
    run = next(p for p in path.parents if (p / "summary.json").is_file())
    before = digests(run)
    code, stderr = run_cli(["report", str(run)], monkeypatch, capsys)
    assert_one_line(code, stderr, [str(path), said, "run it again"])
    assert not (run / "report.html").exists()
    assert digests(run) == before


@pytest.mark.parametrize("damaged", list(DAMAGE), indirect=True)
def test_load_refuses_a_damaged_run(damaged: tuple[Path, str]) -> None:
    path, said = damaged
    run = next(p for p in path.parents if (p / "summary.json").is_file())
    with pytest.raises(UserInputError) as caught:
        Decomposition.load(run)
    assert str(path) in str(caught.value) and said in str(caught.value)


def test_an_undamaged_run_reads_as_written(finished: Path, tmp_path: Path) -> None:
    """The record covers the tables, configuration, provenance and moments, and a report drawn
    afterwards (figures, report.html) does not count as damage."""
    recorded = json.loads((finished / "summary.json").read_text(encoding="utf-8"))[FILES]
    assert {"fits.csv", "group_r2.csv", "config.yaml", "stats/test.safetensors"} <= set(recorded)
    assert not any(name.startswith("plots/") for name in recorded)
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    Decomposition.load(run).report()
    loaded = Decomposition.load(run)  # after the report wrote its figures and page
    assert FILES not in loaded.summary
    assert not loaded.group.empty


def _edit_summary(run: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    edit(summary)
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")


@pytest.mark.parametrize(
    "edit",
    [
        lambda s: s.update(models=s["models"][:1]),  # read as a run of one model
        lambda s: s.update(alpha={"value": "x"}),  # ValueError from Decomposition.alpha
        lambda s: s.pop("models"),  # KeyError from Decomposition.names
    ],
    ids=["models_cut", "alpha_not_a_number", "models_removed"],
)
def test_a_summary_edited_since_is_refused(
    edit: Callable[[dict[str, Any]], None],
    finished: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``summary.json`` carries a checksum of itself: a field edited in a way that stays
    well-formed JSON had been read as the run's (the report and ``names`` of a model less) or
    raised from deep inside the API."""
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _edit_summary(run, edit)
    with pytest.raises(UserInputError, match=r"summary\.json is damaged: edited since"):
        Decomposition.load(run)
    code, stderr = run_cli(["report", str(run)], monkeypatch, capsys)
    assert_one_line(code, stderr, [str(run / "summary.json"), "edited since"])
    assert not (run / "report.html").exists()


def test_a_summary_without_its_checksum_is_read_as_an_older_run(
    finished: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished, run)
    _edit_summary(run, lambda s: s.pop("sha256"))
    assert Decomposition.load(run).names == ["a", "b"]


@pytest.mark.parametrize("torn", ["cut short", "run on"])
def test_a_table_row_torn_short_or_run_on_is_refused_by_line(torn: str, tmp_path: Path) -> None:
    """A table row with fewer cells than its header (cut short mid-line) had its missing cells
    read as empty: ``merge bits-per-byte`` kept a torn row of another model beside its own,
    its bits per byte cut to a few digits and its bits per character NaN. A row of fewer or
    more cells than the header is refused, naming the file and line (``merge bits-per-byte``
    says so and writes its table again from its own rows)."""
    from lmalgebra.distill.causal.bits_per_byte import SCORED
    from lmalgebra.storage.csv_tables import read_table

    header = ",".join(SCORED.columns)
    whole = "xx,s,5,1010,0,1500,1500,5389.1,5.183219879385305,5.183219879385305,ref,digest,256"
    row = whole[: whole.index("5.18") + 6] if torn == "cut short" else f"{whole},more"
    (tmp_path / SCORED.file).write_text(f"{header}\n{whole}\n{row}", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"scored_bits_per_byte\.csv, line 3: \d+ cells"):
        read_table(tmp_path, SCORED)
