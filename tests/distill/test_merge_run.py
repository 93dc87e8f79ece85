"""`lmalgebra merge run` end to end: two tiny teachers with different tokenizers, two languages."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from transformers import AutoTokenizer

from hostile_helpers import run_main
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill import pipeline
from lmalgebra.distill.examples import examples_set
from lmalgebra.distill.masked.store import load_copies, read_copies
from lmalgebra.distill.pipeline import check_store
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.vocab.union import UnionVocab, canonical_token, detect_convention
from lmalgebra.storage.shard_set import ShardSet
from merge_fixtures import write_recipe


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, teacher_dirs) -> Path:
    """The run, made by the real command line (``python -m lmalgebra merge run``)."""
    recipe = write_recipe(tmp_path_factory.mktemp("cli"), teacher_dirs)
    proc = subprocess.run(
        [sys.executable, "-m", "lmalgebra", "merge", "run", str(recipe), "--no-progress"],
        capture_output=True,
        text=True,
        check=False,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return load_recipe(recipe).output_dir


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``cli(*ARGS)``: ``lmalgebra ARGS`` through ``cli.main`` in this process (what
    ``python -m lmalgebra`` runs once its imports are done, which a new process would repeat for
    every command), 300 columns wide: its exit status, stdout and stderr (without colours). The
    width is set on the consoles made while it runs (``COLUMNS``) and on the command line's own,
    made when it was imported, which read ``COLUMNS`` then."""
    from lmalgebra.cli.app import console

    def run(*args: str) -> Done:
        monkeypatch.setenv("COLUMNS", "300")
        monkeypatch.setattr(console, "_width", 300)
        return Done(*run_main(list(args), monkeypatch, capsys))

    return run


