"""Messages that name the right thing: a run directory that is a file is called a file, a
directory in the place of a cache entry is named (not a traceback), and ``--trust-remote-code``
says it runs code only for a model that ships some."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

from hostile_helpers import assert_one_line, one_word_treebank
from merge_fixtures import write_recipe


def _decompose(bert_dir: Path, bert2_dir: Path, corpus: Path, out: Path, cache: Path) -> list[str]:
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus), "-T", "8", "--spans.counts", "20,5,5"]
    return [*args, "--out", str(out), "--cache_dir", str(cache), "--no-progress"]


def test_report_of_a_file_says_it_is_a_file(tmp_path: Path, cli) -> None:
    path = tmp_path / "fits.csv"
    path.write_text("kind,target\n", encoding="utf-8")
    code, stderr = cli(["report", str(path)])
    assert_one_line(code, stderr, [str(path), "is a file, not a directory"])
    assert "does not exist" not in stderr
    assert path.read_text(encoding="utf-8") == "kind,target\n"


@pytest.mark.parametrize(
    ("marker", "command", "holds"),
    [
        ("recipe.yaml", ["report"], "it holds a merge run (recipe.yaml)"),
        (
            "lmalgebra.json",
            ["report"],
            "it holds a model directory written by lmalgebra (lmalgebra.json)",
        ),
        ("summary.json", ["merge", "evaluate"], "it holds a decomposition run (summary.json)"),
        ("summary.json", ["merge", "inspect"], "it holds a decomposition run (summary.json)"),
    ],
)
def test_a_directory_of_another_kind_is_called_what_it_is(
    marker: str, command: list[str], holds: str, tmp_path: Path, cli
) -> None:
    """Not only what the command misses in the directory: what the directory is instead (its
    marker confirmed: a merge run's recipe.yaml beside its examples/, a decomposition's
    summary.json beside its config.yaml, a model's lmalgebra.json beside its config.json)."""
    (tmp_path / marker).write_text("{}\n", encoding="utf-8")
    if marker == "recipe.yaml":  # what such an output always holds beside its marker
        (tmp_path / "examples").mkdir()
    beside = {"lmalgebra.json": "config.json", "summary.json": "config.yaml"}.get(marker)
    if beside is not None:
        (tmp_path / beside).write_text("{}\n", encoding="utf-8")
    code, stderr = cli([*command, str(tmp_path)])
    assert_one_line(code, stderr, [str(tmp_path), holds])


@pytest.mark.parametrize(
    "command",
    [["report"], ["merge", "verify"], ["merge", "inspect"], ["merge", "evaluate"]],
    ids=["report", "verify", "inspect", "evaluate"],
)
def test_a_folder_holding_a_user_s_recipe_is_no_merge_run(
    command: list[str], tmp_path: Path, cli
) -> None:
    """A folder holding a recipe.yaml of the user's (no run's copy: not headed as one, no
    examples/ beside it) had been called "a merge run" by ``report``, and read as a run's copy
    by the commands given a run (its keys refused as the run's)."""
    (tmp_path / "recipe.yaml").write_text("notes: mine\n", encoding="utf-8")
    code, stderr = cli([*command, str(tmp_path)])
    line = assert_one_line(code, stderr, [str(tmp_path)])
    assert "holds a merge run" not in line and "unknown key" not in line, line
    if command[0] == "merge":
        assert "is not a merge run directory: its recipe.yaml is no run's copy" in line
    assert (tmp_path / "recipe.yaml").read_text(encoding="utf-8") == "notes: mine\n"


def test_a_directory_in_place_of_a_span_cache_entry_is_drawn_again(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """No writer of the cache leaves a directory in an entry's place (and the dry run, which
    writes nothing, passes it): the entry is drawn again, as a damaged one is."""
    cache = tmp_path / "cache"
    code, stderr = cli(_decompose(bert_dir, bert2_dir, corpus_txt, tmp_path / "first", cache))
    assert code == 0, stderr
    [entry] = (cache / "spans").glob("*.safetensors")
    entry.unlink()
    entry.mkdir()  # a cache entry made a directory by hand
    out = tmp_path / "second"
    code, stderr = cli(_decompose(bert_dir, bert2_dir, corpus_txt, out, cache))
    assert code == 0, stderr
    assert entry.is_file()  # drawn again, and the same spans: the same figures
    first = (tmp_path / "first" / "group_r2.csv").read_text()
    assert (out / "group_r2.csv").read_text() == first


@pytest.fixture
def trusted(
    tmp_path: Path, bert2_dir: Path, corpus_txt: Path, caplog: pytest.LogCaptureFixture, cli
):
    """``decompose --trust-remote-code`` of model 'a' (a directory) beside a tiny BERT:
    (exit status, stderr, the messages logged)."""

    def run(model: Path) -> tuple[int, str, list[str]]:
        caplog.set_level(logging.INFO, logger="lmalgebra")
        args = _decompose(model, bert2_dir, corpus_txt, tmp_path / "out", tmp_path / "cache")
        code, stderr = cli([*args, "--trust-remote-code"])
        return code, stderr, [r.getMessage() for r in caplog.records]

    return run


def test_trust_remote_code_runs_nothing_for_a_model_that_ships_none(
    bert_dir: Path, trusted
) -> None:
    code, stderr, messages = trusted(bert_dir)
    assert code == 0, stderr
    assert not [m for m in messages if "running code shipped" in m]
    assert any(f"model 'a' from {bert_dir} ships no code" in m for m in messages), messages


def test_trust_remote_code_says_it_runs_the_code_a_model_ships(
    tmp_path: Path, bert_dir: Path, trusted
) -> None:
    custom = tmp_path / "custom"
    shutil.copytree(bert_dir, custom)
    config = json.loads((custom / "config.json").read_text(encoding="utf-8"))
    config["auto_map"] = {"AutoModel": "modeling_custom.CustomModel"}  # its file is absent
    (custom / "config.json").write_text(json.dumps(config), encoding="utf-8")
    code, stderr, messages = trusted(custom)
    assert_one_line(code, stderr, ["model 'a'"])
    assert f"running code shipped with model 'a' from {custom} (--trust-remote-code)" in messages
    assert not (tmp_path / "out" / "summary.json").exists()


@pytest.mark.parametrize("existed", [False, True], ids=["new directory", "existing directory"])
def test_a_disk_too_full_for_the_lock_names_it_and_leaves_nothing(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    cli,
    monkeypatch: pytest.MonkeyPatch,
    existed: bool,
) -> None:
    """The disk is full before the first byte: the lock file is the one file named, and neither
    it nor a directory the command made is left behind (a user's directory stays as it was)."""
    import errno
    import os

    import lmalgebra.storage.lockfile as lockfile

    def full(fd: int, data: bytes, offset: int) -> int:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    out = tmp_path / "runs" / "out"
    if existed:
        out.mkdir(parents=True)
        (out / "notes.txt").write_text("mine\n", encoding="utf-8")
    monkeypatch.setattr(lockfile.os, "pwrite", full)
    code, stderr = cli(_decompose(bert_dir, bert2_dir, corpus_txt, out, tmp_path / "cache"))
    assert_one_line(code, stderr, ["no space left", str(out / ".lmalgebra.lock")])
    if existed:
        assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    else:
        assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "where", ["gguf file", "onnx file", "onnx folder", "config.json", "treebank split"]
)
def test_a_fifo_where_a_file_is_read_is_called_what_it_is(
    where: str, bert_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A FIFO in place of a GGUF file had been called missing ("does not exist"), in place of a
    model's ``config.json`` "no config.json", and in place of a treebank's test file "no test
    split": each is named as the FIFO it is, and nothing waits on it. An ONNX file (given, or
    the one ``.onnx`` file of a folder) had been opened, and the command waited for a writer."""
    import os

    from hostile_helpers import one_word_treebank

    out = tmp_path / "out"
    if where == "treebank split":
        bank = one_word_treebank(tmp_path / "bank")
        fifo = bank / "x-ud-test.conllu"
        fifo.unlink()
        os.mkfifo(fifo)
        args = ["evaluate-pos", str(bank), "--models", f"a={bert_dir}", "--out", str(out)]
    else:
        model = tmp_path / "model"
        shutil.copytree(bert_dir, model)
        fifo = {
            "config.json": model / "config.json",
            "gguf file": tmp_path / "m.gguf",
            "onnx file": tmp_path / "m.onnx",
            "onnx folder": tmp_path / "exported" / "model.onnx",
        }[where]
        fifo.unlink(missing_ok=True)
        fifo.parent.mkdir(exist_ok=True)
        os.mkfifo(fifo)
        given = {
            "gguf file": f"gguf:{fifo}",
            "onnx file": f"onnx:{fifo}#{bert_dir}",
            "onnx folder": f"onnx:{fifo.parent}#{bert_dir}",
        }.get(where, str(model))
        args = ["decompose", "--models", f"a={given}", "--models", f"b={bert_dir}", "--dry-run"]
        args += ["--corpus.paths", str(corpus_txt), "--out", str(out)]
    code, stderr = cli(args)
    assert_one_line(code, stderr, [str(fifo.name), "FIFO"])
    assert not out.exists()


def test_a_context_beyond_a_gguf_model_names_the_model_not_its_cache_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``merge bits-per-byte --context`` beyond a ``gguf:`` model's positions had named the
    dequantised directory in the cache, a path the user never gave."""
    from gguf_fixtures import tiny_llama, write_llama_gguf
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distill.causal.bits_per_byte import bits_per_byte
    from lmalgebra.sources.models import ModelRef

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    path = write_llama_gguf(*tiny_llama(), tmp_path / "tiny.gguf")
    ref = ModelRef.parse(f"a=gguf:{path}")
    with pytest.raises(UserInputError) as caught:
        bits_per_byte(ref, {"xx": ["some text"]}, context=1000)
    said = str(caught.value)
    assert "model 'a'" in said and f"gguf:{path}" in said and "cache" not in said, said


@pytest.mark.parametrize("dry_run", [True, False])
def test_a_gguf_teacher_of_the_wrong_kind_is_named_as_given(
    dry_run: bool, teacher_dirs: dict[str, Path], tmp_path: Path, monkeypatch, cli
) -> None:
    """A causal GGUF model as a masked teacher had been named by the directory the toolkit read
    it from: a temporary one in the dry run (``/tmp/lmalgebra-plan-...``), the cache's in the
    run; the message names ``gguf:FILE``, as the recipe gives it."""
    from gguf_fixtures import tiny_llama, write_llama_gguf
    from merge_fixtures import write_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    path = write_llama_gguf(*tiny_llama(), tmp_path / "llama.gguf")
    recipe = write_recipe(tmp_path, {**teacher_dirs, "sp": f"gguf:{path}"})
    args = ["merge", "run", str(recipe), "--no-progress", *(["--dry-run"] if dry_run else [])]
    line = assert_one_line(*cli(args), ["teacher 'sp'", f"gguf:{path}"])
    assert "lmalgebra-plan" not in line and str(tmp_path / "cache") not in line, line


def test_a_hub_id_out_of_reach_is_named_by_its_setting(
    causal_teacher_dirs: dict[str, Path], corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """An unreachable hub id given as ``student.tokenizer`` or as ``--encoder``: the one line
    names the setting, where it had said "model 'student'" or "model 'enc'" (a name made from
    the id, which the user never gave)."""
    from causal_fixtures import write_causal_recipe

    recipe = write_causal_recipe(
        tmp_path, causal_teacher_dirs, student={"tokenizer": "nowhere-org/tok"}
    )
    code, stderr = cli(["merge", "train", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["model 'student.tokenizer'", "'nowhere-org/tok'", "reached"])
    args = ["pretrain", "head-only", "--language", "xx", "--encoder", "nowhere-org/enc"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    code, stderr = cli(args)
    assert_one_line(code, stderr, ["model 'encoder'", "'nowhere-org/enc'", "reached"])


def test_a_mistyped_path_read_as_a_hub_id_says_no_such_directory_is_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``models/bret`` where ``models/`` is a local directory is read as a hub id (it is a
    well-formed one): the line had named the hub alone, not that the directory is not there."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.sources.hub import snapshot

    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    with pytest.raises(UserInputError) as caught:
        snapshot("model 'a'", "models/bret", None)
    assert "nor is there a directory models/bret here (models/ holds no bret)" in str(caught.value)
    with pytest.raises(UserInputError) as caught:
        snapshot("model 'a'", "nowhere-org/bret", None)
    assert "directory" not in str(caught.value).split(";")[0]


@pytest.mark.parametrize(
    "args",
    [
        ["merge", "verify", "FIFO"],
        ["merge", "inspect", "FIFO"],
        ["merge", "evaluate", "FIFO"],
        ["evaluate-pos", "FIFO", "--models", "a=MODEL", "--out", "OUT"],
    ],
    ids=["verify", "inspect", "evaluate", "evaluate-pos"],
)
def test_a_fifo_given_for_a_directory_is_called_what_it_is(
    args: list[str], bert_dir: Path, tmp_path: Path, cli
) -> None:
    """A FIFO given as a merge run had been "not a merge run directory (no recipe.yaml)", as a
    treebank "a file": each is named as the FIFO it is, as an output directory is."""
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    names = {"FIFO": str(fifo), "a=MODEL": f"a={bert_dir}", "OUT": str(tmp_path / "out")}
    code, stderr = cli([names.get(a, a) for a in args])
    assert_one_line(code, stderr, [str(fifo), "is a FIFO, socket or device, not a directory"])


def test_the_api_names_a_fifo_given_for_a_run_directory(tmp_path: Path) -> None:
    import os

    from lmalgebra import Decomposition, MergeRun, UserInputError

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for load in (Decomposition.load, MergeRun.load):
        with pytest.raises(UserInputError, match="is a FIFO, socket or device, not a directory"):
            load(fifo)


def test_bits_per_byte_refuses_a_name_given_twice_or_a_teachers_name_for_another_model(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """``merge bits-per-byte --models a=X --models a=Y`` scored both as one model ``a``, and
    ``--models bl=OTHER`` wrote another model's scores under the run's teacher ``bl`` (which
    RDT then read as the teacher's): both refused before any model is read; the teacher
    itself under its name passes."""
    from causal_fixtures import write_causal_recipe
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs)
    pipeline.prepare(load_recipe(recipe), progress=False)
    run, bl, uni = tmp_path / "run", causal_teacher_dirs["bl"], causal_teacher_dirs["uni"]
    code, stderr = cli(
        ["merge", "bits-per-byte", str(run), "--models", f"a={bl}", "--models", f"a={uni}"]
    )
    assert_one_line(code, stderr, ["model names must be unique; repeated: a"])
    code, stderr = cli(["merge", "bits-per-byte", str(run), "--models", f"bl={uni}"])
    assert_one_line(code, stderr, ["model 'bl'", str(uni), "the run's teacher 'bl'", str(bl)])
    student = run / "student" / "model"  # a saved student, as the run's layout finds one
    shutil.copytree(bl, student)
    (student / "lmalgebra.json").write_text("{}", encoding="utf-8")
    code, stderr = cli(["merge", "bits-per-byte", str(run), "--models", f"student={uni}"])
    assert_one_line(code, stderr, ["model 'student'", str(uni), "the run's student 'student'"])
    assert not (run / "evaluation").exists()
    code, stderr = cli(["merge", "bits-per-byte", str(run), "--models", f"bl={bl}/"])
    assert code == 0, stderr


@pytest.mark.parametrize("stands", ["fifo", "link to nothing", "directory"])
@pytest.mark.parametrize("command", ["verify", "inspect", "evaluate"])
def test_a_run_whose_recipe_copy_is_no_file_is_named_not_called_no_run(
    stands: str, command: str, tmp_path: Path, cli
) -> None:
    """A merge run whose ``recipe.yaml`` is a FIFO, a link to nothing or a directory had been
    "not a merge run directory (no recipe.yaml)"."""
    import os

    run = tmp_path / "run"
    (run / "examples").mkdir(parents=True)
    recipe = run / "recipe.yaml"
    if stands == "fifo":
        os.mkfifo(recipe)
    elif stands == "directory":
        recipe.mkdir()
    else:
        recipe.symlink_to(tmp_path / "gone.yaml")
    said = {"fifo": "is not a regular file", "directory": "is a directory, not a file"}
    code, stderr = cli(["merge", command, str(run)])
    assert_one_line(code, stderr, [str(recipe), said.get(stands, "which does not exist")])
    assert "not a merge run directory" not in stderr


@pytest.mark.parametrize("stands", ["fifo", "link to nothing"])
def test_an_output_known_by_a_marker_that_is_no_file_is_still_that_kind(
    stands: str, tmp_path: Path
) -> None:
    """A teacher selection whose ``recommended.yaml`` was a FIFO had been taken, by its
    ``summary.json``, for a decomposition run, and ``experimental select`` refused it as one."""
    import os

    from lmalgebra.storage.output_paths import directory_kind

    (tmp_path / "summary.json").write_text("{}\n", encoding="utf-8")
    marker = tmp_path / "recommended.yaml"
    if stands == "fifo":
        os.mkfifo(marker)
    else:
        marker.symlink_to(tmp_path / "gone.yaml")
    assert directory_kind(tmp_path) == ("a teacher selection", "recommended.yaml")


@pytest.mark.parametrize("where", ["output", "input"])
@pytest.mark.parametrize("command", ["decompose", "evaluate-pos", "report", "merge init"])
def test_a_path_too_long_for_the_file_system_is_one_line(
    where: str, command: str, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A name longer than 255 bytes (or a path longer than 4096), given as an input or an
    output: the first look at it had ended in an ``OSError: [Errno 36] File name too long``
    traceback. One line now, naming the path (its ends) and both lengths; nothing is made."""
    long = tmp_path / ("x" * 300)
    deep = tmp_path.joinpath(*["y" * 200] * 25)  # each name short, the whole beyond 4096
    path = long if where == "output" else deep
    models = ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args = {
        "decompose": ["decompose", *models, "--corpus.paths"]
        + ([str(corpus_txt), "--out", str(path)] if where == "output" else [str(path)]),
        "evaluate-pos": ["evaluate-pos", *models[:2]]
        + (["--out", str(path), str(tmp_path)] if where == "output" else [str(path)]),
        "report": ["report", str(tmp_path), "--out", str(path)]
        if where == "output"
        else ["report", str(path)],
        "merge init": ["merge", "init", str(path)]
        if where == "output"
        else ["merge", "prepare", str(path)],
    }[command]
    before = sorted(tmp_path.iterdir())
    code, stderr = cli(args)
    line = assert_one_line(code, stderr, ["path too long for the file system", str(path)[:40]])
    assert "Traceback" not in stderr and str(path) not in line  # its ends, not 5,000 bytes
    assert sorted(tmp_path.iterdir()) == before


@pytest.mark.parametrize("kind", ["directory", "fifo", "dangling link"])
def test_a_tokenizer_file_that_is_no_file_is_named(
    kind: str, bert_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A model's ``tokenizer.json`` that is a directory, a FIFO or a link to nothing:
    transformers passed over it and failed on the rest, in a line cut at "Couldn't instantiate
    the backend tokenizer from one of:", naming no file. The file is named, by the dry run
    too."""
    import os

    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    path = model / "tokenizer.json"
    path.unlink(missing_ok=True)
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp_path / "gone")
    args = ["decompose", "--models", f"a={model}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    for flags in (["--dry-run"], []):
        assert_one_line(*cli([*args, *flags]), ["model 'a'", f"tokenizer file {path}"])


def test_a_model_without_tokenizer_json_says_so_in_one_line(
    bert_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A model directory holding ``tokenizer_config.json`` and no ``tokenizer.json`` had been
    refused in transformers' first line, "Couldn't instantiate the backend tokenizer from one
    of:", cut at its colon: the line says which tokenizer files it holds and what it lacks, by
    the dry run too."""
    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    (model / "tokenizer.json").unlink()
    args = ["decompose", "--models", f"a={model}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    for flags in (["--dry-run"], []):
        line = assert_one_line(
            *cli([*args, *flags]),
            ["model 'a'", "holds tokenizer_config.json but no tokenizer.json"],
        )
        assert not line.endswith(":"), line


def test_a_max_length_that_cuts_every_word_names_it(bert_dir: Path, tmp_path: Path, cli) -> None:
    """``evaluate-pos --max_length 2`` leaves a BERT sentence its two special tokens alone: the
    refusal had said the split holds no word the tokenizer can represent."""
    bank = one_word_treebank(tmp_path / "bank")
    args = ["evaluate-pos", str(bank), "--models", f"a={bert_dir}", "--max_length", "2"]
    code, stderr = cli([*args, "--out", str(tmp_path / "out"), "--no-progress"])
    assert_one_line(
        code, stderr, ["model 'a'", "train split", "past the 2 subwords", "--max_length"]
    )
    assert "represent" not in stderr


def test_a_max_length_that_leaves_every_span_alike_names_it(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """``decompose --max_length 2`` cuts a BERT span to its two special tokens: every span embeds
    alike, and the refusal had named the model alone ("check its embeddings")."""
    args = _decompose(bert_dir, bert2_dir, corpus_txt, tmp_path / "out", tmp_path / "cache")
    code, stderr = cli([*args, "--max_length", "2"])
    needles = ["model 'a' does not vary", "cut to its first 2 tokens", "raise --max_length (max_"]
    assert_one_line(code, stderr, needles)


def test_a_teacher_that_reads_a_language_as_unknown_tokens_is_named(
    tmp_path: Path, teacher_dirs, cli, caplog: pytest.LogCaptureFixture
) -> None:
    """A teacher whose tokenizer turns a language into its unknown token had been prepared,
    taught and distilled from without a word (a causal store aligns no byte of one): `merge
    prepare` names it, with its share of the language's tokens; a teacher that reads the text
    is not named."""
    from merge_fixtures import write_recipe

    recipe = write_recipe(tmp_path, teacher_dirs)
    cyrillic = "съешь же ещё этих мягких французских булок да выпей чаю\n" * 30
    (tmp_path / "yy.txt").write_text(cyrillic, encoding="utf-8")
    caplog.set_level(logging.WARNING, logger="lmalgebra")
    code, stderr = cli(["merge", "prepare", str(recipe), "--no-progress"])
    assert code == 0, stderr
    named = sorted(r.getMessage() for r in caplog.records if "unknown token" in r.getMessage())
    assert [m.split(" reads ")[0] for m in named] == ["teacher 'sp'", "teacher 'wp'"], named
    assert all("of the tokens of language 'yy'" in m for m in named)  # xx, read, is not named
    assert "as its unknown token '[UNK]'" in named[1]


def test_an_unknown_prefixed_name_points_to_the_local_path_spelled_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """``recipe:NAME`` and ``package:NAME`` are the shipped ones even where a local file of
    that name is here: the refusal had said no such recipe or asset, not how to reach the file."""
    monkeypatch.chdir(tmp_path)
    Path("recipe:mine").write_text("models: []\n", encoding="utf-8")
    Path("package:mine").mkdir()
    Path("c.txt").write_text("one text\n", encoding="utf-8")
    code, stderr = cli(["decompose", "recipe:mine", "--dry-run"])
    assert_one_line(code, stderr, ["no shipped recipe 'mine'", "reached as ./recipe:mine"])
    models = ["--models", "package:mine", "--models", "package:minilm"]
    code, stderr = cli(["decompose", *models, "--corpus.paths", "c.txt", "--dry-run"])
    assert_one_line(code, stderr, ["unknown packaged asset 'mine'", "as ./package:mine"])
    code, stderr = cli(["decompose", "recipe:nothing", "--dry-run"])
    assert "./recipe:nothing" not in stderr


def test_a_model_name_with_spaces_around_it_is_named_in_its_reference(cli) -> None:
    """``--models ' x =PATH'`` was refused as ``ModelRef: key 'name': ...``, an internal class
    the user never named: the reference as given is named, as its other faults are."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.sources.models import ModelRef

    with pytest.raises(UserInputError, match=r"^model reference ' x =p': key 'name': a model"):
        ModelRef.parse(" x =p")
    args = ["decompose", "--models", "a =package:minilm", "--models", "b=package:minilm"]
    line = assert_one_line(*cli([*args, "--dry-run"]), ["model reference 'a =package:minilm'"])
    assert "ModelRef" not in line


@pytest.mark.parametrize("command", ["inspect", "verify", "evaluate", "bits-per-byte"])
def test_a_run_directory_that_does_not_exist_is_named_so(command: str, tmp_path: Path, cli) -> None:
    """A mistyped run directory had been called "not a merge run directory (no recipe.yaml)",
    as if a run there were not yet prepared."""
    missing = tmp_path / "nope"
    code, stderr = cli(["merge", command, str(missing)])
    assert_one_line(code, stderr, [f"run directory {missing} does not exist", "check the path"])
    assert not missing.exists()


def test_a_user_s_recipe_yaml_in_output_dir_is_not_replaced(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``merge prepare`` into a folder holding a recipe.yaml of the user's (not this recipe, no
    run's copy) had replaced it with the run's copy, unsaid; ``pretrain`` there had been refused
    as writing into "a merge run"."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "recipe.yaml").write_text("notes: mine\n", encoding="utf-8")
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=str(out))
    for dry in (["--dry-run"], []):
        code, stderr = cli(["merge", "prepare", str(recipe), "--no-progress", *dry])
        assert_one_line(code, stderr, [str(out / "recipe.yaml"), "no merge run's copy"])
    assert sorted(p.name for p in out.iterdir()) == ["recipe.yaml"]
    assert (out / "recipe.yaml").read_text(encoding="utf-8") == "notes: mine\n"
    pretrain = ["pretrain", "masked", "--corpus.paths", str(tmp_path / "xx.txt"), "--out", str(out)]
    pretrain += ["--language", "xx", "--tokenizer.vocab_size", "100", "--training.steps", "1"]
    code, stderr = cli([*pretrain, "--no-progress"])
    assert code == 0, stderr  # a folder of the user's, as one holding their notes.txt is
    assert (out / "recipe.yaml").read_text(encoding="utf-8") == "notes: mine\n"


def test_a_message_holding_an_emoji_code_is_shown_as_written(tmp_path: Path, cli) -> None:
    """A message naming ``onnx:package:NAME`` (a path, a model) had been shown as
    ``onnx📦NAME``: the console read ``:package:`` as an emoji code."""
    code, stderr = cli(["merge", "inspect", str(tmp_path / "onnx:package:minilm")])
    assert_one_line(code, stderr, [f"{tmp_path}/onnx:package:minilm does not exist"])


def test_the_console_shows_emoji_codes_as_written() -> None:
    """What a command prints (a model named ``x:smile:y``, say) is shown as written."""
    from lmalgebra.cli.app import console

    with console.capture() as captured:
        console.print("teacher onnx:package:minilm, model x:smile:y")
    assert captured.get().strip() == "teacher onnx:package:minilm, model x:smile:y"


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"text_column": "nope"}, "package:wiki-en: no text field 'nope'"),
        ({"doc_sep": "blank"}, "the corpus has none (package:wiki-en)"),
    ],
    ids=["text_column", "doc_sep"],
)
def test_a_packaged_corpus_is_named_as_given(
    options: dict[str, str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal of a ``package:NAME`` corpus had named its file inside the installed package
    (``.../site-packages/.../summaries_en-us.json``), not the corpus the user wrote."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.sources import corpus

    inside = tmp_path / "site-packages" / "wiki" / "summaries_en-us.json"
    inside.parent.mkdir(parents=True)
    inside.write_text(json.dumps([{"title": "t", "extract": "Some text."}]), encoding="utf-8")
    monkeypatch.setattr(corpus, "asset_path", lambda name, kind: inside)
    spec = corpus.CorpusSpec(paths=["package:wiki-en"], **options)  # type: ignore[arg-type]
    with pytest.raises(UserInputError) as caught:
        corpus.read_documents(spec)
    assert words in str(caught.value) and "site-packages" not in str(caught.value)


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        ("missing.yaml", None, "pretrain spec {path} does not exist"),
        ("list.yaml", "- a\n", "pretrain spec {path}: the top level must be a mapping"),
        (
            "beside.yaml",
            "language: xx\ncorpus: {paths: [xx.txt]}\nout: o\ntokenizer: {vocab_size: 300}\n",
            "the pretrain spec's directory, and nothing from the current directory",
        ),
    ],
    ids=["missing", "list", "relative"],
)
def test_a_pretrain_spec_is_called_a_spec(
    name: str,
    text: str | None,
    words: str,
    tmp_path: Path,
    cli,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``pretrain``'s file is its spec: its messages had called it a recipe (``recipe
    spec.yaml does not exist``, ``the recipe's directory``), the merge recipe's word."""
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "xx.txt").write_text("Some text.\n", encoding="utf-8")
    path = folder / name
    if text is not None:
        path.write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, stderr = cli(["pretrain", "causal", str(path.relative_to(tmp_path))])
    line = assert_one_line(code, stderr, [words.format(path=path.relative_to(tmp_path))])
    assert "recipe" not in line, line


def test_a_folder_holding_a_user_s_summary_is_no_decomposition_run(tmp_path: Path, cli) -> None:
    """A ``summary.json`` of the user's (no ``config.yaml`` beside it) had made their folder "a
    decomposition run" to the messages of the merge run's readers."""
    (tmp_path / "summary.json").write_text("{}\n", encoding="utf-8")
    code, stderr = cli(["merge", "verify", str(tmp_path)])
    line = assert_one_line(code, stderr, [str(tmp_path), "is not a merge run directory"])
    assert "decomposition run" not in line, line
