"""Identity that trusts nothing it cannot check: a remembered weight hash does not let an edited
model through, and a damaged record of what a directory holds (an evaluation's
``pos_config.json``, a selection's ``summary.json``) is refused, named, instead of switching the
identity check off or being read as "no run here"."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.evaluate.pos_results import claim_evaluation
from lmalgebra.experimental.selection.outputs import claim_selection
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef


def test_an_edit_of_the_same_size_with_its_time_set_back_is_seen(
    bert_dir: Path, tmp_path: Path
) -> None:
    """``cp -p``, ``touch -d`` or an unpacked archive set the modification time back: the memo
    of the weights hash is keyed on what the kernel sets on every write too."""
    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    ref = ModelRef(name="m", path=str(model))
    memo = tmp_path / "hashes"
    first = source_of(ref, model).fingerprint(memo)
    weights = model / "model.safetensors"
    stamp = weights.stat()
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight
    weights.write_bytes(bytes(data))
    os.utime(weights, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert weights.stat().st_size == stamp.st_size
    assert weights.stat().st_mtime_ns == stamp.st_mtime_ns
    assert source_of(ref, model).fingerprint(memo)["weights"] != first["weights"]


def test_a_remembered_hash_edited_to_another_is_computed_again(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A memo whose hash was changed to another well-formed one had been trusted: a finished
    run over the same model was refused as "model differs", and a new run recorded the wrong
    hash. The memo carries a checksum of itself and its key."""
    ref = ModelRef(name="m", path=str(bert_dir))
    memo = tmp_path / "hashes"
    first = source_of(ref, bert_dir).fingerprint(memo)
    for path in memo.glob("*.hash"):
        path.write_text("0" * 64 + path.read_text()[64:])
    assert source_of(ref, bert_dir).fingerprint(memo) == first


