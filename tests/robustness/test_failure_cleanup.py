"""A command that fails leaves no directory it created behind.

For every command that writes, a failure found after its output directory was made (a model that
cannot be loaded, a corpus that is not UTF-8, a disk that fills up, a step that stops) leaves the
file tree as it was before the command: no new directory, no copy of the recipe, no memoised
hashes. Only the steps a command finished stay (the demo's corpora), for the next run to resume.
``tidy_on_failure`` itself is tested at the end.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

import lmalgebra
from hostile_helpers import LATIN1, assert_one_line, one_word_treebank, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.storage.output_paths import LOCK_NAME, tidy_on_failure
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe


def tree(root: Path) -> set[str]:
    """Every file and directory under ``root`` (relative; lock files left out)."""
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.name != LOCK_NAME}


@pytest.fixture(scope="module")
def merge_done(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    """A recipe whose run went through every stage to a trained student; its path."""
    root = tmp_path_factory.mktemp("cleanup-merge")
    path = write_recipe(root, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)
    lmalgebra.merge(
        path, ["prepare", "teach", "vocab", "train"], students={"student": {"steps": 2}}
    )
    return path


@pytest.fixture(scope="module")
def lmd_run(tmp_path_factory: pytest.TempPathFactory, bert_dir: Path, corpus_txt: Path) -> Path:
    """A finished decomposition run directory."""
    root = tmp_path_factory.mktemp("cleanup-lmd")
    models = {"a": str(bert_dir), "b": f"random:{bert_dir}"}
    texts, out = str(corpus_txt), root / "run"
    lmalgebra.decompose(
        models, texts, spans={"length": 8, "counts": (20, 5, 5)}, out=out, cache_dir=root
    )
    return out


@dataclass
class Context:
    tmp: Path
    monkeypatch: pytest.MonkeyPatch
    fixtures: dict[str, Any]


def _disk_full(ctx: Context) -> None:
    """Every fsync from now on reports a full disk, as a real one does at the first write."""

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    ctx.monkeypatch.setattr(os, "fsync", full)


def _stop(ctx: Context, module: Any, name: str) -> None:
    """``module.name`` stops the command with a bad-input error."""

    def stop(*args: Any, **kwargs: Any) -> None:
        raise UserInputError(f"stopped in {name}")

    ctx.monkeypatch.setattr(module, name, stop)


def _merge_copy(ctx: Context, teachers: dict[str, Path] | None = None) -> Path:
    """A copy of the finished merge run in ``tmp/run``, with a recipe that points to it (and to
    other teacher directories, if given)."""
    source: Path = ctx.fixtures["merge_done"]
    data = yaml.safe_load(source.read_text(encoding="utf-8"))
    shutil.copytree(data["output_dir"], ctx.tmp / "run")
    data["output_dir"] = str(ctx.tmp / "run")
    data["teachers"].update({k: {"path": str(v)} for k, v in (teachers or {}).items()})
    path = ctx.tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _bad_corpus_recipe(ctx: Context) -> Path:
    """A recipe for a new run directory whose first language's corpus is not UTF-8."""
    teachers: dict[str, Path] = ctx.fixtures["teacher_dirs"]
    path = write_recipe(ctx.tmp, teachers, output_dir=str(ctx.tmp / "new" / "run"))
    (ctx.tmp / "xx.txt").write_bytes(LATIN1)
    return path


def decompose(ctx: Context) -> list[str]:
    bert: Path = ctx.fixtures["bert_dir"]
    broken = ctx.tmp / "broken-model"  # found weightless once the run has begun, by its hash
    shutil.copytree(bert, broken)
    (broken / "model.safetensors").unlink()
    args = ["decompose", "--models", f"a={bert}", "--models", f"b={broken}"]
    args += [
        "--corpus.paths",
        str(ctx.fixtures["corpus_txt"]),
        "-T",
        "8",
        "--spans.counts",
        "20,5,5",
    ]
    return [*args, "--no-progress", "--out", str(ctx.tmp / "new" / "run")]


def demo_lmd(ctx: Context) -> list[str]:
    import lmalgebra.sources.embed

    _stop(ctx, lmalgebra.sources.embed, "embed")
    return ["demo-lmd", "--quick", "--no-progress", "--out", str(ctx.tmp / "new" / "lmd")]


