"""A saved student read as it was written, or not at all: ``write_model_directory`` records the
sha256 of every file in the directory's ``lmalgebra.json``, and evaluation and ``merge verify``
check them, so a weights file damaged after training is named in one line (exit 2) instead of
being scored as if it were the student."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
from hostile_helpers import assert_one_line, built_store, digests
from lmalgebra.distill import pipeline
from lmalgebra.distill.layout import CHECK_KEY, FILES_KEY, MARKER, model_damage
from lmalgebra.distill.recipe import load_recipe
from merge_fixtures import TINY_TRAINING


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """A causal run whose student is trained (two steps)."""
    root = tmp_path_factory.mktemp("trained")
    training = {**TINY_TRAINING, "steps": 2, "checkpoint_every": 2}
    path = write_causal_recipe(root, causal_teacher_dirs, student=CAUSAL_STUDENT, training=training)
    recipe = load_recipe(path)
    pipeline.run_stages(recipe, ["prepare", "teach", "train"], {"student": recipe.training}, False)
    return root / "run"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, same header: loads fine, other weights
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    ("damage", "name", "said"),
    [
        (_flip, "model.safetensors", "is damaged"),
        (Path.unlink, "tokenizer.json", "is missing"),
        (_flip, "config.json", "is damaged"),
    ],
)
def test_a_damaged_student_is_named_by_evaluate_and_verify(
    damage, name: str, said: str, trained: Path, tmp_path: Path, cli
) -> None:
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr  # intact: every file as recorded
    damage(run / "student" / "model" / name)
    before = digests(run)
    file = str(run / "student" / "model" / name)
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student"])
    assert_one_line(code, stderr, [file, said, "--restart"])
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, ["student model", file, said])
    assert digests(run) == before  # nothing written, nothing removed


def test_the_marker_records_every_file_but_the_card(trained: Path, tmp_path: Path) -> None:
    model = trained / "student" / "model"
    sums = json.loads((model / MARKER).read_text(encoding="utf-8"))[FILES_KEY]
    on_disk = {p.name for p in model.iterdir() if p.is_file()} - {MARKER, "README.md"}
    assert set(sums) == on_disk and "model.safetensors" in sums
    copy = tmp_path / "model"
    shutil.copytree(model, copy)
    (copy / "README.md").write_text("an evaluation added to the card\n", encoding="utf-8")
    assert model_damage(copy) is None  # the card is the evaluations' to edit
    marker = json.loads((copy / MARKER).read_text(encoding="utf-8"))
    del marker[FILES_KEY], marker[CHECK_KEY]  # written by an older release: taken as it is
    (copy / MARKER).write_text(json.dumps(marker), encoding="utf-8")
    _flip(copy / "config.json")
    assert model_damage(copy) is None


def test_a_models_files_are_read_whole_once_while_unchanged(
    trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teacher's files were read whole when a stage opened it and again when it was loaded
    (a stage read a large model two or three times): once per process now, and again after an
    edit, which is still found."""
    from lmalgebra.sources import model_files

    copy = tmp_path / "model"
    shutil.copytree(trained / "student" / "model", copy)
    read: list[str] = []
    monkeypatch.setattr(model_files, "sha256_file", lambda p: read.append(p.name) or _sha(p))
    assert model_damage(copy) is None and model_damage(copy) is None
    assert sorted(read) == sorted(set(read)) and "model.safetensors" in read
    _flip(copy / "config.json")
    assert "config.json is damaged" in str(model_damage(copy))


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_student_is_not_scored_against_teachers_changed_since(
    tmp_path: Path, causal_teacher_dirs, cli
) -> None:
    """A teacher's files replaced after training: the store is refused until rebuilt, then the
    student, which learnt from the old teacher, until trained again."""
    from causal_fixtures import build_causal_teacher

    teachers = {name: tmp_path / name for name in causal_teacher_dirs}
    for name, path in causal_teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    training = {**TINY_TRAINING, "steps": 1, "checkpoint_every": 1}
    path = write_causal_recipe(tmp_path, teachers, student=CAUSAL_STUDENT, training=training)
    recipe = load_recipe(path)
    pipeline.run_stages(recipe, ["prepare", "teach", "train"], {"student": recipe.training}, False)
    build_causal_teacher(teachers["wp"], "wordpiece", seed=9)  # other weights and tokenizer
    run = str(tmp_path / "run")
    code, stderr = cli(["merge", "evaluate", run])
    assert_one_line(code, stderr, ["tokens/yy/wp", "different recipe or teacher", "merge prepare"])
    pipeline.run_stages(recipe, ["prepare", "teach"], progress=False)
    before = digests(tmp_path / "run")
    code, stderr = cli(["merge", "evaluate", run])
    line = assert_one_line(code, stderr, ["student 'student'", "teacher 'wp'", str(teachers["wp"])])
    # the call names restart=True itself: it had been named again after it, "(restart=True)"
    assert line.endswith("restart=True))") and "(restart=True)" not in line, line
    assert digests(tmp_path / "run") == before