def test_a_remembered_hash_of_bytes_that_are_not_utf8_is_computed_again(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A memo garbled on disk (bytes that are not UTF-8) had stopped every command hashing the
    model with a ``UnicodeDecodeError`` traceback (``merge evaluate`` over the run's
    ``.hashes``); it is computed again, as a memo torn or edited is."""
    ref = ModelRef(name="m", path=str(bert_dir))
    memo = tmp_path / "hashes"
    first = source_of(ref, bert_dir).fingerprint(memo)
    for path in memo.glob("*.hash"):
        path.write_bytes(b"\xff\xfe" + path.read_bytes()[2:])
    assert source_of(ref, bert_dir).fingerprint(memo) == first


def test_an_edit_of_the_code_a_model_ships_is_seen(bert_dir: Path, tmp_path: Path) -> None:
    """A model run with its own code (``--trust-remote-code``) computes its outputs with that
    code: an edit of it had left the fingerprint as it was, so a finished run was computed
    again from the embeddings cached under the old code, and a new run read them too."""
    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModel": "modeling_tiny.TinyModel"}
    (model / "config.json").write_text(json.dumps(config))
    code = model / "modeling_tiny.py"
    code.write_text("SCALE = 1.0\n")
    memo = tmp_path / "hashes"
    trusted = ModelRef(name="m", path=str(model), trust_remote_code=True)
    first = source_of(trusted, model).fingerprint(memo)
    code.write_text("SCALE = 2.0\n")  # same size
    second = source_of(trusted, model).fingerprint(memo)
    assert second["code"] != first["code"]
    assert {k: v for k, v in second.items() if k != "code"} == {
        k: v for k, v in first.items() if k != "code"
    }
    untrusted = ModelRef(name="m", path=str(model))  # its code never runs: not its identity
    assert "code" not in source_of(untrusted, model).fingerprint(memo)


@pytest.mark.parametrize("content", ["{not json", '{"identity": 3}', "[]"])
@pytest.mark.parametrize(
    ("claim", "record"),
    [(claim_evaluation, "pos_config.json"), (claim_selection, "summary.json")],
    ids=["evaluate-pos", "experimental select"],
)
def test_a_damaged_record_is_refused_by_name(
    claim, record: str, content: str, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / record).write_text(content, encoding="utf-8")
    with pytest.raises(UserInputError, match=f"{record} is damaged.*--overwrite"):
        claim(out, {"models": "x"}, False)
    assert (out / record).read_text(encoding="utf-8") == content
    claim(out, {"models": "x"}, True)  # --overwrite replaces it
    assert not (out / record).exists()


def test_an_evaluation_of_an_earlier_release_is_named_as_such(tmp_path: Path) -> None:
    """An earlier release wrote ``pos_config.json`` as the evaluation's settings alone (no
    identity, no checksum): it had been called damaged, with the advice to restore it."""
    out = tmp_path / "out"
    out.mkdir()
    settings = {"train": "t.conllu", "mode": "probe", "layer": -1, "epochs": 1, "seed": 0}
    (out / "pos_config.json").write_text(json.dumps(settings), encoding="utf-8")
    (out / "pos_results.csv").write_text("model,accuracy\na,0.5\n", encoding="utf-8")
    with pytest.raises(
        UserInputError, match=r"an earlier release of lmalgebra.*--overwrite"
    ) as err:
        claim_evaluation(out, {"models": "x"}, False)
    assert "damaged" not in str(err.value) and "restore" not in str(err.value)
    claim_evaluation(out, {"models": "x"}, True)  # --overwrite replaces it
    assert not (out / "pos_config.json").exists()


def test_a_result_an_unfinished_tagging_evaluation_keeps_is_read_only_as_written(
    tmp_path: Path,
) -> None:
    """``pos_config.json`` keeps the results of the models an interrupted evaluation finished,
    which the next run writes into its tables unscored: a result edited there (an accuracy) had
    been published as the model's. The record carries a checksum of itself."""
    from dataclasses import fields

    from lmalgebra.evaluate.pos_results import PosResult, finished_results, write_results

    out = tmp_path / "out"
    out.mkdir()
    identity = {"models": {"a": {"weights": "w"}}}
    zeros = dict.fromkeys((f.name for f in fields(PosResult)), 0)
    result = PosResult(**zeros | {"model": "a", "mode": "probe", "accuracy": 0.5})
    write_results([result], out, {"identity": identity, "finished": False})
    assert finished_results(out, identity) == {"a": result}
    claim_evaluation(out, identity, False)  # the same evaluation resumes
    record = json.loads((out / "pos_config.json").read_text())
    record["results"][0]["accuracy"] = 0.9
    (out / "pos_config.json").write_text(json.dumps(record))
    with pytest.raises(UserInputError, match=r"pos_config\.json is damaged.*checksum"):
        claim_evaluation(out, identity, False)
    assert finished_results(out, identity) == {}