def demo(ctx: Context) -> list[str]:
    import lmalgebra.demo.workflow as workflow

    def teachers(out: Path, *args: Any) -> dict[str, Path]:
        names = [f"teacher-{lang}" for lang in ("en", "fr", "es")] + [workflow.HEAD_TEACHER]
        return {name: out / name for name in names}  # none trained

    ctx.monkeypatch.setattr(workflow, "pretrain_teachers", teachers)
    _stop(ctx, workflow, "merge_and_train")  # once the merge directories are made
    return ["demo", "--quick", "--no-progress", "--out", str(ctx.tmp / "new" / "demo")]


def report(ctx: Context) -> list[str]:
    run = ctx.tmp / "lmd"
    shutil.copytree(ctx.fixtures["lmd_run"], run)
    shutil.rmtree(run / "plots", ignore_errors=True)  # a run draws figures only when asked
    _disk_full(ctx)
    return ["report", str(run), "--out", str(ctx.tmp / "new" / "report.html")]


def spans(ctx: Context) -> list[str]:
    _disk_full(ctx)
    args = [
        "spans",
        "--models",
        f"a={ctx.fixtures['bert_dir']}",
        "-T",
        "8",
        "--spans.counts",
        "20,5,5",
    ]
    args += ["--corpus.paths", str(ctx.fixtures["corpus_txt"])]
    return [*args, "--out", str(ctx.tmp / "new" / "spans.jsonl")]


def merge_init(ctx: Context) -> list[str]:
    _disk_full(ctx)
    return ["merge", "init", str(ctx.tmp / "new" / "merge.yaml")]


def merge_prepare(ctx: Context) -> list[str]:
    return ["merge", "prepare", str(_bad_corpus_recipe(ctx)), "--no-progress"]


def merge_run(ctx: Context) -> list[str]:
    return ["merge", "run", str(_bad_corpus_recipe(ctx)), "--no-progress"]


def merge_teach(ctx: Context) -> list[str]:
    teachers: dict[str, Path] = ctx.fixtures["teacher_dirs"]
    broken = ctx.tmp / "broken-wp"
    shutil.copytree(teachers["wp"], broken)
    (broken / "model.safetensors").write_bytes(b"not a weights file")
    recipe = _merge_copy(ctx, {"wp": broken})
    shutil.rmtree(ctx.tmp / "run" / "topk")  # teach it again, from the broken weights
    return ["merge", "teach", str(recipe), "--no-progress"]


def merge_vocab(ctx: Context) -> list[str]:
    teachers: dict[str, Path] = ctx.fixtures["teacher_dirs"]
    recipe = write_recipe(ctx.tmp, teachers, output_dir=str(ctx.tmp / "new" / "run"))
    return ["merge", "vocab", str(recipe)]  # nothing prepared: found after the teachers opened


def merge_train(ctx: Context) -> list[str]:
    import lmalgebra.train.loop

    _stop(ctx, lmalgebra.train.loop, "load_latest")
    return ["merge", "train", str(_merge_copy(ctx)), "--name", "other", "--no-progress"]


