"""``merge verify`` trusts nothing that is missing: a shard set whose manifest was deleted is found
by its shards, and a whole set deleted by the recipe that says it belongs there, each named (exit
2), instead of every remaining set being reported fine."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

from hostile_helpers import assert_one_line, built_store, digests


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, teacher_dirs: dict[str, Path]) -> Path:
    """A masked run whose examples, masked copies, teacher store and vocabulary are built."""
    return built_store(tmp_path_factory.mktemp("verifier"), teacher_dirs).parent / "run"


@pytest.mark.parametrize(
    ("part", "stage"), [("examples", "prepare"), ("masked", "prepare"), ("topk", "teach")]
)
def test_a_deleted_manifest_is_named(
    part: str, stage: str, built: Path, tmp_path: Path, cli
) -> None:
    """The set is named with the command that writes it again (the line had said "run the
    stage again", naming none)."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr  # the intact run passes
    manifest = sorted((run / part).rglob("manifest.json"))[-1]
    manifest.unlink()
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    again = (
        f"run `lmalgebra merge {stage} RECIPE` (merge(recipe, {stage!r})) again to rebuild the set"
    )
    assert_one_line(code, stderr, [str(manifest.parent), "no manifest.json", again])
    assert "every shard matches" not in stderr
    assert digests(run) == before  # verifying repairs nothing and removes nothing


@pytest.mark.parametrize(
    ("deleted", "named", "stage"),
    [
        ("examples/yy", ["examples/yy"], "prepare"),
        ("masked/yy/sp", ["masked/yy/sp"], "prepare"),
        ("topk/yy", ["topk/yy/wp", "topk/yy/sp"], "teach"),
        ("topk", ["topk/xx/wp", "topk/yy/wp", "topk/yy/sp"], "teach"),
    ],
)
def test_a_deleted_shard_set_is_named(
    deleted: str, named: list[str], stage: str, built: Path, tmp_path: Path, cli
) -> None:
    """A whole set gone (no manifest, no shard left to find it by) while the run holds what was
    made after it: the recipe says it belongs there."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    shutil.rmtree(run / deleted)
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [*(str(run / n) for n in named), f"merge {stage} RECIPE"])
    assert digests(run) == before


def test_a_run_not_yet_taught_is_not_called_damaged(built: Path, tmp_path: Path, cli) -> None:
    """What a stage not yet run would make is not missing: a prepared run verifies clean."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    for part in ("topk", "vocab"):
        shutil.rmtree(run / part)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def _edit_manifest(path: Path, **fields: object) -> None:
    manifest = json.loads(path.read_text(encoding="utf-8"))
    path.write_text(json.dumps({**manifest, **fields}), encoding="utf-8")


def _edit_older_manifest(path: Path, **fields: object) -> None:
    """``fields`` edited in a manifest without the checksum of its records and facts (as an older
    release wrote them), so that the checks beyond the checksum are what finds the edit: with
    it, any edit is named as such (``test_an_edited_shard_record_is_named_damaged``)."""
    manifest = json.loads(path.read_text(encoding="utf-8"))
    manifest.pop("manifest_sha256")
    path.write_text(json.dumps({**manifest, **fields}), encoding="utf-8")


def test_an_edited_shard_record_is_named_damaged(built: Path, tmp_path: Path, cli) -> None:
    """The checksum of a manifest covers its shard records too: a record's fields other than the
    shard's sha256 (its rows, an embedding's token count) had been read as written."""
    run, recipe = _copy_run(built, tmp_path)
    manifest = run / "topk" / "yy" / "sp" / "manifest.json"
    found = json.loads(manifest.read_text(encoding="utf-8"))
    found["shards"][0]["bytes"] += 1  # the shard and its sha256 as they were
    manifest.write_text(json.dumps(found), encoding="utf-8")
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(manifest), "damaged"])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, [str(manifest.parent), "merge teach"])


@pytest.mark.parametrize(
    ("fields", "said"),
    [
        ({"shards": []}, "marked complete but lists no shards"),
        ({"shards": [{"rows": 3}]}, "damaged"),
        ({"shards": 7}, "damaged"),
        ({"complete": "no"}, "damaged"),
    ],
    ids=["no_shards", "record_without_checksum", "not_a_list", "complete_as_a_string"],
)
def test_a_manifest_later_stages_could_not_read_fails_verify(
    fields: dict, said: str, built: Path, tmp_path: Path, cli
) -> None:
    """What verify passes, training reads: a teacher store marked complete that lists no shards
    (or damaged records) had passed verify, then crashed ``merge train``."""
    shutil.copytree(built.parent, tmp_path / "copy")
    run, recipe = tmp_path / "copy" / "run", tmp_path / "copy" / "recipe.yaml"
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    manifest = run / "topk" / "yy" / "sp" / "manifest.json"
    # the list emptied is found beyond the checksum (which names any edit): in an older manifest
    edit = _edit_older_manifest if fields == {"shards": []} else _edit_manifest
    edit(manifest, **fields)
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(manifest.parent), said])
    assert digests(run) == before
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, [str(manifest.parent), "merge teach"])


