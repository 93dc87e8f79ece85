"""`lmalgebra experimental select` / `select_teachers`: LMD ranks a recipe's teacher sets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from hostile_helpers import assert_one_line, digests, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.experimental import select_teachers
from tiny import build_bert_mlm, documents

OPTIONS = {"spans": {"counts": (240, 60, 120), "length": 8}, "bootstrap": 40}


@pytest.fixture(scope="module")
def candidates(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> dict:
    root = tmp_path_factory.mktemp("candidates")
    copy = root / "wp_copy"
    shutil.copytree(teacher_dirs["wp"], copy)  # the same model under another name
    return {
        "wp": teacher_dirs["wp"],
        "wp_copy": copy,
        "other": build_bert_mlm(root / "other", seed=7),
        "sp": teacher_dirs["sp"],
    }


def write(root: Path, teachers: dict[str, Path], order: list[str]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / "xx.txt"
    corpus.write_text("\n".join(documents(160, seed=21)) + "\n", encoding="utf-8")
    recipe = {
        "languages": {
            "xx": {"corpus": {"paths": [str(corpus)]}, "teachers": order},
            "yy": {"corpus": {"paths": [str(corpus)]}, "teachers": ["sp"]},
        },
        "teachers": {name: {"path": str(teachers[name])} for name in teachers},
        "example_length": 48,
        "heldout_fraction": 0.5,
        "output_dir": str(root / "run"),
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def selected(tmp_path_factory: pytest.TempPathFactory, candidates: dict) -> tuple:
    root = tmp_path_factory.mktemp("select")
    path = write(root, candidates, ["wp", "wp_copy", "other", "sp"])
    cache = root / "cache"
    return path, cache, select_teachers(path, size=2, cache_dir=cache, **OPTIONS)


def test_a_duplicate_is_never_chosen_over_a_distinct_teacher(selected: tuple) -> None:
    _, _, found = selected
    xx = found.sets[found.sets.language == "xx"].reset_index(drop=True)
    assert len(xx) == 6  # every pair of four candidates
    assert xx.members[0] != "wp+wp_copy"
    duplicate = xx[xx.members == "wp+wp_copy"].iloc[0]
    assert duplicate["rank"] == 6 and duplicate.complementarity < 0.05
    assert (xx.complementarity[:5] > 0.2).all()
    assert (xx.score_low <= xx.score).all() and (xx.score <= xx.score_high).all()
    assert found.recommended["yy"] == ["sp"] and len(found.recommended["xx"]) == 2
    assert set(found.teachers.columns) >= {"accuracy", "loss", "group_r2"}
    # the recommended recipe keeps only the chosen teachers and loads as a recipe
    assert sorted(found.recipe.languages["xx"].teachers) == found.recommended["xx"]
    assert set(found.recipe.teachers) == {*found.recommended["xx"], "sp"}


def test_stable_under_reordering_of_candidates(
    tmp_path: Path, selected: tuple, candidates: dict
) -> None:
    _, cache, found = selected
    path = write(tmp_path, candidates, ["sp", "other", "wp_copy", "wp"])
    again = select_teachers(path, size=2, cache_dir=cache, **OPTIONS)
    assert list(again.sets.members) == list(found.sets.members)
    assert again.sets.score.to_numpy() == pytest.approx(found.sets.score.to_numpy(), abs=1e-9)


def test_cli_writes_the_tables_and_a_recipe_that_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], selected: tuple
) -> None:
    path, cache, found = selected
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    args = ["experimental", "select", str(path), "--spans.counts", "240,60,120", "-T", "8"]
    code, err = run_cli([*args, "--bootstrap", "40", "--no-progress"], monkeypatch, capsys)
    assert code == 0, err
    out = path.parent / "run" / "selection"
    names = {p.name for p in out.iterdir()}
    assert {"sets.csv", "teachers.csv", "recommended.yaml", "selection.png"} <= names
    assert sorted(p.name for p in (path.parent / "run").iterdir()) == ["selection"]  # no store
    chosen = load_recipe(out / "recommended.yaml")
    assert sorted(chosen.languages["xx"].teachers) == found.recommended["xx"]
    # its relative paths are the recipe's, read from here: it says so, as a run's copy does
    from lmalgebra.distill.recipe import MADE_IN

    second = (out / "recommended.yaml").read_text().splitlines()[1]
    assert second == f"{MADE_IN}{json.dumps(str(Path.cwd()))}"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (["--size", "5"], ["size 5", "4"]),
        (["--languages", "zz"], ["'zz'"]),
        # yy alone has one teacher: the line had said no language of the recipe had more
        (
            ["--languages", "yy"],
            ["size 2", "no language of --languages (languages=), yy, lists more than 1 teacher"],
        ),
        # an empty list (a variable left unset) had selected for every language
        (["--languages", ""], ["--languages (languages) names no language"]),
        (["--languages", ","], ["--languages (languages) names no language"]),
        (["--spans.counts", "10,10"], ["10,10"]),
        # no interval drawn: a level or a seed of the bootstrap had been accepted, doing nothing
        (["--bootstrap", "0", "--level", "0.9"], ["level 0.9 would be ignored", "bootstrap above"]),
        (["--bootstrap", "0", "--seed", "5"], ["seed 5 would be ignored", "bootstrap above 0"]),
        # a set of one has complementarity 1 in every replicate: its "interval" had been the
        # score twice ([1.000, 1.000]), whatever the replicates, level or seed
        (["--size", "1", "--bootstrap", "20"], ["bootstrap 20 would be ignored", "size above"]),
        (["--size", "1", "--level", "0.8"], ["level 0.8 would be ignored", "size above 1"]),
    ],
)
def test_bad_input_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    selected: tuple,
    extra: list[str],
    named: list[str],
) -> None:
    path, _, _ = selected
    code, err = run_cli(["experimental", "select", str(path), *extra], monkeypatch, capsys)
    assert_one_line(code, err, named)


def test_sets_of_one_draw_no_interval(tmp_path: Path, candidates: dict) -> None:
    """Sets of one, ranked by quality alone, have no interval (it had been the score twice)."""
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    found = select_teachers(path, size=1, cache_dir=tmp_path / "cache", spans=OPTIONS["spans"])
    assert len(found.sets) == 5  # xx: wp, sp; yy: sp; overall: wp, sp
    assert found.sets[["score_low", "score_high", "complementarity_low"]].isna().all().all()


def test_an_empty_list_of_languages_is_refused_by_the_api(selected: tuple) -> None:
    path, _, _ = selected
    with pytest.raises(UserInputError, match=r"languages\) names no language"):
        select_teachers(path, size=2, languages=[], **OPTIONS)


def test_a_language_without_held_out_text_is_refused(tmp_path: Path, candidates: dict) -> None:
    path = write(tmp_path, candidates, ["wp", "wp_copy", "other"])
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["heldout_fraction"] = 0.0
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(UserInputError, match="language 'xx' has no held-out example"):
        select_teachers(path, size=2, **OPTIONS)


def test_a_selection_of_other_inputs_is_not_replaced_without_overwrite(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    selected: tuple,
    candidates: dict,
) -> None:
    """A finished selection records what it was made of (recipe, settings, held-out text,
    teachers): another one is refused before any teacher is scored, naming what differs, and
    ``--overwrite`` replaces its files only."""
    _, cache, _ = selected
    monkeypatch.setenv("LMALGEBRA_CACHE", str(cache))
    chosen = {name: candidates[name] for name in ("wp", "other", "sp")}
    path = write(tmp_path, chosen, ["wp", "other"])
    out = tmp_path / "chosen"
    base = ["experimental", "select", str(path), "--out", str(out), "--spans.counts", "240,60,120"]
    base += ["-T", "8", "--bootstrap", "40", "--no-progress"]
    out.mkdir()
    (out / "notes.txt").write_text("mine", encoding="utf-8")  # files of no selection: refused
    code, err = run_cli(base, monkeypatch, capsys)
    assert_one_line(code, err, [str(out), "holds no teacher selection", "notes.txt"])
    assert sorted(p.name for p in out.iterdir() if p.name != ".lmalgebra.lock") == ["notes.txt"]
    (out / "notes.txt").unlink()
    code, err = run_cli(base, monkeypatch, capsys)
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert set(summary["identity"]) >= {"recipe", "settings", "held-out text of xx", "teacher wp"}
    code, err = run_cli(base, monkeypatch, capsys)  # the same selection is made again
    assert code == 0, err
    before = digests(out)

    code, err = run_cli([*base, "--seed", "3"], monkeypatch, capsys)
    assert_one_line(code, err, [str(out), "finished teacher selection", "(settings.seed differs)"])
    corpus = tmp_path / "xx.txt"
    corpus.write_text("\n".join(documents(160, seed=22)) + "\n", encoding="utf-8")
    code, err = run_cli(base, monkeypatch, capsys)
    assert_one_line(code, err, [str(out), "held-out text of xx", "--overwrite"])
    assert digests(out) == before

    (out / "notes.txt").write_text("mine", encoding="utf-8")
    code, err = run_cli([*base, "--overwrite"], monkeypatch, capsys)
    assert_one_line(code, err, [str(out), "notes.txt"])
    assert digests(out) == {**before, "notes.txt": digests(out)["notes.txt"]}
    (out / "notes.txt").unlink()
    code, err = run_cli([*base, "--overwrite"], monkeypatch, capsys)
    assert code == 0, err
    again = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    assert again["identity"]["held-out text of xx"] != summary["identity"]["held-out text of xx"]


def test_too_little_held_out_text_names_the_full_key(tmp_path: Path, candidates: dict) -> None:
    """The refusal said ``max_examples``, a key of each language (``languages.xx.
    max_examples``), where ``heldout_fraction`` beside it is the recipe's own: it names the key
    in full."""
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    recipe["languages"]["xx"]["max_examples"] = 4
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    with pytest.raises(UserInputError, match=r"too little text .* languages\.xx\.max_examples"):
        select_teachers(path, size=2, cache_dir=tmp_path / "cache", spans=OPTIONS["spans"])


def test_sets_of_one_rank_on_text_too_little_for_lmd(
    tmp_path: Path, candidates: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """Sets of one rank by quality alone: a selection of them had been refused for held-out
    text too little for the LMD run that only fills ``group_r2``. It ranks them, saying so."""
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    recipe = yaml.safe_load(path.read_text(encoding="utf-8"))
    recipe["languages"]["xx"]["max_examples"] = 4
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    with caplog.at_level("WARNING"):
        found = select_teachers(path, size=1, cache_dir=tmp_path / "c", spans=OPTIONS["spans"])
    xx = found.teachers[found.teachers["language"] == "xx"]
    assert len(xx) == 2 and xx["group_r2"].isna().all()
    assert any("sets of one rank by quality alone" in r.getMessage() for r in caplog.records)


def test_too_little_held_out_text_names_max_texts_where_it_was_given(
    tmp_path: Path, candidates: dict
) -> None:
    """``max_texts`` alone had cut the held-out text too short, while the refusal named only
    the recipe's keys to raise."""
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    with pytest.raises(UserInputError, match=r"raise --max_texts 1 \(max_texts\), heldout"):
        select_teachers(path, size=2, max_texts=1, cache_dir=tmp_path / "cache", **OPTIONS)