def merge_evaluate(ctx: Context) -> list[str]:
    import lmalgebra.distill.masked.scores as scores

    def full(*args: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    _merge_copy(ctx)
    ctx.monkeypatch.setattr(scores, "write_text_atomic", full)  # the first table of evaluation/
    return ["merge", "evaluate", str(ctx.tmp / "run")]


def pretrain(ctx: Context) -> list[str]:
    corpus = ctx.tmp / "latin1.txt"
    corpus.write_bytes(LATIN1)
    args = [
        "pretrain",
        "masked",
        "--corpus.paths",
        str(corpus),
        "--language",
        "xx",
        "--tokenizer.vocab_size",
        "100",
    ]
    return [*args, "--out", str(ctx.tmp / "new" / "teacher"), "--no-progress"]


def evaluate_pos(ctx: Context) -> list[str]:
    import lmalgebra.evaluate.pos_tagging as pos
    from lmalgebra.evaluate.pos_results import PosResult

    bank = one_word_treebank(ctx.tmp / "bank")
    fields = PosResult.__dataclass_fields__
    result = PosResult(**{name: 0 for name in fields} | {"model": "a", "mode": "probe"})
    ctx.monkeypatch.setattr(pos, "_evaluate", lambda *args, **kwargs: result)
    _disk_full(ctx)
    args = ["evaluate-pos", str(bank), "--models", f"a={ctx.fixtures['bert_dir']}"]
    return [*args, "--out", str(ctx.tmp / "new" / "pos"), "--no-progress"]


Case = Callable[[Context], list[str]]
CASES: dict[str, tuple[Case, str]] = {
    "decompose": (decompose, "no weight files"),
    "demo-lmd": (demo_lmd, "stopped in embed"),
    "demo": (demo, "stopped in merge_and_train"),
    "report": (report, "no space left"),
    "spans": (spans, "no space left"),
    "merge init": (merge_init, "no space left"),
    "merge prepare": (merge_prepare, "not UTF-8"),
    "merge run": (merge_run, "not UTF-8"),
    "merge teach": (merge_teach, "teacher 'wp'"),
    "merge vocab": (merge_vocab, "merge prepare RECIPE"),
    "merge train": (merge_train, "stopped in load_latest"),
    "merge evaluate": (merge_evaluate, "no space left"),
    "pretrain": (pretrain, "not UTF-8"),
    "evaluate-pos": (evaluate_pos, "no space left"),
}
# what a failed command may leave: the steps it finished (the demo's corpora and merge recipes)
FINISHED = {"demo": {"new", "new/demo", "new/demo/data"}}


@pytest.mark.parametrize("command", list(CASES))
def test_a_failed_command_leaves_no_new_directory(
    command: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    needed = ["bert_dir", "corpus_txt", "teacher_dirs"]
    needed += {"merge": ["merge_done"], "report": ["lmd_run"]}.get(command.split()[0], [])
    fixtures = {name: request.getfixturevalue(name) for name in needed}
    cache = tmp_path / "cache"  # a cache directory the command would create
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    case, message = CASES[command]
    args = case(Context(tmp_path, monkeypatch, fixtures))
    before = tree(tmp_path)
    code, stderr = run_cli(args, monkeypatch, capsys)
    assert_one_line(code, stderr, [message])
    new = tree(tmp_path) - before
    kept = FINISHED.get(command, set())
    assert {p for p in new if (tmp_path / p).is_dir()} <= kept, sorted(new)
    assert all(Path(p).parent.as_posix() in kept for p in new if not (tmp_path / p).is_dir())
    assert not cache.exists()


# --- tidy_on_failure itself -------------------------------------------------------------------


def test_success_keeps_everything_and_failure_only_what_it_did_not_create(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "kept").mkdir(parents=True)
    (old / "recipe.yaml").write_text("the user's\n", encoding="utf-8")
    with tidy_on_failure(old, tmp_path / "a" / "b", scratch=("recipe.yaml", "memo/*")):
        (old / "made" / "deeper").mkdir(parents=True)
        (tmp_path / "a" / "b").mkdir(parents=True)
    assert (old / "made" / "deeper").is_dir() and (tmp_path / "a" / "b").is_dir()
    with pytest.raises(RuntimeError), tidy_on_failure(old, tmp_path / "x" / "y"):
        (old / "new" / "deeper").mkdir(parents=True)
        (tmp_path / "x" / "y" / "z").mkdir(parents=True)
        raise RuntimeError("late failure")
    assert not (old / "new").exists() and not (tmp_path / "x").exists()
    assert (old / "kept").is_dir() and (old / "recipe.yaml").read_text() == "the user's\n"


def test_scratch_goes_only_when_it_is_all_that_was_written(tmp_path: Path) -> None:
    run = tmp_path / "run"
    scratch = ("recipe.yaml", "memo/*")
    with pytest.raises(KeyboardInterrupt), tidy_on_failure(run, scratch=scratch):
        (run / "memo").mkdir(parents=True)
        (run / "memo" / "a.hash").write_text("0" * 64)
        (run / "recipe.yaml").write_text("copy\n")
        raise KeyboardInterrupt
    assert not run.exists()
    with pytest.raises(RuntimeError), tidy_on_failure(run, scratch=scratch):
        (run / "memo").mkdir(parents=True)
        (run / "recipe.yaml").write_text("copy\n")
        (run / "shard-00000.arrow").write_bytes(b"finished work")
        raise RuntimeError("late failure")
    assert tree(run) == {"recipe.yaml", "shard-00000.arrow"}  # empty memo/ went, work stayed


def test_a_file_outputs_directory_is_not_listed_only_its_missing_parents_go(
    tmp_path: Path,
) -> None:
    here = tmp_path / "work"  # the user's working directory, say: never listed, never touched
    (here / "project" / "empty").mkdir(parents=True)
    with pytest.raises(RuntimeError), tidy_on_failure(here, here / "new" / "dir", deep=False):
        (here / "new" / "dir").mkdir(parents=True)
        (here / "made-by-someone").mkdir()  # not the block's to take back: it writes files only
        raise RuntimeError("disk full")
    assert tree(here) == {"project", "project/empty", "made-by-someone"}