def test_a_store_of_other_shards_than_its_copies_fails_verify(
    built: Path, tmp_path: Path, cli
) -> None:
    """The teacher's outputs are read row by row beside the copies they were computed from."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    manifest = run / "topk" / "yy" / "sp" / "manifest.json"
    shards = json.loads(manifest.read_text(encoding="utf-8"))["shards"]
    _edit_older_manifest(manifest, shards=shards[:-1])
    (manifest.parent / f"shard-{len(shards) - 1:05d}.arrow").unlink()
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(manifest.parent), str(run / "masked" / "yy" / "sp")])


def test_verify_names_a_run_another_command_is_writing(built: Path, tmp_path: Path, cli) -> None:
    """``merge verify`` while ``merge teach`` held the run's lock reported the sets it had not
    finished as missing, and advised running teach; it names the run as in use now."""
    import subprocess
    import sys

    run = tmp_path / "run"
    shutil.copytree(built, run)
    holder = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from lmalgebra.storage.lockfile import run_directory_lock\n"
        "with run_directory_lock(Path(sys.argv[1]), 'merge teach'):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(120)\n"
    )
    process = subprocess.Popen(
        [sys.executable, "-c", holder, str(run)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "held"
        code, stderr = cli(["merge", "verify", str(run)])
        assert_one_line(code, stderr, [str(run), "in use", f"pid {process.pid}", "merge teach"])
    finally:
        process.kill()
        process.wait()
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def _copy_run(built: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the built run and of its recipe, pointing at the copy; (run, recipe)."""
    shutil.copytree(built.parent, tmp_path / "copy")
    run, recipe = tmp_path / "copy" / "run", tmp_path / "copy" / "recipe.yaml"
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    return run, recipe


def _drop_last_shard(directory: Path) -> None:
    """The set's manifest, still marked complete, without its last shard, whose file goes too."""
    manifest = directory / "manifest.json"
    shards = json.loads(manifest.read_text(encoding="utf-8"))["shards"]
    _edit_older_manifest(manifest, shards=shards[:-1])
    (directory / f"shard-{len(shards) - 1:05d}.arrow").unlink()


def _miscount_examples(run: Path) -> None:
    """A count the shards do not hold, in a manifest without the checksum of its facts (as an
    older release wrote them: with it, the edit is named as such)."""
    manifest = run / "examples" / "yy" / "manifest.json"
    found = json.loads(manifest.read_text())
    found.pop("manifest_sha256")
    manifest.write_text(json.dumps({**found, "examples": found["examples"] + 1}))


def _drop_an_examples_shard(run: Path) -> None:
    _drop_last_shard(run / "examples" / "yy")


def _drop_a_teachers_last_examples(run: Path) -> None:
    """One teacher's copies and outputs agree with each other, not with the examples."""
    for part in ("masked", "topk"):
        _drop_last_shard(run / part / "yy" / "sp")


def _record_rows(value: object):
    """A damage: the first shard record of ``examples/yy`` holding ``rows`` ``value``."""

    def damage(run: Path) -> None:
        manifest = run / "examples" / "yy" / "manifest.json"
        shards = json.loads(manifest.read_text(encoding="utf-8"))["shards"]
        _edit_older_manifest(manifest, shards=[{**shards[0], "rows": value}, *shards[1:]])

    return damage


@pytest.mark.parametrize(
    ("damage", "named", "said"),
    [
        (_miscount_examples, "examples/yy/manifest.json", "examples, but its shards hold"),
        (_drop_an_examples_shard, "examples/yy/manifest.json", "examples, but its shards hold"),
        (_drop_a_teachers_last_examples, "masked/yy/sp", "examples"),
        # the sums over a record that holds no count quoted numbers nobody wrote
        (_record_rows(-16), "examples/yy/manifest.json", "shard-00000.arrow holds rows -16,"),
        (_record_rows("16"), "examples/yy/manifest.json", "shard-00000.arrow holds rows '16',"),
    ],
    ids=[
        "examples_count",
        "examples_shard_unlisted",
        "teacher_copies_short",
        "record_rows_negative",
        "record_rows_text",
    ],
)
def test_example_counts_that_disagree_fail_verify_and_training(
    damage, named: str, said: str, built: Path, tmp_path: Path, cli
) -> None:
    """The examples' manifest, its shards, each teacher's copies and its outputs must count the
    same examples: a store one teacher holds fewer examples of, or examples whose manifest
    counts other rows than its shards, passed verify; training read the copies row by row
    beside each other (or trained on fewer examples, unsaid). Running the stage again mends it.
    """
    run, recipe = _copy_run(built, tmp_path)
    damage(run)
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(run / named), said, "merge prepare RECIPE"])
    assert digests(run) == before
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, [str(run / named), said, "merge prepare RECIPE"])
    assert not (run / "student").exists()  # training did not start
    for stage in ("prepare", "teach"):
        code, stderr = cli(["merge", stage, str(recipe), "--no-progress"])
        assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