def test_a_teachers_configuration_edited_since_teach_is_not_taken_for_its_outputs(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A teacher's ``config.json`` edited after ``merge teach`` (``hidden_act``, which changes
    its outputs): the store's key holds the teacher's weights and tokenizer alone, so ``merge
    verify`` passed the store, ``merge train`` trained from outputs the teacher no longer gives
    and ``merge run`` kept them. Now verify and train name the set, and teach computes it again."""
    teachers = {name: tmp_path / name for name in teacher_dirs}
    for name, path in teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    recipe = str(built_store(tmp_path, teachers))
    config = teachers["sp"] / "config.json"
    settings = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**settings, "hidden_act": "relu"}), encoding="utf-8")
    run, store = tmp_path / "run", tmp_path / "run" / "topk" / "yy" / "sp"
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 2 and f"{store} was computed by teacher 'sp' before its files" in stderr
    code, stderr = cli(["merge", "train", recipe, "--no-progress"])
    assert_one_line(code, stderr, [str(store), "(config)", "merge teach RECIPE"])
    assert not (run / "student").exists()
    before = digests(store)
    assert cli(["merge", "teach", recipe, "--no-progress"])[0] == 0
    assert digests(store) != before and digests(run / "topk" / "yy" / "wp")
    assert cli(["merge", "verify", str(run)]) == (0, "")


def test_copies_made_with_a_tokenizer_edited_since_are_named_for_prepare(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A teacher's tokenizer edited after ``merge prepare``: verify and train told the user to
    run ``merge teach``, and teach called its copies "missing or incomplete"; each now names
    the copies and ``merge prepare``, which makes them again."""
    teachers = {name: tmp_path / name for name in teacher_dirs}
    for name, path in teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    recipe = str(built_store(tmp_path, teachers))
    config = teachers["wp"] / "tokenizer_config.json"
    settings = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**settings, "model_max_length": 16}), encoding="utf-8")
    run = tmp_path / "run"
    said = [f"{run / 'masked' / 'xx' / 'wp'} was built with a different", "merge prepare RECIPE"]
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 2 and all(words in stderr for words in said)
    for command in ("teach", "train"):
        assert_one_line(*cli(["merge", command, recipe, "--no-progress"]), said)
    assert cli(["merge", "prepare", recipe, "--no-progress"])[0] == 0
    assert cli(["merge", "teach", recipe, "--no-progress"])[0] == 0
    assert cli(["merge", "vocab", recipe])[0] == 0
    assert cli(["merge", "verify", str(run)]) == (0, "")


def test_verify_names_a_student_merge_evaluate_refuses(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A teacher's configuration edited after training, its outputs computed again: ``merge
    verify`` passed the run, and ``merge evaluate`` then refused the student, trained from the
    teacher as it was; verify names it in evaluate's words."""
    teachers = {name: tmp_path / name for name in teacher_dirs}
    for name, path in teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    recipe = str(built_store(tmp_path, teachers, training={**TINY_TRAINING, "steps": 1}))
    assert cli(["merge", "train", recipe, "--no-progress"])[0] == 0
    config = teachers["sp"] / "config.json"
    settings = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**settings, "hidden_dropout_prob": 0.2}), encoding="utf-8")
    assert cli(["merge", "teach", recipe, "--no-progress"])[0] == 0
    run = str(tmp_path / "run")
    said = ["student 'student' was trained from teacher 'sp'", "--restart"]
    assert_one_line(*cli(["merge", "verify", run]), said)
    line = assert_one_line(*cli(["merge", "evaluate", run]), said)
    assert line.count("restart=True") == 1, line  # the call named once, not its keyword again
    assert cli(["merge", "train", recipe, "--no-progress", "--restart"])[0] == 0
    assert cli(["merge", "verify", run]) == (0, "")


