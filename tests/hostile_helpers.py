"""Helpers of the hostile-input tests: run a command in-process, check its one message line, and
fingerprint directories so a test can show that a refused command changed nothing."""

from __future__ import annotations

import contextlib
import hashlib
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmalgebra.cli import main
from lmalgebra.distill import pipeline
from lmalgebra.distill.recipe import load_recipe
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
INTERRUPTED = "interrupted; run the same command again to resume"


def run_main(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str, str]:
    """``lmalgebra ARGS`` through ``cli.main`` in this process: (exit status, stdout, stderr
    without colours)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(sys, "argv", ["lmalgebra", *args])
    capsys.readouterr()
    try:
        main()
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    else:
        code = 0
    captured = capsys.readouterr()
    return code, captured.out, ANSI.sub("", captured.err)


def run_cli(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """``lmalgebra ARGS`` through ``cli.main``: (exit status, stderr without colours)."""
    code, _, stderr = run_main(args, monkeypatch, capsys)
    return code, stderr


def assert_one_line(code: int, stderr: str, needles: list[str], status: int = 2) -> str:
    """Exit ``status``; stderr ends with exactly one ``error:`` line holding every needle."""
    assert code == status, stderr
    assert "Traceback" not in stderr, stderr
    lines = re.findall(r"^error: .*$", stderr, flags=re.MULTILINE)
    assert len(lines) == 1, stderr
    assert stderr.rstrip().endswith(lines[0]), f"message spans several lines:\n{stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    return lines[0]


def digests(root: Path) -> dict[str, str]:
    """sha256 of every file under ``root`` by relative path (the lock file left out)."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != ".lmalgebra.lock"
    }


def built_store(root: Path, teachers: dict[str, Path], **overrides: object) -> Path:
    """A recipe (tiny student, six steps, a checkpoint every three) whose store and vocabulary
    are built; its path."""
    settings: dict[str, object] = {"student": TINY_STUDENT, "training": TINY_TRAINING}
    path = write_recipe(root, teachers, **{**settings, **overrides})
    recipe = load_recipe(path)
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    pipeline.vocab(recipe)
    return path


LATIN1 = "caf\xe9 au lait, cr\xe8me br\xfbl\xe9e\n".encode("latin-1")  # 0xe9 at offset 3


def refused_before_embedding(
    cli,
    models: dict[str, Path],
    corpus: Path,
    flags: list[str],
    needles: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> str:
    """``decompose`` of ``models`` on ``corpus`` with ``flags`` (8-token spans, 20/5/5) ends in one
    line holding every needle, before anything is embedded: no cache, no output directory."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    args = ["decompose", *(f"--models={name}={path}" for name, path in models.items())]
    args += ["--corpus.paths", str(corpus), "-T", "8", "--spans.counts", "20,5,5", *flags]
    code, stderr = cli([*args, "--out", str(tmp_path / "out")])
    line = assert_one_line(code, stderr, needles)
    assert not cache.exists() and not (tmp_path / "out").exists()
    return line


def one_word_treebank(bank: Path) -> Path:
    """``bank`` made, holding a UD treebank of one noun per split (train, dev, test): what
    ``evaluate-pos`` reads, for tests that replace its scoring."""
    bank.mkdir()
    word = "\t".join(["1", "word", "_", "NOUN", *"______"])
    for split in ("train", "dev", "test"):
        (bank / f"x-ud-{split}.conllu").write_text(f"{word}\n\n", encoding="utf-8")
    return bank


class StillWaiting(BaseException):
    """A block ran past its deadline; no ``except Exception`` (nor ``OSError``, which a
    ``TimeoutError`` is) in the code under test swallows it."""


@contextlib.contextmanager
def deadline(seconds: int) -> Iterator[None]:
    """Fail, rather than hang the suite, when the block waits longer than ``seconds``."""

    def expired(signum: int, frame: object) -> None:
        raise StillWaiting(f"still waiting after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def blocked(path: Path, blocker: str) -> Path:
    """``path`` (a directory a command writes in) made a ``"file"`` or a ``"link to nothing"``
    (a link to a path beside it that does not exist)."""
    if blocker == "file":
        path.write_text("x\n", encoding="utf-8")
    else:
        path.symlink_to(path.with_name(f"{path.name}-gone"))
    return path