@pytest.fixture(scope="module")
def causal_built(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """A causal run whose examples, tokens and log-probabilities are built."""
    from causal_fixtures import taught_causal_recipe

    training = {"steps": 2, "batch_size": 4, "checkpoint_every": 2, "warmup_steps": 0}
    root = tmp_path_factory.mktemp("causal-verifier")
    return taught_causal_recipe(root, causal_teacher_dirs, training).parent / "run"


def test_a_causal_teacher_holding_fewer_examples_fails_verify(
    causal_built: Path, tmp_path: Path, cli
) -> None:
    """A teacher's tokens and log-probabilities agreeing with each other, not with the examples
    (training refused them, but verify passed them)."""
    run, recipe = _copy_run(causal_built, tmp_path)
    for part in ("tokens", "logprobs"):
        _drop_last_shard(run / part / "xx" / "uni")
    code, stderr = cli(["merge", "verify", str(run)])
    named = str(run / "tokens" / "xx" / "uni")
    assert_one_line(code, stderr, [named, str(run / "examples" / "xx"), "merge prepare RECIPE"])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, [named, "merge prepare RECIPE"])
    assert not (run / "student").exists()


@pytest.mark.parametrize("blocker", ["directory", "fifo", "link to nothing"])
def test_a_blocked_bits_per_byte_table_is_named_by_verify(
    blocker: str, causal_built: Path, tmp_path: Path, cli
) -> None:
    """A directory, a FIFO or a link to nothing where ``merge bits-per-byte`` writes its table
    (``scored_bits_per_byte.csv``, beside the evaluation's): bits-per-byte refuses it before
    any scoring, and ``merge verify`` had passed the run."""
    import os

    from hostile_helpers import blocked

    run, _ = _copy_run(causal_built, tmp_path)
    (run / "evaluation").mkdir()
    table = run / "evaluation" / "scored_bits_per_byte.csv"
    if blocker == "directory":
        table.mkdir()
    else:
        os.mkfifo(table) if blocker == "fifo" else blocked(table, blocker)
    assert_one_line(*cli(["merge", "verify", str(run)]), [str(table)])
    assert_one_line(*cli(["merge", "bits-per-byte", str(run)]), [str(table)])


@pytest.mark.parametrize("content", ["garbage\n", "[]\n", '{"x": 1}\n'])
def test_a_damaged_vocabulary_report_is_named_and_vocab_mends_it(
    content: str, built: Path, tmp_path: Path, cli
) -> None:
    """``merge inspect`` read ``vocab/report.json`` raw: a damaged one ended in a traceback
    (JSONDecodeError, KeyError), verify passed it and ``merge vocab`` kept it."""
    run, recipe = _copy_run(built, tmp_path)
    path = run / "vocab" / "report.json"
    intact = path.read_bytes()
    path.write_text(content, encoding="utf-8")
    for args in (["inspect", str(run)], ["verify", str(run)]):
        code, stderr = cli(["merge", *args])
        assert_one_line(code, stderr, [str(path), "merge vocab"])
    code, stderr = cli(["merge", "vocab", str(recipe)])
    assert code == 0, stderr
    assert path.read_bytes() == intact


@pytest.mark.parametrize("edit", ["number", "another vocabulary"])
def test_an_edited_vocabulary_report_is_named_and_vocab_mends_it(
    edit: str, built: Path, tmp_path: Path, cli
) -> None:
    """``vocab/report.json`` edited in a well-formed way (a language's tokens per word changed)
    had been shown by ``merge inspect`` and passed verify: it carries a checksum of itself and
    of the ``vocab_union.json`` it describes (a report resealed for another vocabulary is
    named too); one with neither, of an older release, is read as it is."""
    from lmalgebra.core.fingerprint import sealed, unseal
    from lmalgebra.distill.vocab.union import REPORT_CHECK, REPORT_OF

    run, recipe = _copy_run(built, tmp_path)
    path = run / "vocab" / "report.json"
    intact = path.read_bytes()
    report = json.loads(intact)
    assert unseal(report, REPORT_CHECK) is True
    if edit == "number":
        report["tokens_per_language"]["xx"] = 9.9
        edited, needle = {**report, REPORT_CHECK: json.loads(intact)[REPORT_CHECK]}, "edited since"
    else:
        edited, needle = sealed({**report, REPORT_OF: "0" * 64}, REPORT_CHECK), "another vocabulary"
    path.write_text(json.dumps(edited), encoding="utf-8")
    for args in (["inspect", str(run)], ["verify", str(run)]):
        code, stderr = cli(["merge", *args])
        assert_one_line(code, stderr, [str(path), needle, "merge vocab"])
    code, stderr = cli(["merge", "vocab", str(recipe)])
    assert code == 0, stderr
    assert path.read_bytes() == intact
    older = {k: v for k, v in report.items() if k not in (REPORT_CHECK, REPORT_OF)}
    path.write_text(json.dumps(older), encoding="utf-8")
    code, stderr = cli(["merge", "inspect", str(run)])
    assert code == 0, stderr


