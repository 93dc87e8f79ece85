"""A command does not replace a finished output with a lesser one: training asked for fewer
steps than a student has (``steps: 0``: the model as it starts) is refused, naming both."""

from __future__ import annotations

from pathlib import Path

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
    pretrain += ["--training.keep_checkpoints", keep]
    code, err = cli([*pretrain, "--training.steps", "2"])
    assert code == 0, err
    before = digests(out)
    code, err = cli([*pretrain, "--training.steps", "0"])
    assert_one_line(code, err, [str(out), "trained 2 steps", "steps 0"])
    assert digests(out) == before


def test_an_evaluation_of_fewer_students_or_languages_is_refused(trained: Path, cli) -> None:
    """``merge evaluate --students s2`` over an evaluation of ``student`` and ``s2`` would replace
    its tables with s2's rows alone (``rdt.csv``, the scores, ``evaluation.md``): refused, naming
    the rows it would drop and the command that keeps them, the evaluation unchanged."""
    run = trained.parent / "run"
    args = ["merge", "train", str(trained), "--name", "s2", "--training.steps", "2"]
    code, stderr = cli([*args, "--no-progress"])
    assert code == 0, stderr
    both = ["--students", "student", "--students", "s2"]
    code, stderr = cli(["merge", "evaluate", str(run), *both])
    assert code == 0, stderr
    evaluation = run / "evaluation"
    before = digests(evaluation)
    languages = (evaluation / "rdt.csv").read_text().splitlines()[0].split(",")[1:-1]
    assert len(languages) >= 2
    code, stderr = cli(["merge", "evaluate", str(run), "--students", "s2"])
    assert_one_line(code, stderr, [str(evaluation), "students student", " ".join(both)])
    code, stderr = cli(["merge", "evaluate", str(run), *both, "--languages", languages[0]])
    assert_one_line(code, stderr, [str(evaluation), f"languages {', '.join(languages[1:])}"])
    assert digests(evaluation) == before
    code, stderr = cli(["merge", "evaluate", str(run), *both])  # the same rows again: fine
    assert code == 0, stderr
