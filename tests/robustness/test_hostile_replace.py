"""A command does not replace a finished output with a lesser one: training asked for fewer
steps than a student has (``steps: 0``: the model as it starts) is refused, naming both."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hostile_helpers import assert_one_line, built_store, digests


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    """A masked recipe whose student ``student`` trained its six steps; the recipe's path."""
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe

    recipe = built_store(tmp_path_factory.mktemp("replace"), teacher_dirs)
    pipeline.train_student(load_recipe(recipe), "student", progress=False)
    return recipe


@pytest.mark.parametrize("steps", ["0", "3"])
@pytest.mark.parametrize("checkpoints", [True, False], ids=["checkpoints", "saved_model_only"])
def test_fewer_steps_over_a_trained_student_are_refused(
    steps: str, checkpoints: bool, trained: Path, cli
) -> None:
    student = trained.parent / "run" / "student"
    hidden = student / "checkpoints.hidden"
    if not checkpoints:  # as training.keep_checkpoints 0 leaves it: the saved model alone
        (student / "checkpoints").rename(hidden)
    try:
        before = digests(student)
        for dry in ([], ["--dry-run"]):  # the dry run says what the run would
            code, stderr = cli(
                ["merge", "train", str(trained), "--training.steps", steps, "--no-progress", *dry]
            )
            assert_one_line(code, stderr, [str(student), "trained 6 steps", f"steps {steps}"])
            assert digests(student) == before
    finally:
        if hidden.exists():
            hidden.rename(student / "checkpoints")


@pytest.mark.parametrize("keep", ["2", "0"], ids=["checkpoints", "saved_model_only"])
def test_pretrain_with_fewer_steps_over_its_model_is_refused(
    keep: str, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    out = tmp_path / "teacher"
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--no-progress", "--out", str(out)]
    code, err = cli([*pretrain, "--training.steps", "2", "--training.keep_checkpoints", keep])
    assert code == 0, err
    before = digests(out)
    code, err = cli([*pretrain, "--training.steps", "0"])
    assert_one_line(code, err, [str(out), "trained 2 steps", "steps 0"])
    assert digests(out) == before


def test_pretrain_over_a_teacher_of_another_kind_is_refused_naming_both(
    corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """``pretrain masked`` into a causal teacher's directory had been refused as a checkpoint of
    "other inputs" (``data.lowercase (absent) -> False; ...``), offering ``--restart``, which
    then replaced the causal teacher with a masked one: both kinds are named, restart or not."""
    out = tmp_path / "teacher"
    common = ["--corpus.paths", str(corpus_txt), "--language", "xx", "--no-progress"]
    common += ["--training.steps", "1", "--example_length", "16", "--out", str(out)]
    code, err = cli(["pretrain", "causal", *common, "--tokenizer.vocab_size", "300"])
    assert code == 0, err
    before = digests(out)
    for restart in ([], ["--restart"]):
        args = ["pretrain", "masked", *common, "--tokenizer.vocab_size", "100", *restart]
        assert_one_line(*cli(args), [str(out), "holds a causal teacher", "makes a masked teacher"])
    assert digests(out) == before


def _train(recipe: Path, name: str, steps: int, cli) -> None:
    args = ["merge", "train", str(recipe), "--name", name, "--training.steps", str(steps)]
    code, stderr = cli([*args, "--no-progress"])
    assert code == 0, stderr


def _rdt_rows(evaluation: Path) -> list[list[str]]:
    return [line.split(",") for line in (evaluation / "rdt.csv").read_text().splitlines()]


def test_an_evaluation_of_some_students_or_languages_keeps_the_others(trained: Path, cli) -> None:
    """``merge evaluate --students s2`` (the command ``merge train --name s2`` suggests) or
    ``--languages xx`` over an evaluation of more rows had replaced its tables with its own rows
    alone (``rdt.csv`` without the other student). The rows it does not score again are kept and
    every file is written again from them all: here, what the whole evaluation wrote."""
    run = trained.parent / "run"
    _train(trained, "s2", 2, cli)
    both = ["--students", "student", "--students", "s2"]
    code, stderr = cli(["merge", "evaluate", str(run), *both])
    assert code == 0, stderr
    evaluation = run / "evaluation"
    whole = digests(evaluation)
    cards = {s: (run / s / "model" / "README.md").read_text() for s in ("student", "s2")}
    header = _rdt_rows(evaluation)[0]
    assert [r[0] for r in _rdt_rows(evaluation)[1:]] == ["student", "s2"]
    xx, yy = header[1:-1]
    for subset in (
        ["--students", "s2"],
        ["--languages", xx],  # the default student, on one language
        ["--students", "s2", "--languages", yy],
    ):
        code, stderr = cli(["merge", "evaluate", str(run), *subset])
        assert code == 0, stderr
        assert digests(evaluation) == whole, subset
        assert {s: (run / s / "model" / "README.md").read_text() for s in cards} == cards


def test_an_evaluation_keeps_no_row_that_no_longer_holds(trained: Path, cli) -> None:
    """A kept row must still hold: a student trained again since its rows were scored, or a
    damaged record of the rows, is refused in one line naming it and ``--overwrite``, the
    evaluation unchanged; ``--overwrite`` keeps this evaluation's rows alone."""
    run = trained.parent / "run"
    evaluation = run / "evaluation"
    _train(trained, "s3", 2, cli)
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student", "--students", "s3"])
    assert code == 0, stderr
    _train(trained, "s3", 3, cli)  # other weights since its rows were scored
    before = digests(evaluation)
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student"])
    assert_one_line(
        code, stderr, [str(evaluation), "student 's3' was trained again", "--overwrite"]
    )
    assert digests(evaluation) == before
    record = evaluation / "evaluation.json"
    kept = record.read_text()
    for damage in ("{", kept.replace('"student"', '"someone"', 1)):
        record.write_text(damage)
        code, stderr = cli(["merge", "evaluate", str(run), "--students", "s3"])
        assert_one_line(code, stderr, [str(record), "is damaged", "--overwrite"])
    record.unlink()  # tables without their record (an older release's): no row can be kept
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "s3"])
    assert_one_line(code, stderr, [str(evaluation), "students student", "--overwrite"])
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "s3", "--overwrite"])
    assert code == 0, stderr
    assert [r[0] for r in _rdt_rows(evaluation)[1:]] == ["s3"]
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student"])
    assert code == 0, stderr  # s3's rows hold: kept, in the order the students were scored
    assert [r[0] for r in _rdt_rows(evaluation)[1:]] == ["s3", "student"]
    scores = (evaluation / "scores.csv").read_text()
    assert ",s3," in scores and ",student," in scores


