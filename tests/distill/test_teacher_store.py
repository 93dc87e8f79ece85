"""Offline teacher inference and the sharded top-k store: parity, refusal, resumption, checksums."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill import pipeline
from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker
from lmalgebra.distill.masked.topk import TeacherOutput, _split_outputs, masked_topk
from lmalgebra.distill.pipeline import inspect_run
from lmalgebra.distill.pipeline import verify as verify_run
from lmalgebra.distill.recipe import MaskingSpec, load_recipe
from lmalgebra.distill.teachers import load_lm
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.shard_set import ShardSet
from merge_fixtures import write_recipe
from tiny import sentences
from topk_helpers import assert_same_topk


@torch.inference_mode()
def naive_topk(model, copy: MaskedCopy, k: int) -> TeacherOutput:
    """Reference: full-vocabulary logits at every position, then top-k."""
    logits = model(input_ids=torch.from_numpy(copy.input_ids)[None]).logits[0].float()
    return _split_outputs(logits[torch.from_numpy(copy.positions)], [copy], k)[0]


@pytest.mark.parametrize("teacher", ["wp", "sp"])
def test_masked_positions_head_matches_full_logits(teacher_dirs, teacher: str) -> None:
    directory = teacher_dirs[teacher]
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForMaskedLM.from_pretrained(directory).eval()
    masker = TeacherMasker(teacher, tok, MaskingSpec(probability=0.3), max_length=40)
    copies = [masker(f"e{i}", t) for i, t in enumerate(sentences(30, seed=2))]
    fast = masked_topk(model, copies, k=8, pad_id=tok.pad_token_id, batch_size=7)
    exact = listed = 0
    for copy, got in zip(copies, fast, strict=True):
        want = naive_topk(model, copy, k=9)  # the ninth: is the eighth a near-tie?
        # batched and padded, or alone: a near-tie may be ordered either way in other kernels
        exact += assert_same_topk(
            got.topk_ids, got.topk_logprobs, want.topk_ids, want.topk_logprobs, atol=1e-5
        )
        listed += got.topk_ids.size
        assert got.loss == pytest.approx(want.loss, abs=1e-5)
        # stored values are log-probabilities over the full vocabulary
        assert np.all(got.topk_logprobs <= 0) and np.exp(got.topk_logprobs).sum(1).max() <= 1 + 1e-5
    assert exact >= 0.9 * listed > 0  # measured: 1,451 of 1,472 (wp), 1,074 of 1,096 (sp)


def test_a_table_padded_past_the_tokenizer_gives_a_top_k_of_its_tokens(teacher_dirs) -> None:
    """A masked teacher whose token table has rows past its tokenizer (padded to a round size)
    had stored top-k ids that name no token, refused by ``merge train`` ("token id 263 is
    outside the teacher vocabulary of 200 ids") after the store was built: the top-k is taken
    among the tokenizer's ids, its log-probabilities of the whole table."""
    import torch

    directory = teacher_dirs["wp"]
    tok = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForMaskedLM.from_pretrained(directory).eval()
    torch.manual_seed(0)
    model.resize_token_embeddings(len(tok) + 64, mean_resizing=False)
    masker = TeacherMasker("wp", tok, MaskingSpec(probability=0.3), max_length=40)
    copies = [masker(f"e{i}", t) for i, t in enumerate(sentences(10, seed=2))]
    padded = masked_topk(model, copies, k=8, pad_id=tok.pad_token_id, tokens=len(tok))
    for copy, got in zip(copies, padded, strict=True):
        want = naive_topk(model, copy, k=len(tok) + 64)
        named = want.topk_ids < len(tok)
        expected = want.topk_logprobs[named].reshape(len(copy.positions), -1)[:, :8]
        assert got.topk_ids.max() < len(tok)
        np.testing.assert_allclose(got.topk_logprobs, expected, rtol=0, atol=1e-5)


def test_teacher_without_trained_head_is_refused(teacher_dirs, tmp_path: Path) -> None:
    encoder = tmp_path / "encoder-only"
    AutoModel.from_pretrained(teacher_dirs["wp"]).save_pretrained(encoder)
    ref = ModelRef(name="enc", path=str(encoder))
    with pytest.raises(UserInputError, match="holds a BertModel, a model without a language-model"):
        load_lm(ref, encoder, "masked")  # config.json says so: refused before loading
    config = json.loads((encoder / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]  # says it has a head; its weights do not
    (encoder / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserInputError, match="no trained masked-LM head"):
        load_lm(ref, encoder, "masked")


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, teacher_dirs):
    root = tmp_path_factory.mktemp("merge")
    recipe = load_recipe(write_recipe(root, teacher_dirs))
    pipeline.prepare(recipe, progress=False)
    pipeline.teach(recipe, progress=False)
    return recipe


def shard_bytes(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*.arrow"))}


def test_store_layout_and_bytes_per_masked_token(run) -> None:
    report = inspect_run(run.output_dir)
    pairs = {(r["language"], r["teacher"]): r for r in report.pairs}
    assert set(pairs) == {("xx", "wp"), ("yy", "wp"), ("yy", "sp")}
    for row in pairs.values():
        assert row["teach_complete"] and row["masked_tokens"] > 0
        assert row["topk_payload_bytes_per_masked_token"] == 32  # uint16 ids + fp16 values, k=8
        # 16-row shards carry Arrow's per-file framing; bench/ measures realistic shard sizes
        assert 32 < row["topk_file_bytes_per_masked_token"] < 48
    assert pairs[("xx", "wp")]["examples"] == 60
    manifest = ShardSet.existing(run.output_dir / "topk" / "yy" / "sp").manifest
    assert manifest["complete"] and manifest["teacher_hashes"]["weights"]
    assert all(len(s["sha256"]) == 64 for s in manifest["shards"])


def test_interrupted_teach_resumes_to_identical_shards(run, tmp_path: Path, monkeypatch) -> None:
    copy_dir = tmp_path / "run"
    shutil.copytree(run.output_dir / "examples", copy_dir / "examples")
    shutil.copytree(run.output_dir / "masked", copy_dir / "masked")
    shutil.copy(run.output_dir / "recipe.yaml", copy_dir / "recipe.yaml")
    recipe = run.model_copy(update={"output_dir": copy_dir})
    real_write, calls = ShardSet.write, []

    def dying_write(self, index, table, **extra):
        if "topk" in str(self.directory) and len(calls) == 2:
            raise KeyboardInterrupt  # killed between two shards
        calls.append(index)
        real_write(self, index, table, **extra)

    monkeypatch.setattr(ShardSet, "write", dying_write)
    with pytest.raises(KeyboardInterrupt):
        pipeline.teach(recipe, progress=False)
    monkeypatch.setattr(ShardSet, "write", real_write)
    assert any(p for p in (copy_dir / "topk").rglob("shard-*.arrow"))
    pipeline.teach(recipe, progress=False)
    assert shard_bytes(copy_dir) == shard_bytes(run.output_dir)


def test_corrupt_shard_is_named_by_verify_and_on_read(run, tmp_path: Path) -> None:
    copy_dir = tmp_path / "run"
    shutil.copytree(run.output_dir, copy_dir, ignore=shutil.ignore_patterns("vocab"))
    assert verify_run(copy_dir) == []
    victim = copy_dir / "topk" / "yy" / "sp" / "shard-00001.arrow"
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF
    victim.write_bytes(bytes(data))
    problems = verify_run(copy_dir)
    assert problems == [f"{victim}: corrupt (checksum mismatch)"]
    with pytest.raises(UserInputError, match=r"shard-00001\.arrow is corrupt"):
        ShardSet.existing(victim.parent).read(1)
    # a run that finds it marks the set incomplete on disk at once and plans that shard alone
    assert ShardSet.existing(victim.parent).plan(3) == [1]
    assert not ShardSet.existing(victim.parent).complete
    others = sorted(p for p in (copy_dir / "topk").rglob("shard-*.arrow") if p != victim)
    before = {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in others}
    recipe = run.model_copy(update={"output_dir": copy_dir})
    pipeline.teach(recipe, progress=False)
    assert verify_run(copy_dir) == []
    assert victim.read_bytes() == (run.output_dir / "topk/yy/sp/shard-00001.arrow").read_bytes()
    assert {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in others} == before  # not redone


def test_teach_before_prepare_says_which_command(tmp_path: Path, teacher_dirs) -> None:
    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs))
    with pytest.raises(
        UserInputError,
        match=r"run `lmalgebra merge prepare RECIPE` \(merge\(recipe, 'prepare'\)\) first",
    ):
        pipeline.teach(recipe, progress=False)
