"""Smaller hostile inputs: paths of the wrong kind, malformed YAML, code shipped with a model,
records whose text is not a string, student names that leave the run, a teacher listed twice,
damage that ``merge verify`` must find, and no empty directories left by a failed command."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, built_store, deadline, digests, one_word_treebank
from lmalgebra.core.errors import UserInputError
from lmalgebra.evaluate.pos_tagging import evaluate_many
from lmalgebra.sources.models import ModelRef
from merge_fixtures import write_recipe


@pytest.mark.parametrize("command", [["decompose"], ["merge", "prepare"], ["merge", "train"]])
def test_recipe_that_is_a_directory(command: list[str], tmp_path: Path, cli) -> None:
    code, stderr = cli([*command, str(tmp_path)])
    assert_one_line(code, stderr, [f"recipe {tmp_path} is a directory, not a file"])


def test_model_path_that_is_a_file(tmp_path: Path, bert_dir: Path, corpus_txt: Path, cli) -> None:
    weights = bert_dir / "model.safetensors"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={weights}"]
    code, stderr = cli([*args, "--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")])
    assert_one_line(code, stderr, ["model 'b'", str(weights), "is a file, not a model directory"])


YAML = {
    "unclosed_list": (b"models: [a, b\ncorpus: x\n", ["line 2, column 7"]),
    "python_tag": (
        b"models: !!python/object/apply:os.system [echo hi]\n",
        ["tag !!python/object/apply:os.system is not allowed"],
    ),
    "nested_colon": (b"models: a: b\n", ["line 1, column 10", "mapping values"]),
    "open_quote": (b'corpus: "x\n', ["unexpected end of stream"]),
    # a key given twice: the later section had replaced the earlier whole, with nothing said
    "duplicate_key": (
        b"spans:\n  counts: [20, 5, 5]\nout: x\nspans:\n  length: 8\n",
        ["line 4, column 1", "key 'spans' is given twice", "first on line 1"],
    ),
    "duplicate_nested_key": (b"a:\n  b: 1\n  b: 2\n", ["line 3, column 3", "key 'b'"]),
}


@pytest.mark.parametrize("case", list(YAML))
@pytest.mark.parametrize("command", [["decompose"], ["merge", "prepare"]])
def test_malformed_yaml_is_one_line(case: str, command: list[str], tmp_path: Path, cli) -> None:
    text, needles = YAML[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(text)
    code, stderr = cli([*command, str(recipe)])
    assert_one_line(code, stderr, [f"recipe {recipe} is not valid YAML", *needles])


ALIASES = {
    # a value that holds itself: every walk over the recipe had ended in a RecursionError
    "holds_itself": (b"corpus:\n  paths: &m [a, *m]\n", "holds itself"),
    # a chain of aliases each repeating the one before: 10**8 values, walked for minutes (at
    # 10**7, seconds) before the first of them was refused
    "billion_laughs": (
        b"corpus:\n  paths:\n    - &l0 [x, x, x, x, x, x, x, x, x, x]\n"
        + b"".join(
            f"    - &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]\n".encode() for i in range(1, 8)
        ),
        "expands to more than 100000 values",
    ),
}


@pytest.mark.parametrize("case", list(ALIASES))
@pytest.mark.parametrize("command", [["decompose"], ["merge", "prepare"], ["pretrain", "causal"]])
def test_recipe_aliases_that_expand_without_end_are_one_line(
    case: str, command: list[str], tmp_path: Path, cli
) -> None:
    text, needle = ALIASES[case]
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(text)
    with deadline(60):
        code, stderr = cli([*command, str(recipe)])
    term = "pretrain spec" if command[0] == "pretrain" else "recipe"  # each file by its name
    assert_one_line(code, stderr, [f"{term} {recipe}", needle, "through its aliases"])


def test_a_recipe_nested_thousands_of_levels_deep_is_one_line(tmp_path: Path, cli) -> None:
    """A list in a list thousands of levels deep: PyYAML's reader had run out of stack, a
    RecursionError traceback."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("models: " + "[" * 3000 + "\n", encoding="utf-8")
    code, stderr = cli(["decompose", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, [f"recipe {recipe}", "nest too deeply"])


def test_merge_keys_and_anchors_still_read(tmp_path: Path) -> None:
    """A key beside a merge key overrides what the merge brings (no duplicate), and an anchor
    used twice is read as written."""
    from lmalgebra.core.recipe_files import read_yaml

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "base: &b {path: m, layer: 1}\nmodels:\n  - {<<: *b, name: x}\n"
        "  - {<<: *b, name: y, layer: 2}\nalso: *b\n",
        encoding="utf-8",
    )
    data = read_yaml(recipe)
    assert data["models"] == [
        {"path": "m", "layer": 1, "name": "x"},
        {"path": "m", "layer": 2, "name": "y"},
    ]
    assert data["also"] == {"path": "m", "layer": 1}


def test_yaml_1_1_booleans_and_dates_are_text_where_a_recipe_names_something(
    tmp_path: Path,
) -> None:
    """YAML 1.1 read ``no``, ``on`` and ``off`` as booleans and ``2024-01-01`` as a date: a
    language ``no`` (Norwegian) was refused as a key ``False`` that is no text, and so were a
    teacher named ``on`` and a revision of a date. They are text, as in YAML 1.2; a switch
    written ``yes`` still reads as one."""
    from lmalgebra.distill.recipe import load_recipe

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "languages:\n  no: {corpus: {paths: [no.txt]}, teachers: [on, off]}\n"
        "teachers:\n  on: {path: t, revision: 2024-01-01}\n  off: {path: u}\n"
        "masking: {whole_word: yes}\n",
        encoding="utf-8",
    )
    loaded = load_recipe(recipe)
    assert list(loaded.languages) == ["no"] and loaded.languages["no"].teachers == ["on", "off"]
    assert loaded.teachers["on"].revision == "2024-01-01"
    assert loaded.masking.whole_word is True


