"""`lmalgebra merge evaluate`: student vs teachers on held-out text, RDT, files, bad input."""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer

from lmalgebra.api.merge import MergeRun
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill import pipeline
from lmalgebra.distill.masked.comparability import is_comparable, teacher_languages
from lmalgebra.distill.masked.evaluation import evaluate_run
from lmalgebra.distill.masked.scores import Score, score_rdt
from lmalgebra.distill.masked.store import load_copies
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.vocab.union import UnionVocab
from lmalgebra.storage.shard_set import ShardSet
from merge_fixtures import write_recipe
from tiny import build_bert_mlm

STUDENT = {
    "hidden_size": 32,
    "num_layers": 1,
    "num_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("evaluate")
    recipe = load_recipe(
        write_recipe(
            root,
            teacher_dirs,
            heldout_fraction=0.3,
            student=STUDENT,
            training={"steps": 3, "batch_size": 4, "warmup_steps": 0},
        )
    )
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    pipeline.vocab(recipe)
    train_student(recipe, "student", progress=False)
    return recipe.output_dir


def test_rdt_follows_equation_3() -> None:
    def score(model: str, teacher: str, accuracy: float) -> Score:
        return Score("xx", teacher, model, 1, 1, accuracy, 0.0, 1.0, 1.0, 1.0)

    scores = [
        score("t1", "t1", 0.5),
        score("t2", "t2", 0.8),
        score("s", "t1", 0.55),
        score("s", "t2", 0.6),
    ]
    assert score_rdt(scores, "s")["xx"] == pytest.approx(
        100 * ((0.55 - 0.5) / 0.5 + (0.6 - 0.8) / 0.8) / 2
    )


def _fill_mask_reference(
    model: object, rows: list[tuple[np.ndarray, np.ndarray]], mask_id: int | None
) -> tuple[np.ndarray, float, int]:
    """Independent reference, one example at a time with plain transformers: the selected
    positions replaced by ``mask_id`` (None: the input as given), full-vocabulary logits, argmax.
    ``rows``: (input ids, positions). Returns the predicted ids, the gold tokens' total NLL,
    the gold ids being ``ids[positions]`` before masking, and how many argmaxes lead their
    runner-up by 1e-4 or less (near-ties, which another kernel may break the other way)."""
    predicted, nll, ties = [], 0.0, 0
    with torch.no_grad():
        for ids, positions in rows:
            x = torch.from_numpy(ids.copy())
            gold = x[positions].clone()
            if mask_id is not None:
                x[positions] = mask_id
            logits = model(input_ids=x[None]).logits[0, positions]  # type: ignore[operator]
            predicted.append(logits.argmax(-1).numpy())
            nll -= float(torch.log_softmax(logits, -1).gather(1, gold[:, None]).sum())
            first, second = logits.topk(2, dim=-1).values.unbind(-1)
            ties += int((first - second <= 1e-4).sum())
    return np.concatenate(predicted), nll, ties


def test_scores_match_a_plain_fill_mask_reference(run_dir: Path, teacher_dirs) -> None:
    """Teacher and student, each on the held-out text in the teacher's tokenisation (the student
    through the vocabulary map), every selected token replaced by the mask token."""
    examples = pa.concat_tables(ShardSet.existing(run_dir / "examples" / "yy").tables())
    texts = dict(
        zip(examples.column("id").to_pylist(), examples.column("text").to_pylist(), strict=True)
    )
    raw = load_copies(run_dir, "yy", "sp", None)
    tokenizer = AutoTokenizer.from_pretrained(teacher_dirs["sp"])
    rows = []
    for r in np.flatnonzero(raw.heldout):
        ids = tokenizer(texts[raw.example_ids[r]], truncation=True, max_length=48)["input_ids"]
        rows.append((np.array(ids), raw.positions[raw.mask_offsets[r] : raw.mask_offsets[r + 1]]))
    gold = np.concatenate([ids[positions] for ids, positions in rows])
    teacher = AutoModelForMaskedLM.from_pretrained(teacher_dirs["sp"]).eval()
    mapping = UnionVocab.load(run_dir / "vocab").maps["sp"]
    student_rows = [(mapping[ids].astype(np.int64), positions) for ids, positions in rows]
    student = AutoModelForMaskedLM.from_pretrained(run_dir / "student" / "model").eval()
    expected = {
        "sp": (*_fill_mask_reference(teacher, rows, tokenizer.mask_token_id), gold),
        "student": (
            *_fill_mask_reference(student, student_rows, int(mapping[tokenizer.mask_token_id])),
            mapping[gold],
        ),
    }
    scores = evaluate_run(MergeRun.load(run_dir).recipe, ["student"], ["yy"])
    for model, (predicted, nll, ties, labels) in expected.items():
        score = next(s for s in scores if s.teacher == "sp" and s.model == model)
        assert score.masked_tokens == gold.size > 20
        # batched there, alone here: a near-tie's argmax may break the other way in other kernels
        assert abs(round(score.accuracy * gold.size) - np.sum(predicted == labels)) <= ties
        assert score.loss == pytest.approx(nll / gold.size, rel=1e-4)


def test_training_masking_column_keeps_the_stored_figure(run_dir: Path) -> None:
    """The teacher's top-1 under the training masking (80/10/10) is the store's, exactly."""
    raw = load_copies(run_dir, "yy", "sp", None)
    rows = np.flatnonzero(raw.heldout)
    idx = np.concatenate([np.arange(raw.mask_offsets[r], raw.mask_offsets[r + 1]) for r in rows])
    scores = evaluate_run(MergeRun.load(run_dir).recipe, ["student"], ["yy"])
    teacher = next(s for s in scores if s.teacher == "sp" and s.model == "sp")
    assert teacher.examples == len(rows) > 0 and teacher.masked_tokens == idx.size
    stored = np.mean(raw.topk_ids[idx, 0] == raw.labels[idx])
    assert teacher.top1_training_masking == pytest.approx(stored)
    assert teacher.top1_agreement == 1.0 and teacher.topk_overlap == 1.0


def test_evaluate_command_writes_tables_and_plot(run_dir: Path, cli) -> None:
    """``lmalgebra merge evaluate`` through ``cli.main`` (``conftest.cli``, in this process)."""
    code, stderr = cli(["merge", "evaluate", str(run_dir)])
    assert code == 0, stderr
    out = run_dir / "evaluation"
    for name in ("scores.csv", "rdt.csv", "evaluation.md", "accuracy.png"):
        assert (out / name).is_file()
    lines = (out / "scores.csv").read_text().splitlines()
    assert len(lines) == 1 + 2 * 3  # (teacher, student) x (xx/wp, yy/wp, yy/sp)
    assert (out / "rdt.csv").read_text().startswith("student,xx,yy,average")
    # the student's model card now carries its evaluation, beside how it was made
    card = (run_dir / "student" / "model" / "README.md").read_text(encoding="utf-8")
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "## How it was made" in card and "xx: wp; yy: wp, sp" in card
    evaluation = card.split("## Evaluation", 1)[1]
    assert "Not evaluated yet" not in evaluation and "| student |" in evaluation
    assert evaluation.count("| yy | sp |") == 2  # the teacher's row and the student's


def test_scores_are_in_range(run_dir: Path) -> None:
    scores = evaluate_run(MergeRun.load(run_dir).recipe, ["student"], ["yy"])
    assert {s.language for s in scores} == {"yy"}
    for s in scores:
        assert 0 <= s.accuracy <= 1 and s.loss > 0 and 0 <= s.topk_overlap <= 1
    assert set(score_rdt(scores, "student")) == {"yy", "average"}


def test_bad_inputs_name_the_missing_stage(run_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="language 'zz' is not in the run"):
        evaluate_run(MergeRun.load(run_dir).recipe, ["student"], ["zz"])
    with pytest.raises(UserInputError, match="merge train RECIPE --name other"):
        evaluate_run(MergeRun.load(run_dir).recipe, ["other"])
    with pytest.raises(UserInputError, match="merge prepare RECIPE"):
        MergeRun.load(tmp_path).evaluate(["student"])


def test_rdt_leaves_out_a_teacher_with_zero_accuracy_and_says_so(tmp_path: Path) -> None:
    from lmalgebra.distill.masked.scores import markdown, undefined_rdt
    from lmalgebra.distill.run.rdt import rdt_text

    def score(lang: str, teacher: str, model: str, accuracy: float) -> Score:
        return Score(lang, teacher, model, 10, 50, accuracy, 1.0, 2.7, 0.5, 0.5)

    scores = [
        score("xx", "t1", "t1", 0.5),
        score("xx", "t1", "s", 0.6),
        score("yy", "t2", "t2", 0.0),  # a teacher that gets no masked token right
        score("yy", "t2", "s", 0.3),
    ]
    values = score_rdt(scores, "s")
    assert values["xx"] == pytest.approx(20.0)
    assert np.isnan(values["yy"]) and values["average"] == pytest.approx(20.0)
    assert undefined_rdt(scores) == [
        "teacher t2 scores 0 accuracy on yy: RDT against it is undefined and left out (a "
        "teacher that predicts no masked token right cannot be a reference)"
    ]
    assert "nan" not in rdt_text({"s": values}).lower()
    page = markdown(scores, {"s": values})
    assert "nan" not in page.lower() and "| s | +20.00 | n/a | +20.00 |" in page
    assert "Note: teacher t2 scores 0 accuracy on yy" in page


def test_a_teacher_changed_since_the_teach_stage_is_refused(tmp_path: Path, teacher_dirs) -> None:
    """Scoring a teacher again (its all-mask predictions are not in the store) needs the same
    weights the store was made with; a student, the teachers it was trained from."""
    teachers = {name: tmp_path / name for name in teacher_dirs}
    for name, path in teacher_dirs.items():
        shutil.copytree(path, teachers[name])
    recipe = load_recipe(
        write_recipe(tmp_path, teachers, student=STUDENT, training={"steps": 1, "batch_size": 4})
    )
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    pipeline.vocab(recipe)
    train_student(recipe, "student", progress=False)
    build_bert_mlm(teachers["wp"], seed=1)  # other weights, same tokenizer
    with pytest.raises(UserInputError, match=r"topk/xx/wp was built with a different recipe or "):
        pipeline.evaluate_students(recipe, ["student"])
    pipeline.teach(recipe, progress=False)  # the store again, from the new weights
    pipeline.vocab(recipe)
    with pytest.raises(UserInputError, match=r"student 'student' was trained from teacher 'wp' "):
        pipeline.evaluate_students(recipe, ["student"])


# --- comparability: a teacher on a language it was not trained on is no reference ----------


def test_the_comparability_rule() -> None:
    assert is_comparable("fr", frozenset({"fr", "es"}))
    assert not is_comparable("fr", frozenset({"en"}))
    assert is_comparable("fr", None)  # the teacher's languages are unknown: nothing to judge by


def test_teacher_languages_come_from_the_pretraining_record(tmp_path: Path) -> None:
    records = {
        "teacher-en": {"kind": "pretrained-teacher", "language": "en"},
        "student": {"kind": "student", "recipe": {}},  # a student's record names no language
    }
    for name, record in records.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "lmalgebra.json").write_text(json.dumps(record), encoding="utf-8")
    teachers = {
        "teacher-en": str(tmp_path / "teacher-en"),
        "student": str(tmp_path / "student"),
        "hub": "some-org/some-model",
    }
    assert teacher_languages(teachers) == {
        "teacher-en": frozenset({"en"}),
        "student": None,
        "hub": None,
    }


