"""`lmalgebra merge init`: a commented starter recipe that the recipe loader accepts as written."""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile_helpers import assert_one_line, run_cli
from lmalgebra.distill.recipe import CausalRecipe, MaskedRecipe, load_recipe
from lmalgebra.distill.run.starter_recipe import STARTER


def test_init_writes_a_recipe_that_loads(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "merge.yaml"
    code, err = run_cli(["merge", "init", str(path)], monkeypatch, capsys)
    assert code == 0, err
    assert path.read_text(encoding="utf-8") == STARTER
    recipe = load_recipe(path)
    assert sorted(recipe.languages) == ["en", "fr"] and recipe.training.sampling_exponent == 0.7
    # every top-level key of a recipe is shown (the file is also the reference)
    text = path.read_text(encoding="utf-8")
    for key in MaskedRecipe.model_fields:
        assert f"\n{key}:" in text, key
    for key in set(CausalRecipe.model_fields) - set(MaskedRecipe.model_fields):
        assert f"\n# {key}:" in text, key  # the causal recipe's own keys, commented
    assert text.count("#") > 20  # commented


def test_init_never_replaces_a_file_unless_asked(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "merge.yaml"
    path.write_text("mine\n", encoding="utf-8")
    code, err = run_cli(["merge", "init", str(path)], monkeypatch, capsys)
    assert_one_line(code, err, [str(path), "--force"])
    assert path.read_text(encoding="utf-8") == "mine\n"
    code, err = run_cli(["merge", "init", str(path), "--force"], monkeypatch, capsys)
    assert code == 0 and path.read_text(encoding="utf-8") == STARTER


def test_a_directory_in_the_recipes_place_is_named_without_offering_force(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--force replaces a file, never a directory: the message says what is there instead."""
    (tmp_path / "mine.txt").write_text("kept\n", encoding="utf-8")
    for force in ([], ["--force"]):
        code, err = run_cli(["merge", "init", str(tmp_path), *force], monkeypatch, capsys)
        line = assert_one_line(code, err, [str(tmp_path), "is a directory, not a file"])
        assert "--force" not in line
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]