@pytest.mark.parametrize(
    "damage", ["provenance deleted", "configuration torn", "configuration edited"]
)
def test_a_finished_decomposition_missing_or_tearing_a_record_is_refused_by_name(
    damage: str,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A ``provenance.json`` deleted from a finished run had switched the identity check off
    (a corpus edited since replaced the run, exit 0); a torn ``config.yaml`` had been named in
    a message of five lines (YAML's excerpt and caret); one edited to another configuration
    (its alpha) had been read as the run's, and a run of that configuration replaced the
    finished run, exit 0 (its summary records the sha256 of the one it was run with)."""
    from hostile_helpers import assert_one_line, digests

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "docs.txt"
    shutil.copy(corpus_txt, corpus)
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}", "-T", "8"]
    args += ["--corpus.paths", str(corpus), "--spans.counts", "20,5,5", "--out", str(out)]
    code, stderr = cli([*args, "--no-progress"])
    assert code == 0, stderr
    if damage == "provenance deleted":
        (out / "provenance.json").unlink()
        needles = [str(out / "provenance.json"), "missing", "summary.json records it"]
    elif damage == "configuration torn":
        (out / "config.yaml").write_text("{: [\n", encoding="utf-8")
        needles = [str(out / "config.yaml"), "line 1, column 2"]
    else:
        config = out / "config.yaml"
        config.write_text(config.read_text().replace("alpha: 0.01", "alpha: 10.0"))
        needles = [str(config), "edited since the run finished", "summary.json"]
        args += ["--alpha", "10"]  # the configuration it now names: the same inputs
    if damage != "configuration edited":
        with corpus.open("a", encoding="utf-8") as handle:
            handle.write("\nanother document about the river and the city\n")
    before = digests(out)
    assert_one_line(*cli([*args, "--no-progress"]), needles)
    assert digests(out) == before


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("content", ["{}", "[]", '{"step": 2, "sha256": {}}', "3"])
def test_a_checkpoint_state_of_no_checksums_is_named_not_its_model(
    content: str, tmp_path: Path
) -> None:
    """A checkpoint's ``state.json`` holding ``{}`` (or a list, or no sha256 of its files):
    ``merge verify`` had named the checkpoint's ``model.safetensors`` damaged, as ``('sha256')``,
    where the record is what was damaged. The record is named, in words; training skips the
    checkpoint as before."""
    import torch

    from lmalgebra.train.checkpoint import damage, save_checkpoint

    model = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    save_checkpoint(tmp_path, 1, model, optimizer, {}, keep=1)
    directory = next(tmp_path.iterdir())
    assert damage(directory)[2] is not None
    (directory / "state.json").write_text(content, encoding="utf-8")
    path, reason, found = damage(directory)
    assert (path, found) == (directory / "state.json", None), (path, reason)
    assert reason.startswith("it records no sha256 of each of the checkpoint's files"), reason


def test_a_record_read_back_that_is_a_fifo_is_never_waited_on(tmp_path: Path) -> None:
    """Every record a command reads back to resume or to compare (an evaluation's
    ``pos_config.json``, a selection's ``summary.json``, a checkpoint's ``state.json`` and the
    files it hashes, the best weights' ``best.json``, a completion stamp, a manifest's parts, a
    vocabulary's ``vocab_union.json``, block statistics, a model's ``config.json`` read for its
    code) replaced by a FIFO: each reader had waited for a writer forever (``merge train``
    resuming, ``evaluate-pos`` and ``experimental select`` over their directory). Each now
    names it, or takes it for a damaged record, at once."""
    from hostile_helpers import deadline
    from lmalgebra.core.fingerprint import sha256_file
    from lmalgebra.core.remote_code import ships_code
    from lmalgebra.distill.vocab.union import _vocabulary_check
    from lmalgebra.stats.span_blocks import SpanBlockMoments
    from lmalgebra.storage.completion import CompletionStamp
    from lmalgebra.storage.manifest_parts import read_parts
    from lmalgebra.train.checkpoint import damage
    from lmalgebra.train.validation import _intact_record

    fifo = "is not a regular file (a FIFO, socket or device)"
    with deadline(30):
        _fifo(tmp_path / "pos" / "pos_config.json")
        with pytest.raises(UserInputError, match=re.escape(f"pos_config.json {fifo}")):
            claim_evaluation(tmp_path / "pos", {}, overwrite=False)
        _fifo(tmp_path / "sel" / "summary.json")
        with pytest.raises(UserInputError, match=r"summary\.json is not a regular file"):
            claim_selection(tmp_path / "sel", {}, overwrite=False)
        state = _fifo(tmp_path / "ck" / "state.json")
        path, reason, found = damage(tmp_path / "ck")
        assert (path, found) == (state, None) and fifo in reason and "Errno" not in reason
        with pytest.raises(OSError, match="a FIFO"):
            sha256_file(state)
        assert _intact_record(_fifo(tmp_path / "best" / "best.json").parent) is None
        stamp = CompletionStamp(tmp_path / "set", "key")
        _fifo(stamp.path)
        assert stamp.recorded() is None
        _fifo(tmp_path / "parts" / "manifest.rank-0.json")
        assert read_parts(tmp_path / "parts" / "manifest.json", {}) == []
        assert _vocabulary_check(_fifo(tmp_path / "vocab" / "vocab_union.json").parent) is None
        with pytest.raises(UserInputError, match=re.escape(fifo)):
            SpanBlockMoments.load(_fifo(tmp_path / "blocks" / "blocks.json").parent)
        assert ships_code(_fifo(tmp_path / "model" / "config.json").parent) is False


def test_a_users_file_kept_in_a_run_is_not_recorded_as_the_runs(
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A decomposition recorded every ``.csv``, ``.json``, ``.yaml`` and ``.safetensors`` file
    of its directory in its ``summary.json``: a user's ``notes.csv`` kept beside a run computed
    again was recorded as the run's, and once the user edited it ``report`` refused the run as
    damaged. The record holds the run's own files alone."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}", "-T", "8"]
    args += ["--corpus.paths", str(corpus_txt), "--spans.counts", "20,5,5", "--out", str(out)]
    code, stderr = cli([*args, "--no-progress"])
    assert code == 0, stderr
    notes = out / "notes.csv"
    notes.write_text("mine\n", encoding="utf-8")
    code, stderr = cli([*args, "--no-progress"])  # the same run again, the notes beside it
    assert code == 0, stderr
    assert "notes.csv" not in json.loads((out / "summary.json").read_text())["files"]
    notes.write_text("mine, edited\n", encoding="utf-8")
    code, stderr = cli(["report", str(out)])
    assert code == 0, stderr


@pytest.mark.parametrize("damage", ["cut short", "files record removed", "a JSON list"])
def test_a_damaged_summary_of_a_finished_decomposition_is_refused_not_read_as_no_record(
    damage: str,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A finished run's ``summary.json`` cut short, edited (its record of the run's files
    removed) or replaced had been read as recording no sha256, which switched off the check of
    its ``provenance.json``: with that emptied too, a run over an edited corpus replaced the
    finished one, exit 0. The summary is refused, naming it, by the run and its dry run alike;
    ``--overwrite`` replaces the run."""
    from hostile_helpers import assert_one_line, digests

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "docs.txt"
    shutil.copy(corpus_txt, corpus)
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}", "-T", "8"]
    args += ["--corpus.paths", str(corpus), "--spans.counts", "20,5,5", "--out", str(out)]
    args += ["--no-progress"]
    code, stderr = cli(args)
    assert code == 0, stderr
    summary = out / "summary.json"
    if damage == "cut short":
        summary.write_text(summary.read_text(encoding="utf-8")[:-40], encoding="utf-8")
    elif damage == "files record removed":
        record = json.loads(summary.read_text(encoding="utf-8"))
        del record["files"]
        summary.write_text(json.dumps(record), encoding="utf-8")
    else:
        summary.write_text("[]", encoding="utf-8")
    provenance = json.loads((out / "provenance.json").read_text(encoding="utf-8"))
    (out / "provenance.json").write_text(json.dumps({**provenance, "models": {}}))
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("\nanother document about the river and the city\n")
    before = digests(out)
    for dry_run in (["--dry-run"], []):
        assert_one_line(*cli([*args, *dry_run]), [str(summary), "is damaged", "--overwrite"])
    assert digests(out) == before
    code, stderr = cli([*args, "--overwrite"])
    assert code == 0, stderr


@pytest.mark.parametrize("record", ['{"files": []}', '{"files": "model.safetensors"}'])
def test_a_model_marker_whose_record_of_files_is_no_mapping_is_named(
    record: str, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A model directory's ``lmalgebra.json`` (written without its checksum, or torn) whose
    record of the model's files is no mapping had ended a command that reads the model in a
    traceback (``'list' object has no attribute 'items'``)."""
    from hostile_helpers import assert_one_line

    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    (model / "lmalgebra.json").write_text(record, encoding="utf-8")
    args = ["decompose", "--models", f"a={model}", "--models", f"b={bert2_dir}", "-T", "8"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache")]
    needles = ["model 'a'", str(model / "lmalgebra.json"), "is damaged", "no mapping"]
    assert_one_line(*cli(args), needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("record", ["{", "[]", '{"sha256": "x"}'])
def test_a_damaged_record_of_a_dequantised_models_gguf_file_is_named(
    record: str, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A model directory holding a dequantised model's ``gguf.json`` (copied out of the cache)
    whose record cannot be read, or names no file's sha256 or quantisation, had ended
    ``decompose`` in a traceback as its fingerprint read the record."""
    from hostile_helpers import assert_one_line

    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    (model / "gguf.json").write_text(record, encoding="utf-8")
    args = ["decompose", "--models", f"a={model}", "--models", f"b={bert2_dir}", "-T", "8"]
    args += ["--corpus.paths", str(corpus_txt), "--spans.counts", "20,5,5"]
    args += ["--out", str(tmp_path / "out"), "--cache_dir", str(tmp_path / "cache")]
    assert_one_line(*cli(args), ["model 'a'", str(model / "gguf.json"), "is damaged"])
    assert not (tmp_path / "out").exists()


def test_a_model_file_written_again_at_its_size_and_time_is_recorded_and_checked(
    teacher_dirs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model directory written again tells the files it wrote from those it left as they were
    (a user's note) by what the file system says of them: a file written again in place (the
    model's ``config.json``), of the same size, whose modification time came out the same (a
    file system of coarse times, a clock set back) had been taken for one left as it was, and
    was missing from ``lmalgebra.json``, so no later damage of it was ever seen. Its change
    time tells it."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    from lmalgebra.distill.layout import write_model_directory
    from lmalgebra.sources.model_files import FILES_KEY, MARKER, model_damage

    model = AutoModelForMaskedLM.from_pretrained(teacher_dirs["wp"])
    tokenizer = AutoTokenizer.from_pretrained(teacher_dirs["wp"])
    target = tmp_path / "model"
    write_model_directory(target, model, tokenizer, {"kind": "student"})
    config = target / "config.json"
    stamp = config.stat()
    save = type(model).save_pretrained

    def at_the_same_time(self: object, directory: Path, **options: object) -> None:
        save(self, directory, **options)
        os.utime(config, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))

    monkeypatch.setattr(type(model), "save_pretrained", at_the_same_time)
    write_model_directory(target, model, tokenizer, {"kind": "student"})
    assert (config.stat().st_ino, config.stat().st_size) == (stamp.st_ino, stamp.st_size)
    assert "config.json" in json.loads((target / MARKER).read_text())[FILES_KEY]
    config.write_text(config.read_text().replace('"gelu"', '"relu"'))
    assert "config.json is damaged" in str(model_damage(target))


def test_a_shard_the_index_names_in_a_folder_is_part_of_the_models_fingerprint(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A sharded checkpoint whose index names a shard in a folder of the model's directory
    (``w/model-00002-of-00002.safetensors``), which transformers loads: its weights had been
    left out of the model's fingerprint, so an edit of that shard kept the cached embeddings
    and the finished runs of the model as it was."""
    from safetensors.torch import load_file, save_file

    model = Path(shutil.copytree(bert_dir, tmp_path / "model"))
    tensors = load_file(model / "model.safetensors")
    (model / "model.safetensors").unlink()
    (model / "w").mkdir()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[:8]}
    shards["w/model-00002-of-00002.safetensors"] = names[8:]
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(model / shard), metadata={"format": "pt"})
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    index = {"metadata": {}, "weight_map": weight_map}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    ref = ModelRef(name="m", path=str(model))
    memo = tmp_path / "hashes"
    first = source_of(ref, model).fingerprint(memo)["weights"]
    inner = model / "w" / "model-00002-of-00002.safetensors"
    edited = load_file(inner)
    key = next(k for k in edited if k.startswith("encoder."))
    edited[key] = edited[key] + 1.0
    save_file(edited, str(inner), metadata={"format": "pt"})
    assert source_of(ref, model).fingerprint(memo)["weights"] != first
