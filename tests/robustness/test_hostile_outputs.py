"""Outputs that cannot be written, and finished runs that must not be overwritten or mixed.

Every command that writes meets a bad output path in its first milliseconds: one ``error:`` line
naming the path, exit status 2, nothing left behind (no empty directory, no earlier output
changed). A run directory holding another configuration's run is refused unless ``--overwrite``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from hostile_helpers import assert_one_line, deadline, digests, one_word_treebank, run_cli
from lmalgebra.core.errors import UserInputError
from merge_fixtures import write_recipe

Runner = Callable[..., tuple[int, str]]


@pytest.fixture
def cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> Runner:
    """Run ``lmalgebra ARGS`` through ``cli.main``; (exit status, stderr without colours)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "default-cache"))
    return lambda *args: run_cli(list(args), monkeypatch, capsys)


def one_error(code: int, stderr: str, *needles: str) -> str:
    """Exit 2 and a single ``error:`` line, the last thing printed, naming every needle."""
    return assert_one_line(code, stderr, list(needles))


def decompose_args(bert_dir: Path, bert2_dir: Path, corpus: Path, out: Path) -> list[str]:
    return [
        "decompose",
        "--models",
        f"a={bert_dir}",
        "--models",
        f"b={bert2_dir}",
        "--corpus.paths",
        str(corpus),
        "-T",
        "8",
        "--spans.counts",
        "20,5,5",
        "--no-progress",
        "--out",
        str(out),
    ]


@pytest.fixture
def blocker(tmp_path: Path) -> Path:
    """A plain file where commands will be asked to write a directory."""
    path = tmp_path / "a-file"
    path.write_text("not a directory\n", encoding="utf-8")
    return path


# --- class 2: outputs that cannot be written ---------------------------------------------------


def test_decompose_refuses_outputs_that_cannot_be_written(
    cli: Runner, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, blocker: Path, tmp_path: Path
) -> None:
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, blocker)
    one_error(*cli(*args), str(blocker), "is a file")
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, blocker / "run")
    one_error(*cli(*args), str(blocker), "is a file")
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, tmp_path / "run")
    one_error(*cli(*args, "--cache_dir", str(blocker)), "cache directory", str(blocker))
    assert not (tmp_path / "run").exists()  # checked before the run directory was made
    assert blocker.read_text(encoding="utf-8") == "not a directory\n"


def test_unwritable_parent_is_named(
    cli: Runner,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    locked = tmp_path / "read-only"
    locked.mkdir()
    real = os.access
    # root writes anywhere, so the permission check itself is what the test can exercise here
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != locked and real(p, mode))
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, locked / "run")
    one_error(*cli(*args), str(locked), "not writable")
    assert list(locked.iterdir()) == []


def test_file_outputs_that_are_directories_are_refused(
    cli: Runner, finished_run: Path, tmp_path: Path, blocker: Path
) -> None:
    before = digests(finished_run)
    one_error(*cli("report", str(finished_run), "--out", str(tmp_path)), str(tmp_path), "directory")
    one_error(*cli("report", str(finished_run), "--out", str(blocker / "r.html")), str(blocker))
    one_error(*cli("demo", "--quick", "--out", str(blocker)), str(blocker), "is a file")
    assert digests(finished_run) == before


def test_pretrain_and_merge_refuse_outputs_that_cannot_be_written(
    cli: Runner, corpus_txt: Path, blocker: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    one_error(
        *cli(
            "pretrain",
            "masked",
            "--corpus.paths",
            str(corpus_txt),
            "--language",
            "xx",
            "--tokenizer.vocab_size",
            "100",
            "--out",
            str(blocker / "teacher"),
            "--no-progress",
        ),
        str(blocker),
    )
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(blocker))
    for stage in ("prepare", "run"):
        one_error(*cli("merge", stage, str(recipe), "--no-progress"), str(blocker), "is a file")
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(blocker / "run"))
    one_error(*cli("merge", "prepare", str(recipe), "--no-progress"), str(blocker))
    assert blocker.read_text(encoding="utf-8") == "not a directory\n"


