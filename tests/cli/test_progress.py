"""Progress bars: off unless on a terminal; the training bar shows loss and tokens/s."""

from __future__ import annotations

import io
import sys

import pytest
from rich.console import Console

from lmalgebra.core import progress
from lmalgebra.train.loop import _status


def test_training_status_shows_loss_and_tokens_per_second() -> None:
    record = {"step": 3, "loss": 2.34567, "tokens_per_s/en": 1000.4, "tokens_per_s/fr": 234.2}
    assert _status(record) == "loss 2.346, 1,235 tokens/s"


def test_bar_draws_the_status_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = io.StringIO()
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    real = progress.Progress

    def to_screen(*columns: object, **options: object) -> object:
        console = Console(file=screen, force_terminal=True, width=120)
        return real(*columns, console=console, **{**options, "transient": False})

    monkeypatch.setattr(progress, "Progress", to_screen)
    with progress.progress_bar("train", 4) as advance:
        advance(1, "loss 2.346, 1,235 tokens/s")
        advance(3)
    assert "train" in screen.getvalue() and "loss 2.346, 1,235 tokens/s" in screen.getvalue()


def test_bar_is_silent_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.progress_bar("train", 2) as advance:
        advance(2, "loss 1.000, 10 tokens/s")
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
