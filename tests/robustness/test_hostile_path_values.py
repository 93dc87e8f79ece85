"""An empty string given for a path (``--out "$DIR"`` with ``DIR`` unset, ``output_dir: ""``)
is refused, naming where it was given: ``Path("")`` is the current directory, which the run
had written into or read from, with nothing said. A leading ``~`` no shell expanded is the home
directory wherever a path is given."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml

from hostile_helpers import assert_one_line
from lmalgebra.core.errors import UserInputError

EMPTY = "an empty path"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The current directory, holding a user's file, which an empty path had stood for."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine\n")
    return tmp_path


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["demo", "--quick", "--out", ""], "--out"),
        (["merge", "verify", ""], "RUN_DIR"),
        (["merge", "init", " "], "PATH"),
        (["report", ""], "RUN_DIR"),
    ],
    ids=["option", "argument", "blank", "report"],
)
def test_an_empty_path_on_the_command_line_is_refused(
    cli, here: Path, args: list[str], named: str
) -> None:
    code, stderr = cli(args)
    assert_one_line(code, stderr, [f"{named}: {EMPTY}"])
    assert sorted(p.name for p in here.iterdir()) == ["notes.txt"]  # nothing written here


def test_an_empty_path_in_a_recipe_key_or_its_flag_is_refused(cli, here: Path) -> None:
    recipe = here / "recipe.yaml"
    models = [{"name": "a", "path": "random:bert-tiny"}, {"name": "b", "path": "random:bert-tiny"}]
    corpus = {"paths": ["corpus.txt"]}
    recipe.write_text(yaml.safe_dump({"models": models, "corpus": corpus, "out": ""}))
    code, stderr = cli(["decompose", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["key 'out'", EMPTY])
    recipe.write_text(yaml.safe_dump({"models": models, "corpus": corpus}))
    code, stderr = cli(["decompose", str(recipe), "--dry-run", "--cache_dir", ""])
    assert_one_line(code, stderr, ["--cache_dir ''", EMPTY])


def test_an_empty_model_tokenizer_or_corpus_path_is_refused_not_read_as_here(
    cli, here: Path
) -> None:
    """Text naming a path or a hub id (a model's or a teacher's path, a corpus file, a
    tokenizer, an encoder) given as "": each had been read as the current directory ('. is not
    a model directory', '.: a directory, but not a saved dataset')."""
    from lmalgebra.distill.recipe import TeacherSpec
    from lmalgebra.sources.corpus import CorpusSpec

    recipe = here / "recipe.yaml"
    models = [{"name": "a", "path": ""}, {"name": "b", "path": "random:bert-tiny"}]
    recipe.write_text(yaml.safe_dump({"models": models, "corpus": {"paths": ["c.txt"]}}))
    code, stderr = cli(["decompose", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["key 'models.0.path'", EMPTY])
    flags = ["--models", "b=random:bert-tiny", "--models", "c=random:bert-tiny"]
    for flag in ("--corpus.paths", "--reference_tokenizer"):
        given = [flag, ""] + (["--corpus.paths", "c.txt"] if flag != "--corpus.paths" else [])
        code, stderr = cli(["decompose", *flags, *given, "--dry-run"])
        assert_one_line(code, stderr, [f"{flag} ''", EMPTY])
    with pytest.raises(UserInputError, match=f"key 'path': {EMPTY}"):
        TeacherSpec(path=" ")
    with pytest.raises(UserInputError, match=f"key 'paths': {EMPTY}"):
        CorpusSpec(paths=["c.txt", ""])
    assert sorted(p.name for p in here.iterdir()) == ["notes.txt", "recipe.yaml"]


def test_an_empty_path_given_to_the_python_api_is_refused(here: Path) -> None:
    from lmalgebra.api.decomposition import Decomposition
    from lmalgebra.lmd.settings.recipe import DecomposeConfig

    with pytest.raises(UserInputError, match=f"Decomposition.load\\(\\): run_dir: {EMPTY}"):
        Decomposition.load("")
    models = [{"name": n, "path": "random:bert-tiny"} for n in "ab"]
    with pytest.raises(UserInputError, match=f"key 'cache_dir': {EMPTY}"):
        DecomposeConfig(models=models, corpus={"paths": ["c.txt"]}, cache_dir="")


def test_a_leading_tilde_on_the_command_line_is_the_home_directory(
    cli, here: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quoted ``~`` given to an option or argument the command line reads itself (``report``,
    ``demo --out``) had been a directory named ``~`` here, as it had in a recipe."""
    home = here / "home"
    monkeypatch.setenv("HOME", str(home))
    code, stderr = cli(["report", "~/nothing"])
    assert_one_line(code, stderr, [f"run directory {home / 'nothing'} does not exist"])
    code, stderr = cli(["spans", "~/no-recipe.yaml", "--out", "~/spans.jsonl"])
    assert_one_line(code, stderr, [str(home / "no-recipe.yaml")])
    assert not (here / "~").exists()


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--models", "a=~nosuchuser/m", "--models", "b=B"], "directory ~nosuchuser/m"),
        (["--models", "a=gguf:~nosuchuser/m.gguf", "--models", "b=B"], "~nosuchuser/m.gguf"),
        (
            ["--models", "a=B", "--models", "b=random:B", "--reference_tokenizer", "~nosuchuser/t"],
            "t",
        ),
    ],
    ids=["model", "gguf", "tokenizer"],
)
def test_a_tilde_of_no_user_is_a_path_as_given_not_a_traceback(
    args: list[str], named: str, cli, here: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path
) -> None:
    """``~nosuchuser/...`` (a user this machine does not have) had raised ``RuntimeError: Could
    not determine home directory`` where a model, GGUF file, tokenizer or corpus is read; it is
    the path as given (as a shell leaves it), named as missing."""
    given = [str(bert_dir) if a == "B" else re.sub(r"(?<=[=:])B$", str(bert_dir), a) for a in args]
    corpus = ["--corpus.paths", str(corpus_txt), "--out", str(here / "out"), "--dry-run"]
    code, stderr = cli(["decompose", *given, *corpus])
    assert_one_line(code, stderr, [named, "does not exist"])
    models = ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}", "--dry-run"]
    code, stderr = cli(["decompose", *models, "--corpus.paths", "~nosuchuser/c.txt"])
    assert_one_line(code, stderr, ["corpus ~nosuchuser/c.txt does not exist"])


def test_a_model_path_holding_an_equals_sign_an_at_or_a_hash_is_that_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--models runs/lr=0.1/model`` had been split at its last ``=`` into a model named
    ``runs/lr`` at ``0.1/model``, and ``ckpt@v2`` into ``ckpt`` at revision ``v2``: a name is
    what comes before the first ``=`` (no path's ``/``), and a local path is taken whole."""
    from lmalgebra.sources.models import ModelRef

    monkeypatch.chdir(tmp_path)
    for made in ("runs/lr=0.1/model", "ckpt@v2", "run#2"):
        (tmp_path / made).mkdir(parents=True)
    (tmp_path / "run#2" / "m.onnx").write_bytes(b"")

    def parsed(text: str) -> tuple[str, str, str | None]:
        ref = ModelRef.parse(text)
        return ref.name, ref.path, ref.revision

    assert parsed("runs/lr=0.1/model") == ("model", "runs/lr=0.1/model", None)
    assert parsed("a=runs/lr=0.1/model") == ("a", "runs/lr=0.1/model", None)
    assert parsed("a=elsewhere/lr=0.1") == ("a", "elsewhere/lr=0.1", None)
    assert parsed("ckpt@v2") == ("ckpt@v2", "ckpt@v2", None)
    assert parsed("org/model@v1") == ("model", "org/model", "v1")  # a hub id and its revision
    assert ModelRef.parse("onnx:run#2/m.onnx").path == "run#2/m.onnx"
    assert ModelRef.parse("onnx:run#2/m.onnx#tok").tokenizer == "tok"


def test_a_newline_in_a_path_named_keeps_the_message_one_line(tmp_path: Path, cli) -> None:
    """A directory named with a newline had broken the one line naming it in two."""
    run = tmp_path / "a\nb"
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, ["a\\nb"])


def test_a_runs_relative_paths_read_from_elsewhere_are_refused_naming_both_directories(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe's relative paths are read from the current directory; the commands given the
    run directory read them from its copy, and from another directory had named the teachers
    missing (or read other files of those names). The copy records where the run was made: a
    relative path that names something there and nothing here is refused, naming its key and
    both directories; from the run's own directory the same commands read it as before."""
    from lmalgebra.distill.pipeline import prepare, verify
    from lmalgebra.distill.recipe import MADE_IN, load_recipe, run_recipe
    from merge_fixtures import build_teachers, write_recipe

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    teachers = build_teachers(project)
    path = write_recipe(project, {n: p.relative_to(project) for n, p in teachers.items()})
    data = yaml.safe_load(path.read_text())
    data["output_dir"] = "run"
    for spec in data["languages"].values():
        spec["corpus"]["paths"] = [Path(p).name for p in spec["corpus"]["paths"]]
    path.write_text(yaml.safe_dump(data))
    monkeypatch.chdir(project)
    recipe = load_recipe(path)
    prepare(recipe, progress=False)
    copy = project / "run" / "recipe.yaml"
    assert copy.read_text().splitlines()[0] == f'{MADE_IN}"{project}"'
    assert "run its commands there" in MADE_IN
    assert load_recipe(copy).model_dump() == recipe.model_dump()  # fingerprints unchanged
    assert run_recipe(Path("run")).output_dir == Path("run")  # read from here: refused nothing

    monkeypatch.chdir(elsewhere)
    with pytest.raises(UserInputError, match=r"key 'languages\.xx\.corpus\.paths'") as err:
        verify(project / "run")
    assert "\n" not in str(err.value)
    # the first line had said relative paths "are read from the directory the run was made
    # in", which commands run elsewhere do not do; a copy of that older line reads the same
    text = copy.read_text()
    older = "# relative paths below are read from the directory the run was made in: "
    copy.write_text(text.replace(MADE_IN, older, 1))
    with pytest.raises(UserInputError, match=r"key 'languages\.xx\.corpus\.paths'"):
        verify(project / "run")
    copy.write_text(text)
    code, stderr = cli(["merge", "verify", str(project / "run")])
    needles = ["key 'languages.xx.corpus.paths'", str(project), str(elsewhere), "run the command"]
    assert_one_line(code, stderr, needles)
    (elsewhere / "xx.txt").write_text("another file of that name\n")
    (elsewhere / "yy.txt").write_text("another file of that name\n")
    (elsewhere / "wp").mkdir()
    with pytest.raises(UserInputError, match=r"key 'teachers\.sp\.path'"):
        run_recipe(project / "run")  # a path found here but not its neighbours


def test_a_recipes_relative_teacher_read_from_elsewhere_names_both_directories(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe naming its teachers and corpora relative to its own directory (``teachers/sp``),
    run from another: the teacher was refused as a hub id out of reach of the offline cache,
    no word of the directory beside the recipe that holds it. Relative paths are read from the
    current directory, as ``from_pretrained`` reads them; one that names nothing here and
    something beside the recipe is refused, naming its key and both directories, by the command
    and ``merge()``; a hub id that names no directory keeps the hub's line, no directory in it."""
    import lmalgebra
    from lmalgebra.distill.recipe import MADE_IN
    from merge_fixtures import build_teachers, write_recipe

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    elsewhere.mkdir()
    teachers = build_teachers(project / "teachers")
    path = write_recipe(project, {n: p.relative_to(project) for n, p in teachers.items()})
    monkeypatch.chdir(elsewhere)
    needles = ["key 'teachers.sp.path'", str(project), str(elsewhere), "run the command from"]
    code, stderr = cli(["merge", "prepare", str(path), "--dry-run", "--no-progress"])
    assert_one_line(code, stderr, needles)
    with pytest.raises(UserInputError) as err:
        lmalgebra.merge(path, ["prepare"], progress=False)
    assert all(n in str(err.value) for n in needles), err.value
    made = project / "made"  # a file saying where it was made (a selection's recommended.yaml)
    made.mkdir()
    (made / "r.yaml").write_text(f'# chosen\n{MADE_IN}"{project}"\n{path.read_text()}')
    monkeypatch.chdir(made)
    code, stderr = cli(["merge", "prepare", "r.yaml", "--dry-run", "--no-progress"])
    assert_one_line(code, stderr, [*needles[:2], str(made), "where it was made"])
    data = yaml.safe_load(path.read_text())
    data["teachers"] = {"sp": {"path": "someone/sp"}, "wp": {"path": str(teachers["wp"])}}
    path.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code, stderr = cli(["merge", "prepare", str(path), "--dry-run", "--no-progress"])
    line = assert_one_line(code, stderr, ["'someone/sp'", "hub"])
    assert str(project) not in line and str(elsewhere) not in line


@pytest.mark.parametrize("command", ["decompose", "pretrain"])
def test_a_decompose_or_pretrain_recipes_relative_path_read_from_elsewhere_names_both(
    command: str, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decompose recipe (or a pretrain spec) naming its corpus beside it, run from another
    directory: `corpus xx.txt does not exist`, no word of the file beside the recipe. Named as
    a merge recipe's is; a flag's path (read from here, as given) is not the recipe's."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "xx.txt").write_text("one document\n")
    if command == "decompose":
        text = "models: [{name: a, path: package:minilm}, {name: b, path: package:minilm-sre}]\n"
        args = ["decompose", str(project / "r.yaml"), "--dry-run"]
    else:
        text = "language: xx\nout: o\ntraining: {steps: 1}\ntokenizer: {vocab_size: 200}\n"
        args = ["pretrain", "masked", str(project / "r.yaml")]
    (project / "r.yaml").write_text(text + "corpus: {paths: [xx.txt]}\n")
    monkeypatch.chdir(elsewhere)
    needles = ["key 'corpus.paths'", "'xx.txt'", str(project), str(elsewhere), "run the command"]
    assert_one_line(*cli(args), needles)
    code, stderr = cli([*args, "--corpus.paths", "xx.txt"])  # the flag's: read from here
    assert code == 2 and str(project) not in stderr.splitlines()[-1], stderr
    assert not (elsewhere / "o").exists()


@pytest.mark.parametrize(
    ("command", "key"), [("decompose", "out"), ("decompose", "cache_dir"), ("pretrain", "out")]
)
def test_an_output_a_recipe_names_beside_it_alone_is_refused_from_elsewhere(
    command: str, key: str, cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe's relative ``out`` (or ``cache_dir``) that names a directory beside the recipe
    (its earlier run, its cache) and nothing here had been read from here unchecked: a run from
    another directory started afresh there, where its inputs' paths are refused naming both
    directories. Refused the same way; the default, or a flag's, is not the recipe's."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "o").mkdir(parents=True)
    elsewhere.mkdir()
    corpus = tmp_path / "xx.txt"
    corpus.write_text("one document\n")
    if command == "decompose":
        text = "models: [{name: a, path: package:minilm}, {name: b, path: package:minilm-sre}]\n"
        text += f"{key}: o\n"
        args = ["decompose", str(project / "r.yaml"), "--dry-run"]
    else:
        text = "language: xx\nout: o\ntraining: {steps: 1}\ntokenizer: {vocab_size: 200}\n"
        args = ["pretrain", "masked", str(project / "r.yaml")]
    (project / "r.yaml").write_text(text + f"corpus: {{paths: [{corpus}]}}\n")
    monkeypatch.chdir(elsewhere)
    needles = [f"key {key!r}", "'o'", str(project), str(elsewhere), "run the command"]
    assert_one_line(*cli(args), needles)
    assert not (elsewhere / "o").exists()
    if command == "decompose":  # a flag's: read from here, as given (the dry run plans it)
        _, stderr = cli([*args, f"--{key}", "o"])
        assert str(project) not in stderr, stderr


def test_a_merge_recipes_output_dir_beside_it_alone_is_refused_from_elsewhere(
    cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A merge recipe's relative ``output_dir`` naming a run beside the recipe and nothing here
    had been read from here unchecked (``merge teach`` from elsewhere named the prepared run
    missing, ``merge prepare`` started another), where a decompose recipe's ``out`` is refused
    naming both directories. Refused the same way; the default names nothing of the file's, and
    the commands given the run read its copy's ``output_dir`` as the run directory given."""
    from lmalgebra.distill.recipe import MADE_IN, run_recipe, user_recipe
    from merge_fixtures import write_recipe

    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "run").mkdir(parents=True)
    elsewhere.mkdir()
    teachers = {"wp": project / "wp", "sp": project / "sp"}
    path = write_recipe(project, teachers, output_dir="run")
    monkeypatch.chdir(elsewhere)
    needles = ["key 'output_dir'", "'run'", str(project), str(elsewhere), "run the command"]
    assert_one_line(*cli(["merge", "teach", str(path), "--dry-run"]), needles)
    code, _ = cli(["merge", "prepare", str(path), "--no-progress"])
    assert code == 2 and not (elsewhere / "run").exists()
    (project / "run" / "recipe.yaml").write_text(f'{MADE_IN}"{project}"\n{path.read_text()}')
    assert run_recipe(project / "run").output_dir == project / "run"
    data = yaml.safe_load(path.read_text())
    del data["output_dir"]
    path.write_text(yaml.safe_dump(data))
    (project / "runs" / "merge").mkdir(parents=True)
    assert user_recipe(path).output_dir == Path("runs/merge")  # the default: read from here


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (
            "models: [{name: a, path: package:minilm}]\n"
            "corpus: {paths: [package:wiki-en]}\nout: ~\n",
            "out",
        ),
        (
            "languages: {en: {corpus: {paths: [~]}, teachers: [a]}}\nteachers: {a: {path: x}}\n",
            "languages.en.corpus.paths.0",
        ),
    ],
    ids=["decompose-out", "merge-corpus"],
)
def test_a_path_key_given_yaml_null_says_so(cli, here: Path, text: str, key: str) -> None:
    """``out: ~`` (the home directory, a user meant) is YAML's null: it had been refused as
    "Input is not a valid path for <class 'pathlib.Path'>, got None", no word of why."""
    (here / "r.yaml").write_text(text)
    command = ["decompose"] if text.startswith("models") else ["merge", "prepare"]
    code, stderr = cli([*command, "r.yaml", *(["--dry-run"] if command == ["decompose"] else [])])
    line = assert_one_line(code, stderr, [f"key {key!r}", "YAML's null", "'~' in quotes"])
    assert "pathlib" not in line


def test_a_local_recipe_named_recipe_colon_is_reached_as_dot_slash(cli, here: Path) -> None:
    """A file of the user's named ``recipe:NAME`` is reached as ``./recipe:NAME`` (as
    ``./package:NAME`` reaches a local model directory): ``Path`` drops the ``./``, and the
    shipped recipe of that name had been run in its place, silently."""
    (here / "recipe:decompose-minilm-wiki").write_text("models: not a list\n")
    code, stderr = cli(["decompose", "./recipe:decompose-minilm-wiki", "--dry-run"])
    assert_one_line(code, stderr, [f"{here}/recipe:decompose-minilm-wiki", "key 'models'"])


def test_a_newline_in_a_path_named_keeps_the_message_one_line_from_python(tmp_path: Path) -> None:
    """From Python the message had held the newline itself, two lines where the command line
    prints one."""
    import lmalgebra

    for call in (lmalgebra.Decomposition.load, lmalgebra.MergeRun.load, lmalgebra.read_texts):
        with pytest.raises(UserInputError) as caught:
            call(tmp_path / "a\nb")
        assert "\n" not in str(caught.value) and "a\\nb" in str(caught.value)


def _positional_paths() -> list[tuple[list[str], str]]:
    """Every command's positional argument (each names a path: a recipe, a run, a spec, a
    treebank), read from the command line itself, so that a new command is tried too."""
    import typer.main

    from lmalgebra.cli.app import app

    found: list[tuple[list[str], str]] = []

    def walk(command: Any, names: list[str]) -> None:
        for name, sub in (getattr(command, "commands", None) or {}).items():
            walk(sub, [*names, name])
        arguments = [p for p in getattr(command, "params", []) if "Argument" in type(p).__name__]
        found.extend((names, str(p.name)) for p in arguments)

    walk(typer.main.get_command(app), [])
    return found


POSITIONAL_PATHS = _positional_paths()
NOT_FILES = ["fifo", "socket", "device", "dangling link"]
REQUIRED = {"evaluate-pos": ["--models", "package:minilm"]}  # what the command asks for first


def test_every_command_has_a_positional_path_tried_here() -> None:
    assert len(POSITIONAL_PATHS) >= 18  # every command but demo, demo-lmd and packaged
    assert (["merge", "bits-per-byte"], "run_dir") in POSITIONAL_PATHS


@pytest.mark.parametrize("kind", NOT_FILES)
@pytest.mark.parametrize(("command", "argument"), POSITIONAL_PATHS, ids=lambda v: str(v))
def test_every_commands_path_that_is_no_file_or_directory_is_one_line(
    cli, here: Path, command: list[str], argument: str, kind: str
) -> None:
    """A FIFO (read, it blocks the command), a socket, a device (``/dev/zero`` never ends) or a
    link to nothing given for any command's path: one line naming it, exit status 2, nothing
    written."""
    path = {"device": Path("/dev/zero"), "dangling link": here / "link"}.get(kind, here / kind)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as bound:
            bound.bind(str(path))
    elif kind == "dangling link":
        path.symlink_to(here / "gone")
    before = sorted(p.name for p in here.iterdir())
    code, stderr = cli([*command, str(path), *REQUIRED.get(command[0], [])])
    assert_one_line(code, stderr, [str(path)])
    assert sorted(p.name for p in here.iterdir()) == before