def test_a_selection_refused_where_it_would_go_leaves_no_directory(
    tmp_path: Path, selected: tuple
) -> None:
    """``TeacherSelection.save`` made its directory before the checks of where it goes: one
    refused inside a decomposition run was left there, empty, among the run's files."""
    _, _, selection = selected
    run = tmp_path / "decomposition"
    run.mkdir()
    for name in ("summary.json", "config.yaml"):
        (run / name).write_text("{}\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="holds a decomposition run"):
        selection.save(run / "selection")
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "summary.json"]


def test_a_selection_is_not_written_where_its_recommended_recipe_would_run(
    tmp_path: Path,
    selected: tuple,
    candidates: dict,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A selection written into the recipe's ``output_dir`` (or a directory above it) had its
    ``next: lmalgebra merge run .../recommended.yaml`` refused, the run's directory being the
    selection's: refused before any teacher is scored, by the command and by ``save``."""
    _, _, selection = selected
    run = Path(selection.recipe.output_dir)
    with pytest.raises(UserInputError, match=r"is the recipe's output_dir .* merge run would"):
        selection.save(run)
    assert not (run / "recommended.yaml").exists()
    recipe = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    below = tmp_path / "sel" / "run"  # the run inside the selection
    text = recipe.read_text(encoding="utf-8").replace(str(tmp_path / "run"), str(below))
    recipe.write_text(text, encoding="utf-8")
    for out, how in ((below, "is"), (below.parent, "holds")):
        args = ["experimental", "select", str(recipe), "--out", str(out)]
        code, err = run_cli(args, monkeypatch, capsys)
        assert_one_line(code, err, [f"selection directory {out} {how} the recipe's output_dir"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.yaml", "xx.txt"]


def test_a_singular_basis_names_this_commands_flag(tmp_path: Path, candidates: dict) -> None:
    """At ``alpha 0`` the refusal named ``--products``, a flag of ``decompose`` that select
    lacks (and a teacher whose name holds "span" turned it into "too little text")."""
    teachers = {"wp": candidates["wp"], "spanish": candidates["sp"], "sp": candidates["sp"]}
    path = write(tmp_path, teachers, ["wp", "spanish"])
    with pytest.raises(UserInputError) as caught:
        select_teachers(
            path, size=2, alpha=0.0, bootstrap=0, cache_dir=tmp_path / "c", spans=OPTIONS["spans"]
        )
    message = str(caught.value)
    assert "language 'xx': basis [" in message and "is singular" in message
    assert "use a larger alpha than 0.0" in message and "--products" not in message


def test_the_runs_warnings_are_logged_once_in_selects_flags(
    tmp_path: Path, candidates: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """The LMD run's warnings were logged twice (once more prefixed by the language), and
    ``--bootstrap 0`` warned of ``--study.bootstrap 1``, a flag and a count no one gave; the
    others' remedies named decompose's flags (``-T``, ``--study.alpha_select``)."""
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    spans = {"counts": (100000, 20, 40), "length": 8}
    with caplog.at_level("WARNING"):
        select_teachers(path, size=2, bootstrap=0, cache_dir=tmp_path / "c", spans=spans)
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert [w for w in warned if "fewer spans than requested" in w] == [
        next(w for w in warned if w.startswith("xx: fewer spans than requested"))
    ]
    assert not [w for w in warned if "--study." in w or "(-T)" in w]  # decompose's flags


def test_too_few_replicates_are_named_in_selects_flag_and_keyword(
    tmp_path: Path, candidates: dict, caplog: pytest.LogCaptureFixture
) -> None:
    """The warning of too few replicates was rewritten to ``--bootstrap`` but kept decompose's
    keyword: ``use --bootstrap 40 (study={"bootstrap": 40}) or more``, a keyword
    ``select_teachers`` has not. Both forms are the selection's now."""
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    with caplog.at_level("WARNING"):
        select_teachers(path, size=2, bootstrap=3, cache_dir=tmp_path / "c", spans={"length": 8})
    warned = [r.getMessage() for r in caplog.records if "replicates at least" in r.getMessage()]
    assert warned and all(w.startswith("xx: --bootstrap 3 (bootstrap=3): ") for w in warned)
    assert all("use --bootstrap 40 (bootstrap=40) or more" in w for w in warned), warned


def test_the_next_line_says_where_other_teachers_would_meet_trained_students(
    tmp_path: Path,
) -> None:
    """The recommended recipe keeps the recipe's ``output_dir``: run as the "next:" line said,
    over a run of trained students, it had built their vocabulary again with other teachers in
    silence (the students then refused by verify and train). The line says so there, and only
    there."""
    from types import SimpleNamespace

    from lmalgebra.cli.experimental import _over

    config = SimpleNamespace(
        output_dir=tmp_path, languages={"xx": SimpleNamespace(teachers=["wp", "sp"])}
    )
    same, other = (
        SimpleNamespace(recommended={"xx": ["sp", "wp"]}),
        SimpleNamespace(recommended={"xx": ["wp"]}),
    )
    assert _over(config, other) == ""  # no trained student: nothing to lose
    marker = tmp_path / "s1" / "model" / "lmalgebra.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}", encoding="utf-8")
    assert _over(config, same) == ""  # the same teachers: the run resumes
    assert f"writes into {tmp_path}, which holds students trained with other" in _over(
        config, other
    )
    assert "teachers, s1: give it another output_dir" in _over(config, other)


def test_a_teacher_that_reads_the_text_as_unknown_tokens_earns_no_accuracy(
    teacher_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A teacher whose tokenizer reads a language as its unknown token, and which predicts that
    token, had scored an accuracy near 1 and been recommended first (a ``pretrain`` teacher of
    another language's tokenizer: 0.99 against 0.02): a gold unknown token counts as missed."""
    import torch

    from lmalgebra.distill.examples import Example
    from lmalgebra.distill.masked.teachers import open_masked_teacher
    from lmalgebra.distill.recipe import MaskingSpec
    from lmalgebra.experimental.selection import teacher_quality
    from lmalgebra.sources.models import ModelRef

    ref = ModelRef(name="wp", path=str(teacher_dirs["wp"]))
    teacher = open_masked_teacher(ref)
    unk = teacher.tokenizer.unk_token_id

    def always_unknown(model: object, batch: dict) -> torch.Tensor:  # a perfect [UNK] guesser
        logits = torch.zeros(batch["rows"].numel(), len(teacher.tokenizer))
        logits[:, unk] = 1.0
        return logits

    monkeypatch.setattr(teacher_quality, "masked_logits", always_unknown)
    text = " ".join(["съешь же ещё этих мягких булок"] * 8)
    examples = [Example(f"yy-{i}", f"{text} {i}", True) for i in range(4)]
    found = teacher_quality.held_out_quality("yy", teacher, ref, examples, MaskingSpec(seed=3), 48)
    assert found.masked_tokens > 0 and found.accuracy == 0.0


def test_candidates_that_predict_nothing_are_said_to_rank_by_name(
    tmp_path: Path,
    candidates: dict,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Every candidate of accuracy 0 gets quality 1.0 ("no signal"): sets of one then ranked by
    name and the first recommended, as if it were better, unsaid. The log says so."""
    import dataclasses
    from typing import Any

    from lmalgebra.experimental.selection import teacher_sets

    scored = teacher_sets.held_out_quality

    def nothing(*args: Any, **kwargs: Any) -> Any:
        return dataclasses.replace(scored(*args, **kwargs), accuracy=0.0)

    monkeypatch.setattr(teacher_sets, "held_out_quality", nothing)
    path = write(tmp_path, {k: candidates[k] for k in ("wp", "sp")}, ["wp", "sp"])
    with caplog.at_level("WARNING"):
        select_teachers(path, size=1, cache_dir=tmp_path / "c", spans=OPTIONS["spans"])
    said = [r.getMessage() for r in caplog.records if "predicts a masked" in r.getMessage()]
    assert said == [
        "xx: no candidate predicts a masked held-out token (accuracy 0 for each): quality says "
        "nothing, so sets rank by complementarity alone (ties in name order)"
    ]