def test_inspect_reports_counts_bytes_and_overlap(run_dir: Path, cli) -> None:
    proc = cli("merge", "inspect", str(run_dir), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert {(r["language"], r["teacher"]) for r in report["pairs"]} == {
        ("xx", "wp"),
        ("yy", "wp"),
        ("yy", "sp"),
    }
    vocab = report["vocab"]
    assert vocab["union_size"] > 200
    assert set(vocab["tokens_per_language"]) == {"xx", "yy"}
    assert cli("merge", "verify", str(run_dir)).returncode == 0
    # the same from Python, typed: the JSON is its as_dict(); a DataFrame by language and teacher
    import lmalgebra

    found = lmalgebra.MergeRun.load(run_dir).inspect()
    assert isinstance(found, lmalgebra.RunInspection)
    assert json.loads(json.dumps(found.as_dict())) == report
    frame = found.frame()
    assert list(frame.index.names) == ["language", "teacher"]
    assert int(frame.loc[("xx", "wp"), "examples"]) == found.pairs[0]["examples"] > 0
    assert found.summary.startswith("3 (language, teacher) pairs")
    # the table shows the vocabulary overlap the documentation promises, not the JSON alone
    shown = cli("merge", "inspect", str(run_dir)).stdout
    shared = vocab["overlap"][0]
    assert f"tokens shared: {shared['a']}/{shared['b']} {shared['shared']}" in shown


def test_student_tokenizer_loads_with_auto_tokenizer(run_dir: Path) -> None:
    student = AutoTokenizer.from_pretrained(run_dir / "vocab")
    ids = student("the river city")["input_ids"]
    assert student.convert_ids_to_tokens(ids)[0] == "[CLS]"
    assert student.decode(ids, skip_special_tokens=True) == "the river city"


def test_ids_round_trip_through_the_maps(run_dir: Path, teacher_dirs) -> None:
    """Stored teacher ids, mapped to student ids, name the same canonical tokens."""
    union = UnionVocab.load(run_dir / "vocab")
    for lang, teacher in (("xx", "wp"), ("yy", "sp")):
        tok = AutoTokenizer.from_pretrained(teacher_dirs[teacher])
        convention = detect_convention(tok)
        raw = load_copies(run_dir, lang, teacher, vocab=None)
        mapped = load_copies(run_dir, lang, teacher, vocab=union)
        specials = set(tok.all_special_ids)
        for name in ("input_ids", "labels", "topk_ids"):
            teacher_ids, student_ids = getattr(raw, name).ravel(), getattr(mapped, name).ravel()
            assert teacher_ids.shape == student_ids.shape
            for t_id, s_id in zip(teacher_ids[:2000], student_ids[:2000], strict=True):
                if int(t_id) in specials:
                    continue
                token = tok.convert_ids_to_tokens(int(t_id))
                assert union.tokens[s_id] == canonical_token(token, convention)
        # rows line up with the examples, and held-out flags with the examples' flags
        examples = ShardSet.existing(run_dir / "examples" / lang).tables()
        ids = [i for t in examples for i in t.column("id").to_pylist()]
        assert list(mapped.example_ids) == ids
        assert mapped.topk_ids.shape[1] == 8 and mapped.topk_logprobs.dtype == np.float32
        assert mapped.positions.size == mapped.labels.size == mapped.topk_ids.shape[0]


def test_bad_run_dir_and_corrupt_shard_exit_2(run_dir: Path, tmp_path: Path, cli) -> None:
    proc = cli("merge", "inspect", str(tmp_path))
    assert proc.returncode == 2 and "not a merge run directory" in proc.stderr
    shard = run_dir / "masked" / "xx" / "wp" / "shard-00000.arrow"
    original = shard.read_bytes()
    try:
        shard.write_bytes(original[:-10] + b"0123456789")
        proc = cli("merge", "verify", str(run_dir))
        assert proc.returncode == 2 and str(shard) in proc.stderr
        assert "Traceback" not in proc.stderr
    finally:
        shard.write_bytes(original)


def test_examples_and_masked_shards_line_up(run_dir: Path) -> None:
    recipe = load_recipe(run_dir.parent / "recipe.yaml")
    assert examples_set(recipe, "xx").complete
    table = ShardSet.existing(run_dir / "masked" / "xx" / "wp").read(0)
    assert len(read_copies(table)) == table.num_rows


def test_vocabulary_is_stamped_and_checked_against_the_teachers(run_dir: Path) -> None:
    recipe = load_recipe(run_dir.parent / "recipe.yaml")
    vocab = run_dir / "vocab"
    stamp = vocab / "complete.json"
    built = {p.name: p.read_bytes() for p in sorted(vocab.iterdir())}
    times = {p.name: p.stat().st_mtime_ns for p in vocab.iterdir()}
    check_store(recipe)
    pipeline.vocab(recipe)  # stamped under these teachers' tokenizers: nothing is rebuilt
    assert {p.name: p.stat().st_mtime_ns for p in vocab.iterdir()} == times
    try:
        stamp.write_text(json.dumps("0" * 64) + "\n")
        with pytest.raises(UserInputError, match="was built from other teachers"):
            check_store(recipe)
        stamp.unlink()
        with pytest.raises(UserInputError, match=r"missing: run `lmalgebra merge vocab RECIPE`"):
            check_store(recipe)
        pipeline.vocab(recipe)  # rebuilt, to the same bytes, and stamped again
        assert {p.name: p.read_bytes() for p in sorted(vocab.iterdir())} == built
        check_store(recipe)
    finally:
        stamp.write_bytes(built["complete.json"])


def test_each_stage_ends_with_a_summary_and_the_next_command(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    recipe = write_recipe(tmp_path, teacher_dirs)
    lines = {}
    for stage in ("prepare", "teach", "vocab"):
        progress = ["--no-progress"] if stage != "vocab" else []  # vocab shows no progress
        done = cli("merge", stage, str(recipe), *progress)
        assert done.returncode == 0, done.stderr
        lines[stage] = done.stdout.strip().splitlines()
    assert "3 (language, teacher) pairs" in lines["prepare"][-2]
    assert lines["prepare"][-1] == f"next: lmalgebra merge teach {recipe}"
    assert lines["teach"][-1] == f"next: lmalgebra merge vocab {recipe}"
    assert "student vocabulary" in lines["vocab"][-2]
    assert lines["vocab"][-1] == f"next: lmalgebra merge train {recipe}"


def test_an_inspection_without_examples_has_the_columns_and_types_of_a_row(
    tmp_path: Path,
) -> None:
    """Before ``prepare`` the frame had the printed table's columns alone, every one an object:
    ``teach_complete`` (and masked runs' payload bytes) were missing until there were rows."""
    from lmalgebra.distill.causal.inspection import CAUSAL_ROW, causal_report
    from lmalgebra.distill.masked.inspection import MASKED_ROW, masked_report

    for report, row in ((causal_report, CAUSAL_ROW), (masked_report, MASKED_ROW)):
        frame = report(tmp_path / "run").frame()
        assert frame.empty and list(frame.index.names) == ["language", "teacher"]
        assert list(frame.columns) == [k for k in row if k not in ("language", "teacher")]
        assert frame["teach_complete"].dtype == bool and frame["examples"].dtype == np.int64