@pytest.mark.parametrize("damaged", ["tokenizer.json", "complete.json", "vocab_union.json"])
def test_a_damaged_vocabulary_fails_verify_and_training_and_vocab_mends_it(
    damaged: str, built: Path, tmp_path: Path, cli
) -> None:
    """The student tokenizer is checked against its checksum and the completion mark read as
    such: a token renamed in ``tokenizer.json`` had passed both into training, and a damaged
    mark passed verify and was then called a missing vocabulary. ``vocab_union.json`` carries a
    checksum of itself: its ``lowercase`` (which the student's copy keeps) edited had passed."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    recipe = tmp_path / "recipe.yaml"
    text = (run / "recipe.yaml").read_text(encoding="utf-8")
    recipe.write_text(text.replace(str(built), str(run)), encoding="utf-8")
    path = run / "vocab" / damaged
    intact = path.read_bytes()
    if damaged == "tokenizer.json":
        path.write_bytes(intact.replace(b'"[UNK]"', b'"[UNX]"'))
    elif damaged == "vocab_union.json":
        meta = json.loads(intact)
        path.write_text(json.dumps({**meta, "lowercase": not meta["lowercase"]}), encoding="utf-8")
    else:
        path.write_text("garbage\n", encoding="utf-8")
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(path)])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    said = assert_one_line(code, stderr, [str(path), "merge vocab"])
    code, stderr = cli(["merge", "train", str(recipe), "--dry-run"])  # refused alike
    assert assert_one_line(code, stderr, []) == said
    assert digests(run) == before
    code, stderr = cli(["merge", "vocab", str(recipe)])
    assert code == 0, stderr
    assert path.read_bytes() == intact
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def _key_edit(manifest: Path, **fields: object) -> None:
    data = json.loads(manifest.read_text(encoding="utf-8"))
    _edit_manifest(manifest, key={**data["key"], **fields})


def test_a_store_key_training_refuses_fails_verify_in_the_same_words(
    built: Path, tmp_path: Path, cli
) -> None:
    """A teacher store's manifest saying another ``top_k`` than the recipe's, its shards intact,
    passed verify; training then refused it. Both now check the key with one function."""
    run, recipe = _copy_run(built, tmp_path)
    manifest = run / "topk" / "xx" / "wp" / "manifest.json"
    _key_edit(manifest, top_k=4)
    before = digests(run)
    code, stderr = cli(["merge", "verify", str(run)])
    said = assert_one_line(code, stderr, [str(manifest.parent), "top_k 4 -> 8", "merge teach"])
    assert digests(run) == before
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert assert_one_line(code, stderr, []) == said


def test_a_vocabulary_built_from_other_teachers_fails_verify(
    built: Path, tmp_path: Path, cli
) -> None:
    """The vocabulary's completion mark is keyed by the teachers' tokenizers: one of another key
    passed verify, and training refused it."""
    run, recipe = _copy_run(built, tmp_path)
    (run / "vocab" / "complete.json").write_text(json.dumps("0" * 64), encoding="utf-8")
    code, stderr = cli(["merge", "verify", str(run)])
    said = assert_one_line(code, stderr, [str(run / "vocab"), "other teachers", "merge vocab"])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert assert_one_line(code, stderr, []) == said


def test_a_causal_store_key_training_refuses_fails_verify(
    causal_built: Path, tmp_path: Path, cli
) -> None:
    run, recipe = _copy_run(causal_built, tmp_path)
    manifest = run / "logprobs" / "xx" / "uni" / "manifest.json"
    _key_edit(manifest, top_k=3)
    code, stderr = cli(["merge", "verify", str(run)])
    said = assert_one_line(code, stderr, [str(manifest.parent), "top_k 3 ->", "merge teach"])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert assert_one_line(code, stderr, []) == said


@pytest.mark.parametrize(
    ("part", "fields", "stage"),
    [
        ("logprobs", {"top_k": 3}, "teach"),
        ("logprobs", {"samples": 2}, "teach"),
        ("tokens", {"start_token_id": 7}, "prepare"),
        ("tokens", {"tokens": 5}, "prepare"),
    ],
)
def test_a_manifest_whose_facts_were_edited_fails_verify_and_its_stage_mends_it(
    part: str, fields: dict, stage: str, causal_built: Path, tmp_path: Path, cli
) -> None:
    """What a finished set records beside its shards (``top_k`` and ``samples``, which shape
    the arrays training reads, the start token, the counts) is covered by no shard's checksum:
    edited, it passed verify, then training crashed on it or trained from another start
    token. The manifest carries a checksum of those facts."""
    run, recipe = _copy_run(causal_built, tmp_path)
    manifest = run / part / "xx" / "uni" / "manifest.json"
    _edit_manifest(manifest, **fields)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(manifest), "damaged"])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert_one_line(
        code,
        stderr,
        [f"{manifest} is damaged", f"merge {stage} RECIPE` (merge(recipe, {stage!r})) again"],
    )
    assert not (run / "student").exists()
    code, stderr = cli(["merge", "run", str(recipe), "--no-progress"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


def test_a_run_whose_teacher_cannot_be_opened_fails_verify(
    built: Path, tmp_path: Path, cli
) -> None:
    """The store's keys are checked against the teachers: a teacher gone from where the recipe
    names it is named by verify, as training refuses it."""
    run, recipe = _copy_run(built, tmp_path)
    data = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    gone = str(tmp_path / "gone")
    data["teachers"]["sp"]["path"] = gone
    for path in (run / "recipe.yaml", recipe):
        path.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    code, stderr = cli(["merge", "verify", str(run)])
    said = assert_one_line(code, stderr, ["cannot be checked against its teachers", gone])
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert said.split("teachers: ", 1)[1] in assert_one_line(code, stderr, [gone])


def test_verify_checks_the_whole_run_and_each_stage_what_it_reads(
    built: Path, tmp_path: Path, cli
) -> None:
    """``merge verify`` is stricter than any one stage: a masked run whose examples manifest is
    gone fails it, while training again (``--restart``), which reads the teachers' copies and
    outputs, runs; ``merge evaluate``, which records the held-out text its rows were scored on,
    names the examples as verify does. ``merge prepare`` mends them."""
    run = tmp_path / "run"
    shutil.copytree(built, run)
    data = yaml.safe_load((run / "recipe.yaml").read_text(encoding="utf-8"))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert code == 0, stderr
    manifest = run / "examples" / "xx" / "manifest.json"
    manifest.unlink()
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(manifest.parent), "no manifest.json"])
    code, stderr = cli(["merge", "train", str(recipe), "--restart", "--no-progress"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert_one_line(code, stderr, [str(manifest.parent), "merge prepare RECIPE"])
    code, stderr = cli(["merge", "prepare", str(recipe), "--no-progress"])
    assert code == 0, stderr
    for args in (["evaluate", str(run)], ["verify", str(run)]):
        code, stderr = cli(["merge", *args])
        assert code == 0, stderr
    # a table edited, and one an evaluation stopped after its record had not written yet: the
    # run's result, they had passed verify
    table, report = run / "evaluation" / "scores.csv", run / "evaluation" / "evaluation.md"
    table.write_text(table.read_text(encoding="utf-8").replace(",0.", ",1.", 1), encoding="utf-8")
    report.unlink()
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(table), str(report), "does not hold what evaluation.json"])
    for args in (["evaluate", str(run)], ["verify", str(run)]):
        code, stderr = cli(["merge", *args])
        assert code == 0, stderr
    # the evaluation's record, which the next `merge evaluate` reads, edited as well-formed JSON
    record = run / "evaluation" / "evaluation.json"
    found = json.loads(record.read_text(encoding="utf-8"))
    found["students"] = {name: "0" * 64 for name in found["students"]}
    record.write_text(json.dumps(found), encoding="utf-8")
    code, stderr = cli(["merge", "verify", str(run)])
    said = assert_one_line(code, stderr, [str(record), "damaged"])
    code, stderr = cli(["merge", "evaluate", str(run), "--languages", "xx"])
    assert said.removeprefix("error: merge evaluate: ") in assert_one_line(code, stderr, [])


@pytest.mark.parametrize("blocker", ["fifo", "file", "link to nothing"])
def test_an_evaluation_folder_evaluate_refuses_is_named_by_verify(
    blocker: str, built: Path, tmp_path: Path, cli
) -> None:
    """``evaluation`` a FIFO, a file or a link to nothing: ``merge evaluate`` and ``merge
    bits-per-byte`` refuse it, and ``merge verify`` had passed the run."""
    import os

    from hostile_helpers import blocked

    run = tmp_path / "run"
    shutil.copytree(built, run)
    folder = run / "evaluation"
    os.mkfifo(folder) if blocker == "fifo" else blocked(folder, blocker)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [f"merge evaluate: evaluation directory {folder} "])


@pytest.mark.parametrize("blocker", ["directory", "link to nothing"])
def test_a_blocked_evaluation_file_or_model_card_is_named_by_verify(
    blocker: str, built: Path, tmp_path: Path, cli
) -> None:
    """A directory or a link to nothing where ``merge evaluate`` writes its figure, and where
    training and evaluation write a student's model card: both refuse it (one line, before any
    scoring), and ``merge verify`` had passed the run."""
    run, recipe = _copy_run(built, tmp_path)
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert code == 0, stderr
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert code == 0, stderr
    figure, card = run / "evaluation" / "accuracy.png", run / "student" / "model" / "README.md"
    for path in (figure, card):
        path.unlink()
        path.mkdir() if blocker == "directory" else path.symlink_to(tmp_path / "gone")
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(figure), str(card)])
    code, stderr = cli(["merge", "evaluate", str(run)])
    line = assert_one_line(code, stderr, [])  # a link among the student's files is named first
    assert str(figure if blocker == "directory" else card) in line
    for path in (figure, card):
        path.rmdir() if blocker == "directory" else path.unlink()
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert code == 0, stderr
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


@pytest.fixture(scope="module")
def candidates_trained(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """A causal run whose student was trained at two ``lambda_candidates``, validating."""
    from causal_fixtures import CAUSAL_STUDENT, taught_causal_recipe
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe

    training = {
        "steps": 4,
        "batch_size": 4,
        "warmup_steps": 1,
        "checkpoint_every": 2,
        "lambda_schedule": "constant",
        "lambda_candidates": [0.2, 0.8],
        "validation_every": 2,
        "validation_fraction": 0.2,
    }
    root = tmp_path_factory.mktemp("candidates")
    recipe = load_recipe(taught_causal_recipe(root, causal_teacher_dirs, training))
    assert CAUSAL_STUDENT["tokenizer"] == recipe.student.tokenizer
    pipeline.run_stages(recipe, ["train"], {"student": recipe.training}, False)
    return root / "run"


@pytest.mark.parametrize("damaged", ["candidate checkpoint", "best weights"])
def test_a_candidates_checkpoint_or_best_weights_damaged_fail_verify(
    damaged: str, candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """``merge verify`` looked for checkpoints one level deep: a ``lambda_candidates`` run's
    (``student/lambda-0.8/checkpoints``) went unchecked, and so did the best validation weights
    (``best/``) that resuming training refuses when damaged; both are named now."""
    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr
    candidate = run / "student" / "lambda-0.8"
    if damaged == "candidate checkpoint":
        target = sorted((candidate / "checkpoints").glob("step-*"))[-1] / "model.safetensors"
    else:
        target = candidate / "best" / "model.safetensors"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    code, stderr = cli(["merge", "verify", str(run)])
    named = str(target) if damaged == "candidate checkpoint" else str(candidate / "best")
    assert_one_line(code, stderr, [named, "damaged" if "checkpoint" in damaged else "best.json"])


def test_a_best_record_edited_fails_verify_and_training_refuses_it_first(
    candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """A ``best.json`` whose ``step`` was edited (its weights intact) passed ``merge verify``;
    resuming training then refused it, after training every step. It carries a checksum of
    itself now: verify names it, and training refuses it before any step."""
    import json

    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    candidate = run / "student" / "lambda-0.8"
    record = json.loads((candidate / "best" / "best.json").read_text(encoding="utf-8"))
    record["step"] = 2 if record["step"] != 2 else 4
    (candidate / "best" / "best.json").write_text(json.dumps(record), encoding="utf-8")
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [str(candidate / "best"), "best.json"])
    recipe = tmp_path / "recipe.yaml"  # the copy's, its output_dir the copy
    text = (run / "recipe.yaml").read_text(encoding="utf-8")
    recipe.write_text(text.replace(str(candidates_trained), str(run)), encoding="utf-8")
    checkpoints = sorted(p.name for p in (candidate / "checkpoints").iterdir())
    code, stderr = cli(["merge", "train", str(recipe), "--training.steps", "6", "--no-progress"])
    assert_one_line(code, stderr, [str(candidate / "best"), "--restart"])
    assert sorted(p.name for p in (candidate / "checkpoints").iterdir()) == checkpoints


@pytest.mark.parametrize("damage", ["deleted", "edited", "another step's", "another run's"])
def test_best_weights_resuming_refuses_fail_verify_and_the_dry_run(
    damage: str, candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """Best validation weights that resuming refuses before its first step (``best/`` deleted,
    its ``best.json`` edited, a best kept at another step than the checkpoint records) had
    passed ``merge train --dry-run``, and the deleted and another step's passed ``merge
    verify``: both name them now, as training does. So are another run's best weights, intact,
    of the same step (another candidate's ``best/`` copied in), which training had restored
    and saved as this run's: each checkpoint records the sha256 of its best weights."""
    import json

    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    best = run / "student" / "lambda-0.8" / "best"
    if damage == "deleted":
        shutil.rmtree(best)
    elif damage == "another run's":
        shutil.rmtree(best)
        shutil.copytree(run / "student" / "lambda-0.2" / "best", best)
    else:
        record = json.loads((best / "best.json").read_text(encoding="utf-8"))
        record["step"] = 2 if record["step"] != 2 else 4
        if damage == "another step's":  # sealed again: an intact record of another step
            from lmalgebra.core.fingerprint import sealed

            record = sealed(
                {k: v for k, v in record.items() if k != "record_sha256"}, "record_sha256"
            )
        (best / "best.json").write_text(json.dumps(record), encoding="utf-8")
    assert_one_line(*cli(["merge", "verify", str(run)]), [str(best)])
    recipe = tmp_path / "recipe.yaml"  # the copy's, its output_dir the copy
    text = (run / "recipe.yaml").read_text(encoding="utf-8")
    recipe.write_text(text.replace(str(candidates_trained), str(run)), encoding="utf-8")
    train = ["merge", "train", str(recipe), "--training.steps", "6", "--no-progress"]
    for dry in (["--dry-run"], []):
        assert_one_line(*cli([*train, *dry]), [str(best), "--restart"])


def test_a_checkpoint_renamed_to_another_step_fails_verify(
    candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """A checkpoint renamed (``step-0000004`` to ``step-0000008``) had passed ``merge verify``:
    training took the run for one of 8 steps, and resumed from the 4 it holds. Its state's step
    is checked against its name now: verify names it, and training skips it, as a damaged one."""
    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    checkpoints = run / "student" / "lambda-0.2" / "checkpoints"
    (checkpoints / "step-0000004").rename(checkpoints / "step-0000008")
    code, stderr = cli(["merge", "verify", str(run)])
    state = checkpoints / "step-0000008" / "state.json"
    assert_one_line(code, stderr, [str(state), "records step 4", "step 8"])


def test_the_other_layouts_checkpoints_do_not_replace_a_student_trained_again(
    candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """A student trained with ``lambda_candidates``, trained again with ``--restart`` without
    them, then trained with the candidates again: the old candidates' checkpoints (which the
    restart had kept) had been resumed and their best had replaced the student saved by the
    restart, unsaid. The restart drops them now, and training with the candidates is refused,
    naming the settings; the model is left as it was."""
    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    recipe = tmp_path / "recipe.yaml"  # the copy's, its output_dir the copy
    text = (run / "recipe.yaml").read_text(encoding="utf-8")
    recipe.write_text(text.replace(str(candidates_trained), str(run)), encoding="utf-8")
    import yaml

    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    for key in ("lambda_candidates", "validation_every", "validation_fraction"):
        del data["training"][key]
    plain = tmp_path / "plain.yaml"  # the same student, no candidates
    plain.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, stderr = cli(["merge", "train", str(plain), "--restart", "--no-progress"])
    assert code == 0, stderr
    assert not list((run / "student").glob("lambda-*"))
    model = run / "student" / "model" / "model.safetensors"
    before = model.read_bytes()
    for dry in ([], ["--dry-run"]):
        code, stderr = cli(["merge", "train", str(recipe), "--no-progress", *dry])
        said = ["training.lambda_candidates None -> [0.2, 0.8]", "no checkpoint", "--restart"]
        assert_one_line(code, stderr, said)
    assert model.read_bytes() == before


def test_a_restart_with_fewer_candidates_drops_the_runs_it_leaves_out(
    candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """``--restart`` with fewer ``lambda_candidates`` had left the dropped candidate's run
    (``lambda-0.8/``: checkpoints, best weights, log) beside the student, which verify went on
    checking as the student's own. Its files are removed now, a user's file there kept (and
    not taken for damaged best weights by verify), and so is a user's copy of the run
    (``lambda-0.8.bak``); a checkpoint holding a user's file is refused first, by the dry run
    too, naming it."""
    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    recipe = tmp_path / "recipe.yaml"  # the copy's, its output_dir the copy
    text = (run / "recipe.yaml").read_text(encoding="utf-8")
    recipe.write_text(text.replace(str(candidates_trained), str(run)), encoding="utf-8")
    dropped = run / "student" / "lambda-0.8"
    copy = run / "student" / "lambda-0.8.bak"  # a user's copy of the run: not the run's
    shutil.copytree(dropped, copy)
    (dropped / "notes.txt").write_text("mine\n", encoding="utf-8")
    (dropped / "best" / "notes.txt").write_text("mine\n", encoding="utf-8")
    step = sorted((dropped / "checkpoints").iterdir())[0]
    (step / "notes.txt").write_text("mine\n", encoding="utf-8")
    args = ["merge", "train", str(recipe), "--restart", "--no-progress"]
    args += ["--training.lambda_candidates", "0.2"]
    for dry in (["--dry-run"], []):
        assert_one_line(*cli([*args, *dry]), [str(step), "notes.txt"])
    (step / "notes.txt").unlink()
    code, stderr = cli(args)
    assert code == 0, stderr
    assert sorted(p.name for p in dropped.iterdir()) == ["best", "notes.txt"]
    assert sorted(p.name for p in (dropped / "best").iterdir()) == ["notes.txt"]
    assert (run / "student" / "lambda-0.2" / "checkpoints").is_dir()
    assert (copy / "checkpoints").is_dir() and (copy / "best" / "best.json").is_file()
    code, stderr = cli(["merge", "verify", str(run)])
    assert code == 0, stderr


@pytest.mark.parametrize("kept", [True, False], ids=["checkpoints", "no_checkpoint"])
@pytest.mark.parametrize("odd", ["directory", "fifo"])
def test_a_training_log_that_is_no_file_fails_verify(
    odd: str, kept: bool, built: Path, tmp_path: Path, cli
) -> None:
    """A student's ``train_log.jsonl`` that is a directory (or a FIFO) had passed verify, and
    training, which reads it to resume, then stopped on it; where the student kept no
    checkpoint (``keep_checkpoints`` 0) verify passed it still, and so did the dry run, while
    training stopped on it once the model was built. Verify names it, and the dry run and
    training refuse it first."""
    import os

    run, recipe = _copy_run(built, tmp_path)
    (run / "student").mkdir()
    if kept:
        (run / "student" / "checkpoints").mkdir()
    log = run / "student" / "train_log.jsonl"
    log.mkdir() if odd == "directory" else os.mkfifo(log)
    assert_one_line(*cli(["merge", "verify", str(run)]), [str(log), "training reads it"])
    train = ["merge", "train", str(recipe), "--no-progress"]
    for dry in (["--dry-run"], []):
        assert_one_line(*cli([*train, *dry]), [str(log), "training log"])


@pytest.mark.parametrize(("part", "stage"), [("topk", "teach"), ("masked", "prepare")])
def test_training_names_the_stage_that_mends_a_damaged_store_shard(
    part: str, stage: str, built: Path, tmp_path: Path, cli
) -> None:
    """A store shard altered since (or gone) was met as training read it, refused with "run
    again to recompute it": training again met it again, and only the stage that writes it
    mends it. Training (and evaluation, which checks the store the same way) names that stage
    before it builds a student."""
    run, recipe = _copy_run(built, tmp_path)
    shard = sorted((run / part).rglob("shard-*.arrow"))[-1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, [str(shard), f"lmalgebra merge {stage} RECIPE"])
    assert not (run / "student").exists()


@pytest.mark.parametrize("part", ["model", "checkpoints"])
def test_a_student_directory_that_is_a_link_fails_verify(
    part: str, built: Path, tmp_path: Path
) -> None:
    """A saved student whose ``model/`` (or ``checkpoints/``) is a link to a directory
    elsewhere passed verify, while ``merge evaluate`` and ``merge train`` refuse it (training
    would write through the link): verify names it as they do."""
    from lmalgebra.distill.pipeline import verify

    run, _ = _copy_run(built, tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    student = run / "student"
    (student / "model").mkdir(parents=True)
    (student / "model" / "lmalgebra.json").write_text("{}", encoding="utf-8")
    target = student / part
    if target.exists():
        target.rename(elsewhere / part)
    else:
        (elsewhere / part).mkdir()
    target.symlink_to(elsewhere / part)
    problems = verify(run)
    assert any(str(target) in p and "is a symbolic link" in p for p in problems), problems


@pytest.mark.parametrize(
    ("kind", "said"),
    [("fifo", "a FIFO, socket or device"), ("directory", "a directory"), ("link", "a symbolic")],
)
def test_a_lock_file_no_stage_can_open_fails_verify(
    kind: str, said: str, built: Path, tmp_path: Path, cli
) -> None:
    """A FIFO in place of the run's lock file passed verify, while every stage that writes the
    run refuses it (opening it would wait for a writer): verify names it in their words. A
    directory there had ended verify (and any file written below it: ``merge init``) in an
    IsADirectoryError traceback, reading who held the lock."""
    run, _ = _copy_run(built, tmp_path)
    lock = run / ".lmalgebra.lock"
    make = {"fifo": os.mkfifo, "directory": Path.mkdir, "link": _dangling}[kind]
    make(lock)
    code, stderr = cli(["merge", "verify", str(run)])
    assert_one_line(code, stderr, [f"lock file {lock} is {said}", "remove it"])
    plain = tmp_path / "plain"  # no run: such a lock file holds it for no one
    plain.mkdir()
    make(plain / ".lmalgebra.lock")
    code, stderr = cli(["merge", "init", str(plain / "r.yaml")])
    assert code == 0 and (plain / "r.yaml").is_file(), stderr


def _dangling(path: Path) -> None:
    path.symlink_to(path.parent / "elsewhere")


@pytest.mark.parametrize("call", ["verify", "inspect", "evaluate", "bits-per-byte", "prepare"])
def test_a_run_of_the_other_objective_is_named(
    call: str, built: Path, tmp_path: Path, causal_teacher_dirs: dict[str, Path], cli
) -> None:
    """A masked run directory read with a causal recipe (its ``recipe.yaml`` replaced, or its
    output_dir given to a causal recipe) was taken for a causal run not yet prepared: inspect
    said "0 pairs", evaluate "run merge prepare first", bits-per-byte scored the causal
    teachers on the masked run's examples, and prepare wrote the causal store beside the masked
    one. Each names the masked run's folders now, writing nothing."""
    from causal_fixtures import write_causal_recipe

    run, _ = _copy_run(built, tmp_path)
    causal = write_causal_recipe(tmp_path, causal_teacher_dirs, output_dir=str(run))
    if call != "prepare":
        shutil.copyfile(causal, run / "recipe.yaml")
    before = digests(run)
    code, stderr = cli(["merge", call, str(causal if call == "prepare" else run)])
    assert_one_line(code, stderr, [f"{run} holds a masked run (masked/, topk/)", "causal"])
    assert digests(run) == before


def test_a_checkpoint_of_another_training_beside_its_own_fails_verify(
    candidates_trained: Path, tmp_path: Path, cli
) -> None:
    """A checkpoint copied in from another student (every file matching its record) passed
    ``merge verify``, and ``merge train`` then refused it as written with other settings. No
    training writes checkpoints of two settings into one directory (``--restart`` drops them
    all): verify names the two."""
    run = tmp_path / "run"
    shutil.copytree(candidates_trained, run)
    own = run / "student" / "lambda-0.8" / "checkpoints" / "step-0000004"
    shutil.rmtree(own)
    shutil.copytree(run / "student" / "lambda-0.2" / "checkpoints" / "step-0000004", own)
    code, stderr = cli(["merge", "verify", str(run)])
    said = [str(own.parent / "step-0000002"), "step-0000004", "other inputs", "--restart"]
    assert_one_line(code, stderr, said)