def test_failed_command_leaves_no_empty_directory(
    cli: Runner, bert_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "new" / "run"
    # a model that does not exist fails after the run directory was claimed
    args = decompose_args(bert_dir, tmp_path / "no-such-model", corpus_txt, out)
    code, err = cli(*args)
    assert code == 2, err
    assert not out.exists()


# --- class 3: a finished run is never overwritten silently -----------------------------------


@pytest.fixture(scope="module")
def finished_run(
    tmp_path_factory: pytest.TempPathFactory, bert_dir: Path, bert2_dir: Path, corpus_txt: Path
) -> Path:
    out = tmp_path_factory.mktemp("finished") / "run"
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, out)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "LMALGEBRA_CACHE": str(out.parent / "cache")}
    done = subprocess.run(
        [sys.executable, "-m", "lmalgebra", *args], env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return out


def test_another_configuration_into_a_finished_run_is_refused(
    cli: Runner, finished_run: Path, bert_dir: Path, gpt2_dir: Path, corpus_txt: Path
) -> None:
    before = digests(finished_run)
    args = decompose_args(bert_dir, gpt2_dir, corpus_txt, finished_run)
    line = one_error(*cli(*args), str(finished_run), "finished", "models", "--overwrite")
    assert "another configuration" in line
    args = decompose_args(bert_dir, gpt2_dir, corpus_txt, finished_run)
    one_error(*cli(*args[:-4], "-T", "6", *args[-2:]), "spans")
    assert digests(finished_run) == before


def test_the_same_run_again_without_statistics_leaves_none_of_the_earlier_runs(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """``--save_statistics`` is no part of a run's identity: the same run computed again
    without it had left the earlier run's ``stats/``, which its new ``summary.json`` does not
    record, so that ``report`` and ``Decomposition.load`` refused the run it had just finished."""
    import shutil

    from lmalgebra import Decomposition

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, out)
    code, err = cli(*args, "--save_statistics")
    assert code == 0 and (out / "stats" / "train.safetensors").is_file(), err
    code, err = cli(*args)
    assert code == 0, err
    assert not (out / "stats").exists()
    assert Decomposition.load(out).names == ["a", "b"]


def test_overwrite_replaces_the_old_run_without_stale_files(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """A file under a run's own name that the finished run's ``summary.json`` does not record
    (``sweeps/length.csv`` beside a run of no sweeps: an earlier run's table, or a user's) had
    been removed by ``--overwrite``, and a run of the same configuration recorded it as its own,
    so that ``report`` and ``Decomposition.load`` read it back as the run's result. It is
    refused, named, by each, and nothing is removed; the run's own files alone are replaced."""
    import shutil

    from lmalgebra import Decomposition

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "weights.safetensors").write_bytes(b"stale weights of the old run")
    (out / "sweeps").mkdir()
    (out / "sweeps" / "length.csv").write_text("stale\n", encoding="utf-8")
    stray = ["is no file of", "summary.json records no such file"]
    with pytest.raises(UserInputError, match=r"weights\.safetensors is no file of this run"):
        Decomposition.load(out)
    code, err = cli(*decompose_args(bert_dir, bert2_dir, corpus_txt, out))
    assert_one_line(code, err, ["sweeps/length.csv", *stray])
    code, err = cli(*decompose_args(bert_dir, gpt2_dir, corpus_txt, out), "--overwrite")
    assert_one_line(code, err, ["holds files a decomposition does not write", "length.csv"])
    assert (out / "sweeps" / "length.csv").is_file() and (out / "summary.json").is_file()
    (out / "weights.safetensors").unlink()
    shutil.rmtree(out / "sweeps")
    code, err = cli(*decompose_args(bert_dir, gpt2_dir, corpus_txt, out), "--overwrite")
    assert code == 0, err
    config = yaml.safe_load((out / "config.yaml").read_text(encoding="utf-8"))
    assert [m["path"] for m in config["models"]] == [str(bert_dir), str(gpt2_dir)]


def test_same_configuration_runs_again_in_place(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    before = {k: v for k, v in digests(out).items() if k.endswith(".csv")}
    code, err = cli(*decompose_args(bert_dir, bert2_dir, corpus_txt, out))
    assert code == 0, err
    assert {k: v for k, v in digests(out).items() if k.endswith(".csv")} == before


def test_a_directory_of_other_files_is_not_taken_over(
    cli: Runner, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "my-documents"
    out.mkdir()
    (out / "thesis.tex").write_text("precious\n", encoding="utf-8")
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, out)
    line = one_error(*cli(*args), str(out), "not empty", "thesis.tex")
    assert "--overwrite" not in line  # it would not remove a user's file either
    code, err = cli(*args, "--overwrite")
    one_error(code, err, str(out), "thesis.tex", "does not write", "another directory")
    assert (out / "thesis.tex").read_text(encoding="utf-8") == "precious\n"


def test_overwrite_removes_only_what_a_decomposition_writes(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """--overwrite over a run plus a user's own files, or over a merge run, removes nothing and
    names what is not a decomposition's (a few names, then how many more)."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "notes.txt").write_text("mine\n", encoding="utf-8")
    (out / "drafts").mkdir()
    before = digests(out)
    code, err = cli(*decompose_args(bert_dir, gpt2_dir, corpus_txt, out), "--overwrite")
    one_error(code, err, str(out), "drafts/", "notes.txt", "does not write")
    assert digests(out) == before
    merge_run = tmp_path / "merge-run"
    for name in ("examples", "topk", "masked", "student"):
        (merge_run / name).mkdir(parents=True)
    (merge_run / "recipe.yaml").write_text("objective: masked\n", encoding="utf-8")
    before = digests(merge_run)
    code, err = cli(*decompose_args(bert_dir, gpt2_dir, corpus_txt, merge_run), "--overwrite")
    one_error(code, err, str(merge_run), "examples/", "and 2 more")
    assert digests(merge_run) == before


@pytest.mark.parametrize(
    "kept",
    [
        "plots/poster.svg",
        "stats/notes.txt",
        "sweeps/mine/x.csv",
        # named like the run's own files, but none a run writes: the patterns had matched them
        "plots/poster.png",
        "stats/mine.safetensors",
        "pairwise_r2_mine.csv",
    ],
)
def test_overwrite_keeps_a_users_file_inside_a_runs_directory(
    kept: str,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """--overwrite removes the files a decomposition writes, one by one and by their exact
    names: a user's file kept in one of its directories (``plots/``, ``stats/``), or named like
    the run's files (``plots/*.png``), refuses it, named, where the directory had been removed
    whole with the file inside (and then the file matching the pattern)."""
    import shutil

    from lmalgebra import Decomposition
    from lmalgebra.core.errors import UserInputError

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / kept).parent.mkdir(parents=True, exist_ok=True)
    (out / kept).write_text("mine\n", encoding="utf-8")
    before = digests(out)
    code, err = cli(*decompose_args(bert_dir, gpt2_dir, corpus_txt, out), "--overwrite")
    one_error(code, err, str(out), kept.rsplit("/", 1)[0] if kept.count("/") > 1 else kept)
    with pytest.raises(UserInputError, match=kept.split("/")[0]):
        Decomposition.load(finished_run).save(out, overwrite=True)
    assert digests(out) == before


def test_overwrite_removes_nothing_where_a_folder_of_the_run_is_not_writable(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """--overwrite over a run whose ``stats/`` this user may not write (a read-only mount):
    the run's other files were removed first, then the command stopped at ``stats/``, leaving
    a run cut to its statistics, still marked complete by its ``summary.json``, with a message
    saying finished parts are kept. It is refused before anything goes, naming the folder (by
    the dry run too)."""
    out = tmp_path / "run"
    code, err = cli(*decompose_args(bert_dir, gpt2_dir, corpus_txt, out), "--save_statistics")
    assert code == 0 and (out / "stats" / "train.safetensors").is_file(), err
    stats, access, unlink = out / "stats", os.access, Path.unlink

    def refused(path: Path, *args: object, **kwargs: object) -> None:
        if path.parent == stats:  # as the kernel refuses a read-only mount
            raise PermissionError(13, "Permission denied", str(path))
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != stats and access(p, mode))
    monkeypatch.setattr(Path, "unlink", refused)
    before = digests(out)
    args = decompose_args(bert_dir, gpt2_dir, corpus_txt, out)
    for dry in (["--dry-run"], []):
        one_error(*cli(*args, "--overwrite", *dry), str(stats), "not writable", "removes none")
        assert digests(out) == before


@pytest.mark.parametrize("kind", ["link", "fifo"])
@pytest.mark.parametrize("linked", ["fits.csv", "group_r2.csv"])
def test_overwrite_replaces_no_link_where_the_run_wrote_a_file(
    linked: str,
    kind: str,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """A file of the run replaced by a link to a user's file: without --overwrite the link was
    refused, with it the link was removed and a file written in its place. Both refuse it now,
    naming the link, and leave it and the user's file as they were; a FIFO there the same (it
    had been removed by --overwrite)."""
    import os
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    mine = tmp_path / "important.csv"
    mine.write_text("mine\n", encoding="utf-8")
    link = out / linked
    link.parent.mkdir(exist_ok=True)
    link.unlink(missing_ok=True)
    link.symlink_to(mine) if kind == "link" else os.mkfifo(link)
    before = sorted(p.name for p in out.iterdir())
    args = decompose_args(bert_dir, gpt2_dir, corpus_txt, out)
    for flags in (["--overwrite", "--dry-run"], ["--overwrite"]):
        code, err = cli(*args, *flags)
        one_error(code, err, str(out), linked, "symbolic links or special files", "replaces none")
        assert link.is_symlink() if kind == "link" else link.is_fifo()
        assert sorted(p.name for p in out.iterdir()) == before
    assert mine.read_text(encoding="utf-8") == "mine\n"


@pytest.mark.parametrize("part", ["plots", "stats", "sweeps"])
def test_a_runs_own_directory_that_is_a_link_is_refused(
    part: str,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """``plots/`` (``stats/``, ``sweeps/``) of a run, a link to a user's directory elsewhere:
    ``report`` had drawn its figures through it over the user's ``group_r2.png``, and the same
    run computed again its statistics over the user's files. Refused now, naming the link, by
    ``report``, ``decompose`` (its dry run too) and ``Decomposition.save``; nothing changes."""
    import shutil

    from lmalgebra import Decomposition
    from lmalgebra.core.errors import UserInputError

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    users = tmp_path / "elsewhere"
    users.mkdir()
    for name in ("group_r2.png", "train.safetensors", "length.csv"):
        (users / name).write_text("mine\n", encoding="utf-8")
    (out / part).symlink_to(users)
    before, theirs = digests(out), digests(users)
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, out)
    for command in (["report", str(out)], args, [*args, "--dry-run"]):
        one_error(*cli(*command), f"{out / part} is a symbolic link to {users}", "remove the link")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / part).symlink_to(users)
    with pytest.raises(UserInputError, match="is a symbolic link"):
        Decomposition.load(finished_run).save(copy)
    assert digests(out) == before and digests(users) == theirs


@pytest.mark.parametrize("kind", ["link", "fifo", "directory"])
@pytest.mark.parametrize("where", ["fits.csv", "pairwise_r2_test.csv"])
def test_the_same_run_again_finds_a_link_or_fifo_before_any_work(
    where: str,
    kind: str,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """The same configuration again over its finished run, one of whose files is now a link
    (or a FIFO, or a directory): it had been found only at the write, after every model was
    embedded and fitted, with ``summary.json`` already removed, leaving the finished run
    unfinished. Refused before any work now, by the run and its dry run, the run and its
    ``summary.json`` as they were."""
    import os
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    path = out / where
    path.unlink()
    if kind == "link":
        path.symlink_to(tmp_path / "mine.csv")
    else:
        os.mkfifo(path) if kind == "fifo" else path.mkdir()
    needle = "is a directory, where" if kind == "directory" else "symbolic links or special files"
    before = sorted(p.name for p in out.iterdir())
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, out)
    for flags in ([], ["--dry-run"]):
        with deadline(60):
            code, err = cli(*args, *flags)
        one_error(code, err, str(out), where, needle)
        assert "INFO" not in err  # refused before any model was read
        assert sorted(p.name for p in out.iterdir()) == before


def test_saving_over_a_directory_keeps_a_users_files(finished_run: Path, tmp_path: Path) -> None:
    """``Decomposition.save(overwrite=True)`` replaces an old run's files and refuses (removing
    nothing) a directory that holds a user's own file, one under a run's name that the old
    run's ``summary.json`` does not record (it had been removed) among them."""
    import shutil

    from lmalgebra import Decomposition
    from lmalgebra.core.errors import UserInputError

    result = Decomposition.load(finished_run)
    target = tmp_path / "copy"
    shutil.copytree(finished_run, target)
    (target / "alpha_curve.csv").write_text("stale\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"does not write \(alpha_curve\.csv\)"):
        result.save(target, overwrite=True)
    (target / "alpha_curve.csv").unlink()
    result.save(target, overwrite=True)
    assert Decomposition.load(target).pairwise("test").equals(result.pairwise("test"))
    (target / "thesis.tex").write_text("precious\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"thesis\.tex"):
        result.save(target, overwrite=True)
    assert (target / "thesis.tex").is_file() and (target / "summary.json").is_file()


def test_a_run_saved_where_it_was_read_from_is_kept(finished_run: Path, tmp_path: Path) -> None:
    """``load(DIR).save(DIR, overwrite=True)`` had removed the run's files before copying them
    onto themselves: an empty directory, reported saved. The run is there already: kept."""
    import shutil

    from lmalgebra import Decomposition

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = digests(run)
    read = Decomposition.load(run)
    for overwrite in (True, False):
        assert read.save(tmp_path / "." / "run", overwrite=overwrite) == tmp_path / "run"
        assert digests(run) == before
    assert Decomposition.load(run).pairwise("test").equals(read.pairwise("test"))


def test_a_run_is_not_written_inside_another_output(
    cli: Runner, finished_run: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path
) -> None:
    """``load(DIR).save(DIR/inner)`` had copied the run into a folder of itself, the copy's
    folder included (``inner/inner/...``), and ``decompose --out RUN/nested`` wrote a run inside
    a finished one (or inside a merge run): each is refused in one line naming the directory
    that holds the other output, the dry run too, and nothing is written."""
    import shutil

    from lmalgebra import Decomposition, UserInputError

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = digests(run)
    with pytest.raises(UserInputError, match=r"would go inside .*run, which holds a decomp"):
        Decomposition.load(run).save(run / "inner")
    for dry in ([], ["--dry-run"]):
        args = decompose_args(bert_dir, bert2_dir, corpus_txt, run / "deeper" / "nested")
        one_error(*cli(*args, *dry), "would go inside", str(run), "a decomposition run")
    assert digests(run) == before


def test_a_merge_run_or_teacher_is_not_written_inside_another_output(
    cli: Runner, finished_run: Path, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A merge run whose ``output_dir`` lies inside a finished decomposition, and a teacher
    ``pretrain --out`` wrote inside a merge run's store, had been written among the other
    output's files: each is refused in one line naming the directory that holds it, the dry
    run too, and nothing is written."""
    import shutil

    run = tmp_path / "lmd"
    shutil.copytree(finished_run, run)
    before = digests(run)
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(run / "merge"))
    for dry in ([], ["--dry-run"]):
        code, stderr = cli("merge", "prepare", str(recipe), "--no-progress", *dry)
        one_error(code, stderr, "would go inside", str(run), "a decomposition run")
    assert digests(run) == before
    merge = write_recipe(tmp_path, teacher_dirs, output_dir=str(tmp_path / "merge"))
    assert cli("merge", "prepare", str(merge), "--no-progress")[0] == 0
    store = tmp_path / "merge" / "examples"
    corpus = ["--corpus.paths", str(tmp_path / "xx.txt"), "--language", "xx"]
    corpus += ["--tokenizer.vocab_size", "300"]
    code, stderr = cli("pretrain", "causal", "--out", str(store / "teacher"), *corpus)
    one_error(code, stderr, "would go inside", str(tmp_path / "merge"), "a merge run")
    assert not (store / "teacher").exists()


@pytest.mark.parametrize("linked", ["training", "training/checkpoints"])
def test_pretraining_writes_through_no_link_in_its_training_directory(
    linked: str, cli: Runner, corpus_txt: Path, tmp_path: Path
) -> None:
    """A teacher's ``training/`` (or its ``checkpoints/``), a link to a directory of the user's
    elsewhere: ``pretrain`` had written its log and checkpoints there over the user's files,
    ``--restart`` removing a checkpoint-named folder first. Refused now, naming the link, with
    and without ``--restart``; nothing there changes."""
    out = tmp_path / "teacher"
    users = tmp_path / "elsewhere"
    (users / "step-0000001").mkdir(parents=True)
    (users / "train_log.jsonl").write_text("mine\n", encoding="utf-8")
    (users / "step-0000001" / "state.json").write_text("mine\n", encoding="utf-8")
    (out / linked).parent.mkdir(parents=True)
    (out / linked).symlink_to(users)
    args = ["pretrain", "causal", "--out", str(out), "--corpus.paths", str(corpus_txt)]
    args += ["--language", "xx", "--tokenizer.vocab_size", "300", "--model.hidden_size", "16"]
    args += ["--training.steps", "2", "--training.batch_size", "2", "--example_length", "16"]
    before = digests(users)
    for restart in ([], ["--restart"]):
        code, err = cli(*args, *restart, "--no-progress")
        one_error(code, err, f"{out / linked} is a symbolic link to {users}", "remove the link")
    assert digests(users) == before


def test_a_copy_of_a_run_stopped_at_any_write_resumes(finished_run: Path, tmp_path: Path) -> None:
    """``Decomposition.save`` of a run read back, stopped at each of its writes, is never marked
    complete and, saved again, finishes as an uninterrupted copy; it had been refused as a
    directory that is not empty, and could leave ``summary.json`` copied before the tables."""
    import shutil

    from kill_helpers import count_points, interrupted_at
    from lmalgebra import Decomposition
    from lmalgebra.core.errors import UserInputError

    read = Decomposition.load(finished_run)
    target = tmp_path / "copy"

    def save() -> tuple[int, str]:
        try:
            read.save(target)
        except KeyboardInterrupt:
            return 130, ""
        return 0, ""

    points = count_points(tmp_path, save)
    expected = digests(target)
    assert save() == (0, "") and digests(target) == expected  # the same run: copied again
    for k in range(1, len(points) + 1):
        shutil.rmtree(target)
        code, _, point = interrupted_at(k, tmp_path, save)
        assert code == 130 and point is not None
        with pytest.raises(UserInputError):
            Decomposition.load(target)
        assert save() == (0, ""), point
        assert digests(target) == expected, point


def test_a_finished_run_is_not_replaced_by_a_run_on_other_inputs(
    cli: Runner, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    """The same configuration over a finished run computes it again only on the same inputs: a
    corpus file changed since, or another array under the same name from Python, is refused in
    one line naming what differs, the run untouched; --overwrite replaces it."""
    import numpy as np

    import lmalgebra

    corpus = tmp_path / "docs.txt"
    corpus.write_text(corpus_txt.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "run"
    args = decompose_args(bert_dir, bert2_dir, corpus, out)
    assert cli(*args)[0] == 0
    assert cli(*args)[0] == 0  # the same inputs: computed again in place
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("\nA document added after the run finished.\n")
    before = digests(out)
    line = one_error(*cli(*args), str(out), "other inputs", "corpus", "--overwrite")
    assert "model" not in line  # the models are the same
    assert digests(out) == before
    code, err = cli(*args, "--overwrite")
    assert code == 0, err

    texts = corpus_txt.read_text(encoding="utf-8").split("\n\n")
    spans = {"length": 8, "counts": (20, 5, 5)}
    rows = len(lmalgebra.spans({"a": str(bert_dir)}, texts, spans=spans))
    rng = np.random.default_rng(0)
    first = {"a": str(bert_dir), "b": rng.normal(size=(rows, 5))}
    api_out = tmp_path / "api-run"
    options = {"spans": spans, "out": api_out}
    lmalgebra.decompose(first, texts, **options)
    before = digests(api_out)
    second = {**first, "b": rng.normal(size=(rows, 5))}  # another array under the same name
    with pytest.raises(lmalgebra.UserInputError, match="model 'b' differs since"):
        lmalgebra.decompose(second, texts, **options)
    edited = [texts[0] + " One more sentence.", *texts[1:]]  # other documents from Python
    with pytest.raises(lmalgebra.UserInputError, match=r"other inputs \(corpus"):
        lmalgebra.decompose(first, edited, **options)
    assert digests(api_out) == before
    lmalgebra.decompose(first, edited, overwrite=True, **options)


def test_no_command_writes_into_another_kind_of_directory(
    cli: Runner, finished_run: Path, corpus_txt: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A model directory is not written into a decomposition run or a merge run, nor a merge run
    into a decomposition run or a model directory: one line naming the directory, what it holds
    and the file that tells, and nothing in it changed."""
    import shutil

    from merge_fixtures import write_recipe

    run = tmp_path / "decomposition"
    shutil.copytree(finished_run, run)
    merge_run = tmp_path / "merge-run"
    (merge_run / "examples").mkdir(parents=True)  # beside its recipe.yaml: a merge run's
    (merge_run / "recipe.yaml").write_text("objective: masked\n", encoding="utf-8")
    model = tmp_path / "model"
    model.mkdir()
    (model / "lmalgebra.json").write_text("{}", encoding="utf-8")
    users = tmp_path / "users-model"  # a Hugging Face model directory lmalgebra did not write
    shutil.copytree(teacher_dirs["wp"], users)
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--training.steps", "1", "--no-progress"]
    for target, holds, tell in (
        (run, "decomposition run", "summary.json"),
        (merge_run, "merge run", "recipe.yaml"),
        (users, "a model lmalgebra did not write", "config.json"),
    ):
        before = digests(target)
        one_error(*cli(*pretrain, "--out", str(target)), str(target), holds, tell, "pretrain")
        assert digests(target) == before
    for target, holds, tell in (
        (run, "decomposition run", "summary.json"),
        (model, "model directory", "lmalgebra.json"),
        (users, "a model lmalgebra did not write", "config.json"),
    ):
        recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(target))
        before = digests(target)
        one_error(*cli("merge", "prepare", str(recipe), "--no-progress"), str(target), holds, tell)
        assert digests(target) == before


def test_selection_and_tagging_take_the_lock_and_keep_to_their_own_kind(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
) -> None:
    """``experimental select`` and ``evaluate-pos`` hold their output directory's lock from before
    their first model is loaded, as every other writer does, and write into no other kind of output:
    one line naming the directory (and the holder, or what it holds), nothing in it changed."""
    import shutil

    bank = tmp_path / "bank"
    bank.mkdir()
    for split in ("train", "dev", "test"):
        (bank / f"x-ud-{split}.conllu").write_text("1\tword\t_\tNOUN\n\n", encoding="utf-8")
    recipe = write_recipe(tmp_path, teacher_dirs)

    def select(out: Path) -> list[str]:
        return ["experimental", "select", str(recipe), "--out", str(out), "--no-progress"]

    def tag(out: Path) -> list[str]:
        return ["evaluate-pos", str(bank), "--models", f"a={bert_dir}", "--out", str(out)]

    run = tmp_path / "decomposition"
    shutil.copytree(finished_run, run)
    before = digests(run)
    names = ("decomposition run", "summary.json")
    one_error(*cli(*select(run)), str(run), *names, "experimental select")
    one_error(*cli(*tag(run)), str(run), "decomposition run", "summary.json", "evaluate-pos")
    assert digests(run) == before

    held = tmp_path / "held"
    with held_by_another(held) as holder:
        before = digests(held)
        for args in (select(held), tag(held)):
            one_error(*cli(*args), str(held.resolve()), "in use by another", f"pid {holder.pid}")
        assert digests(held) == before


def test_an_evaluation_of_other_inputs_is_not_replaced_without_overwrite(
    cli: Runner,
    bert_dir: Path,
    bert2_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``evaluate-pos`` into a directory holding an evaluation of other treebank files or other
    models is refused, naming what differs, and nothing is changed; the same evaluation is
    computed again; ``--overwrite`` replaces its files and refuses a directory holding others."""
    import lmalgebra.evaluate.pos_tagging as pos
    from lmalgebra.evaluate.pos_results import PosResult

    def scored(ref, *args, **kwargs) -> PosResult:  # the tagger is tested elsewhere
        zeros = dict.fromkeys(PosResult.__dataclass_fields__, 0)
        return PosResult(**zeros | {"model": ref.name, "mode": "probe"})

    monkeypatch.setattr(pos, "_evaluate", scored)
    bank = one_word_treebank(tmp_path / "bank")
    out = tmp_path / "pos"
    args = ["evaluate-pos", str(bank), "--out", str(out), "--no-progress"]
    first = [*args, "--models", f"a={bert_dir}"]
    code, err = cli(*first)
    assert code == 0, err
    code, err = cli(*first)  # the same evaluation: computed again
    assert code == 0, err
    before = digests(out)
    one_error(*cli(*args, "--models", f"a={bert2_dir}"), str(out), "another", "models.a.weights")
    with (bank / "x-ud-train.conllu").open("a", encoding="utf-8") as handle:
        handle.write("\t".join(["1", "other", "_", "VERB", *"______"]) + "\n\n")
    one_error(*cli(*first), str(out), "tagging evaluation of another", "(treebank.train differs)")
    assert digests(out) == before
    (out / "my-notes.txt").write_text("mine\n", encoding="utf-8")
    one_error(*cli(*first, "--overwrite"), str(out), "my-notes.txt", "does not write")
    (out / "my-notes.txt").unlink()
    code, err = cli(*first, "--overwrite")
    assert code == 0, err


HOLDER = """
import sys, time
from pathlib import Path
from lmalgebra.storage.lockfile import run_directory_lock
with run_directory_lock(Path(sys.argv[1]), "holder command"):
    print("held", flush=True)
    time.sleep(120)
"""


@contextlib.contextmanager
def held_by_another(directory: Path) -> Iterator[subprocess.Popen[str]]:
    """``directory`` locked by another process (``HOLDER``, named "holder command") while the
    block runs."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_pretrain_resumes_into_its_own_unfinished_directory(
    cli: Runner, corpus_txt: Path, tmp_path: Path
) -> None:
    """Its checkpoints (``training/``) mark a directory ``pretrain`` is writing, even when the
    model's files are there before its ``lmalgebra.json`` (cut short while saving)."""
    out = tmp_path / "teacher"
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--training.steps", "1", "--no-progress"]
    code, err = cli(*pretrain, "--out", str(out))
    assert code == 0, err
    (out / "lmalgebra.json").unlink()  # as if stopped between the weights and the marker
    code, err = cli(*pretrain, "--out", str(out))
    assert code == 0, err
    assert (out / "lmalgebra.json").is_file()


def test_pretrain_refuses_a_fifo_among_its_models_files_before_training(
    cli: Runner, corpus_txt: Path, tmp_path: Path
) -> None:
    """A FIFO in place of the ``config.json`` of the model ``pretrain --restart`` trains again:
    it trained every step, then refused it as it saved the model; refused before the first."""
    out = tmp_path / "teacher"
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--no-progress", "--out", str(out)]
    code, err = cli(*pretrain, "--training.steps", "1")
    assert code == 0, err
    (out / "config.json").unlink()
    os.mkfifo(out / "config.json")
    log = (out / "training" / "train_log.jsonl").read_text(encoding="utf-8")
    code, err = cli(*pretrain, "--training.steps", "2", "--restart")
    assert_one_line(code, err, [str(out / "config.json"), "FIFO"])
    assert (out / "training" / "train_log.jsonl").read_text(encoding="utf-8") == log


def test_a_users_file_is_not_replaced_by_a_report_or_a_span_list(
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """``report --out`` and ``spans --out`` replace a file they wrote (or an empty one), never a
    user's own: one line naming it, and it is left as it was."""
    notes = tmp_path / "notes.html"
    notes.write_text("<p>my notes</p>\n", encoding="utf-8")
    one_error(
        *cli("report", str(finished_run), "--out", str(notes)),
        str(notes),
        "not one lmalgebra wrote",
    )
    assert notes.read_text(encoding="utf-8") == "<p>my notes</p>\n"
    ours = tmp_path / "report.html"
    for _ in range(2):  # written, then replaced: it is ours
        code, err = cli("report", str(finished_run), "--out", str(ours))
        assert code == 0, err
    spans = ["spans", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    spans += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    for name, text in (("list.jsonl", '{"mine": 1}\n'), ("list.sha256", "my checksums\n")):
        mine = tmp_path / name
        mine.write_text(text, encoding="utf-8")
        out = tmp_path / "list.jsonl"
        one_error(*cli(*spans, "--out", str(out)), str(mine), "not one lmalgebra wrote")
        assert mine.read_text(encoding="utf-8") == text
        mine.unlink()
    for _ in range(2):
        code, err = cli(*spans, "--out", str(tmp_path / "list.jsonl"))
        assert code == 0, err
    before = {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()}
    for inside in (finished_run / "list.jsonl", finished_run / "spans" / "list.jsonl"):
        code, err = cli(*spans, "--out", str(inside))  # another run's files are its own
        one_error(code, err, str(finished_run), "which holds a decomposition run")
    assert {p: p.read_bytes() for p in finished_run.rglob("*") if p.is_file()} == before


def test_a_file_output_named_as_the_lock_file_is_refused(
    cli: Runner, finished_run: Path, tmp_path: Path
) -> None:
    """``report RUN --out RUN/.lmalgebra.lock`` printed the report's path and exit 0, and the
    lock's release then removed the report: the lock's name is refused for a file output."""
    before = digests(finished_run)
    lock = finished_run / ".lmalgebra.lock"
    one_error(*cli("report", str(finished_run), "--out", str(lock)), str(lock), "lock file")
    assert not lock.exists() and digests(finished_run) == before


def test_a_span_list_keeps_its_own_digest(
    cli: Runner, bert_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    """``s.jsonl`` and ``s.json`` both keep their digest in ``s.sha256``: the second export had
    replaced the first list's digest with its own, leaving that list beside another's digest.
    It is refused, naming the list, and both files are left as they were."""
    spans = ["spans", "--models", f"a={bert_dir}", "--corpus.paths", str(corpus_txt), "-T", "8"]
    first = tmp_path / "s.jsonl"
    code, err = cli(*spans, "--spans.counts", "20,5,5", "--out", str(first))
    assert code == 0, err
    kept = digests(tmp_path)
    code, err = cli(*spans, "--spans.counts", "10,5,5", "--out", str(tmp_path / "s.json"))
    one_error(code, err, str(tmp_path / "s.sha256"), str(first))
    assert digests(tmp_path) == kept
    code, err = cli(*spans, "--spans.counts", "20,5,5", "--out", str(first))  # its own again
    assert code == 0, err


def test_a_span_list_stopped_before_its_digest_keeps_no_older_digest(
    cli: Runner, bert_dir: Path, corpus_txt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``spans --out`` writes its list, then the list's digest: stopped between the two, it had
    left the new list beside the digest of the list before it, vouching for another order. The
    older digest is removed first now, and the pair is written under a lock of its directory,
    so that two exports there write theirs one after the other, never one's list beside the
    other's digest."""
    import fcntl

    from lmalgebra.lmd.spans import draw

    spans = ["spans", "--models", f"a={bert_dir}", "--corpus.paths", str(corpus_txt), "-T", "8"]
    out, digest = tmp_path / "s.jsonl", tmp_path / "s.sha256"
    code, err = cli(*spans, "--spans.counts", "20,5,5", "--out", str(out))
    assert code == 0, err
    first, real = out.read_bytes(), draw.write_text_atomic

    def stopped(path: Path, text: str) -> None:
        fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
        try:  # the directory is held while the pair is written
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        raise KeyboardInterrupt  # Ctrl-C between the list and its digest

    monkeypatch.setattr(draw, "write_text_atomic", stopped)
    code, err = cli(*spans, "--spans.counts", "10,5,5", "--out", str(out))
    assert code == 130, err
    assert out.read_bytes() != first and not digest.exists()
    monkeypatch.setattr(draw, "write_text_atomic", real)
    code, err = cli(*spans, "--spans.counts", "10,5,5", "--out", str(out))
    assert code == 0 and digest.is_file(), err


def test_merge_init_writes_into_no_other_output(
    cli: Runner, finished_run: Path, tmp_path: Path
) -> None:
    """``merge init PATH --force`` had replaced a run's own files (its ``config.yaml``, a merge
    run's ``recipe.yaml``, a student's ``lmalgebra.json``) with the starter recipe: a recipe
    inside another output is refused as a report or span list there is, nothing changed."""
    import shutil

    run = tmp_path / "decomposition"
    shutil.copytree(finished_run, run)
    merge_run = tmp_path / "merge-run"
    (merge_run / "s" / "model").mkdir(parents=True)
    (merge_run / "examples").mkdir()
    (merge_run / "recipe.yaml").write_text("objective: masked\n", encoding="utf-8")
    for name in ("lmalgebra.json", "config.json"):
        (merge_run / "s" / "model" / name).write_text("{}", encoding="utf-8")
    for target, holds in (
        (run / "config.yaml", "decomposition run"),
        (run / "merge.yaml", "decomposition run"),
        (merge_run / "recipe.yaml", "merge run"),
        (merge_run / "s" / "model" / "lmalgebra.json", "model directory"),
    ):
        before = digests(target.parent)
        one_error(*cli("merge", "init", str(target), "--force"), str(target), holds)
        assert digests(target.parent) == before


def test_demo_lmd_keeps_each_size_to_its_own_directory_and_offers_overwrite(
    cli: Runner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``demo-lmd --quick`` then ``demo-lmd`` had shared one default directory: the full run
    was refused as another configuration there, and told to pass ``--overwrite``, an option
    ``demo-lmd`` did not have. Each size has its own default now, and ``--overwrite`` is
    passed on to the decomposition."""
    import lmalgebra.api.decompose as api
    from lmalgebra.core.errors import UserInputError

    calls: list[tuple[str, bool]] = []

    def recorded(recipe: dict, overwrite: bool = False, **_: object) -> None:
        calls.append((recipe["out"], overwrite))
        raise UserInputError("stopped here")

    monkeypatch.setattr(api, "decompose_recipe", recorded)
    for args in (["--quick"], [], ["--overwrite", "--out", "mine"]):
        one_error(*cli("demo-lmd", "--no-progress", *args), "stopped here")
    assert calls == [
        ("demo-output/packaged-lmd-quick", False),
        ("demo-output/packaged-lmd", False),
        ("mine", True),
    ]


def test_each_demo_keeps_to_its_own_directory(
    cli: Runner, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A demo resumes what its directory holds (corpora, teachers, runs), so a directory that
    holds another demo, or the same demo at other sizes, or another kind of output, is refused
    before anything is written; each demo's default directory is its own."""
    import json

    from lmalgebra.cli.lmd import demo_directory
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.demo.plan import FULL, QUICK
    from lmalgebra.demo.workflow import run_workflow
    from lmalgebra.storage.output_paths import DEMO_PLAN

    defaults = {
        (c, r, q): str(demo_directory(c, r, q))
        for c in (False, True)
        for r in (False, True)
        for q in (False, True)
        if not (c and r)
    }
    assert defaults == {
        (False, False, False): "demo-output",
        (False, False, True): "demo-output/quick",
        (True, False, False): "demo-output/causal",
        (True, False, True): "demo-output/causal-quick",
        (False, True, False): "demo-output/real",
        (False, True, True): "demo-output/real-quick",
    }
    out = tmp_path / "demo"
    quick = {"demo": "quick masked", "plan": QUICK.as_dict()}
    assert run_workflow(out, lambda: "ran", quick) == "ran"
    assert json.loads((out / DEMO_PLAN).read_text()) == json.loads(json.dumps(quick))
    assert run_workflow(out, lambda: "resumed", quick) == "resumed"

    def never() -> str:
        raise AssertionError("a refused demo ran a step")

    (out / "data").mkdir()
    (out / "data" / "en.txt").write_text("the quick demo's corpus\n", encoding="utf-8")
    before = digests(out)
    full = {"demo": "masked", "plan": FULL.as_dict()}
    smaller = {"demo": "quick masked", "plan": {**QUICK.as_dict(), "teacher_steps": 1}}
    refusals = ((full, "the quick masked demo, not the masked demo"), (smaller, "at other sizes"))
    for other, said in refusals:
        with pytest.raises(UserInputError, match=said):
            run_workflow(out, never, other)
        assert digests(out) == before
    one_error(
        *cli("demo", "--real", "--quick", "--out", str(out), "--no-progress"),
        str(out),
        "the quick masked demo, not the quick real demo",
        DEMO_PLAN,
        "--out",
    )
    assert digests(out) == before
    merge_run = tmp_path / "merge-run"
    (merge_run / "examples").mkdir(parents=True)  # beside its recipe.yaml: a merge run's
    (merge_run / "recipe.yaml").write_text("objective: masked\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"holds a merge run \(recipe\.yaml\)"):
        run_workflow(merge_run, never, quick)
    assert sorted(p.name for p in merge_run.iterdir()) == ["examples", "recipe.yaml"]
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(out))
    one_error(*cli("merge", "prepare", str(recipe), "--no-progress"), str(out), "a demo's output")
    assert digests(out) == before


def test_a_demo_into_a_directory_of_the_users_files_is_refused(tmp_path: Path) -> None:
    """A directory that records no demo but holds a user's files is refused before anything is
    written: the steps take what they find as their own, and a ``data/en.txt`` of the user's
    had been replaced by the demo's corpus. The other demos' directories may be inside, and the
    temporary file of a record whose write was killed."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.demo.plan import FULL, QUICK
    from lmalgebra.demo.workflow import run_workflow

    quick = {"demo": "quick masked", "plan": QUICK.as_dict()}
    mine = tmp_path / "mine"
    (mine / "data").mkdir(parents=True)
    (mine / "data" / "en.txt").write_text("my own notes\n", encoding="utf-8")
    before = digests(mine)
    with pytest.raises(UserInputError, match=r"mine is not empty and holds no demo \(data/; no"):
        run_workflow(mine, lambda: "ran", quick)
    assert digests(mine) == before
    outputs = tmp_path / "demo-output"
    assert run_workflow(outputs / "quick", lambda: "ran", quick) == "ran"
    full = {"demo": "masked", "plan": FULL.as_dict()}
    assert run_workflow(outputs, lambda: "ran", full) == "ran"  # beside the quick demo's
    killed = tmp_path / "killed"  # as it wrote its record
    killed.mkdir()
    (killed / ".demo-plan.json.tmp-7").write_text("{", encoding="utf-8")
    assert run_workflow(killed, lambda: "ran", quick) == "ran"


def test_a_second_demo_into_a_directory_a_demo_is_writing_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """A demo holds its directory's lock: a second demo there had run until the first step the
    two shared (and been stopped by that step's lock, named by its directory)."""

    from lmalgebra.core.errors import UserInputError
    from lmalgebra.demo.plan import QUICK
    from lmalgebra.demo.workflow import run_workflow

    held = tmp_path / "demo"
    held.mkdir()
    ran: list[str] = []
    with held_by_another(held) as holder:
        quick = {"demo": "quick masked", "plan": QUICK.as_dict()}
        with pytest.raises(
            UserInputError, match=f"in use by another lmalgebra run: pid {holder.pid}"
        ):
            run_workflow(held, lambda: ran.append("ran"), quick)
        assert not ran and sorted(p.name for p in held.iterdir()) == [".lmalgebra.lock"]


@pytest.mark.parametrize("special", ["fifo", "link", "dangling link"])
def test_a_fifo_or_link_given_as_an_output_file_is_refused_at_once(
    special: str,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """Looking into a FIFO waits for a writer forever; renaming over a link replaces the link.
    ``report --out``, ``spans --out`` and ``merge init PATH`` refuse both, naming the path."""
    target = tmp_path / "aimed-at"
    target.write_text("the file a link names\n", encoding="utf-8")
    spans = ["spans", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    spans += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    commands = {
        "report.html": ["report", str(finished_run), "--out"],
        "list.jsonl": [*spans, "--out"],
        "merge.yaml": ["merge", "init"],
    }
    needle = "not a regular file" if special == "fifo" else "symbolic link"
    for name, command in commands.items():
        path = tmp_path / name
        if special == "fifo":
            os.mkfifo(path)
        else:
            path.symlink_to(target if special == "link" else tmp_path / "nowhere")
        with deadline(60):
            one_error(*cli(*command, str(path)), str(path), needle)
        assert path.is_symlink() or stat.S_ISFIFO(path.lstat().st_mode)
        path.unlink()
    assert target.read_text(encoding="utf-8") == "the file a link names\n"
    if special == "fifo":  # a directory output: named for what it is, not "a file"
        os.mkfifo(tmp_path / "run")
        args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
        args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "run")]
        with deadline(60):
            one_error(*cli(*args), str(tmp_path / "run"), "a FIFO, socket or device")


def test_every_writer_honours_the_lock_the_python_api_too(
    cli: Runner, finished_run: Path, tmp_path: Path
) -> None:
    """While another run holds a directory, ``Decomposition.save`` of a run read back,
    ``report`` (which draws its figures into the run), ``Decomposition.heatmap`` (drawn into
    the run the first time it is asked for; it had been drawn there under the holder) and
    ``merge bits-per-byte``'s library call are refused naming the holder, and nothing there
    changes."""
    import shutil

    from lmalgebra import Decomposition
    from lmalgebra.distill.causal.bits_per_byte import evaluate_bits
    from lmalgebra.storage.lockfile import DirectoryInUseError

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    loaded = Decomposition.load(finished_run)
    for held in (tmp_path / "copy", run):
        with held_by_another(held) as holder:
            before = digests(held)
            if held == run:
                one_error(*cli("report", str(run)), str(run), f"pid {holder.pid}")
                with pytest.raises(DirectoryInUseError, match=f"pid {holder.pid}"):
                    evaluate_bits(run, [])
                (run / "pairwise_r2_test.png").unlink(missing_ok=True)
                before = digests(held)
                with pytest.raises(DirectoryInUseError, match=f"pid {holder.pid}"):
                    _ = Decomposition.load(run).heatmap
            else:
                with pytest.raises(DirectoryInUseError, match=f"pid {holder.pid}"):
                    loaded.save(held)
            assert digests(held) == before
    assert Decomposition.load(loaded.save(tmp_path / "copy")).names == loaded.names


def test_a_file_output_does_not_go_into_a_directory_another_run_holds(
    cli: Runner, finished_run: Path, bert_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    """A directory another command is writing (its lock held, its own files perhaps not there
    yet): a report page, a span list or a starter recipe had been written into it (the API's
    report of an unsaved decomposition too: the same check)."""

    held = tmp_path / "held"
    held.mkdir()
    with held_by_another(held):
        spans = ["spans", "--models", f"a={bert_dir}", "--corpus.paths", str(corpus_txt)]
        for command in (
            ["report", str(finished_run), "--out", str(held / "sub" / "report.html")],
            [*spans, "-T", "8", "--spans.counts", "20,5,5", "--out", str(held / "s.jsonl")],
            ["merge", "init", str(held / "merge.yaml")],
        ):
            one_error(*cli(*command), str(held), "in use by another lmalgebra run")
        assert sorted(p.name for p in held.iterdir()) == [".lmalgebra.lock"]


def test_a_run_another_command_is_writing_is_named_as_in_use_not_incomplete(
    cli: Runner, tmp_path: Path
) -> None:
    """``report`` of, and ``Decomposition.load`` of, a run whose decomposition is under way
    (its lock held, its ``summary.json`` not written yet) name the run in progress, as ``merge
    verify`` does; they had called it "not a complete decomposition run"."""

    from lmalgebra import Decomposition

    held = tmp_path / "held"
    held.mkdir()
    with held_by_another(held) as holder:
        one_error(*cli("report", str(held)), str(held), "in use by another", "holder command")
        in_use = f"in use by another lmalgebra run .pid {holder.pid}"
        with pytest.raises(UserInputError, match=in_use):
            Decomposition.load(held)


@pytest.mark.parametrize(
    ("record", "content"),
    [
        ("provenance.json", "{not json"),
        ("provenance.json", '{"hashes": {}, "models": {}}'),
        ("provenance.json", None),  # a model's hash edited: had been called the model's change
    ],
)
def test_a_damaged_provenance_does_not_switch_the_input_check_off(
    record: str,
    content: str | None,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """Over a finished run the inputs are compared with its provenance: a damaged one had been
    read as "made before it recorded one", and the run replaced on any inputs."""
    import json
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    if content is None:
        found = json.loads((out / record).read_text(encoding="utf-8"))
        next(iter(found["models"].values()))["weights"] = "0" * 64
        content = json.dumps(found)
    (out / record).write_text(content, encoding="utf-8")
    before = digests(out)
    one_error(*cli(*decompose_args(bert_dir, bert2_dir, corpus_txt, out)), record, "damaged")
    assert digests(out) == before


@pytest.mark.parametrize("how", ["deleted", "directory", "dangling link"])
def test_a_finished_runs_configuration_gone_is_named_not_called_no_run(
    how: str,
    cli: Runner,
    finished_run: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
) -> None:
    """A finished run whose ``config.yaml`` is gone (``summary.json`` records it) had been
    called a directory that "holds no decomposition", run again over: the file is named."""
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    (out / "config.yaml").unlink()
    if how == "directory":
        (out / "config.yaml").mkdir()
    elif how == "dangling link":
        (out / "config.yaml").symlink_to(tmp_path / "gone")
    before = digests(out)
    args = decompose_args(bert_dir, bert2_dir, corpus_txt, out)
    one_error(*cli(*args), "config.yaml", "though", "summary.json records it", "--overwrite")
    assert digests(out) == before


def test_a_damaged_record_of_the_runs_files_is_refused_by_report(
    cli: Runner, finished_run: Path, tmp_path: Path
) -> None:
    """``summary.json`` records the run's files: a damaged record had switched the check off."""
    import json
    import shutil

    out = tmp_path / "run"
    shutil.copytree(finished_run, out)
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    key = next(k for k, v in summary.items() if isinstance(v, dict) and "config.yaml" in v)
    (out / "summary.json").write_text(json.dumps({**summary, key: "x"}), encoding="utf-8")
    one_error(*cli("report", str(out)), "summary.json", "damaged")


def test_a_home_directory_in_an_output_or_cache_path_is_read_as_home(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """Input paths read ``~/x`` as the home directory; output and cache paths given where no
    shell expands them (a recipe, a quoted flag, ``LMALGEBRA_CACHE``) had been made as a
    directory named ``~`` in the working directory."""
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.evaluate.pos_options import PosSpec
    from lmalgebra.lmd.settings.recipe import DecomposeConfig
    from lmalgebra.storage.output_paths import cache_directory, default_cache_dir
    from merge_fixtures import write_recipe

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMALGEBRA_CACHE", "~/cache")
    assert default_cache_dir() == home / "cache"
    assert cache_directory() == home / "cache"
    models = [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}]
    config = DecomposeConfig.model_validate(
        {"models": models, "corpus": {"paths": []}, "out": "~/run", "cache_dir": "~/c"}
    )
    assert (config.out, config.cache_dir) == (home / "run", home / "c")
    pos = PosSpec.model_validate({"models": [{"name": "a", "path": "x"}], "out": "~/pos"})
    assert pos.out == home / "pos"
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir="~/merge")
    assert load_recipe(recipe).output_dir == home / "merge"
    assert not (tmp_path / "~").exists()


@pytest.mark.parametrize(("finished", "said"), [(True, "a finished"), (False, "an unfinished")])
def test_a_run_of_another_configuration_is_named_in_plain_words(
    finished: bool, said: str, tmp_path: Path
) -> None:
    """An interrupted run of another configuration had been called "a unfinished
    decomposition"."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.storage.output_paths import claim_run_directory

    (tmp_path / "config.yaml").write_text("alpha: 1\n")
    with pytest.raises(UserInputError, match=f"holds {said} decomposition of another config"):
        claim_run_directory(
            tmp_path,
            {"alpha": 2},
            {"alpha": 1},
            finished=finished,
            overwrite=False,
            what="decomposition",
        )


def test_another_configuration_names_the_model_that_differs(tmp_path: Path) -> None:
    """A decomposition of the same models spelt by other paths (``./m/a``, an absolute one) was
    refused as "another configuration (models differs)", naming none: the list of models, named,
    is compared model by model; models of another order or other names are the list's."""
    from lmalgebra.storage.output_paths import claim_run_directory

    (tmp_path / "config.yaml").write_text("models: []\n")
    args: dict[str, Any] = {"finished": True, "overwrite": False, "what": "decomposition"}
    a, b = {"name": "a", "path": "m/a"}, {"name": "b", "path": "m/b"}
    for models, said in (
        ([a | {"path": "./m/a"}, b], r"\(models\.a\.path differs\)"),
        ([b, a], r"\(models differs\)"),
        ([a, b | {"name": "c"}], r"\(models differs\)"),
    ):
        with pytest.raises(UserInputError, match=said):
            claim_run_directory(tmp_path, {"models": models}, {"models": [a, b]}, **args)


def test_a_run_read_back_and_saved_onto_a_full_disk_is_one_error(
    finished_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``Decomposition.load(RUN).save(DIR)`` onto a full disk had raised ``shutil.Error`` with a
    list of every file it could not write, having copied on after the first, and left files cut
    short: the first file the disk cannot hold is now one error naming it, nothing cut short is
    left, and saved again with space the copy is finished."""
    import errno
    import shutil

    from lmalgebra import Decomposition
    from lmalgebra.storage.disk_space import OutOfSpaceError

    copy = tmp_path / "copy"
    real = shutil.copyfile

    def full(source: str, target: str, *args: object, **kwargs: object) -> object:
        if Path(source).name == "fits.csv":
            raise OSError(errno.ENOSPC, "No space left on device", str(target))
        return real(source, target, *args, **kwargs)

    loaded = Decomposition.load(finished_run)
    with monkeypatch.context() as patch:
        patch.setattr(shutil, "copyfile", full)
        with pytest.raises(OutOfSpaceError, match=r"while writing .*fits\.csv"):
            loaded.save(copy)
    assert not (copy / "summary.json").exists()
    assert not [p for p in copy.rglob("*") if ".tmp-" in p.name]
    assert Decomposition.load(loaded.save(copy)).names == loaded.names


def test_a_device_as_an_output_is_refused_without_advice_to_remove_it(tmp_path: Path) -> None:
    """``report --out /dev/null`` was refused with "remove it, or name another path"."""
    from lmalgebra.storage.atomic import refuse_special

    with pytest.raises(UserInputError) as device:
        refuse_special(Path("/dev/null"), "report file")
    assert str(device.value).endswith("lmalgebra writes only regular files; name another path")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(UserInputError, match="remove it, or name another path"):
        refuse_special(tmp_path / "pipe")


def test_an_overwrite_stopped_midway_leaves_a_directory_of_the_same_kind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``experimental select --overwrite`` stopped after its first removal had left a
    ``summary.json`` without its ``recommended.yaml``: the same command then called the folder
    a decomposition run and refused it. The files that tell the kind go last."""
    from lmalgebra.experimental.selection.outputs import OWNED
    from lmalgebra.storage.output_paths import directory_kind, remove_run_files

    out = tmp_path / "selection"
    out.mkdir()
    for name in OWNED:
        (out / name).write_text("x", encoding="utf-8")
    kinds = []
    unlink = Path.unlink

    def watched(path: Path, *args: object, **kwargs: object) -> None:
        unlink(path, *args, **kwargs)  # type: ignore[arg-type]
        if any(out.iterdir()):
            kinds.append(directory_kind(out))

    monkeypatch.setattr(Path, "unlink", watched)
    remove_run_files(out, "teacher selection", OWNED)
    assert kinds and {k[0] if k else None for k in kinds} == {"a teacher selection"}