def test_verify_names_several_stale_students_in_one_readable_line(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """Several students trained from a teacher changed since: verify joined one full line per
    student (about 250 characters each, its remedy repeated). One line names them all, the
    first one's cause and remedy in full, its length that of one student's and their names."""
    teachers = {name: tmp_path / name for name in teacher_dirs}
    for name, path in teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    recipe = str(built_store(tmp_path, teachers, training={**TINY_TRAINING, "steps": 1}))
    for name in ("a1", "a2", "a3"):
        assert cli(["merge", "train", recipe, "--name", name, "--no-progress"])[0] == 0
    config = teachers["sp"] / "config.json"
    settings = json.loads(config.read_text(encoding="utf-8"))
    config.write_text(json.dumps({**settings, "hidden_dropout_prob": 0.2}), encoding="utf-8")
    assert cli(["merge", "teach", recipe, "--no-progress"])[0] == 0
    said = ["3 students", "('a1', 'a2', 'a3')", "student 'a1' was trained from teacher 'sp'"]
    line = assert_one_line(*cli(["merge", "verify", str(tmp_path / "run")]), said)
    assert line.count("--restart") == 1 and len(line) < 500, line


def test_a_student_of_a_vocabulary_since_built_again_is_not_scored(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """The union vocabulary built again after training with the recipe's teachers in another
    order (its files damaged, say, and ``merge vocab`` run again as the message says): other
    ids for the same tokens. ``merge verify`` passed the run and ``merge evaluate`` scored the
    student through maps it was not trained on, exit 0; both now name it."""
    import yaml

    recipe = built_store(tmp_path, teacher_dirs, training={**TINY_TRAINING, "steps": 1})
    assert cli(["merge", "train", str(recipe), "--no-progress"])[0] == 0
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data["teachers"] = dict(reversed(list(data["teachers"].items())))
    recipe.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    shutil.rmtree(tmp_path / "run" / "vocab")
    assert cli(["merge", "vocab", str(recipe)])[0] == 0
    run = str(tmp_path / "run")
    said = ["student 'student' was trained on the union vocabulary as it was before", "--restart"]
    line = assert_one_line(*cli(["merge", "verify", run]), said)
    assert line.count("restart=True") == 1, line
    assert_one_line(*cli(["merge", "evaluate", run]), said)
    assert not (tmp_path / "run" / "evaluation").exists()
    assert cli(["merge", "train", str(recipe), "--no-progress", "--restart"])[0] == 0
    assert cli(["merge", "evaluate", run])[0] == 0


@pytest.mark.parametrize("given", ["bert_dir", "gpt2_dir"])
def test_a_model_without_a_language_model_head_is_named_as_such(
    given: str, trained: Path, request: pytest.FixtureRequest, cli
) -> None:
    """A bare encoder or decoder (``BertModel``, ``GPT2Model``) where a causal LM is needed is
    refused for what it is, not for a tokenizer detail found first."""
    directory = request.getfixturevalue(given)
    before = digests(trained)
    code, stderr = cli(["merge", "bits-per-byte", str(trained), "--models", f"x={directory}"])
    assert_one_line(code, stderr, ["model 'x'", str(directory), "without a language-model head"])
    assert digests(trained) == before


@pytest.mark.parametrize("context", ["0", "-5"])
def test_a_context_below_one_token_is_refused_by_name(context: str, trained: Path, cli) -> None:
    """0 was taken for "the model's" (and run), -5 blamed on the stride."""
    before = digests(trained)
    code, stderr = cli(["merge", "bits-per-byte", str(trained), "--context", context])
    assert_one_line(code, stderr, ["context must be at least 1", f"got {context}"])
    assert "stride" not in stderr and digests(trained) == before


def test_a_users_file_beside_a_model_is_not_recorded_as_the_models(
    trained: Path, tmp_path: Path
) -> None:
    """A model written into a directory holding a user's note (``pretrain --restart``, ``merge
    train --restart`` keep it) had recorded the note as one of the model's files: the note
    edited later made the model "damaged", to be trained again or removed with the note."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmalgebra.distill.layout import write_model_directory

    source = trained / "student" / "model"
    model = AutoModelForCausalLM.from_pretrained(source)
    tokenizer = AutoTokenizer.from_pretrained(source)
    target = tmp_path / "model"
    target.mkdir()
    (target / "notes.txt").write_text("mine\n", encoding="utf-8")
    for _ in range(2):  # into the note's directory, then over the model written there
        write_model_directory(target, model, tokenizer, {"kind": "test"})
        sums = json.loads((target / MARKER).read_text(encoding="utf-8"))[FILES_KEY]
        assert "notes.txt" not in sums and {"model.safetensors", "config.json"} <= set(sums)
        assert set(sums) == {p.name for p in target.iterdir() if p.is_file()} - {
            MARKER,
            "notes.txt",
        }
    (target / "notes.txt").write_text("mine, edited\n", encoding="utf-8")
    assert model_damage(target) is None


@pytest.mark.parametrize("given", ["path", "named"])
def test_a_damaged_student_is_not_scored_by_bits_per_byte(
    given: str, trained: Path, tmp_path: Path, cli
) -> None:
    """``merge bits-per-byte RUN --models RUN/student/model`` scored a student ``merge evaluate``
    refuses as damaged, and wrote its scores into the run's evaluation: every read of a model
    directory written here as a language model now checks it, naming the model and the file."""
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    model = run / "student" / "model"
    _flip(model / "model.safetensors")
    before = digests(run)
    reference = str(model) if given == "path" else f"s={model}"
    code, stderr = cli(["merge", "bits-per-byte", str(run), "--models", reference])
    name = "model" if given == "path" else "s"
    assert_one_line(code, stderr, [f"model {name!r}", str(model / "model.safetensors"), "damaged"])
    assert digests(run) == before


def test_a_damaged_teacher_written_here_is_refused_before_any_stage_writes(
    trained: Path, tmp_path: Path, causal_teacher_dirs, cli
) -> None:
    """A teacher written here (a student, a pretrained teacher) whose files no longer match its
    record had been refused at ``merge teach`` only, after ``prepare`` had written the examples
    and every teacher's copies: it is refused when the stage opens it, before any work."""
    teacher = tmp_path / "edited"
    shutil.copytree(trained / "student" / "model", teacher)
    config = json.loads((teacher / "config.json").read_text(encoding="utf-8"))
    config["initializer_range"] = 0.5  # a setting edited: loads as before, another record
    (teacher / "config.json").write_text(json.dumps(config), encoding="utf-8")
    teachers = {**causal_teacher_dirs, "wp": teacher}
    path = write_causal_recipe(tmp_path, teachers, student=CAUSAL_STUDENT)
    code, stderr = cli(["merge", "prepare", str(path)])
    assert_one_line(code, stderr, ["teacher 'wp'", str(teacher / "config.json"), "is damaged"])
    assert not (tmp_path / "run").exists()


def test_a_damaged_student_is_neither_embedded_nor_tagged(
    trained: Path, tmp_path: Path, bert_dir: Path, cli
) -> None:
    """``decompose`` had embedded, and ``evaluate-pos`` tagged with, a student whose weights no
    longer match its record (loads fine, other weights), under its name: each refuses it in one
    line naming the file, before anything is written."""
    from hostile_helpers import one_word_treebank
    from tiny import documents

    student = tmp_path / "student"
    shutil.copytree(trained / "student" / "model", student)
    _flip(student / "model.safetensors")
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(documents(60, seed=1)) + "\n", encoding="utf-8")
    said = [f"model 's': {student / 'model.safetensors'} is damaged"]
    args = ["decompose", "--models", f"s={student}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus), "--out", str(tmp_path / "d"), "--spans.length", "8"]
    code, stderr = cli([*args, "--cache_dir", str(tmp_path / "cache")])
    assert_one_line(code, stderr, said)
    bank = one_word_treebank(tmp_path / "bank")
    pos = tmp_path / "pos"
    code, stderr = cli(["evaluate-pos", str(bank), "--models", f"s={student}", "--out", str(pos)])
    assert_one_line(code, stderr, said)
    assert not (tmp_path / "d").exists() and not pos.exists()