def test_a_flag_of_yaml_reads_as_a_recipe_does() -> None:
    """``--training.teachers '{no: [on]}'`` is a recipe's value: the same booleans, and a key
    given twice refused (the later had replaced the earlier)."""
    from lmalgebra.cli.merge import TRAINING_FLAGS

    flag = next(f for f in TRAINING_FLAGS if f.key == "training.teachers")
    assert flag.convert("{no: [on]}") == {"no": ["on"]}
    with pytest.raises(UserInputError, match="key 'xx' is given twice"):
        flag.convert("{xx: [a], xx: [b]}")
    assert flag.convert("null") is None  # every teacher, over a recipe's list: not one named null


def test_a_list_flag_takes_null_as_none() -> None:
    """``--training.lambda_candidates null`` (a recipe's candidates dropped, to train one student
    without them) was refused as no number, where ``--training.teachers null`` is none, as the
    docs say of every flag's YAML value; a null inside a list is still no number."""
    from lmalgebra.cli.merge import TRAINING_FLAGS

    flag = next(f for f in TRAINING_FLAGS if f.key == "training.lambda_candidates")
    assert flag.convert(["null"]) is None
    assert flag.convert(["0.2,0.8"]) == [0.2, 0.8]
    with pytest.raises(UserInputError, match="valid number"):
        flag.convert(["0.2,null"])


def test_a_list_flag_takes_a_yaml_list_as_a_recipe_writes_it() -> None:
    """``--training.lambda_candidates '[0.25, 0.75]'`` and ``--spans.counts '[20, 5, 5]'`` (a
    list as a recipe writes it, as a mapping flag takes YAML) had been read as the items
    ``[0.25`` and ``0.75]``, each refused as no number; a path's list keeps its brackets."""
    from lmalgebra.cli.lmd import DECOMPOSE_FLAGS
    from lmalgebra.cli.merge import TRAINING_FLAGS

    flag = next(f for f in TRAINING_FLAGS if f.key == "training.lambda_candidates")
    assert flag.convert(["[0.25, 0.75]"]) == [0.25, 0.75]
    with pytest.raises(UserInputError, match="valid number"):
        flag.convert(["[0.25, x]"])
    counts = next(f for f in DECOMPOSE_FLAGS if f.key == "spans.counts")
    assert counts.convert("[20, 5, 5]") == counts.convert("20,5,5") == (20, 5, 5)
    paths = next(f for f in DECOMPOSE_FLAGS if f.key == "corpus.paths")
    assert paths.convert(["[a].txt"]) == ["[a].txt"]


