"""Ctrl-C: one line, exit status 130, and the same command resumes as after ``kill -9``.

Typer, outside standalone mode, turns a KeyboardInterrupt into a *returned* exit code, which the
entry point used to drop (status 0, nothing printed). Here the interrupt is raised inside each
command that meets it in practice, in-process, and once sent as a real SIGINT to a real process.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hostile_helpers import INTERRUPTED, built_store, digests, one_word_treebank, run_cli
from lmalgebra.distill.masked.student_data import StoreBatches
from lmalgebra.distill.pretrain.masked import TextBatches
from tiny import documents


def _interrupt_at(index: int):
    def batch(self, i):
        if i == index:
            raise KeyboardInterrupt
        return batch.real(self, i)

    return batch


def assert_interrupted(code: int, stderr: str) -> None:
    assert code == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.rstrip().splitlines()[-1] == INTERRUPTED, stderr


@pytest.fixture(scope="module")
def recipe(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    return built_store(tmp_path_factory.mktemp("interrupt"), teacher_dirs)


def test_merge_train_interrupted_resumes_to_identical_weights(
    recipe: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run = recipe.parent / "run"
    code, stderr = run_cli(["merge", "train", str(recipe), "--name", "ref"], monkeypatch, capsys)
    assert code == 0, stderr
    batch = _interrupt_at(4)  # after the step-3 checkpoint, during step 5
    batch.real = StoreBatches.batch  # type: ignore[attr-defined]
    monkeypatch.setattr(StoreBatches, "batch", batch)
    args = ["merge", "train", str(recipe), "--name", "cut", "--no-progress"]
    assert_interrupted(*run_cli(args, monkeypatch, capsys))
    kept = digests(run / "cut" / "checkpoints")
    assert sorted({k.split("/")[0] for k in kept}) == ["step-0000003"]
    assert not (run / "cut" / "model").exists()  # nothing marked complete
    monkeypatch.setattr(StoreBatches, "batch", batch.real)  # type: ignore[attr-defined]
    code, stderr = run_cli(args, monkeypatch, capsys)
    assert code == 0, stderr
    a = load_file(str(run / "ref" / "model" / "model.safetensors"))
    b = load_file(str(run / "cut" / "model" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_pretrain_interrupted_exits_130_and_leaves_its_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(documents(60)) + "\n", encoding="utf-8")
    batch = _interrupt_at(6)
    batch.real = TextBatches.batch  # type: ignore[attr-defined]
    monkeypatch.setattr(TextBatches, "batch", batch)
    out = tmp_path / "teacher"
    args = [
        "pretrain",
        "masked",
        "--corpus.paths",
        str(corpus),
        "--language",
        "xx",
        "--tokenizer.vocab_size",
        "120",
    ]
    args += [
        "--out",
        str(out),
        "--training.steps",
        "10",
        "--model.hidden_size",
        "16",
        "--example_length",
        "32",
    ]
    args += ["--training.batch_size", "4", "--no-progress"]
    assert_interrupted(*run_cli(args, monkeypatch, capsys))
    assert (out / "training" / "checkpoints" / "step-0000006").is_dir()
    assert not (out / "lmalgebra.json").exists()


def test_decompose_interrupted_exits_130(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    import lmalgebra.sources.embed

    def stop(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(lmalgebra.sources.embed, "embed", stop)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--out", str(tmp_path / "out"), "--no-progress"]
    assert_interrupted(*run_cli(args, monkeypatch, capsys))
    assert not (tmp_path / "out" / "summary.json").exists()


def _as_a_shell_starts_it() -> None:
    """What a user's shell gives a command: SIGINT at its default and not blocked. A child
    inherits both from the test runner's worker, where an earlier test's library may have left
    SIGINT ignored or blocked (Python then never installs its Ctrl-C handler)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def test_sigint_to_a_real_process(tmp_path: Path) -> None:
    """The way a user meets it: Ctrl-C (SIGINT) to ``python -m lmalgebra`` while it trains."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(documents(60)) + "\n", encoding="utf-8")
    out = tmp_path / "teacher"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "NO_COLOR": "1"}
    env["PYTHONFAULTHANDLER"] = "1"  # SIGABRT dumps every thread's stack: where a hang is
    command = [
        sys.executable,
        "-m",
        "lmalgebra",
        "pretrain",
        "masked",
        "--corpus.paths",
        str(corpus),
    ]
    command += [
        "--language",
        "xx",
        "--tokenizer.vocab_size",
        "120",
        "--out",
        str(out),
        "--training.steps",
        "100000",
    ]
    command += ["--model.hidden_size", "16", "--example_length", "32", "--training.batch_size", "4"]
    # how the test runner's worker holds SIGINT, which a child inherits (ignored or blocked)
    inherited = (signal.getsignal(signal.SIGINT), signal.pthread_sigmask(signal.SIG_BLOCK, []))
    process = subprocess.Popen(
        [*command, "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=_as_a_shell_starts_it,
    )
    deadline, log = time.monotonic() + 120, out / "training" / "train_log.jsonl"
    while not (log.is_file() and log.read_text()):  # training has logged its first steps
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        _, err = process.communicate(timeout=60)
        pytest.fail(
            f"still running 120 s after SIGINT (the worker's SIGINT handler and blocked signals: "
            f"{inherited}); its stacks:\n{err.decode()[-4000:]}"
        )
    stderr = err.decode()
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert stderr.rstrip().splitlines()[-1] == INTERRUPTED
    assert not (out / "lmalgebra.json").exists()


@pytest.mark.parametrize("cut", ["write_json_atomic", "write_table", "write_text_atomic"])
def test_evaluate_pos_killed_between_its_files_resumes(
    cut: str,
    bert_dir: Path,
    bert2_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The record (``pos_config.json``) and the tables are two files: stopped after either,
    the same command resumes, keeping the model it had finished. The record had been written
    last, so tables without it made a directory the next run refused."""
    import lmalgebra.evaluate.pos_results as results
    import lmalgebra.evaluate.pos_tagging as pos
    from lmalgebra.evaluate.pos_results import PosResult

    evaluated: list[str] = []

    def scored(ref, *args, **kwargs) -> PosResult:  # the tagger is tested elsewhere
        evaluated.append(ref.name)
        zeros = dict.fromkeys(PosResult.__dataclass_fields__, 0)
        return PosResult(**zeros | {"model": ref.name, "mode": "probe"})

    def killed(*args, **kwargs) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(pos, "_evaluate", scored)
    bank = one_word_treebank(tmp_path / "bank")
    args = ["evaluate-pos", str(bank), "--out", str(tmp_path / "pos"), "--no-progress"]
    args += ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    with monkeypatch.context() as patch:
        patch.setattr(results, cut, killed)
        code, stderr = run_cli(args, monkeypatch, capsys)
    assert code == 130, stderr
    code, stderr = run_cli(args, monkeypatch, capsys)
    assert code == 0, stderr
    # killed before its record, the first model is evaluated again; after it, kept
    assert evaluated == (["a", "a", "b"] if cut == "write_json_atomic" else ["a", "b"])