def _sm1_scores() -> list[Score]:
    """SM1 of the demo: every language scored in the English teacher's tokenisation."""
    accuracy = {"en": (0.5, 0.6), "fr": (0.1, 0.4), "es": (0.2, 0.5)}  # (teacher, student)
    return [
        Score(
            lang,
            "teacher-en",
            model,
            10,
            50,
            acc,
            1.0,
            2.7,
            0.5,
            0.5,
            comparable=is_comparable(lang, {"en"}),
        )
        for lang, (teacher, student) in accuracy.items()
        for model, acc in (("teacher-en", teacher), ("sm1", student))
    ]


def test_rows_on_a_language_the_teacher_never_learnt_are_marked_and_left_out(
    tmp_path: Path,
) -> None:
    import pandas as pd

    from lmalgebra.distill.masked.scores import SCORES, incomparable_languages, markdown
    from lmalgebra.storage.csv_tables import read_table, write_table

    scores = _sm1_scores()
    frame = pd.DataFrame([asdict(s) for s in scores], columns=list(SCORES.columns))
    assert frame["comparable"].dtype == bool
    assert sorted(frame.loc[~frame["comparable"], "language"].unique()) == ["es", "fr"]
    assert frame.loc[frame["comparable"], "language"].unique().tolist() == ["en"]
    values = score_rdt(scores, "sm1")
    assert values["en"] == pytest.approx(20.0)
    assert np.isnan(values["fr"]) and np.isnan(values["es"])
    assert values["average"] == pytest.approx(20.0)  # not (20 + 300 + 150) / 3
    assert incomparable_languages(scores, "sm1") == ["es", "fr"]
    page = markdown(scores, {"sm1": values})
    assert "| sm1 | +20.00 | not comparable | not comparable | +20.00 |" in page
    assert "Note: teacher teacher-en was not trained on es, fr:" in page
    assert page.count("| no |") == 4 and page.count("| yes |") == 2
    write_table(tmp_path, SCORES, scores)
    assert [s.comparable for s in read_table(tmp_path, SCORES) or []] == [
        s.comparable for s in scores
    ]