def test_an_evaluation_directory_in_the_way_is_named_before_any_scoring(
    trained: Path, cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``evaluation`` a file: one line naming it, before a teacher or student is scored (it had
    been found at the first write, after the scoring)."""
    from lmalgebra.distill.masked import evaluation as scoring

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("scored")

    run = trained.parent / "run"
    evaluation = run / "evaluation"
    aside = run / "evaluation.aside"
    if evaluation.exists():
        evaluation.rename(aside)
    try:
        evaluation.write_text("in the way\n")
        monkeypatch.setattr(scoring, "evaluate_run", never)
        code, stderr = cli(["merge", "evaluate", str(run)])
        assert_one_line(code, stderr, [str(evaluation), "is a file"])
    finally:
        evaluation.unlink()
        if aside.exists():
            aside.rename(evaluation)


@pytest.mark.parametrize("blocked", ["evaluation/rdt.csv", "student/model/README.md"])
def test_a_file_of_the_evaluation_in_the_way_is_named_before_any_scoring(
    blocked: str, trained: Path, cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A directory where ``merge evaluate`` writes a table, or a link in place of the student's
    card (which it extends): met at the write, after every teacher and student was scored, with
    the record written. Named before any scoring now."""
    import shutil

    from lmalgebra.distill.masked import evaluation as scoring

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("scored")

    run = tmp_path / "run"
    shutil.copytree(trained.parent / "run", run)
    path = run / blocked
    if path.exists():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    if blocked.endswith(".csv"):
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "my-card.md")
    monkeypatch.setattr(scoring, "evaluate_run", never)
    before = digests(run)
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert_one_line(code, stderr, [str(path)])
    assert digests(run) == before


