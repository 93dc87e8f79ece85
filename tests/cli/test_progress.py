"""Progress: a bar on a terminal, a log line now and then elsewhere; the training bar shows loss
and tokens/s."""

from __future__ import annotations

import io
import logging
import sys

import pytest
import rich.progress
from rich.console import Console

from lmalgebra.core import progress
from lmalgebra.train.loop import _status


def test_training_status_shows_loss_and_tokens_per_second() -> None:
    record = {"step": 3, "loss": 2.34567, "tokens_per_s/en": 1000.4, "tokens_per_s/fr": 234.2}
    assert _status(record) == "loss 2.346, 1,235 tokens/s"


def test_bar_draws_the_status_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    real = rich.progress.Progress

    def to_screen(*columns: object, **options: object) -> object:
        console = Console(file=screen, force_terminal=True, width=120)
        return real(*columns, console=console, **{**options, "transient": False})

    monkeypatch.setattr(rich.progress, "Progress", to_screen)
    with progress.progress_bar("train", 4) as advance:
        advance(1, "loss 2.346, 1,235 tokens/s")
        advance(3)
    assert "train" in screen.getvalue() and "loss 2.346, 1,235 tokens/s" in screen.getvalue()


def test_bar_is_silent_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.progress_bar("train", 2) as advance:
        advance(2, "loss 1.000, 10 tokens/s")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_off_a_terminal_a_long_loop_logs_where_it_is(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    clock = iter([0.0, 30.0, 90.0, 100.0])  # start, then one reading per advance
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    caplog.set_level(logging.INFO, logger=progress.__name__)
    with progress.progress_bar("embed a", 4000) as advance:
        advance(1000)  # 30 s: under a minute since the start, no line
        advance(1000, "loss 3.100")  # 90 s: a line
        advance(2000)  # 100 s: 10 s since the last line
    assert [r.getMessage() for r in caplog.records] == [
        "embed a: 2,000/4,000 (50%) in 90.0 s, about 90.0 s left; loss 3.100"
    ]


def test_progress_off_logs_nothing(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(progress, "HEARTBEAT", 0.0)
    caplog.set_level(logging.INFO, logger=progress.__name__)
    with progress.progress_bar("embed a", 2, enabled=False) as advance:
        advance(2)
    assert caplog.records == []


def test_progress_line_in_minutes_and_without_a_total() -> None:
    assert progress.progress_line("train", 30, 120, 180.0) == (
        "train: 30/120 (25%) in 3.0 min, about 9.0 min left"
    )
    assert progress.progress_line("", 5, 0, 1.0) == "progress: 5/0"
