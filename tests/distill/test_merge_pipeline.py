"""``run_stages``: the one MergeDistill stage sequence that ``merge run`` and the demo call.

The stages themselves are tested in their own files (and end to end through ``merge run`` in
``test_merge_run.py``); here they are replaced by recorders, to check order and skipping.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.objective import CausalObjective
from lmalgebra.distill.masked.objective import MaskedObjective
from lmalgebra.distill.pipeline import RUN_STAGES, STORE_STAGES, objective_of, run_stages
from lmalgebra.distill.recipe import CausalRecipe, MaskedRecipe, MergeRecipe
from lmalgebra.train.config import TrainingSpec


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[Any, ...]]:
    made: list[tuple[Any, ...]] = []

    def train(objective: Any, name: str, training: TrainingSpec, progress: bool, restart: bool):
        made.append(("train", name, training.gold_only, progress))
        return objective.recipe.output_dir / name / "model"

    for objective in (MaskedObjective, CausalObjective):
        monkeypatch.setattr(objective, "prepare", lambda o, p: made.append(("prepare", p)))
        monkeypatch.setattr(objective, "teach", lambda o, p, setup: made.append(("teach", p)))
        monkeypatch.setattr(objective, "train", train)
        monkeypatch.setattr(
            objective, "check_students", lambda o, names: made.append(("kept", *names))
        )
    monkeypatch.setattr(MaskedObjective, "vocab", lambda o: made.append(("vocab",)))
    return made


@pytest.fixture
def recipe(tmp_path: Path) -> MergeRecipe:
    return MergeRecipe.model_validate(
        {
            "languages": {"xx": {"corpus": {"paths": ["xx.txt"]}, "teachers": ["t"]}},
            "teachers": {"t": {"path": "./teacher"}},
            "output_dir": str(tmp_path / "run"),
        }
    )


def test_the_objective_is_chosen_once_from_the_recipe(recipe: MergeRecipe) -> None:
    assert isinstance(recipe, MaskedRecipe) and isinstance(objective_of(recipe), MaskedObjective)
    causal = MergeRecipe.model_validate({**_keys(recipe), "objective": "causal"})
    assert isinstance(causal, CausalRecipe) and isinstance(objective_of(causal), CausalObjective)
    assert "vocab" not in objective_of(causal).stages


def _keys(recipe: MergeRecipe) -> dict[str, Any]:
    """The recipe's keys every objective shares."""
    return recipe.model_dump(mode="json", include=set(MergeRecipe.model_fields))


def test_store_stages_run_in_order(recipe: MergeRecipe, calls: list[tuple[Any, ...]]) -> None:
    assert run_stages(recipe, STORE_STAGES, progress=False) == {}
    assert calls == [("prepare", False), ("teach", False), ("vocab",)]


def test_stages_run_in_pipeline_order_whatever_the_order_given(
    recipe: MergeRecipe, calls: list[tuple[Any, ...]]
) -> None:
    run_stages(recipe, ["vocab", "prepare"])
    assert calls == [("prepare", True), ("vocab",)]


def test_train_stage_trains_each_student_not_yet_saved(
    recipe: MergeRecipe, calls: list[tuple[Any, ...]]
) -> None:
    saved = recipe.output_dir / "sm2" / "model"
    saved.mkdir(parents=True)
    (saved / "lmalgebra.json").write_text("{}")
    students = {
        "sm3": recipe.training,
        "sm2": recipe.training.model_copy(update={"gold_only": True}),
    }
    models = run_stages(recipe, RUN_STAGES, students, progress=False)
    assert calls[:3] == [("prepare", False), ("teach", False), ("vocab",)]
    # sm2 is already saved: kept, once checked to be of these teachers and this store
    assert calls[3:] == [("kept", "sm2"), ("train", "sm3", False, False)]
    assert models == {"sm3": recipe.output_dir / "sm3" / "model", "sm2": saved}