def test_a_ctrl_c_swallowed_by_a_finaliser_is_raised_again() -> None:
    """A SIGINT whose KeyboardInterrupt lands in a ``__del__`` is printed and ignored by Python;
    the interrupt is recorded, so the training loop's ``check`` between steps raises it."""
    from lmalgebra.core import interrupt

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupt.install()
        interrupt.check()  # nothing asked yet

        class Finaliser:
            def __del__(self) -> None:
                signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt: ignored

        Finaliser()  # collected at once: Python prints "Exception ignored in" and goes on
        with pytest.raises(KeyboardInterrupt):
            interrupt.check()
        interrupt.install()  # the next command starts clean
        interrupt.check()
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_copy_of_a_ctrl_c_on_the_heels_of_the_first_is_not_raised_again(monkeypatch) -> None:
    """A terminal's Ctrl-C reaches torchrun's workers twice (from the terminal, and forwarded by
    torchrun): the second KeyboardInterrupt had landed in the first one's handling, a traceback
    on the main rank. A copy that soon is dropped; a later one (the user insisting) is raised."""
    from lmalgebra.core import interrupt

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(interrupt, "REPEAT_S", 60.0)  # "soon" on a machine as slow as any
    try:
        interrupt.install()
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # the copy: nothing raised
        monkeypatch.setattr(interrupt, "REPEAT_S", 0.0)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)


EARLY = """
import runpy, sys

class Stop:  # Ctrl-C while the command line imports its modules (the first second)
    def find_spec(self, name, path=None, target=None):
        if name == "rich.console":
            raise KeyboardInterrupt

sys.meta_path.insert(0, Stop())
sys.argv = ["lmalgebra", "--help"]
runpy.run_module("lmalgebra", run_name="__main__")
"""


