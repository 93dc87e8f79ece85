"""``$LMALGEBRA_CACHE`` pointing at a file or an unwritable directory: every command that opens
the cache refuses with one line naming it (exit 2), before it writes a run marked complete."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from gguf_fixtures import tiny_llama, write_llama_gguf
from hostile_helpers import assert_one_line, blocked
from lmalgebra import UserInputError
from lmalgebra.distill.vocab.mined_map import mined_map
from merge_fixtures import write_recipe


@pytest.fixture(params=["file", "unwritable"])
def bad_cache(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, str]:
    """``$LMALGEBRA_CACHE`` set to a file, or to a directory the user cannot write; (the path,
    what the message says of it)."""
    if request.param == "file":
        path = tmp_path / "cache-file"
        path.write_text("not a cache\n", encoding="utf-8")
        said = "is a file, not a directory"
    else:
        path = tmp_path / "cache-read-only"
        path.mkdir()
        real = os.access
        # root writes anywhere, so the permission check itself is what the test can exercise
        monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != path and real(p, mode))
        said = "is not writable"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(path))
    return path, said


def _untouched(path: Path) -> None:
    assert (
        (path.read_text(encoding="utf-8") == "not a cache\n")
        if path.is_file()
        else (list(path.iterdir()) == [])
    )


def test_decompose(
    bad_cache: tuple[Path, str],
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    cli,
) -> None:
    cache, said = bad_cache
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    code, stderr = cli([*args, "--out", str(tmp_path / "out")])
    assert_one_line(code, stderr, ["cache directory ($LMALGEBRA_CACHE)", str(cache), said])
    assert not (tmp_path / "out").exists()
    _untouched(cache)


def test_experimental_select(
    bad_cache: tuple[Path, str], teacher_dirs: dict[str, Path], tmp_path: Path, cli
) -> None:
    cache, said = bad_cache
    recipe = write_recipe(tmp_path, teacher_dirs)
    args = ["experimental", "select", str(recipe), "--spans.counts", "40,10,10", "-T", "8"]
    code, stderr = cli([*args, "--no-progress"])
    assert_one_line(code, stderr, ["cache directory ($LMALGEBRA_CACHE)", str(cache), said])
    assert not (tmp_path / "run" / "selection" / "summary.json").exists()
    _untouched(cache)


def test_the_token_maps_of_causal_training(
    bad_cache: tuple[Path, str], teacher_dirs: dict[str, Path]
) -> None:
    """Causal training and evaluation open the cache for their token maps (MinED)."""
    cache, said = bad_cache
    teacher = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    student = AutoTokenizer.from_pretrained(teacher_dirs["sp"])
    with pytest.raises(UserInputError, match=f"cache directory .* {said}$") as caught:
        mined_map(teacher, student)
    assert str(cache) in str(caught.value)
    _untouched(cache)


@pytest.mark.parametrize("part", ["hashes", "spans", "embeddings"])
@pytest.mark.parametrize("blocker", ["file", "link to nothing"])
def test_a_cache_directory_below_the_root_in_the_way_is_one_line(
    part: str, blocker: str, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path, cli
) -> None:
    """The cache's own directories (``hashes/``, ``spans/``, ``embeddings/``) as a file or a
    link to nothing: one line naming it, where a link had raised ``FileExistsError``; by the
    dry run too, which had planned the run."""
    cache = tmp_path / "cache"
    cache.mkdir()
    blocked(cache / part, blocker)
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--cache_dir", str(cache), "--no-progress", "--out", str(tmp_path / "out")]
    said = "is a file, not a directory" if blocker == "file" else "which does not exist"
    for flags in (["--dry-run"], []):
        assert_one_line(*cli([*args, *flags]), [str(cache / part), said])


@pytest.mark.parametrize("mix", [{"objective_mix": {"sampled": 1.0}}, {}, {"gold_only": True}])
@pytest.mark.parametrize("blocker", ["file", "link to nothing"])
def test_the_dry_run_refuses_a_mined_maps_folder_the_run_cannot_write(
    blocker: str,
    mix: dict[str, object],
    causal_teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """The cache's ``mined-maps/`` a file or a link to nothing: training refuses it where it
    writes the first map; its dry run (``merge run --dry-run``, ``merge train --dry-run``) had
    planned the run, and once it refused it for a loss that reads the maps (``sampled``), still
    planned the default mix and ``gold_only``, whose training builds them too."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe

    cache = tmp_path / "cache"
    cache.mkdir()
    blocked(cache / "mined-maps", blocker)
    training = {"steps": 2, **mix}
    student = CAUSAL_STUDENT
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, student=student, training=training)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    for command in ("run", "train"):
        code, stderr = cli(["merge", command, str(recipe), "--dry-run"])
        assert_one_line(code, stderr, [f"cache directory {cache / 'mined-maps'}"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("blocker", ["file", "link to nothing"])
def test_the_dry_run_refuses_a_runs_hashes_folder_the_stages_cannot_write(
    blocker: str, teacher_dirs: dict[str, Path], tmp_path: Path, cli
) -> None:
    """A merge run's own ``.hashes/`` (the teachers' remembered hashes, which every stage
    writes) a file or a link to nothing: the stages refuse it at their first write, naming it;
    ``merge run --dry-run`` had planned the run."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    run = tmp_path / "run"
    run.mkdir()
    blocked(run / ".hashes", blocker)
    for flags in (["--dry-run"], []):
        code, stderr = cli(["merge", "run", str(recipe), "--no-progress", *flags])
        assert_one_line(code, stderr, [str(run / ".hashes")])
    assert sorted(p.name for p in run.iterdir()) == [".hashes"]


def test_a_write_refused_by_permissions_is_one_line(tmp_path: Path) -> None:
    """Root writes anywhere, so the refusal is raised by hand: a read-only cache directory or
    file system ends in one line naming the file."""
    import errno

    from lmalgebra.storage.disk_space import naming_file

    target = tmp_path / "cache" / "hashes" / "x.hash"
    refused = pytest.raises(UserInputError, match=f"cannot write {target}: Permission denied")
    with refused, naming_file(target):
        raise PermissionError(errno.EACCES, "Permission denied", str(target))


def test_a_token_map_edited_in_place_is_computed_again(
    teacher_dirs: dict[str, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cached MinED map whose ids were changed to other ids within the vocabulary (the file
    still reads, and fits) had been used as it was: it carries a checksum now."""
    from safetensors import safe_open
    from safetensors.numpy import save_file

    teacher = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    student = AutoTokenizer.from_pretrained(teacher_dirs["sp"])
    first = mined_map(teacher, student, cache_dir=tmp_path)
    (path,) = tmp_path.glob("mined-*.safetensors")
    with safe_open(str(path), framework="numpy") as handle:
        meta = handle.metadata()
        arrays = {name: handle.get_tensor(name) for name in ("student_ids", "distances")}
    arrays["student_ids"][:10] = (arrays["student_ids"][:10] + 1) % len(student)
    save_file(arrays, str(path), metadata=meta)
    again = mined_map(teacher, student, cache_dir=tmp_path)
    assert "does not match its checksum" in caplog.text
    assert again.student_ids.tolist() == first.student_ids.tolist()


def test_cache_dir_holds_every_write_of_the_command(
    gpt2_dir: Path, corpus_txt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """``--cache_dir`` is the root of everything the command caches: a GGUF model is
    dequantised below it (by the run; the dry run writes nothing), not into
    ``$LMALGEBRA_CACHE``, which the command leaves empty."""
    from gguf_fixtures import tiny_llama, write_llama_gguf

    elsewhere, given = tmp_path / "env-cache", tmp_path / "given"
    elsewhere.mkdir()
    monkeypatch.setenv("LMALGEBRA_CACHE", str(elsewhere))
    path = write_llama_gguf(*tiny_llama(), tmp_path / "tiny-llama.gguf")
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={gpt2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--cache_dir", str(given), "--no-progress", "--out", str(tmp_path / "out")]
    code, stderr = cli([*args, "--dry-run"])
    assert code == 0, stderr
    code, stderr = cli(args)
    assert code == 0, stderr
    assert [p for p in (given / "gguf").iterdir() if p.is_dir()], "not dequantised below it"
    assert list(elsewhere.iterdir()) == []


def test_a_blank_lmalgebra_cache_is_one_line_and_makes_no_directory(
    teacher_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``LMALGEBRA_CACHE="  "`` had made a cache directory named by two spaces in the working
    directory (an empty value still reads as unset)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMALGEBRA_CACHE", "  ")
    teacher = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    student = AutoTokenizer.from_pretrained(teacher_dirs["sp"])
    with pytest.raises(UserInputError, match=r"^\$LMALGEBRA_CACHE '  ': an empty path"):
        mined_map(teacher, student)
    assert list(tmp_path.iterdir()) == []


def test_the_temporaries_of_a_killed_cache_writer_are_removed(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A cache writer killed mid-write (``kill -9``, power loss) leaves its temporary
    (``.NAME.tmp-PID``), which nothing had ever removed: a run's own are removed under its lock,
    the cache's never. A decomposition now removes those of writers that are gone, once they
    have gone an hour unwritten (a process of another machine sharing the cache may be writing
    one; its pid is not seen here), and keeps a live process's."""
    import time

    cache = tmp_path / "cache"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--cache_dir", str(cache), "--no-progress"]
    code, stderr = cli([*args, "--out", str(tmp_path / "first")])
    assert code == 0, stderr
    gone = _dead_pid()
    entry = next(p.parent for p in cache.rglob("manifest.json"))
    stale = entry / f".shard-00000.safetensors.tmp-{gone}"
    fresh = entry / f".shard-00001.safetensors.tmp-{gone}"
    live = entry / f".manifest.json.tmp-{os.getppid()}"
    for path in (stale, fresh, live):
        path.write_bytes(b"half a shard")
    hour_ago = time.time() - 3700
    for path in (stale, live):
        os.utime(path, (hour_ago, hour_ago))
    code, stderr = cli([*args, "--out", str(tmp_path / "second")])
    assert code == 0, stderr
    assert not stale.exists() and fresh.exists() and live.exists()


def _dead_pid() -> int:
    """The pid of a process that has ended (and been reaped)."""
    import subprocess

    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("blocker", ["file", "dangling link"])
def test_the_dry_run_refuses_a_gguf_folder_the_run_cannot_build_into(
    blocker: str, gpt2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """The cache's ``gguf/`` a file (or a link to nothing): the run refuses it, naming it,
    before dequantising; the dry run, which dequantises nothing, had passed it (a packaged
    model unpacked into ``packaged/`` alike)."""
    from gguf_fixtures import tiny_llama, write_llama_gguf

    cache = tmp_path / "cache"
    cache.mkdir()
    blocked(cache / "gguf", blocker)
    path = write_llama_gguf(*tiny_llama(), tmp_path / "tiny-llama.gguf")
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={gpt2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--cache_dir", str(cache), "--no-progress", "--out", str(tmp_path / "out")]
    for flags in (["--dry-run"], []):
        assert_one_line(*cli([*args, *flags]), [str(cache / "gguf")])


@pytest.mark.parametrize("command", ["merge evaluate", "experimental select"])
def test_an_lmd_cache_part_in_the_way_is_refused_before_the_scoring_before_lmd(
    command: str,
    causal_teacher_dirs: dict[str, Path],
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The cache's ``embeddings/`` a file: merge evaluate scored every bits per byte, and
    experimental select every teacher's accuracy, before their LMD run refused it (the work
    thrown away); both refuse it first now."""
    import warnings

    from causal_fixtures import write_causal_recipe
    from lmalgebra.distill.causal.evaluation import score_causal_run
    from lmalgebra.distill.recipe import load_recipe
    from lmalgebra.experimental.selection.selection_spec import SelectionSpec
    from lmalgebra.experimental.selection.teacher_sets import select_teachers

    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "embeddings").write_text("not a cache part\n", encoding="utf-8")
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    needle = rf"^cache directory {cache / 'embeddings'} is a file, not a directory"
    with pytest.raises(UserInputError, match=needle), warnings.catch_warnings():
        if command == "merge evaluate":  # no student yet: it had been named first
            score_causal_run(load_recipe(write_causal_recipe(tmp_path, causal_teacher_dirs)), ["s"])
        else:
            select_teachers(load_recipe(write_recipe(tmp_path, teacher_dirs)), SelectionSpec())


def test_a_cache_inside_the_output_or_an_output_inside_the_cache_is_refused_first(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """``--cache_dir`` inside the run's own directory had been accepted, the run's files mixed
    with the cache's (a later ``--overwrite`` refused, naming ``cache/``), and so had a run
    inside the cache's ``spans/``; each is refused by the run and its dry run, naming both,
    nothing written. A run beside the cache's own directories, in its root, runs."""
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--no-progress"]
    out, cache = tmp_path / "out", tmp_path / "cache"
    for where, said in (
        (["--out", str(out), "--cache_dir", str(out / "cache")], "is inside the output"),
        (["--out", str(cache / "spans" / "run"), "--cache_dir", str(cache)], "inside the cache"),
    ):
        for dry in (["--dry-run"], []):
            code, stderr = cli([*args, *where, *dry])
            assert_one_line(code, stderr, [where[1], said])
        assert not out.exists() and not (cache / "spans" / "run").exists()
    code, stderr = cli([*args, "--out", str(cache / "run"), "--cache_dir", str(cache)])
    assert code == 0, stderr


def test_a_cache_inside_another_runs_directory_is_refused_first(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """``--cache_dir`` inside another finished run's directory had been accepted: the cache's
    files made among that run's, which are its own. Refused by the run and its dry run,
    naming the run, nothing written."""
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--no-progress"]
    first = tmp_path / "first"
    code, stderr = cli([*args, "--out", str(first), "--cache_dir", str(tmp_path / "cache")])
    assert code == 0, stderr
    before = sorted(p.name for p in first.iterdir())
    where = ["--out", str(tmp_path / "second"), "--cache_dir", str(first / "cache")]
    for dry in (["--dry-run"], []):
        code, stderr = cli([*args, *where, *dry])
        assert_one_line(code, stderr, [str(first / "cache"), f"inside {first}", "decomposition"])
    assert sorted(p.name for p in first.iterdir()) == before
    assert not (tmp_path / "second").exists()
    # from Python without an output directory, whose call fills its cache all the same
    import lmalgebra
    from tiny import documents

    spans = {"length": 8, "counts": (20, 5, 5)}
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    for call in (lmalgebra.decompose_plan, lmalgebra.decompose):
        with pytest.raises(UserInputError, match=f"would go inside {first}, which holds a dec"):
            call(models, documents(40), spans=spans, cache_dir=first / "cache")
    assert sorted(p.name for p in first.iterdir()) == before


def test_experimental_select_refuses_its_cache_inside_its_output_first(
    teacher_dirs: dict[str, Path], tmp_path: Path, cli
) -> None:
    """``experimental select --cache_dir OUT/cache`` had made the cache, then refused its own
    output directory as "not empty and holds no teacher selection (cache/)", the cache left
    behind: the cache inside the output is named first, nothing written."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    out = tmp_path / "selection"
    args = ["experimental", "select", str(recipe), "--spans.counts", "40,10,10", "-T", "8"]
    code, stderr = cli([*args, "--no-progress", "--out", str(out), "--cache_dir", str(out / "c")])
    assert_one_line(code, stderr, [str(out / "c"), "is inside the output directory"])
    assert not out.exists()


def test_a_selection_saved_from_python_refuses_its_cache_inside_it_or_it_inside_the_cache(
    teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """``select_teachers(..., cache_dir=OUT/c).save(OUT)`` had been refused as "not empty and
    holds no teacher selection (c/)", and ``save`` into the cache's ``spans/`` had written the
    selection among the cache's files: the command refused both, the call neither. ``save``
    names the cache inside the output, and the output inside the cache, nothing written."""
    import warnings

    from lmalgebra.experimental import select_teachers

    recipe = write_recipe(tmp_path, teacher_dirs, heldout_fraction=0.5)
    options = {"spans": {"counts": (40, 10, 20), "length": 8, "per_doc": 4}, "bootstrap": 4}
    out, cache = tmp_path / "selection", tmp_path / "cache"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        inside = select_teachers(recipe, languages=["yy"], cache_dir=out / "c", **options)
        beside = select_teachers(recipe, languages=["yy"], cache_dir=cache, **options)
    with pytest.raises(UserInputError, match=rf"^cache directory {out / 'c'} is inside the out"):
        inside.save(out)
    assert sorted(p.name for p in out.iterdir()) == ["c"]
    target = cache / "spans" / "selection"
    with pytest.raises(UserInputError, match=rf"^output directory {target} is inside the cache"):
        beside.save(target)
    assert not target.exists()
    assert (tmp_path / "elsewhere" / "summary.json") in beside.save(tmp_path / "elsewhere")


@pytest.mark.parametrize("part", ["gguf", "packaged", "mined-maps"])
def test_an_output_inside_the_caches_model_directories_is_refused_by_every_command(
    part: str,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """An output directory inside the cache's ``gguf/`` or ``packaged/`` (or its token maps)
    had been written among the models built there, where one inside its ``spans/`` was
    refused (and by ``decompose`` alone). ``decompose`` (its dry run too), ``merge`` (its dry
    run too) and ``pretrain`` refuse it, naming both, nothing written."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    out = cache / part / "run"
    decompose = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    decompose += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(out))
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--training.steps", "1", "--out", str(out)]
    needles = [f"output directory {out} is inside the cache's {cache / part}"]
    for args in (
        [*decompose, "--out", str(out), "--dry-run"],
        [*decompose, "--out", str(out), "--cache_dir", str(cache)],
        ["merge", "prepare", str(recipe), "--dry-run"],
        ["merge", "prepare", str(recipe)],
        pretrain,
    ):
        assert_one_line(*cli([*args, "--no-progress"]), needles)
        assert not out.exists()


def _build_lock(cache: Path, gguf_file: Path) -> Path:
    """The lock file a build of ``gguf_file``'s cache entry takes turns on."""
    digest = hashlib.sha256(gguf_file.read_bytes()).hexdigest()
    return cache / "gguf" / f".{gguf_file.stem}-{digest[:16]}.lock"


@pytest.mark.parametrize("kind", ["link to nothing", "fifo", "directory"])
def test_a_cache_build_lock_that_is_no_regular_file_is_refused_by_run_and_plan(
    kind: str, gpt2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """The lock a GGUF model's build takes beside its cache entry (``gguf/.NAME.lock``) a link
    to nothing, a FIFO or a directory: one line naming it, from the run and its dry run (which
    had planned it). Through the link the lock had been made as a file where it pointed,
    outside the cache."""
    model, tokenizer = tiny_llama()
    gguf_file = write_llama_gguf(model, tokenizer, tmp_path / "tiny.gguf")
    cache = tmp_path / "cache"
    lock = _build_lock(cache, gguf_file)
    lock.parent.mkdir(parents=True)
    target = tmp_path / "elsewhere.lock"
    if kind == "link to nothing":
        lock.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()
    args = ["decompose", "--models", f"a=gguf:{gguf_file}", "--models", f"b={gpt2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--cache_dir", str(cache), "--no-progress", "--out", str(tmp_path / "out")]
    for flags in (["--dry-run"], []):
        assert_one_line(*cli([*args, *flags]), [f"lock file {lock}", "remove it"])
        assert not target.exists()
        assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in lock.parent.iterdir()) == [lock.name]


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _directory(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.mkdir()
    (path / "x").write_text("x")


def _link_to_nothing(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()
    path.symlink_to(path.with_name("gone"))


def _first(cache: Path, pattern: str) -> Path:
    return sorted(cache.glob(pattern))[0]


# what no writer of the cache leaves, in place of an entry (or of a file in it)
_MISPLACED = {
    "span plan a fifo": ("spans/*.safetensors", _fifo),
    "span plan a directory": ("spans/*.safetensors", _directory),
    "remembered hash a fifo": ("hashes/*.hash", _fifo),
    "architecture check a directory": ("hashes/architecture-*.checked", _directory),
    "embeddings folder a file": ("embeddings/??", lambda p: (shutil.rmtree(p), p.write_text("x"))),
    "embedding entry a link to nothing": ("embeddings/??/*", _link_to_nothing),
    "embedding manifest a fifo": ("embeddings/??/*/manifest.json", _fifo),
    "embedding shard a directory": ("embeddings/??/*/shard-00000.safetensors", _directory),
}


_ARGS = ["-T", "8", "--spans.counts", "20,5,5", "--no-progress"]


@pytest.fixture(scope="module")
def cached_decomposition(
    tmp_path_factory: pytest.TempPathFactory, bert_dir: Path, bert2_dir: Path, corpus_txt: Path
) -> tuple[Path, Path]:
    """A decomposition's cache and its run."""
    import lmalgebra

    root = tmp_path_factory.mktemp("cached")
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    spans = {"length": 8, "counts": (20, 5, 5)}
    options = {"cache_dir": str(root / "cache"), "spans": spans, "progress": False}
    lmalgebra.decompose(models, str(corpus_txt), out=root / "out", **options)
    return root / "cache", root / "out"


@pytest.mark.parametrize("damage", list(_MISPLACED))
def test_what_no_cache_writer_leaves_in_an_entry_is_built_again_and_passed_by_the_dry_run(
    damage: str,
    cached_decomposition: tuple[Path, Path],
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    cli,
) -> None:
    """A FIFO, a directory or a link to nothing in place of a cache entry (or a file in it):
    the run had refused it in one line, which its dry run (which reads no entry) had passed;
    it is built again, and the run's results are those of the intact cache."""
    source, reference = cached_decomposition
    cache = tmp_path / "cache"
    shutil.copytree(source, cache, symlinks=True)
    pattern, damaged = _MISPLACED[damage]
    damaged(_first(cache, pattern))
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), *_ARGS, "--cache_dir", str(cache)]
    args += ["--out", str(tmp_path / "out")]
    before = sorted(cache.rglob("*"))
    code, stderr = cli([*args, "--dry-run"])
    assert code == 0, stderr
    assert sorted(cache.rglob("*")) == before  # the dry run wrote, and moved, nothing
    code, stderr = cli(args)
    assert code == 0, stderr
    for table in ("pairwise_r2_test.csv", "group_r2.csv"):
        assert (tmp_path / "out" / table).read_text() == (reference / table).read_text()


def test_a_token_map_in_place_of_which_stands_a_fifo_is_computed_again(
    teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A FIFO in place of a cached MinED map had been refused in one line by causal training,
    which its dry run had passed; the map is computed again."""
    teacher = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    student = AutoTokenizer.from_pretrained(teacher_dirs["sp"])
    first = mined_map(teacher, student, cache_dir=tmp_path)
    (path,) = tmp_path.glob("mined-*.safetensors")
    _fifo(path)
    again = mined_map(teacher, student, cache_dir=tmp_path)
    assert again.student_ids.tolist() == first.student_ids.tolist()
    assert path.is_file()