def test_remote_code_refusal_names_the_flag(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    custom = tmp_path / "custom"
    shutil.copytree(bert_dir, custom)
    config = json.loads((custom / "config.json").read_text())
    config["model_type"] = "custom-encoder"  # a family only its own code defines
    config["auto_map"] = {
        "AutoConfig": "configuration_custom.CustomConfig",
        "AutoModel": "modeling_custom.CustomModel",
    }
    (custom / "config.json").write_text(json.dumps(config))
    args = ["decompose", "--models", f"a={bert2_dir}", "--models", f"c={custom}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    code, stderr = cli([*args, "--out", str(tmp_path / "out")])
    line = assert_one_line(code, stderr, ["model 'c'", "--trust-remote-code"])
    assert "--trust-remote-code (trust_remote_code=True)" in line  # the flag first


def test_records_whose_text_is_not_a_string_are_warned_about(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from lmalgebra.sources.corpus import CorpusSpec, read_documents

    corpus = tmp_path / "c.jsonl"
    records = [{"text": "kept"}, {"text": 5}, {"text": None}, {"text": ["a"]}, {"text": "too"}]
    corpus.write_text("\n".join(json.dumps(r) for r in records) + "\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING):
        assert read_documents(CorpusSpec(paths=[str(corpus)])) == ["kept", "too"]
    assert f"corpus {corpus}: 3 record(s) whose 'text' is not a string" in caplog.text
    assert "(first: line 2, int)" in caplog.text


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    from lmalgebra.distill.pipeline import train_student
    from lmalgebra.distill.recipe import load_recipe

    recipe = built_store(tmp_path_factory.mktemp("misc"), teacher_dirs)
    train_student(load_recipe(recipe), "student", progress=False)
    return recipe


@pytest.mark.parametrize("name", ["../escape", "/tmp/elsewhere", "..", ".hidden", "a/b"])
def test_student_name_outside_the_run(name: str, trained: Path, cli) -> None:
    around = sorted(p.name for p in trained.parent.iterdir())
    before = digests(trained.parent)
    code, stderr = cli(["merge", "train", str(trained), "--name", name])
    assert_one_line(code, stderr, [f"student name {name!r}"])
    code, stderr = cli(["merge", "evaluate", str(trained.parent / "run"), "--students", name])
    assert_one_line(code, stderr, [f"student name {name!r}"])
    assert sorted(p.name for p in trained.parent.iterdir()) == around
    assert digests(trained.parent) == before


def test_teacher_listed_twice_for_a_language(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    recipe = write_recipe(tmp_path, teacher_dirs)
    data = yaml.safe_load(recipe.read_text())
    data["languages"]["yy"]["teachers"] = ["wp", "sp", "wp"]
    recipe.write_text(yaml.safe_dump(data))
    code, stderr = cli(["merge", "prepare", str(recipe)])
    assert_one_line(code, stderr, ["language 'yy'", "teacher 'wp' more than once"])


@pytest.mark.parametrize(
    "damaged",
    [
        "vocab/vocab_maps.safetensors",
        "student/checkpoints/step-0000006/model.safetensors",
        "student/checkpoints/step-0000003/state.json",
    ],
)
def test_merge_verify_checks_vocabulary_and_checkpoints(
    damaged: str, trained: Path, tmp_path: Path, cli
) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained.parent / "run", run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr
    path = run / damaged
    data = bytearray(path.read_bytes())
    data[-2] ^= 1
    path.write_bytes(bytes(data))
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(path)])
    assert digests(run) == before


def test_a_students_edited_record_is_named_as_such_and_training_mends_it(
    trained: Path, tmp_path: Path, cli
) -> None:
    """A student's ``lmalgebra.json`` edited (its record of a teacher's hash) passed verify and
    made ``merge evaluate`` say the teacher had changed, advising ``--restart``: the record
    carries its own sha256, and the student's training, run again, writes it anew."""
    shutil.copytree(trained.parent, tmp_path / "copy")
    recipe, run = tmp_path / "copy" / trained.name, tmp_path / "copy" / "run"
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    record = run / "student" / "model" / "lmalgebra.json"
    found = json.loads(record.read_text(encoding="utf-8"))
    found["teacher_hashes"]["wp"]["weights"] = "0" * 64
    record.write_text(json.dumps(found), encoding="utf-8")
    for command in (["verify", str(run)], ["evaluate", str(run)]):
        code, stderr = cli(["merge", *command])
        assert_one_line(code, stderr, [str(record), "edited since it was written"])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def test_failed_commands_leave_no_empty_directories(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    out = tmp_path / "new" / "deep" / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={tmp_path / 'gone'}"]
    code, stderr = cli([*args, "--corpus.paths", str(corpus_txt), "--out", str(out)])
    assert_one_line(code, stderr, ["model 'b'", "does not exist"])
    assert not (tmp_path / "new").exists()
    merge = tmp_path / "merge"
    merge.mkdir()
    recipe = write_recipe(
        merge, teacher_dirs, output_dir=str(merge / "a" / "run"), example_length=500
    )
    code, stderr = cli(["merge", "prepare", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, ["example_length 500"])
    assert not (merge / "a").exists()


def _run_copy(trained: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the trained run and its recipe, pointing at the copy; (recipe, run)."""
    shutil.copytree(trained.parent, tmp_path / "copy")
    recipe, run = tmp_path / "copy" / trained.name, tmp_path / "copy" / "run"
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    return recipe, run


def test_a_vocabulary_without_its_completion_mark_fails_verify_as_it_fails_training(
    trained: Path, tmp_path: Path, cli
) -> None:
    """``vocab/complete.json`` gone (deleted, or cleared by a ``merge vocab`` stopped before it
    finished) under a trained student: verify passed while train and evaluate said "vocab is
    missing"; ``merge vocab`` mends it."""
    recipe, run = _run_copy(trained, tmp_path)
    (run / "vocab" / "complete.json").unlink()
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [f"{run / 'vocab'}: missing or incomplete", "merge vocab"])
    for command in (["train", str(recipe), "--no-progress"], ["evaluate", str(run)]):
        code, stderr = cli(["merge", *command])
        assert_one_line(code, stderr, [str(run / "vocab"), "merge vocab"])
    code, stderr = cli(["merge", "vocab", str(recipe)])
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


@pytest.mark.parametrize("record", ["student/model/lmalgebra.json", "vocab/complete.json"])
def test_a_directory_in_place_of_a_record_is_refused_not_removed(
    record: str, trained: Path, tmp_path: Path, cli
) -> None:
    """A run's record (a student's marker, the vocabulary's completion mark) made a directory
    holding a user's file: the stage that writes it again removed the record first and ended in
    an IsADirectoryError traceback."""
    recipe, run = _run_copy(trained, tmp_path)
    path = run / record
    path.unlink()
    path.mkdir()
    (path / "mine.txt").write_text("mine\n", encoding="utf-8")
    stage = (
        ["train", str(recipe), "--no-progress"] if "student" in record else ["vocab", str(recipe)]
    )
    code, stderr = cli(["merge", *stage])
    assert_one_line(code, stderr, [f"{path} is a directory, not a file"])
    assert (path / "mine.txt").read_text(encoding="utf-8") == "mine\n"


def test_a_directory_in_place_of_a_decompositions_summary_is_named(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """``summary.json`` a directory: ``decompose`` over the run ended in an IsADirectoryError
    traceback, and ``report`` said the run "has no summary.json"."""
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    out = tmp_path / "out"
    code, stderr = cli([*args, "--out", str(out)])
    assert code == 0, stderr
    summary = out / "summary.json"
    summary.unlink()
    summary.mkdir()
    for command in ([*args, "--out", str(out)], ["report", str(out)]):
        code, stderr = cli(command)
        assert_one_line(code, stderr, [f"{summary} is a directory"])
    assert summary.is_dir()


def test_evaluate_pos_refuses_two_models_of_one_name(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, cli
) -> None:
    """Results, their record and resumption are keyed by name: two models named ``a`` had
    both been evaluated, written as two rows ``a`` (which was which untold) and recorded as one
    model in ``pos_config.json``."""
    bank = one_word_treebank(tmp_path / "bank")
    out = tmp_path / "pos"
    models = ["--models", f"a={bert_dir}", "--models", f"a={bert2_dir}"]
    code, stderr = cli(["evaluate-pos", str(bank), *models, "--out", str(out), "--epochs", "1"])
    assert_one_line(code, stderr, ["model names must be unique; repeated: a", "--models"])
    assert not out.exists()
    refs = [ModelRef(name="a", path=str(bert_dir)), ModelRef(name="a", path=str(bert2_dir))]
    splits = [bank / f"x-ud-{split}.conllu" for split in ("train", "dev", "test")]
    with pytest.raises(UserInputError, match="repeated: a"):
        evaluate_many(refs, *splits, "probe")


@pytest.mark.parametrize(("key", "name"), [("language", "../../escaped"), ("teacher", "../t")])
@pytest.mark.parametrize("command", [["merge", "prepare"], ["merge", "run", "--dry-run"]])
def test_a_language_or_teacher_name_that_leaves_the_run_is_refused(
    key: str, name: str, command: list[str], tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """The store keeps a language's and a teacher's sets in directories of their names: a
    language `../../escaped` had had `merge prepare` write its examples and their masked copies
    into one directory two levels above the run."""
    (tmp_path / "inputs").mkdir()
    recipe = write_recipe(tmp_path / "inputs", teacher_dirs, output_dir=str(tmp_path / "a" / "run"))
    data = yaml.safe_load(recipe.read_text())
    if key == "language":
        data["languages"][name] = data["languages"].pop("xx")
    else:
        data["teachers"][name] = data["teachers"].pop("sp")
        data["languages"]["yy"]["teachers"] = ["wp", name]
    recipe.write_text(yaml.safe_dump(data))
    code, stderr = cli([*command, str(recipe)])
    assert_one_line(code, stderr, [f"{key}{' name' if key == 'teacher' else ''} {name!r}"])
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(("name", "table"), [("average", "rdt.csv"), ("overall", "sets.csv")])
def test_a_language_named_as_a_tables_row_over_the_languages_is_refused(
    name: str, table: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A language ``average`` had its RDT replaced in rdt.csv by the average over the languages
    (one column ``average``, nothing said), and a language ``overall`` its ranked sets in
    experimental select's sets.csv by those for the whole student. Refused before any work,
    naming the language and the table, from the command and from Python."""
    from lmalgebra.distill.recipe import parse_recipe

    recipe = write_recipe(tmp_path, teacher_dirs)
    data = yaml.safe_load(recipe.read_text())
    data["languages"][name] = data["languages"].pop("xx")
    recipe.write_text(yaml.safe_dump(data))
    code, stderr = cli(["merge", "prepare", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, [f"language {name!r}", table, "name the language otherwise"])
    with pytest.raises(UserInputError, match=f"language {name!r} is the name of"):
        parse_recipe(data, "merge() recipe")
    assert not (tmp_path / "run").exists()


def test_a_student_name_too_long_is_refused_saying_how_long_one_may_be() -> None:
    """A name of 101 letters had been refused as not "letters, digits, '.', '_', '-'", which it
    is: the line did not say what was wrong with it. It says the length now."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distill.layout import check_student_name

    assert check_student_name("a" * 100) == "a" * 100
    with pytest.raises(UserInputError, match=r"\(1 to 100 ASCII letters, digits"):
        check_student_name("a" * 101)


def test_a_name_of_letters_outside_ascii_is_refused_saying_ascii() -> None:
    """``ünï`` had been refused as not "1 to 100 letters, digits, ...", which it is: the
    rule is ASCII letters, and the line says so."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distill.layout import check_plain_name

    with pytest.raises(UserInputError, match=r"'ünï' must be .*\(1 to 100 ASCII letters"):
        check_plain_name("ünï", "language")


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("WORLD_SIZE", "is no integer"),
        ("LOCAL_WORLD_SIZE", "is no integer"),
        ("RANK", "is no integer"),
        ("LMALGEBRA_DIST_TIMEOUT", "is no positive number of seconds"),
    ],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_launchers_variable_that_is_no_integer_is_one_line(
    name: str,
    said: str,
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``WORLD_SIZE=abc`` had ended the run in int()'s traceback, and its dry run passed it;
    ``RANK`` and the wait limit of several processes are read as early."""
    monkeypatch.setenv(name, "abc")
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["decompose", f"--models=a={bert_dir}", f"--models=b={bert2_dir}", "-T", "8"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    code, stderr = cli(args + (["--dry-run"] if dry_run else []))
    assert_one_line(code, stderr, [f"${name} 'abc' {said}"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("rank", "said"), [(None, "$RANK is not set"), ("0", "MASTER_ADDR")], ids=["rank", "master"]
)
def test_world_size_without_a_launcher_is_one_line(
    rank: str | None,
    said: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``WORLD_SIZE=2`` left in a shell, no launcher: accelerate's ValueError traceback (no
    ``MASTER_ADDR``), or, with it, a wait of hours for ranks that never come (no ``RANK``)."""
    from accelerate.state import PartialState

    monkeypatch.setattr(PartialState, "_shared_state", {})  # as in a fresh process
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    if rank is not None:
        monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["decompose", f"--models=a={bert_dir}", f"--models=b={bert2_dir}", "-T", "8"]
    code, stderr = cli([*args, "--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")])
    assert_one_line(code, stderr, ["$WORLD_SIZE is 2", "unset WORLD_SIZE", said])


def test_a_working_directory_removed_under_the_command_is_one_line(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """A working directory removed after the shell entered it: transformers, reading it as it
    is imported, had ended the command in a FileNotFoundError traceback."""
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    args = ["decompose", f"--models=a={bert_dir}", f"--models=b={bert2_dir}", "--dry-run"]
    code, stderr = cli([*args, "--corpus.paths", "docs.txt", "--out", str(tmp_path / "out")])
    assert_one_line(code, stderr, ["the working directory no longer exists"])
    # from Python too, where it had been a bare FileNotFoundError
    import lmalgebra

    arrays = {"a": np.eye(3, 2), "b": np.eye(3, 2, 1)}
    with pytest.raises(lmalgebra.UserInputError, match="the working directory no longer exists"):
        lmalgebra.decompose_plan(arrays, out="out")


@pytest.mark.parametrize("given", ["onnx:model.onnx#BERT", "precomputed:vectors.npy"])
def test_evaluate_pos_refuses_a_model_it_cannot_tag(
    given: str, tmp_path: Path, bert_dir: Path, cli
) -> None:
    """An ONNX graph (a packaged one, `package:minilm-l3-onnx`, too) or a file of vectors had
    reached the tagger: AttributeError tracebacks ('OnnxEncoder' object has no attribute
    'training'). Refused before any model is loaded, the transformers model beside it too."""
    bank = one_word_treebank(tmp_path / "bank")
    (tmp_path / "model.onnx").write_bytes(b"not read")
    np.save(tmp_path / "vectors.npy", np.zeros((2, 3), np.float32))
    reference = given.replace("BERT", str(bert_dir)).replace(":", f":{tmp_path}/", 1)
    out = tmp_path / "pos"
    models = ["--models", f"b={bert_dir}", "--models", f"a={reference}"]
    code, stderr = cli(["evaluate-pos", str(bank), *models, "--out", str(out), "--epochs", "1"])
    assert_one_line(code, stderr, ["model 'a' is a", "a tagger reads each word's hidden state"])
    assert not out.exists()


@pytest.mark.parametrize("objective", ["masked", "causal"])
def test_a_teacher_that_is_no_transformers_model_is_refused_by_name(
    objective: str, tmp_path: Path, bert_dir: Path, request: pytest.FixtureRequest, cli
) -> None:
    """An ONNX graph as a teacher: the masked dry run had ended in NotADirectoryError, `merge
    prepare` had prepared its copies, `experimental select` named a config file that is no JSON,
    and a causal recipe a tokenizer "in" the graph without start or end tokens."""
    graph = tmp_path / "model.onnx"
    graph.write_bytes(b"not read")
    onnx = f"onnx:{graph}#{bert_dir}"
    if objective == "masked":
        recipe = write_recipe(tmp_path, {**request.getfixturevalue("teacher_dirs"), "sp": onnx})
        name = "sp"
    else:
        teachers = request.getfixturevalue("causal_teacher_dirs")
        recipe = write_causal_recipe(tmp_path, {**teachers, "uni": onnx})
        name = "uni"
    needles = [f"teacher {name!r}: onnx:", "is an ONNX graph", "a transformers language model"]
    for command in (["prepare", "--dry-run"], ["prepare"], ["train", "--dry-run"]):
        code, stderr = cli(["merge", command[0], str(recipe), *command[1:], "--no-progress"])
        assert_one_line(code, stderr, needles)
    if objective == "masked":
        code, stderr = cli(["experimental", "select", str(recipe), "--no-progress"])
        assert_one_line(code, stderr, needles)
    assert not (tmp_path / "run").exists()


def test_merge_evaluate_scores_the_students_saved_as_the_api_does(
    trained: Path, tmp_path: Path, cli
) -> None:
    """``merge evaluate RUN`` scored ``student`` alone (refused where the run's student has
    another name) while ``MergeRun.load(RUN).evaluate()`` scored every student saved there."""
    _, run = _run_copy(trained, tmp_path)
    (run / "student").rename(run / "second")
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert code == 0, stderr
    assert "second" in (run / "evaluation" / "evaluation.md").read_text(encoding="utf-8")