@pytest.fixture(scope="module")
def causal_trained(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """A causal recipe (xx: teachers bl, uni; yy: wp) with two trained students, ``student`` and
    ``s2``; the recipe's path."""
    from causal_fixtures import taught_causal_recipe, train_causal

    training = {"steps": 2, "batch_size": 4, "warmup_steps": 0, "seed": 3}
    recipe = taught_causal_recipe(
        tmp_path_factory.mktemp("replace-causal"), causal_teacher_dirs, training
    )
    train_causal(recipe, "student")
    train_causal(recipe, "s2", seed=4)
    return recipe


def test_a_causal_evaluation_of_some_rows_keeps_the_others(
    causal_trained: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """Bits per byte, RDT, LMD coverage and the continuations of a causal run: an evaluation of
    one language or one student leaves every file as the whole evaluation wrote it; one of
    other settings (the coverage's pooling) is refused, naming them, unless ``--overwrite``."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    run = causal_trained.parent / "run"
    evaluation = run / "evaluation"
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student", "--students", "s2"])
    assert code == 0, stderr
    whole = digests(evaluation)
    for subset in (
        ["--languages", "yy"],
        ["--students", "s2"],
        ["--students", "s2", "--languages", "xx"],
    ):
        code, stderr = cli(["merge", "evaluate", str(run), *subset])
        assert code == 0, stderr
        assert digests(evaluation) == whole, subset
    last = ["merge", "evaluate", str(run), "--languages", "yy", "--pooling", "last"]
    code, stderr = cli(last)
    assert_one_line(code, stderr, [str(evaluation), "'pooling': 'mean'", "'pooling': 'last'"])
    assert digests(evaluation) == whole
    code, stderr = cli([*last, "--overwrite"])
    assert code == 0, stderr
    assert _rdt_rows(evaluation)[0] == ["student", "yy", "average"]
    assert "xx" not in (evaluation / "bits_per_byte.csv").read_text()


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"tokenizer": "bytes"}, "the student tokenizer changed (student_tokenizer.tokenizer"),
        ({"tokenizer": "uni"}, "'bl' -> 'uni'"),
        ({"tokenizer": "train:bytelevel-bpe:300"}, "'bl' -> 'train:bytelevel-bpe:300'"),
        ({"hidden_size": 48}, "the model configuration changed (model.n_embd 32 -> 48)"),
        ({"dropout": 0.1}, "model.attn_pdrop 0.0 -> 0.1"),
    ],
)
def test_a_causal_checkpoint_of_another_student_is_refused_by_the_dry_run_too(
    causal_trained: Path, change: dict[str, Any], named: str, cli
) -> None:
    """A causal student's checkpoint made with another ``student.tokenizer`` or other sizes:
    resuming refused it while the dry run had planned the run; the dry run compares the
    tokenizer's recorded name and the configuration's sizes, which need no tokenizer made.
    Another spelling of the same tokenizer (``teacher:bl``) plans."""
    import yaml

    data = yaml.safe_load(causal_trained.read_text())
    student = causal_trained.parent / "run" / "student"
    before = digests(student)
    other = causal_trained.with_name("other-student.yaml")
    for given, refused in ((change, True), ({"tokenizer": "teacher:bl"}, False)):
        other.write_text(yaml.safe_dump({**data, "student": {**data["student"], **given}}))
        code, stderr = cli(["merge", "train", str(other), "--training.steps", "4", "--dry-run"])
        if refused:
            checkpoint = str(sorted((student / "checkpoints").glob("step-*"))[-1])
            assert_one_line(code, stderr, [checkpoint, named])
        else:
            assert code == 0, stderr
    assert digests(student) == before


def test_a_saved_causal_student_is_kept_under_either_spelling_of_its_tokenizer(
    causal_trained: Path,
) -> None:
    """``keep_saved`` of a causal student made with ``student.tokenizer: bl`` from a recipe
    that spells it ``teacher:bl`` (the same tokenizer): refused as "trained with other
    settings (student.tokenizer 'bl' -> 'teacher:bl')"; it is kept, and another tokenizer is
    refused, naming it."""
    import yaml

    from lmalgebra import UserInputError
    from lmalgebra.api.merge import merge

    data = yaml.safe_load(causal_trained.read_text())
    student = causal_trained.parent / "run" / "student"
    before = digests(student)
    other = causal_trained.with_name("respelt.yaml")
    for given in ("teacher:bl", "uni"):
        data["student"] = {**data["student"], "tokenizer": given}
        other.write_text(yaml.safe_dump(data))
        if given == "uni":
            with pytest.raises(UserInputError, match=r"student\.tokenizer 'bl' -> 'uni'"):
                merge(other, ["train"], students={"student": None}, keep_saved=True)
        else:
            merge(other, ["train"], students={"student": None}, keep_saved=True)
    assert digests(student) == before


@pytest.mark.parametrize("stage", ["run", "teach"])
def test_a_student_of_a_store_since_built_again_is_neither_kept_nor_scored(
    tmp_path: Path, teacher_dirs: dict[str, Path], stage: str, cli
) -> None:
    """``top_k`` changed after a student was trained: ``merge run`` builds the store again (with
    a warning); ``merge evaluate`` then refuses to score the student trained from the old one,
    naming it and the setting (it had been scored), and so does ``merge()`` asked to keep
    saved students; ``--restart`` trains it on the new store. ``merge teach`` alone had built
    the store again but left the run's copy of the recipe as it was: ``merge evaluate`` and
    ``merge verify`` then called the new store another recipe's, and asked for the ``merge
    teach`` just run."""
    import yaml

    from lmalgebra import UserInputError
    from lmalgebra.api.merge import merge

    recipe = built_store(tmp_path, teacher_dirs)
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert code == 0, stderr
    data = yaml.safe_load(recipe.read_text())
    data["top_k"] = 4
    # settings no store is built from, listed first among the changes, had hidden top_k
    data["training"] = {**data["training"], "lr": 0.0123, "seed": 5, "warmup_steps": 2}
    data["student"] = {**data["student"], "dropout": 0.0}
    recipe.write_text(yaml.safe_dump(data))
    model = tmp_path / "run" / "student" / "model"
    before = digests(model)
    code, stderr = cli(["merge", stage, str(recipe), "--no-progress"])
    assert code == 0, stderr
    for command in ("verify", "evaluate"):  # verify had passed what evaluate refuses
        code, stderr = cli(["merge", command, str(tmp_path / "run")])
        line = assert_one_line(code, stderr, ["student 'student'", "top_k 8 -> 4", "--restart"])
        assert "built again" in line and "training" not in line and "dropout" not in line, line
    with pytest.raises(UserInputError, match="student 'student' was trained from the teacher"):
        merge(recipe, ["train"], keep_saved=True)
    assert digests(model) == before
    assert not (tmp_path / "run" / "evaluation" / "rdt.csv").exists()
    code, stderr = cli(["merge", "train", str(recipe), "--restart", "--no-progress"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "evaluate", str(tmp_path / "run")])
    assert code == 0, stderr


def test_a_checkpoint_of_other_data_is_refused_by_the_dry_run_too(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A student's newest checkpoint recorded under another teacher store: resuming refuses it
    (``--restart`` starts afresh), and the dry run, which had planned the run, says so too."""

    def other_store(recorded: dict[str, Any]) -> None:
        recorded["store"] = {k: "0" * 64 for k in recorded["store"]}

    _refused_over_checkpoint_of(
        tmp_path, teacher_dirs, cli, other_store, "the teacher store changed"
    )


def _refused_over_checkpoint_of(
    tmp_path: Path,
    teacher_dirs: dict[str, Path],
    cli: Any,
    edit: Callable[[dict[str, Any]], None],
    named: str,
) -> None:
    """A masked student trained 3 steps, its newest checkpoint's recorded inputs changed by
    ``edit`` (and sealed as a run on those inputs writes them: intact), then trained on to 6
    steps: refused by the dry run and the run alike, naming the checkpoint and ``named``,
    nothing of the student changed."""
    import json

    from lmalgebra.train.checkpoint import STATE_SUM, _state_sum

    recipe = built_store(tmp_path, teacher_dirs)
    code, err = cli(["merge", "train", str(recipe), "--training.steps", "3", "--no-progress"])
    assert code == 0, err
    student = tmp_path / "run" / "student"
    state_path = sorted((student / "checkpoints").glob("step-*"))[-1] / "state.json"
    state = json.loads(state_path.read_text())
    edit(state["fingerprint"])
    state[STATE_SUM] = _state_sum(state)
    state_path.write_text(json.dumps(state))
    before = digests(student)
    for dry in (["--dry-run"], []):
        code, stderr = cli(
            ["merge", "train", str(recipe), "--training.steps", "6", "--no-progress", *dry]
        )
        assert_one_line(code, stderr, [str(state_path.parent), named])
        assert digests(student) == before


@pytest.mark.parametrize(
    ("part", "value", "named"),
    [
        ("init_embeddings", "teachers", "the embedding initialisation changed"),
        ("vocabulary", "0" * 64, "the student vocabulary changed"),
        ("model", {"hidden_size": 48}, "the model configuration changed"),
    ],
)
def test_a_checkpoint_of_another_vocabulary_seeding_or_size_is_refused_by_the_dry_run_too(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli, part: str, value: Any, named: str
) -> None:
    """A masked student's checkpoint recorded under another union vocabulary, embedding
    initialisation (a student seeded from its teachers, resumed by a recipe of random ones) or
    size: resuming refused it, while the dry run had planned the run."""

    def other(recorded: dict[str, Any]) -> None:
        recorded[part] = {**recorded[part], **value} if isinstance(value, dict) else value

    _refused_over_checkpoint_of(tmp_path, teacher_dirs, cli, other, named)


def test_restart_removes_no_file_of_the_users_kept_in_a_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``--restart`` had removed each checkpoint directory whole, a user's file kept inside one
    with it; the checkpoints the run keeps no more went the same way. Both leave such a
    directory alone: ``--restart`` (and its dry run) refuses, naming the file, before removing
    any checkpoint; an older checkpoint is kept with a warning."""
    import torch

    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.checkpoint import clear_checkpoints, refuse_uncleared, save_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    root = tmp_path / "checkpoints"
    first = save_checkpoint(root, 1, model, optimizer, {}, keep=1)
    (first / "notes.txt").write_text("mine\n")
    with caplog.at_level("WARNING"):
        second = save_checkpoint(root, 2, model, optimizer, {}, keep=1)
    assert (first / "state.json").is_file()  # kept whole
    assert "notes.txt" in caplog.text
    before = digests(root)
    for call in (refuse_uncleared, clear_checkpoints):
        with pytest.raises(UserInputError, match=r"step-0000001 holds files .*\(notes\.txt\)"):
            call(root)
        assert digests(root) == before
    (first / "notes.txt").unlink()
    clear_checkpoints(root)
    assert not first.exists() and not second.exists()


def test_a_users_directory_named_like_a_checkpoint_is_neither_read_nor_removed(
    tmp_path: Path,
) -> None:
    """A user's ``step-0000001.bak`` (a copy of a checkpoint) or ``step-abc`` beside the
    checkpoints: the step of the newest was read from every ``step-*`` name (a ValueError
    traceback from ``merge train`` and its dry run), the copy was pruned as the run's oldest
    checkpoint and removed by ``--restart``. Only ``step-NNNNNNN`` is the run's."""
    import shutil

    import torch

    from lmalgebra.train.checkpoint import checkpointed_step, clear_checkpoints, save_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    root = tmp_path / "checkpoints"
    first = save_checkpoint(root, 1, model, optimizer, {}, keep=1)
    shutil.copytree(first, root / "step-0000001.bak")
    (root / "step-abc").mkdir()
    assert checkpointed_step(root) == 1
    save_checkpoint(root, 2, model, optimizer, {}, keep=1)
    assert sorted(p.name for p in root.iterdir()) == [
        "step-0000001.bak",
        "step-0000002",
        "step-abc",
    ]
    clear_checkpoints(root)
    assert sorted(p.name for p in root.iterdir()) == ["step-0000001.bak", "step-abc"]


def test_a_checkpoint_that_is_a_link_is_refused_by_the_dry_run_as_by_training(
    trained: Path, tmp_path: Path, cli
) -> None:
    """A student's checkpoint replaced by a link to a copy elsewhere: pruning kept the link
    without a word, and ``--restart`` refused it (rmtree refuses a link) after its dry run had
    planned it. Training, its dry run and verify refuse it first, naming the link."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(trained.parent / "run", run)
    recipe = tmp_path / "recipe.yaml"
    data = yaml.safe_load(trained.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    first = sorted((run / "student" / "checkpoints").glob("step-*"))[0]
    shutil.move(first, tmp_path / "elsewhere")
    first.symlink_to(tmp_path / "elsewhere")
    before = digests(run / "student")
    for dry in (["--dry-run"], []):
        args = ["merge", "train", str(recipe), "--restart", "--no-progress", *dry]
        assert_one_line(*cli(args), [f"checkpoint {first} is a symbolic link", "remove the link"])
    assert digests(run / "student") == before
    assert_one_line(*cli(["merge", "verify", str(run)]), [f"checkpoint {first} is a symbolic"])


def test_pretrain_again_over_a_run_that_kept_no_checkpoint_says_it_starts_afresh(
    corpus_txt: Path, tmp_path: Path, cli, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``training.keep_checkpoints 0`` a finished run keeps no checkpoint, so more steps
    train it again from step 0 and replace what it saved (as the setting's help says): that
    had happened with nothing said, as if it had been continued."""
    out = tmp_path / "teacher"
    pretrain = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    pretrain += ["--tokenizer.vocab_size", "100", "--no-progress", "--out", str(out)]
    pretrain += ["--training.keep_checkpoints", "0"]
    code, err = cli([*pretrain, "--training.steps", "2"])
    assert code == 0, err
    assert "again from step 0" not in caplog.text
    code, err = cli([*pretrain, "--training.steps", "3"])
    assert code == 0, err
    warned = [r.getMessage() for r in caplog.records if "again from step 0" in r.getMessage()]
    assert len(warned) == 1 and str(out) in warned[0], caplog.text


@pytest.mark.parametrize("dry_run", [False, True])
def test_other_settings_over_a_student_that_kept_no_checkpoint_are_refused(
    dry_run: bool, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A student trained with ``keep_checkpoints: 0`` keeps no checkpoint to compare settings
    with: ``merge train`` with others (``multi_teacher``, ``lr``) trained it again from step 0
    and replaced it, a warning said, and its dry run planned it; with a checkpoint the same
    command is refused. Now both name what changed; more steps of the same settings still
    train it again, as the setting's help says."""
    training = {"steps": 2, "batch_size": 4, "warmup_steps": 1, "keep_checkpoints": 0}
    recipe = str(built_store(tmp_path, teacher_dirs, training=training))
    assert cli(["merge", "train", recipe, "--no-progress"])[0] == 0
    before = digests(tmp_path / "run" / "student")
    flags = ["--training.multi_teacher", "best", "--training.lr", "0.01", "--no-progress"]
    code, stderr = cli(["merge", "train", recipe, *flags, *(["--dry-run"] if dry_run else [])])
    said = ["student/model was trained with other settings", "training.lr 0.0005 -> 0.01"]
    assert_one_line(code, stderr, [*said, "training.multi_teacher 'all' -> 'best'", "--restart"])
    assert digests(tmp_path / "run" / "student") == before
    more = ["--training.steps", "3", "--no-progress", *(["--dry-run"] if dry_run else [])]
    assert cli(["merge", "train", recipe, *more])[0] == 0


@pytest.mark.parametrize("dry_run", [False, True])
def test_other_settings_over_a_student_whose_checkpoints_are_gone_name_why(
    dry_run: bool, trained: Path, cli
) -> None:
    """A student trained with checkpoints kept (``keep_checkpoints`` 2) whose checkpoints are
    gone (removed, or those of a run with ``lambda_candidates``, which trains elsewhere): other
    settings are refused, and the line had said ``kept no checkpoint (training.keep_checkpoints
    0)``, a setting the run never had. It names the directory that holds none."""
    student = trained.parent / "run" / "student"
    hidden = student / "checkpoints.hidden"
    (student / "checkpoints").rename(hidden)
    try:
        before = digests(student)
        flags = ["--training.lr", "0.01", "--no-progress", *(["--dry-run"] if dry_run else [])]
        code, stderr = cli(["merge", "train", str(trained), *flags])
        said = ["trained with other settings", f"{student / 'checkpoints'} holds none"]
        assert_one_line(code, stderr, [*said, "--restart"])
        assert "keep_checkpoints 0" not in stderr
        assert digests(student) == before
    finally:
        hidden.rename(student / "checkpoints")


def test_a_run_in_its_recipes_directory_keeps_the_users_recipe(
    tmp_path: Path, teacher_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """``output_dir: .`` beside the user's own ``recipe.yaml``: ``merge prepare`` had replaced
    it with the run's normalised copy (the same settings, its comments lost). A copy that reads
    as the recipe is kept as it is; the run reads it."""
    from merge_fixtures import write_recipe

    recipe = write_recipe(tmp_path, teacher_dirs, output_dir=".")
    text = "# my merge: two teachers, see the notes\n" + recipe.read_text(encoding="utf-8")
    recipe.write_text(text, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code, stderr = cli(["merge", "prepare", "recipe.yaml", "--no-progress"])
    assert code == 0, stderr
    assert recipe.read_text(encoding="utf-8") == text
    code, stderr = cli(["merge", "verify", "."])
    assert code == 0, stderr  # the run reads its recipe


def test_the_same_student_written_again_keeps_its_evaluated_card(
    teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A second ``merge train`` of a trained student (nothing left to train) writes its model
    directory again, the same files: its card had been written anew, "not evaluated yet",
    dropping the evaluation ``merge evaluate`` had written into it while the run's evaluation
    still held the student's rows. The same model keeps its card; another one gets a new card."""
    import torch
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from lmalgebra.distill.layout import CARD, write_model_directory
    from lmalgebra.distill.run.model_card import add_evaluation

    model = AutoModelForMaskedLM.from_pretrained(teacher_dirs["wp"])
    tokenizer = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    target = tmp_path / "model"
    write_model_directory(target, model, tokenizer, {"kind": "student"}, "# card\n")
    add_evaluation(target, "| scores |")
    evaluated = (target / CARD).read_text(encoding="utf-8")
    write_model_directory(target, model, tokenizer, {"kind": "student"}, "# card\n")
    assert (target / CARD).read_text(encoding="utf-8") == evaluated
    with torch.no_grad():
        next(model.parameters()).add_(1.0)  # trained again: another model
    write_model_directory(target, model, tokenizer, {"kind": "student"}, "# card\n")
    assert (target / CARD).read_text(encoding="utf-8") == "# card\n"


@pytest.mark.parametrize("blocked", ["evaluation", "evaluation/scored_bits_per_byte.csv"])
def test_bits_per_byte_names_its_table_in_the_way_before_scoring(
    blocked: str, causal_trained: Path, cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``merge bits-per-byte`` over a run whose ``evaluation`` is a file, or whose table there
    is a directory: it scored every model, then stopped at the write. Named before any model is
    scored now, as ``merge evaluate`` names its own."""
    import shutil

    from lmalgebra.distill.causal import bits_per_byte

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("scored")

    run = tmp_path / "run"
    shutil.copytree(causal_trained.parent / "run", run, ignore=shutil.ignore_patterns("evaluation"))
    path = run / blocked
    path.parent.mkdir(parents=True, exist_ok=True)
    path.mkdir() if blocked.endswith(".csv") else path.write_text("in the way\n")
    monkeypatch.setattr(bits_per_byte, "bits_per_byte", never)
    args = ["merge", "bits-per-byte", str(run), "--models", f"s={run / 'student' / 'model'}"]
    assert_one_line(*cli(args), [str(path)])


def test_verify_names_an_evaluation_of_a_student_trained_again_since(
    trained: Path, cli, tmp_path: Path
) -> None:
    """A student trained again after it was evaluated: ``merge verify`` passed the run, while
    ``merge evaluate`` of any other student refuses to keep its rows, and the evaluation's
    tables describe a model that is gone. Verify names the record and the command that scores
    the student again; once it has, the run passes."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(trained.parent / "run", run)
    recipe = tmp_path / "recipe.yaml"
    data = yaml.safe_load(trained.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student"])
    assert code == 0, stderr
    train = ["merge", "train", str(recipe), "--restart", "--training.seed", "9", "--no-progress"]
    code, stderr = cli(train)
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, ["evaluation.json", "'student'", "--students student"])
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "student"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def test_an_evaluation_of_a_student_the_run_no_longer_holds_names_training_or_overwrite(
    trained: Path, cli, tmp_path: Path
) -> None:
    """An evaluation holding the rows of a student the run holds no model of (removed, or the
    evaluation copied from another run): verify said to score it again (``--students s2``),
    which then said to train it, and an evaluation of every student said to evaluate every
    student again together, which it was. Each names the two remedies: training it, or
    ``--overwrite``, which replaces the evaluation, after which the run passes."""
    import shutil

    import yaml

    run = tmp_path / "run"
    shutil.copytree(trained.parent / "run", run)
    recipe = tmp_path / "recipe.yaml"
    data = yaml.safe_load(trained.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    _train(recipe, "s2", 2, cli)
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert code == 0, stderr
    shutil.rmtree(run / "s2")
    said = ["'s2'", "no saved model now", "--name s2", "--overwrite"]
    for args in (["verify"], ["evaluate"], ["evaluate", "--students", "student"]):
        code, stderr = cli(["merge", *args, str(run)])
        assert_one_line(code, stderr, said)
        assert "again together" not in stderr and "--students s2" not in stderr
    code, stderr = cli(["merge", "evaluate", str(run), "--overwrite"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def test_keep_saved_keeps_only_a_student_trained_as_asked(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``merge(..., students={"student": {"gold_only": True}}, keep_saved=True)`` had returned
    the distilled student as the gold-only one asked for (``merge train`` refuses it, naming the
    change): refused the same way; a student asked for more steps is kept, as documented."""
    import yaml

    from lmalgebra import UserInputError
    from lmalgebra.api.merge import merge

    recipe = built_store(tmp_path, teacher_dirs)
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert code == 0, stderr
    model = tmp_path / "run" / "student" / "model"
    before = digests(model)
    asked = {"student": {"gold_only": True, "lr": 0.05}}
    with pytest.raises(UserInputError, match=r"student 'student' is saved, trained with other "):
        merge(recipe, ["train"], students=asked, keep_saved=True, progress=False)
    longer = merge(recipe, ["train"], students={"student": {"steps": 99}}, keep_saved=True)
    assert longer.students == {"student": model} and digests(model) == before
    # a student of other sizes than the recipe's had been returned as its student
    data = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**data, "student": {**data["student"], "num_heads": 4}}))
    with pytest.raises(UserInputError, match=r"other settings \(student\.num_heads 2 -> 4\)"):
        merge(recipe, ["train"], keep_saved=True, progress=False)
    assert digests(model) == before


def test_a_stale_student_without_checkpoints_is_not_replaced_from_step_0(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A student trained with ``keep_checkpoints 0``, then its store built again (``top_k``):
    ``merge train`` trained it from step 0 over itself, unsaid, where a checkpoint of the old
    store is refused. Refused the same way, by the dry run too; nothing touched."""
    import yaml

    recipe = built_store(tmp_path, teacher_dirs)
    args = ["merge", "train", str(recipe), "--training.keep_checkpoints", "0", "--no-progress"]
    code, stderr = cli(args)
    assert code == 0, stderr
    data = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**data, "top_k": 4}))
    for stage in ("prepare", "teach", "vocab"):
        progress = ["--no-progress"] if stage != "vocab" else []  # vocab shows no progress
        code, stderr = cli(["merge", stage, str(recipe), *progress])
        assert code == 0, stderr
    model = tmp_path / "run" / "student" / "model"
    before = digests(model)
    for extra in (["--dry-run"], []):
        code, stderr = cli([*args, *extra])
        said = ["student 'student'", "top_k 8 -> 4", "--restart", "kept no checkpoint"]
        assert_one_line(code, stderr, said)
    assert digests(model) == before


def test_a_student_of_other_sizes_without_checkpoints_is_not_replaced_from_step_0(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A student trained with ``keep_checkpoints 0``, then trained on with more steps under
    another ``student`` spec (its sizes; a causal student's tokenizer alike): it had been
    trained again from step 0 over itself, unsaid, where a checkpoint of the old spec is
    refused. Refused the same way, by the dry run too, naming the setting; nothing touched."""
    import yaml

    recipe = built_store(tmp_path, teacher_dirs)
    args = ["merge", "train", str(recipe), "--training.keep_checkpoints", "0", "--no-progress"]
    code, stderr = cli(args)
    assert code == 0, stderr
    data = yaml.safe_load(recipe.read_text())
    recipe.write_text(yaml.safe_dump({**data, "student": {**data["student"], "hidden_size": 48}}))
    model = tmp_path / "run" / "student" / "model"
    before = digests(model)
    for extra in (["--dry-run"], []):
        code, stderr = cli([*args, "--training.steps", "9", *extra])
        said = ["student 'student'", "student.hidden_size 32 -> 48", "--restart", "kept no"]
        assert_one_line(code, stderr, said)
    assert digests(model) == before


def test_a_student_setting_an_older_record_lacks_is_not_compared(
    tmp_path: Path, teacher_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A saved student's record of its ``student`` spec from an older release, without a
    setting added since: that setting is not compared (the others are)."""
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe
    from merge_fixtures import TINY_STUDENT, write_recipe

    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT))
    older = recipe.student.model_dump(mode="json")
    del older["dropout"]
    monkeypatch.setattr(pipeline, "saved_training", lambda *_: {"student": older})
    assert pipeline._student_changes(tmp_path, recipe) == []
    older["hidden_size"] = 48
    assert pipeline._student_changes(tmp_path, recipe) == ["student.hidden_size 48 -> 32"]


def test_a_student_is_not_trained_into_a_teacher_selection(trained: Path, cli) -> None:
    """A teacher selection written inside its merge run (``experimental select --out RUN/sel``,
    which the run allows) and a student then trained under that name: training had written its
    checkpoints, log and model among the selection's files. Refused, by the dry run too, and
    nothing there is touched."""
    import json
    import shutil

    selection = trained.parent / "run" / "sel"
    selection.mkdir()
    try:
        (selection / "recommended.yaml").write_text("languages: {}\n", encoding="utf-8")
        (selection / "summary.json").write_text(json.dumps({"identity": {}}), encoding="utf-8")
        before = digests(selection)
        args = ["merge", "train", str(trained), "--name", "sel", "--no-progress"]
        for dry in (["--dry-run"], []):
            assert_one_line(*cli([*args, *dry]), [str(selection), "a teacher selection"])
        assert digests(selection) == before
        assert sorted(p.name for p in selection.iterdir()) == ["recommended.yaml", "summary.json"]
    finally:
        shutil.rmtree(selection)


def test_a_restart_that_trains_nothing_drops_the_training_it_replaces(
    trained: Path, tmp_path: Path, cli
) -> None:
    """``merge train --restart --training.steps 0`` (the model as it starts, over a trained
    student) had saved the untrained model beside the checkpoints and log of the training it
    replaced, and the next ``merge train`` resumed from them. The restart drops them now."""
    import shutil

    import yaml

    shutil.copytree(trained.parent, tmp_path / "copy")
    run, recipe = tmp_path / "copy" / "run", tmp_path / "copy" / "recipe.yaml"
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    shutil.rmtree(run / "evaluation", ignore_errors=True)  # an earlier test's, of the student
    student = run / "student"
    assert list((student / "checkpoints").iterdir()) and (student / "train_log.jsonl").is_file()
    args = ["merge", "train", str(recipe), "--no-progress", "--restart", "--training.steps", "0"]
    code, stderr = cli(args)
    assert code == 0, stderr
    assert sorted(p.name for p in student.iterdir()) == ["model"]
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr
