"""Global command-line options: --version, -h everywhere, -v/-q, and the top-level help."""

from __future__ import annotations

import logging
import sys

import pytest

from lmalgebra import __version__
from lmalgebra.cli import main


def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str):
    monkeypatch.setattr(sys, "argv", ["lmalgebra", *args])
    try:
        main()
    except SystemExit as stop:
        code = int(stop.code or 0)
    else:
        code = 0
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_version(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(monkeypatch, capsys, "--version")
    assert code == 0 and out.strip() == f"lmalgebra {__version__}"


@pytest.mark.parametrize(
    "command", [[], ["decompose"], ["spans"], ["report"], ["merge"], ["merge", "train"]]
)
def test_short_help_everywhere(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code, out, _ = run(monkeypatch, capsys, *command, "-h")
    assert code == 0 and "Usage:" in out


def test_top_level_help_describes_both_jobs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    _, out, _ = run(monkeypatch, capsys, "--help")
    assert "decompose" in out and "MergeDistill" in out and "Example:" in out
    assert "--install-completion" in out


@pytest.mark.parametrize(("flag", "level"), [("-v", logging.DEBUG), ("-q", logging.WARNING)])
def test_verbosity_sets_the_log_level(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str, level: int
) -> None:
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)  # restored after the test
    code, _, _ = run(monkeypatch, capsys, flag, "report", "-h")
    assert code == 0 and root.level == level


def test_verbose_and_quiet_exclude_each_other(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(monkeypatch, capsys, "-v", "-q", "report", "x")
    assert code == 2 and "exclude each other" in err