def test_evaluate_marks_the_scores_of_a_teacher_off_its_languages(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from lmalgebra.distill.masked import evaluation

    # as if wp had been pre-trained on yy alone, and sp's languages were unknown
    monkeypatch.setattr(evaluation, "teacher_languages", lambda teachers: {"wp": frozenset({"yy"})})
    scores = evaluate_run(MergeRun.load(run_dir).recipe, ["student"])
    marked = {(s.language, s.teacher, s.comparable) for s in scores}
    assert marked == {("xx", "wp", False), ("yy", "wp", True), ("yy", "sp", True)}
    assert set(score_rdt(scores, "student")) == {"xx", "yy", "average"}
    # the tiny teachers get no masked token right, so read RDT on perplexity (never 0)
    values = score_rdt(scores, "student", metric="perplexity")
    assert np.isnan(values["xx"]) and np.isfinite(values["yy"])  # xx: no comparable score
    assert values["average"] == pytest.approx(values["yy"])


def test_a_nan_score_in_the_evaluation_record_is_strict_json_and_reads_back(
    tmp_path: Path,
) -> None:
    """A row's NaN (a score with no position to take it on) had been written as ``NaN`` into
    ``evaluation.json``, which strict JSON readers refuse: it is null in the file, covered by
    the record's checksum, and NaN again for the evaluation that keeps the row."""
    from dataclasses import dataclass

    from lmalgebra.distill.layout import RunLayout
    from lmalgebra.distill.run.evaluation_record import Basis, RowKind, read_record, write_record

    @dataclass(frozen=True)
    class Row:
        language: str
        model: str
        loss: float

    kind = RowKind("scores", Row)
    layout = RunLayout(tmp_path)
    basis = Basis("masked", {}, {"en": "d" * 64}, {"t": {"weights": "h"}})
    rows = [asdict(Row("en", "t", float("nan"))), asdict(Row("en", "t", 1.5))]
    write_record(layout, basis, {"scores": rows}, {})

    def refuse(name: str) -> None:
        raise ValueError(f"{name} is not JSON")

    text = (layout.evaluation / "evaluation.json").read_text()
    assert json.loads(text, parse_constant=refuse)["tables"]["scores"][0]["loss"] is None
    back = read_record(layout.evaluation / "evaluation.json", "masked", [kind])["tables"]["scores"]
    assert np.isnan(back[0]["loss"]) and back[1]["loss"] == 1.5


def test_under_a_launcher_the_other_ranks_take_the_main_ranks_evaluation(
    run_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``MergeRun.evaluate`` in a script under ``torchrun`` had scored and written the same
    files on every rank: a rank other than the main one now waits for it and returns the same
    frames, read from its record, scoring and writing nothing."""
    import pandas as pd

    from lmalgebra import distributed
    from lmalgebra.distill.masked.objective import MaskedObjective

    first = MergeRun.load(run_dir).evaluate()
    written = {p: p.stat().st_mtime_ns for p in (run_dir / "evaluation").iterdir()}
    card = (run_dir / "student" / "model" / "README.md").stat().st_mtime_ns

    def scored(*_: object) -> None:
        raise AssertionError("a rank other than the main one scored")

    monkeypatch.setattr(distributed, "world", lambda: (1, 2))
    monkeypatch.setattr(distributed, "any_rank", lambda flag: flag)
    monkeypatch.setattr(MaskedObjective, "score", scored)
    again = MergeRun.load(run_dir).evaluate()
    assert again.scores is not None and first.scores is not None
    pd.testing.assert_frame_equal(again.scores, first.scores)
    pd.testing.assert_frame_equal(again.rdt, first.rdt)
    assert again.evaluation == first.evaluation
    assert {p: p.stat().st_mtime_ns for p in (run_dir / "evaluation").iterdir()} == written
    assert (run_dir / "student" / "model" / "README.md").stat().st_mtime_ns == card


def test_a_gold_unknown_token_predicted_as_unknown_counts_as_missed() -> None:
    """A held-out gold ``[UNK]`` predicted as ``[UNK]`` had counted as correct, so a teacher
    that reads a language as unknown tokens scored high and RDT compared the student with it;
    teacher selection already counted it as missed."""
    from types import SimpleNamespace

    from lmalgebra.distill.masked.evaluation import Predictions, _score

    unk = 1
    labels = np.array([unk, unk, 5, 7])
    copies = SimpleNamespace(labels=labels, heldout=np.array([True]), mask_offsets=np.array([0, 4]))
    top = np.array([[unk], [unk], [5], [6]])
    args = (("xx", "t", "t"), copies, Predictions(top, 1.0), top, top)
    assert _score(*args, unk).accuracy == 0.25  # 5 alone
    assert _score(*args, unk).top1_training_masking == 0.25
    assert _score(*args, None).accuracy == 0.75  # a tokenizer of no unknown token