def test_a_ctrl_c_while_the_command_line_loads_is_one_line() -> None:
    """Ctrl-C in the first second of ``lmalgebra``, while it imports its modules, had ended in
    a traceback of the import machinery."""
    done = subprocess.run([sys.executable, "-c", EARLY], capture_output=True, text=True)
    assert_interrupted(done.returncode, done.stderr)


@pytest.mark.parametrize("shown", [False, True])
def test_a_ctrl_c_swallowed_by_a_finaliser_stops_every_loop(
    shown: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Outside training (``merge teach``, ``prepare``, embedding, evaluation) a Ctrl-C that
    landed in a finaliser had been lost: the command ran on to its end, exit 0. Every long loop
    advances a progress bar, shown or not, and its next advance raises it."""
    from lmalgebra.core import interrupt, progress

    monkeypatch.setattr(progress.sys.stderr, "isatty", lambda: shown)
    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupt.install()

        class Finaliser:
            def __del__(self) -> None:
                signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt: ignored

        with progress.progress_bar("teach xx/wp", 4) as advance:
            advance(1)
            Finaliser()  # collected at once: Python prints "Exception ignored in" and goes on
            with pytest.raises(KeyboardInterrupt):
                advance(1)
        interrupt.install()
    finally:
        signal.signal(signal.SIGINT, before)


TERMINATED_MID_EVALUATION = """
import signal, sys
import lmalgebra.evaluate.pos_tagging as pos

def stopped(*args, **kwargs):  # SIGTERM (a scheduler's time limit, `timeout`) mid-evaluation
    signal.raise_signal(signal.SIGTERM)

pos._evaluate = stopped
sys.argv = ["lmalgebra", "evaluate-pos", *sys.argv[1:]]
from lmalgebra.cli import main
main()
"""


def test_sigterm_is_taken_as_a_ctrl_c(bert_dir: Path, tmp_path: Path) -> None:
    """SIGTERM had ended a command at once: no line, its lock file and the directories it had
    made left behind. It now stops the command as Ctrl-C does, naming the signal, exit 143."""
    bank = one_word_treebank(tmp_path / "bank")
    out = tmp_path / "pos"
    args = [str(bank), "--models", f"a={bert_dir}", "--out", str(out), "--no-progress"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-c", TERMINATED_MID_EVALUATION, *args],
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 143, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.rstrip().splitlines()[-1]
    assert last == "terminated (SIGTERM); run the same command again to resume"
    assert not out.exists()  # taken back, its lock with it


def test_a_ctrl_c_during_an_import_of_an_api_call_leaves_the_module_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C landing while an API call imported torch or transformers (their first use in a
    notebook) cut the import half way: every later call of the kernel failed (``partially
    initialized module 'torch'``, an operator registered twice) until a restart. It is raised
    once the import is done, and the module imported is whole."""
    import importlib
    from typing import Any

    from lmalgebra.api.runtime import library_entry

    (tmp_path / "slow_import_21b.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.3)\n"
        "WHOLE = True\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    @library_entry
    def call(name: str) -> Any:
        module = importlib.import_module(name)
        time.sleep(2)  # the Ctrl-C, raised again once the import is done, lands here
        return module

    started = time.monotonic()
    with _pythons_own_handler(), pytest.raises(KeyboardInterrupt):
        call("slow_import_21b")
    assert time.monotonic() - started < 1.5
    assert sys.modules.pop("slow_import_21b").WHOLE


def test_a_ctrl_c_a_library_made_an_error_of_is_a_ctrl_c() -> None:
    """pydantic turns a ``KeyboardInterrupt`` raised in a serialiser into an error of its own,
    which a call had reworded as "MergeRun() recipe: CausalRecipe does not read back: ...
    KeyboardInterrupt": an error raised after a Ctrl-C in an API call is the Ctrl-C."""
    from lmalgebra.api.runtime import library_entry
    from lmalgebra.core.errors import UserInputError

    @library_entry
    def call() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(2)
        except KeyboardInterrupt as err:
            raise UserInputError(f"recipe does not read back: {err!r}") from None

    with _pythons_own_handler(), pytest.raises(KeyboardInterrupt):
        call()


@contextlib.contextmanager
def _pythons_own_handler() -> Iterator[None]:
    """SIGINT handled by Python's own handler (a notebook's) for the duration."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