def test_unknown_stage_and_train_without_students_are_refused(
    recipe: MergeRecipe, calls: list[tuple[Any, ...]]
) -> None:
    with pytest.raises(ValueError, match="'distill'"):
        run_stages(recipe, ["prepare", "distill"])
    with pytest.raises(ValueError, match="at least one student"):
        run_stages(recipe, ["train"])
    assert calls == []


def test_an_unusable_teacher_dtype_is_refused_before_anything_is_written(
    recipe: MergeRecipe, calls: list[tuple[Any, ...]], cpu_without_bf16: Path
) -> None:
    with pytest.raises(UserInputError, match="merge recipe dtype: bfloat16 is not native"):
        run_stages(recipe.model_copy(update={"dtype": "bfloat16"}), STORE_STAGES)
    assert calls == []


def test_a_causal_recipe_skips_vocab_in_a_sequence_and_refuses_it_alone(
    recipe: MergeRecipe, calls: list[tuple[Any, ...]]
) -> None:
    causal = MergeRecipe.model_validate({**_keys(recipe), "objective": "causal"})
    run_stages(causal, STORE_STAGES, progress=False)
    assert calls == [("prepare", False), ("teach", False)]
    with pytest.raises(UserInputError, match="a causal recipe has no union vocabulary"):
        run_stages(causal, ["vocab"])


def test_a_toy_objective_joins_through_the_tables_alone(
    recipe: MergeRecipe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An objective is a recipe class with a line in ``RECIPES`` and an ``Objective`` with a line
    in ``pipeline.OBJECTIVES``: the recipe union, the chooser and the messages read them."""
    from typing import Literal

    from pydantic import Field, TypeAdapter

    import lmalgebra.distill.pipeline as pipeline
    import lmalgebra.distill.recipe as recipes

    class ToyObjective(CausalObjective):
        stages = ("prepare", "train")

    class ToyRecipe(CausalRecipe):
        objective: Literal["toy"] = Field(default="toy")  # type: ignore[assignment]

    table = {**recipes.RECIPES, "toy": ToyRecipe}
    monkeypatch.setattr(recipes, "RECIPES", table)
    monkeypatch.setattr(recipes, "OBJECTIVES", tuple(table))
    monkeypatch.setattr(recipes, "_KEYS", {n: recipes._keys(r) for n, r in table.items()})
    union = recipes.Union[tuple(recipes.Annotated[r, recipes.Tag(n)] for n, r in table.items())]
    adapter = TypeAdapter(recipes.Annotated[union, recipes.Discriminator(recipes._objective)])
    monkeypatch.setattr(recipes, "_RECIPES", adapter)
    monkeypatch.setitem(pipeline.OBJECTIVES, ToyRecipe, ToyObjective)
    keys = ("languages", "teachers", "output_dir")
    data = {k: v for k, v in recipe.model_dump(mode="json").items() if k in keys}
    data["objective"] = "toy"
    toy = MergeRecipe.model_validate(data)
    assert type(toy) is ToyRecipe and type(objective_of(toy)) is ToyObjective
    assert objective_of(toy).runnable(["prepare", "teach", "train"]) == ["prepare", "train"]
    with pytest.raises(UserInputError, match="must be masked or causal or toy, got 'other'"):
        recipes.parse_recipe(data | {"objective": "other"}, "r.yaml")


def test_both_tables_name_the_same_objectives() -> None:
    from lmalgebra.distill.objective import Objective
    from lmalgebra.distill.pipeline import OBJECTIVES
    from lmalgebra.distill.recipe import RECIPES

    assert set(OBJECTIVES) == set(RECIPES.values())
    for name, recipe_type in RECIPES.items():
        assert recipe_type.model_fields["objective"].default == name
        chosen = OBJECTIVES[recipe_type]
        assert issubclass(chosen, Objective) and not chosen.__abstractmethods__
