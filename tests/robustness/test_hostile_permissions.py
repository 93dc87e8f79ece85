"""Directories a command may not write: a sub-directory of the cache, or an output directory,
made read-only ends the command in one line naming it (exit 2), or the command does without it;
never a traceback.

The commands run in child processes that file permissions bind, forked from one process that
imported the toolkit once (``cli_fork_server.py``: a command costs its work, not Python's
start-up). As a user other than root permissions bind them; as root, each child drops the
capabilities that override them (``CAP_DAC_OVERRIDE`` and ``CAP_DAC_READ_SEARCH``, from every
one of its capability sets) and stays uid 0, so it still reads what root owns (the interpreter,
the fixtures). Where neither binds them (root without the right to drop a capability), the
tests are skipped.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fault_helpers import ForkServer
from hostile_helpers import ANSI, assert_one_line, run_cli

Runner = Callable[[list[str], Path], tuple[int, str]]


@pytest.fixture(scope="module")
def bound(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runner]:
    """``bound(ARGS, cache)``: ``lmalgebra ARGS`` in a child that file permissions bind, with
    ``cache`` as its cache; (exit status, stderr). Skips where permissions cannot bind: a
    command that writes into a read-only directory (``merge init``) must be refused there."""
    logs = tmp_path_factory.mktemp("bound-logs")
    server = ForkServer(logs)
    calls = iter(range(10**9))

    def run(args: list[str], cache: Path) -> tuple[int, str]:
        log = logs / f"{next(calls)}.log"
        code = server.run(args, log, env={"LMALGEBRA_CACHE": str(cache)}, bound=True)
        return code, ANSI.sub("", log.read_text(errors="replace"))

    probe = tmp_path_factory.mktemp("probe")
    probe.chmod(0o555)
    try:
        code, said = run(["merge", "init", str(probe / "merge.yaml")], probe / "cache")
    finally:
        probe.chmod(0o755)
    try:
        if code == 0:
            pytest.skip("file permissions do not bind here (root, whose override stays)")
        if code != 2 or str(probe) not in said:
            pytest.skip(f"file permissions cannot be made to bind here ({said.strip()[-300:]})")
        yield run
    finally:
        server.close()


@pytest.fixture
def read_only() -> Iterator[Callable[[Path], None]]:
    """``read_only(DIR)``: ``DIR`` and every directory below it made read-only (``0o555``) for
    the test, and writable again after it."""
    made: list[Path] = []

    def apply(directory: Path) -> None:
        for path in [directory, *(p for p in directory.rglob("*") if p.is_dir())]:
            path.chmod(0o555)
            made.append(path)

    yield apply
    for path in made:
        path.chmod(0o755)


def _decompose(bert_dir: Path, bert2_dir: Path, corpus: Path, counts: str, out: Path) -> list[str]:
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus), "-T", "8", "--spans.counts", counts]
    return [*args, "--out", str(out), "--no-progress"]


def _ends_well(code: int, stderr: str, directory: Path) -> None:
    """Done without the directory (exit 0), or one line naming a path inside it (exit 2)."""
    assert "Traceback" not in stderr, stderr
    if code != 0:
        assert_one_line(code, stderr, [str(directory)])


@pytest.mark.parametrize("part", ["embeddings", "spans", "hashes"])
def test_a_read_only_cache_directory_ends_in_one_line(
    part: str,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """A decomposition over a cache whose ``embeddings/``, ``spans/`` or ``hashes/`` cannot be
    written: what is there is read (the same run again passes), and an entry that would be new
    ends in one line naming it (``spans/`` had ended in safetensors' traceback)."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    first = _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", tmp_path / "first")
    code, stderr = run_cli(first, monkeypatch, capsys)
    assert code == 0, stderr
    read_only(cache / part)
    again = _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", tmp_path / "again")
    code, stderr = bound(again, cache)
    assert code == 0, stderr
    other = _decompose(bert_dir, bert2_dir, corpus_txt, "24,6,6", tmp_path / "other")
    _ends_well(*bound(other, cache), cache / part)


def test_a_read_only_hashes_directory_is_done_without(
    bert_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """Models never seen before, over a cache whose ``hashes/`` cannot be written: their
    hashes and architecture checks are computed and not remembered (the architecture check's
    memo had ended the run, naming its temporary file)."""
    cache = tmp_path / "cache"
    (cache / "hashes").mkdir(parents=True)
    read_only(cache / "hashes")
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"g={gpt2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    code, stderr = bound([*args, "--out", str(tmp_path / "out"), "--no-progress"], cache)
    assert code == 0, stderr
    assert not list((cache / "hashes").iterdir())


def test_a_read_only_gguf_cache_ends_in_one_line(
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """A GGUF model to dequantise into a ``gguf/`` that cannot be written: one line naming it."""
    from gguf_fixtures import tiny_llama, write_llama_gguf

    cache = tmp_path / "cache"
    (cache / "gguf").mkdir(parents=True)
    read_only(cache / "gguf")
    path = write_llama_gguf(*tiny_llama(), tmp_path / "tiny-llama.gguf")
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={gpt2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    code, stderr = bound([*args, "--out", str(tmp_path / "out"), "--no-progress"], cache)
    assert_one_line(code, stderr, [str(cache / "gguf")])


def test_a_read_only_output_directory_ends_in_one_line(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """Every command that writes, into a directory it may not write or below one, and over a
    finished run made read-only: one line naming the directory, before any work."""
    import yaml

    from hostile_helpers import one_word_treebank
    from merge_fixtures import write_recipe

    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    finished = tmp_path / "finished"
    code, stderr = run_cli(
        _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", finished), monkeypatch, capsys
    )
    assert code == 0, stderr
    bank = one_word_treebank(tmp_path / "bank")
    recipe = write_recipe(tmp_path, teacher_dirs)
    locked = tmp_path / "locked"
    locked.mkdir()
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    inside = tmp_path / "inside.yaml"
    inside.write_text(yaml.safe_dump({**data, "output_dir": str(locked / "run")}), "utf-8")
    read_only(locked)
    read_only(finished)
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--training.steps", "2", "--no-progress"]
    cases = {
        locked: [
            _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", locked),
            _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", locked / "run"),
            [
                "spans",
                *_decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", locked / "l.jsonl")[1:-1],
            ],
            ["report", str(finished), "--out", str(locked / "report.html")],
            ["merge", "prepare", str(inside), "--no-progress"],
            [*pretrain, "--out", str(locked / "teacher")],
            ["evaluate-pos", str(bank), "--models", f"a={bert_dir}", "--out", str(locked / "pos")],
            ["merge", "init", str(locked / "merge.yaml")],
        ],
        finished: [
            ["report", str(finished)],
            _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", finished),
            [*_decompose(bert_dir, bert2_dir, corpus_txt, "24,6,6", finished), "--overwrite"],
        ],
    }
    for directory, commands in cases.items():
        for args in commands:
            code, stderr = bound(args, cache)
            line = assert_one_line(code, stderr, [str(directory)])
            assert "writable" in line or "Permission denied" in line, line


def test_an_unreadable_input_ends_in_one_line(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
    bound: Runner,
) -> None:
    """A corpus, a recipe or a model's file that may not be read: one line naming it, nothing
    written (the recipe, a command-line argument, in the parser's usage-error form)."""
    from merge_fixtures import write_recipe

    corpus = tmp_path / "secret.txt"
    corpus.write_text(corpus_txt.read_text(encoding="utf-8"), encoding="utf-8")
    recipe = write_recipe(tmp_path, teacher_dirs)
    model = tmp_path / "model"
    shutil.copytree(bert2_dir, model)
    config = model / "config.json"
    for path in (corpus, recipe, config):
        path.chmod(0)
    cases = {
        corpus: _decompose(bert_dir, bert2_dir, corpus, "20,5,5", tmp_path / "a"),
        config: _decompose(bert_dir, model, corpus_txt, "20,5,5", tmp_path / "b"),
        recipe: ["merge", "prepare", str(recipe), "--no-progress"],
    }
    for culprit, args in cases.items():
        code, stderr = bound(args, tmp_path / "cache")
        if culprit == recipe:
            last = stderr.rstrip().splitlines()[-1]
            assert code == 2 and "Traceback" not in stderr, stderr
            assert str(culprit) in last and "not readable" in last, stderr
            continue
        line = assert_one_line(code, stderr, [str(culprit)])
        assert "readable" in line or "Permission denied" in line, line
    assert not any((tmp_path / name).exists() for name in ("a", "b"))


def test_a_read_only_directory_below_a_run_or_the_cache_ends_in_one_line(
    teacher_dirs: dict[str, Path],
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """Below a run it may write (a student's ``model/`` or ``checkpoints/``, ``vocab/``) and
    below the cache (``gguf/`` holding a damaged entry to build again): one line naming the
    path, exit 2; each had ended in a ``PermissionError`` traceback."""
    from hostile_helpers import built_store

    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    recipe = built_store(tmp_path, teacher_dirs)
    code, stderr = run_cli(["merge", "train", str(recipe), "--no-progress"], monkeypatch, capsys)
    assert code == 0, stderr
    run = tmp_path / "run"
    embed, _ = _damaged_gguf_entry(cache, gpt2_dir, corpus_txt, tmp_path, monkeypatch, capsys)
    train = ["merge", "train", str(recipe), "--restart", "--no-progress"]
    cases = [
        (run / "student" / "model", train),
        (run / "student" / "checkpoints", train),
        (run / "vocab", ["merge", "vocab", str(recipe)]),
        (cache / "gguf", [*embed, "--out", str(tmp_path / "d2"), "--no-progress"]),
    ]
    for directory, args in cases:
        if directory.name == "vocab":  # built again, into a directory it may not write
            (directory / "complete.json").unlink()
        read_only(directory)
        code, stderr = bound(args, cache)
        line = assert_one_line(code, stderr, [str(directory)])
        # the cache's gguf/ is checked before the model is built, as the dry run checks it
        assert "Permission denied" in line or "is not writable" in line, line
        directory.chmod(0o755)


def test_a_damaged_read_only_gguf_entry_is_built_again_and_leaves_nothing_behind(
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """A damaged dequantised entry that its owner made read-only (``gguf/`` itself writable) is
    built again, and the damaged copy set aside is removed whole: it had stayed in ``gguf/`` as
    ``.NAME.tmp-damaged-PID``, its files not removable."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    embed, entry = _damaged_gguf_entry(cache, gpt2_dir, corpus_txt, tmp_path, monkeypatch, capsys)
    read_only(entry)
    code, stderr = bound([*embed, "--out", str(tmp_path / "b"), "--no-progress"], cache)
    assert code == 0, stderr
    assert sorted(p.name for p in (cache / "gguf").iterdir() if p.is_dir()) == [entry.name]
    assert not list((cache / "gguf").glob(".*tmp-*"))


def _damaged_gguf_entry(
    cache: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> tuple[list[str], Path]:
    """A tiny GGUF model decomposed once (dequantised into ``cache``), then its entry damaged:
    the decomposition's arguments (without ``--out``) and the entry."""
    from gguf_fixtures import tiny_llama, write_llama_gguf

    path = write_llama_gguf(*tiny_llama(), tmp_path / "tiny-llama.gguf")
    embed = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={gpt2_dir}"]
    embed += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    code, stderr = run_cli(
        [*embed, "--out", str(tmp_path / "first"), "--no-progress"], monkeypatch, capsys
    )
    assert code == 0, stderr
    (entry,) = [p for p in (cache / "gguf").iterdir() if p.is_dir()]
    (entry / "model.safetensors").write_bytes(b"cut")
    return embed, entry


def test_merge_verify_checks_a_run_it_may_not_write(
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """``merge verify`` reads a run: one it may not write (a read-only copy, another user's)
    whose teachers' files were touched since (their remembered hashes to compute again) had
    been reported as "cannot be checked against its teachers", the memo unwritable."""
    from hostile_helpers import built_store
    from lmalgebra.distill.layout import RunLayout

    teachers = {name: tmp_path / name for name in teacher_dirs}
    for name, path in teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    recipe = built_store(tmp_path, teachers)
    run = tmp_path / "run"
    for path in teachers.values():
        (path / "model.safetensors").touch()  # a new time: its remembered hash is not used
    read_only(run)
    code, stderr = bound(["merge", "verify", str(run)], tmp_path / "cache")
    assert code == 0, stderr
    assert not any(RunLayout(run).hashes.glob(".*tmp-*")), recipe


def test_a_report_of_a_read_only_run_says_it_draws_into_the_run(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """``report RUN --out ELSEWHERE`` of a run that cannot be written (a colleague's, a
    read-only mount) had been refused as "output directory RUN is not writable", the page's
    place being elsewhere: its figures go into the run."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    run = tmp_path / "run"
    code, stderr = run_cli(
        _decompose(bert_dir, bert2_dir, corpus_txt, "20,5,5", run), monkeypatch, capsys
    )
    assert code == 0, stderr
    read_only(run)
    code, stderr = bound(["report", str(run), "--out", str(tmp_path / "page.html")], cache)
    assert_one_line(code, stderr, [f"run directory {run} is not writable", "draws its figures"])


def test_a_read_only_mined_maps_directory_is_named(
    causal_teacher_dirs: dict[str, Path],
    tmp_path: Path,
    bound: Runner,
    read_only: Callable[[Path], None],
) -> None:
    """Training a causal student over a cache whose ``mined-maps/`` cannot be written (the
    MinED maps of teachers onto the student's vocabulary): one line naming the map's file
    there, not the temporary file it is written to first, and no student saved."""
    from causal_fixtures import taught_causal_recipe

    cache = tmp_path / "cache"
    (cache / "mined-maps").mkdir(parents=True)
    read_only(cache / "mined-maps")
    training = {"steps": 2, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 2}
    recipe = taught_causal_recipe(tmp_path, causal_teacher_dirs, training)
    code, stderr = bound(["merge", "train", str(recipe), "--no-progress"], cache)
    line = assert_one_line(code, stderr, [str(cache / "mined-maps")])
    assert ".tmp-" not in line, line
    assert not (tmp_path / "run" / "student" / "model").exists()
