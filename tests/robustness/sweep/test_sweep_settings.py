"""Sweep (c): every key of a decomposition recipe and of a masked and a causal MergeDistill recipe
(``sweep_cases.setting_keys``, from the settings classes) given every hostile value of
``sweep_cases.HOSTILE_VALUES`` (another type, negative, zero, 10**18, NaN, an empty string, a
list, a boolean), first to the dry run, then, where the dry run takes it, to the run itself.

A dry run refuses whatever its run refuses for a reason of the settings: a run the dry run
planned may not end in a refusal before it began its work (one after, the data decided). The
run starts from the finished store (the student left out), so the stages a setting leaves alone
are not done again; a run still working at its deadline (10**18 steps) was taken, which is the
dry run's answer too.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmalgebra.distill.recipe import CausalRecipe, MaskedRecipe
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from sweep_cases import HOSTILE_VALUES, setting_keys, with_setting
from sweep_helpers import Outcome, Rules, SweepServer, broken_rules, complete_marks

pytestmark = pytest.mark.sweep

RUN_DEADLINE = 60  # seconds a run the dry run took may work before it is stopped


def _merge_recipe(teachers: list[str], objective: str) -> dict[str, Any]:
    """The shape of the fixtures' recipes (``merge_fixtures``, ``causal_fixtures``): what the
    keys are read from at collection, before any file is written."""
    language = {"corpus": {"paths": ["x.txt"]}, "teachers": teachers}
    return {
        "objective": objective,
        "languages": {"xx": language},
        "teachers": {name: {"path": name} for name in teachers},
    }


KINDS: dict[str, tuple[type, dict[str, Any]]] = {
    "decompose": (DecomposeConfig, {"models": [{"name": "a", "path": "a"}]}),
    "masked": (MaskedRecipe, _merge_recipe(["sp", "wp"], "masked")),
    "causal": (CausalRecipe, _merge_recipe(["bl", "uni", "wp"], "causal")),
}
CASES = [
    (kind, key, value)
    for kind, (settings, shape) in KINDS.items()
    for key in setting_keys(settings, shape)
    for value in HOSTILE_VALUES
]


def _decompose_recipe(decomposition, root: Path) -> dict[str, Any]:
    models = [{"name": n, "path": str(p)} for n, p in zip("ab", decomposition.models, strict=True)]
    return {
        "models": models,
        "corpus": {"paths": [str(decomposition.corpus)]},
        "spans": {"length": 8, "counts": [20, 5, 5]},
        "out": str(root / "out"),
        "progress": False,
    }


def _merge_copy(finished, root: Path) -> dict[str, Any]:
    """The finished run's inputs and store copied into ``root`` (its student left out); the
    recipe's data, pointing at the copy."""
    shutil.copytree(finished.recipe.parent, root, symlinks=True)
    for student in ("student", "evaluation"):
        shutil.rmtree(root / "run" / student, ignore_errors=True)
    data = yaml.safe_load(finished.recipe.read_text(encoding="utf-8"))
    return {**data, "output_dir": str(root / "run")}


def _commands(kind: str, recipe: Path) -> tuple[list[list[str]], list[list[str]]]:
    """(dry runs, runs) of ``recipe``."""
    if kind == "decompose":
        return [["decompose", str(recipe), "--dry-run"]], [["decompose", str(recipe)]]
    dry = [["merge", stage, str(recipe), "--dry-run"] for stage in ("run", "train")]
    run = [["merge", stage, str(recipe), "--no-progress"] for stage in ("run", "train")]
    return dry, run


def _written(value: Any) -> str:
    """``value`` as YAML writes it (NaN as ``.nan``, which ``yaml.safe_dump`` does too)."""
    return "nan" if isinstance(value, float) and math.isnan(value) else repr(value)


def _after_work(outcome: Outcome) -> bool:
    """Whether the run refused after it had begun its work (it logged it: the tokens of its
    spans, a vocabulary, a step): what the data make of a setting (``alpha: 0`` over statistics
    that turn out singular), which no dry run can know, not the settings alone."""
    before = outcome.output.split(outcome.error_lines[-1])[0] if outcome.error_lines else ""
    return any(line.startswith("INFO ") for line in before.splitlines())


def _distinct(value: Any) -> list[str]:
    """The value as a refusal may name it in place of its key, where that is distinct enough to
    tell the key (``1000000000000000000``; not ``0``, which any line may hold)."""
    return [str(value)] if isinstance(value, int) and len(str(value)) > 3 else []


@pytest.fixture(scope="module")
def finished(masked_run, causal_run, decomposition) -> dict[str, Any]:
    return {"masked": masked_run, "causal": causal_run, "decompose": decomposition}


@pytest.mark.parametrize(
    ("kind", "key", "value"), CASES, ids=[f"{k}-{key}-{v}" for k, key, v in CASES]
)
def test_hostile_setting(
    kind: str, key: str, value: str, finished, sweep_server: SweepServer, tmp_path: Path
) -> None:
    root = tmp_path / "case"
    if kind == "decompose":
        root.mkdir()
        data = _decompose_recipe(finished[kind], root)
        env = {"LMALGEBRA_CACHE": str(finished[kind].cache)}
    else:
        data, env = _merge_copy(finished[kind], root), {}
    recipe = root / "hostile.yaml"
    changed = with_setting(data, key, HOSTILE_VALUES[value])
    recipe.write_text(yaml.safe_dump(changed), encoding="utf-8")
    dry_runs, runs = _commands(kind, recipe)
    culprits = [key, key.rsplit(".", 1)[-1], str(recipe), *_distinct(HOSTILE_VALUES[value])]
    outcomes: list[tuple[Outcome, list[str]]] = []
    for args in dry_runs:
        rules = Rules(culprits=culprits, marks_before=complete_marks(root), watched=root)
        outcome = sweep_server.run(args, timeout=120, env=env)
        outcomes.append((outcome, broken_rules(outcome, rules)))
    planned = all(outcome.code == 0 for outcome, _ in outcomes)
    for args in runs if planned else []:
        rules = Rules(culprits=culprits, marks_before=complete_marks(root), watched=root)
        rules.statuses = (0, 1, 2)  # 1: training diverged, as documented
        outcome = sweep_server.run(args, timeout=RUN_DEADLINE, env=env)
        broken = [] if outcome.code is None else broken_rules(outcome, rules)
        if outcome.code == 2 and not _after_work(outcome):
            broken.append("the dry run planned what the run refuses")
        outcomes.append((outcome, broken))
        if outcome.code != 0:
            break
    faults = [f"{'; '.join(b)}\n  {o.shown()}" for o, b in outcomes if b]
    assert not faults, f"{key} = {_written(HOSTILE_VALUES[value])}:\n" + "\n".join(faults)
