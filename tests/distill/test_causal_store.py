"""The causal teacher store: parity with a naive full forward, byte offsets, drawn tokens,
inspect and verify, resumption, and the stages a causal recipe runs or refuses."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.distill import pipeline
from lmalgebra.distill.causal.logprobs import CausalOutput, _example_output, draw_samples
from lmalgebra.distill.causal.store import load_causal_store
from lmalgebra.distill.examples import example_id
from lmalgebra.distill.pipeline import inspect_run
from lmalgebra.distill.pipeline import verify as verify_run
from lmalgebra.distill.recipe import load_recipe
from lmalgebra.distill.vocab.byte_alignment import encode_with_offsets
from lmalgebra.storage.shard_set import ShardSet
from topk_helpers import assert_same_topk

PAIRS = [("xx", "bl"), ("xx", "uni"), ("yy", "wp")]


@torch.inference_mode()
def naive_causal_output(model, record, store, k: int) -> CausalOutput:
    """Reference: one example alone, full logits, no padding."""
    logits = model(input_ids=_inputs(record, store)).logits[0]
    return _example_output(logits, record.token_ids, k, 0, ())


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs):
    root = tmp_path_factory.mktemp("causal")
    recipe = load_recipe(write_causal_recipe(root, causal_teacher_dirs))
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    return recipe


@pytest.mark.parametrize(("lang", "teacher"), PAIRS)
def test_store_matches_a_naive_forward_of_each_example(run, causal_teacher_dirs, lang, teacher):
    store = load_causal_store(run.output_dir, lang, teacher)
    model = AutoModelForCausalLM.from_pretrained(causal_teacher_dirs[teacher]).eval()
    exact = listed = 0
    for row in range(0, len(store), 5):
        record = store.record(row)
        want = naive_causal_output(model, record, store, k=6)
        np.testing.assert_allclose(record.next_logprob, want.next_logprob, atol=1e-5)
        # ids chosen in float32 (a near-tie may be ordered either way batched and alone), kept
        # as float16 values
        exact += assert_same_topk(
            record.topk_ids, record.topk_logprobs, want.topk_ids, want.topk_logprobs, atol=5e-3
        )
        listed += record.topk_ids.size
        # each drawn token's stored log-probability is the teacher's
        full = torch.log_softmax(model(input_ids=_inputs(record, store)).logits[0], -1)
        drawn = full.gather(1, torch.from_numpy(record.sample_ids)).detach().numpy()
        np.testing.assert_allclose(record.sample_logprobs, drawn, atol=5e-3)
        assert np.all(np.diff(record.sample_ids, axis=1) >= 0)
    # measured: 7,513 of 7,570 (xx/bl), 2,520 of 2,535 (xx/uni), 1,590 of 1,600 (yy/wp)
    assert exact >= 0.9 * listed > 0


def _inputs(record, store) -> torch.Tensor:
    ids = np.concatenate([[store.start_token_id], record.token_ids[:-1]])
    return torch.from_numpy(ids.astype(np.int64)).unsqueeze(0)


@pytest.mark.parametrize(("lang", "teacher"), PAIRS)
def test_byte_offsets_are_those_the_student_side_computes(run, lang, teacher) -> None:
    from transformers import AutoTokenizer

    store = load_causal_store(run.output_dir, lang, teacher)
    tokenizer = AutoTokenizer.from_pretrained(Path(run.teachers[teacher].path))
    for row in range(len(store)):
        record = store.record(row)
        want = encode_with_offsets(tokenizer, record.text)
        np.testing.assert_array_equal(record.token_ids, want.ids)
        np.testing.assert_array_equal(record.offsets, want.offsets)
        data = record.text.encode("utf-8")
        starts, ends = record.offsets[:, 0], record.offsets[:, 1]
        assert np.all(starts <= ends) and np.all(ends[:-1] <= starts[1:]) and ends[-1] <= len(data)
        if teacher == "bl":  # byte-level BPE covers every byte once, pieces of a character too
            assert b"".join(data[s:e] for s, e in record.offsets) == data


def test_examples_are_cut_by_text_and_shared_by_every_teacher(run) -> None:
    bl = load_causal_store(run.output_dir, "xx", "bl")
    uni = load_causal_store(run.output_dir, "xx", "uni")
    assert list(bl.texts) == list(uni.texts) and list(bl.example_ids) == list(uni.example_ids)
    corpus = (run.output_dir.parent / "xx.txt").read_text(encoding="utf-8").splitlines()
    documents = {example_id("xx", d.strip()): d.strip() for d in corpus}
    cut = 0
    for identifier, text in zip(bl.example_ids, bl.texts, strict=True):
        whole = documents[identifier]  # the id is the whole document's: same held-out split
        assert whole.startswith(text) and len(text.encode("utf-8")) <= 300
        if text != whole:  # cut at the last character that fits
            assert len((whole[: len(text) + 1]).encode("utf-8")) > 300
            cut += 1
    assert cut >= 5


def test_drawn_tokens_follow_the_distribution_and_the_seed() -> None:
    logprobs = torch.log_softmax(torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]), -1)
    ids, values = draw_samples(logprobs, 20000, [3, 4])
    counts = np.bincount(ids[0], minlength=5) / 20000
    np.testing.assert_allclose(counts, logprobs.exp()[0].numpy(), atol=0.012)
    np.testing.assert_allclose(values[0], logprobs[0, ids[0]].numpy())
    assert np.array_equal(
        draw_samples(logprobs, 50, [3, 4])[0], draw_samples(logprobs, 50, [3, 4])[0]
    )
    assert not np.array_equal(
        draw_samples(logprobs, 50, [3, 5])[0], draw_samples(logprobs, 50, [3, 4])[0]
    )


def test_inspect_gives_bytes_per_token_of_each_part(run) -> None:
    rows = {(r["language"], r["teacher"]): r for r in inspect_run(run.output_dir).pairs}
    assert set(rows) == set(PAIRS)
    for row in rows.values():
        assert row["teach_complete"] and row["top_k"] == 5 and row["samples"] == 4
        # uint16 ids and byte offset pairs, float32 next log-prob, fp16 log-probs
        assert {k: v for k, v in row.items() if k.endswith("_bytes_per_token")} == {
            "token_ids_bytes_per_token": 2.0,
            "offsets_bytes_per_token": 4.0,
            "next_logprob_bytes_per_token": 4.0,
            "topk_bytes_per_token": 20.0,
            "samples_bytes_per_token": 16.0,
            "store_bytes_per_token": row["store_bytes_per_token"],
        }
        assert 46 < row["store_bytes_per_token"] < 80  # tiny shards carry Arrow framing
    assert rows[("xx", "bl")]["examples"] == 40


def test_verify_names_a_corrupt_shard_and_teach_redoes_it_alone(run, tmp_path: Path) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run.output_dir, copy)
    assert verify_run(copy) == []
    victim = copy / "logprobs" / "xx" / "uni" / "shard-00002.arrow"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    assert verify_run(copy) == [f"{victim}: corrupt (checksum mismatch)"]
    others = sorted(p for p in (copy / "logprobs").rglob("shard-*.arrow") if p != victim)
    before = {p: p.stat().st_mtime_ns for p in others}
    pipeline.teach(run.model_copy(update={"output_dir": copy}), progress=False)
    assert verify_run(copy) == []
    assert victim.read_bytes() == (run.output_dir / victim.relative_to(copy)).read_bytes()
    assert {p: p.stat().st_mtime_ns for p in others} == before


def test_interrupted_teach_resumes_to_identical_shards(run, tmp_path: Path, monkeypatch) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run.output_dir, copy, ignore=shutil.ignore_patterns("logprobs"))
    recipe = run.model_copy(update={"output_dir": copy})
    real_write, calls = ShardSet.write, []

    def dying_write(self, index, table, **extra):
        if len(calls) == 4:
            raise KeyboardInterrupt  # killed between two shards
        calls.append(index)
        real_write(self, index, table, **extra)

    monkeypatch.setattr(ShardSet, "write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        pipeline.teach(recipe, progress=False)
    monkeypatch.setattr(ShardSet, "write", real_write)
    pipeline.teach(recipe, progress=False)
    for path in sorted((run.output_dir / "logprobs").rglob("*.arrow")):
        assert (copy / path.relative_to(run.output_dir)).read_bytes() == path.read_bytes()


def test_merge_run_builds_the_store_and_vocab_and_train_refuse(
    causal_teacher_dirs, tmp_path: Path, monkeypatch, capsys
) -> None:
    path = write_causal_recipe(tmp_path, causal_teacher_dirs)
    code, err = run_cli(["merge", "run", str(path), "--no-progress"], monkeypatch, capsys)
    assert code == 0, err
    assert (tmp_path / "run" / "logprobs" / "yy" / "wp" / "manifest.json").is_file()
    assert not (tmp_path / "run" / "vocab").exists()
    code, err = run_cli(["merge", "vocab", str(path)], monkeypatch, capsys)
    assert_one_line(code, err, ["causal recipe has no union vocabulary"])
    code, err = run_cli(["merge", "train", str(path), "--no-progress"], monkeypatch, capsys)
    assert_one_line(code, err, ["needs a tokenizer", "student.tokenizer"])
    code, err = run_cli(["merge", "inspect", str(tmp_path / "run")], monkeypatch, capsys)
    assert code == 0, err
    code, err = run_cli(["merge", "evaluate", str(tmp_path / "run")], monkeypatch, capsys)
    assert_one_line(code, err, ["student 'student' has no model", "merge train"])
    code, err = run_cli(["experimental", "select", str(path)], monkeypatch, capsys)
    assert_one_line(code, err, ["experimental select ranks masked-LM teachers"])
    code, err = run_cli(["merge", "verify", str(tmp_path / "run")], monkeypatch, capsys)
    assert code == 0, err
