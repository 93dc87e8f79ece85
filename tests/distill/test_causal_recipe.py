"""Causal recipes: the objective's settings, and every bad recipe refused with one line, exit 2,
before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file, save_file

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.distill.recipe import CausalRecipe, MaskedRecipe, MergeRecipe, cut_text, load_recipe
from merge_fixtures import write_recipe


def test_cut_text_ends_between_characters() -> None:
    assert cut_text("añb", 2) == "a"  # ñ is two bytes: not cut in half
    assert cut_text("añb", 3) == "añ"
    assert cut_text("a😀", 4) == "a" and cut_text("a😀", 5) == "a😀"


def test_each_objective_has_a_recipe_type_of_its_own(tmp_path: Path, teacher_dirs) -> None:
    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs))
    assert isinstance(recipe, MaskedRecipe) and recipe.objective == "masked"
    assert "causal" not in recipe.model_dump() and "tokenizer" not in recipe.student.model_dump()
    assert "objective_mix" not in recipe.training.model_dump()
    causal = MergeRecipe.model_validate(
        {
            **recipe.model_dump(
                mode="json", exclude={"masking", "example_length", "student", "training"}
            ),
            "objective": "causal",
        }
    )
    assert isinstance(causal, CausalRecipe) and "masking" not in causal.model_dump()
    assert set(MaskedRecipe.model_fields) & set(CausalRecipe.model_fields) == set(
        MergeRecipe.model_fields
    ) | {"objective", "student", "training"}


def test_causal_recipe_loads(tmp_path: Path, causal_teacher_dirs) -> None:
    recipe = load_recipe(write_causal_recipe(tmp_path, causal_teacher_dirs))
    assert recipe.objective == "causal" and recipe.causal.samples == 4


def _prepare(path: Path, monkeypatch, capsys) -> tuple[int, str]:
    return run_cli(["merge", "prepare", str(path), "--no-progress"], monkeypatch, capsys)


def test_masked_lm_given_as_causal_teacher(
    tmp_path, causal_teacher_dirs, teacher_dirs, monkeypatch, capsys
):
    teachers = {**causal_teacher_dirs, "uni": teacher_dirs["wp"]}
    code, err = _prepare(write_causal_recipe(tmp_path, teachers), monkeypatch, capsys)
    assert_one_line(code, err, ["teacher 'uni'", "masked LM (BertForMaskedLM), not a causal LM"])
    assert not (tmp_path / "run" / "recipe.yaml").exists()  # refused before anything is written
    assert not (tmp_path / "run" / "examples").exists()


def test_causal_lm_given_as_masked_teacher(
    tmp_path, causal_teacher_dirs, teacher_dirs, monkeypatch, capsys
):
    teachers = {"wp": teacher_dirs["wp"], "sp": causal_teacher_dirs["uni"]}
    code, err = _prepare(write_recipe(tmp_path, teachers), monkeypatch, capsys)
    assert_one_line(
        code,
        err,
        ["teacher 'sp'", "causal LM (GPT2LMHeadModel), not a masked LM", "objective: causal"],
    )


def test_tokenizer_without_offsets(tmp_path, causal_teacher_dirs, monkeypatch, capsys) -> None:
    from transformers import CanineTokenizer

    slow = tmp_path / "slow"
    shutil.copytree(causal_teacher_dirs["bl"], slow)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (slow / name).unlink(missing_ok=True)
    CanineTokenizer().save_pretrained(slow)  # a Python tokenizer: no offsets
    teachers = {**causal_teacher_dirs, "bl": slow}
    code, err = _prepare(write_causal_recipe(tmp_path, teachers), monkeypatch, capsys)
    assert_one_line(code, err, ["teacher 'bl'", "not a fast (Rust) tokenizer", "no token offsets"])


def test_top_k_larger_than_the_vocabulary(tmp_path, causal_teacher_dirs, monkeypatch, capsys):
    path = write_causal_recipe(tmp_path, causal_teacher_dirs, top_k=1000)
    code, err = _prepare(path, monkeypatch, capsys)
    assert_one_line(code, err, ["top_k 1000 exceeds the vocabulary of teacher 'bl' (300 tokens)"])


@pytest.mark.parametrize("command", [["prepare"], ["prepare", "--dry-run"], ["run", "--dry-run"]])
def test_top_k_larger_than_a_masked_vocabulary(
    command, tmp_path, teacher_dirs, monkeypatch, capsys
):
    """Refused by the stage and by its dry run (which had planned it, k capped)."""
    path = write_recipe(tmp_path, teacher_dirs, top_k=250)
    code, err = run_cli(["merge", *command, str(path)], monkeypatch, capsys)
    assert_one_line(code, err, ["top_k 250 exceeds the vocabulary of teacher 'wp' (200 tokens)"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("setting", "value", "needle"),
    [
        ("masking", {"probability": 0.3}, "unknown key 'masking': a setting of masked recipes"),
        ("example_length", 64, "unknown key 'example_length': a setting of masked recipes"),
    ],
)
def test_masked_settings_in_a_causal_recipe(
    tmp_path, causal_teacher_dirs, monkeypatch, capsys, setting, value, needle
):
    path = write_causal_recipe(tmp_path, causal_teacher_dirs, **{setting: value})
    code, err = _prepare(path, monkeypatch, capsys)
    assert_one_line(code, err, [needle, "this recipe's objective is causal"])


def test_causal_settings_in_a_masked_recipe(tmp_path, teacher_dirs, monkeypatch, capsys) -> None:
    path = write_recipe(tmp_path, teacher_dirs, causal={"samples": 8})
    code, err = _prepare(path, monkeypatch, capsys)
    assert_one_line(
        code, err, ["unknown key 'causal': a setting of causal recipes", "objective is masked"]
    )


@pytest.mark.parametrize(
    ("key", "value", "needle"),
    [("samples", 2000, "causal.samples"), ("example_bytes", 4, "causal.example_bytes")],
)
def test_out_of_range_causal_settings(
    tmp_path, causal_teacher_dirs, monkeypatch, capsys, key, value, needle
):
    causal = {"example_bytes": 300, key: value}
    path = write_causal_recipe(tmp_path, causal_teacher_dirs, causal=causal)
    assert_one_line(*_prepare(path, monkeypatch, capsys), [needle, str(path)])


def test_example_longer_than_a_teacher_reads(tmp_path, causal_teacher_dirs, monkeypatch, capsys):
    short = tmp_path / "short"
    shutil.copytree(causal_teacher_dirs["wp"], short)
    config = json.loads((short / "config.json").read_text())
    (short / "config.json").write_text(json.dumps({**config, "n_positions": 20}))
    weights = load_file(str(short / "model.safetensors"))  # positions cut to match
    weights["transformer.wpe.weight"] = weights["transformer.wpe.weight"][:20].clone()
    save_file(weights, str(short / "model.safetensors"), metadata={"format": "pt"})
    path = write_causal_recipe(tmp_path, {**causal_teacher_dirs, "wp": short})
    code, err = _prepare(path, monkeypatch, capsys)
    assert_one_line(
        code,
        err,
        [
            "of language 'yy' is",
            "for teacher 'wp', which reads at most 20",
            "lower causal.example_bytes (now 300)",
        ],
    )


def test_tokenizer_without_start_token(tmp_path, causal_teacher_dirs, monkeypatch, capsys):
    bare = tmp_path / "bare"
    shutil.copytree(causal_teacher_dirs["uni"], bare)
    config_path = bare / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.update(bos_token=None, eos_token=None)
    config_path.write_text(json.dumps(config))
    path = write_causal_recipe(tmp_path, {**causal_teacher_dirs, "uni": bare})
    code, err = _prepare(path, monkeypatch, capsys)
    assert_one_line(
        code, err, ["teacher 'uni'", "neither a beginning-of-sequence nor an end-of-text token"]
    )


def test_starter_recipe_documents_the_causal_keys() -> None:
    from lmalgebra.distill.run.starter_recipe import STARTER

    data = yaml.safe_load(STARTER)
    assert data["objective"] == "masked" and "causal" not in data  # a masked recipe, as written
    for key in ("causal:", "example_bytes:", "samples:", "sample_seed:", "student.tokenizer"):
        assert f"# {key}" in STARTER or f"#   {key}" in STARTER or key in STARTER, key
