"""Sweep (a): every path parameter of every command (``sweep_cases.path_parameters``, from the
command tree) given every hostile path (``sweep_cases.HOSTILE_PATHS``): a FIFO, a socket, a link
to nothing or to itself, ``/dev/zero``, bytes that are no text, a directory of the user's, one
the command may not read...

The command's other parameters are given what a real run gives them (``_base``), so that the
hostile one is what it meets. Every outcome is checked by ``sweep_helpers.broken_rules``.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from hostile_helpers import one_word_treebank
from sweep_cases import (
    HOSTILE_PATHS,
    UNREADABLE,
    PathParameter,
    hostile_path,
    is_valid,
    path_parameters,
    readable_again,
)
from sweep_helpers import Rules, SweepServer, broken_rules, complete_marks

pytestmark = pytest.mark.sweep

PARAMETERS = path_parameters()


def _base(parameter: PathParameter, root: Path, runs: dict[str, object]) -> list[str]:
    """What the command is given besides the swept parameter: the inputs of a real run."""
    masked, decomposition = runs["masked"], runs["decomposition"]
    models = [f"--models=a={decomposition.models[0]}", f"--models=b={decomposition.models[1]}"]
    span_flags = ["--corpus.paths", str(decomposition.corpus), "-T", "8"]
    teacher = ["--corpus.paths", str(decomposition.corpus), "--language", "xx", "--no-progress"]
    teacher += ["--training.steps", "1", "--example_length", "16"]
    bases: dict[tuple[str, ...], list[str]] = {
        ("decompose",): [*models, *span_flags, "--spans.counts", "20,5,5", "--no-progress"],
        ("spans",): [*models, *span_flags, "--spans.counts", "20,5,5"],
        ("report",): [str(decomposition.out)],
        ("evaluate-pos",): [str(one_word_treebank(root / "bank")), models[0], "--epochs", "1"],
        ("experimental", "select"): [
            _select_recipe(masked.recipe, root),
            "--no-progress",
            "--bootstrap",
            "10",
        ],
        ("pretrain", "masked"): [*teacher, "--tokenizer.vocab_size", "100"],
        ("pretrain", "causal"): [*teacher, "--tokenizer.vocab_size", "300"],
        ("pretrain", "head-only"): [*teacher, "--encoder", str(decomposition.models[0])],
    }
    words = list(bases.get(parameter.command, []))
    writes = any(p.command == parameter.command and p.option == "--out" for p in PARAMETERS)
    if writes and parameter.option != "--out":
        words += ["--out", str(root / "out")]
    return _without(words, parameter)


def _select_recipe(recipe: Path, root: Path) -> str:
    """The masked recipe with half its examples held out (what teachers are compared on: the
    fixture's tenth is too little text) and its run in ``root``."""
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data.update(heldout_fraction=0.5, output_dir=str(root / "run"))
    path = root / "select.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def _without(words: list[str], parameter: PathParameter) -> list[str]:
    """``words`` less what gives the swept parameter its value (its flag, or the argument in
    first place when it is one), and less the flags of the same section (``--tokenizer.path``
    and ``--tokenizer.vocab_size`` exclude each other)."""
    if parameter.option is None:
        return words[1:] if words and not words[0].startswith("-") else words
    section = parameter.option.rsplit(".", 1)[0] + "." if "." in parameter.option else None
    kept, skip, dropped = [], False, False
    for word in words:
        if skip:
            skip = False
            continue
        if word == parameter.option or (section and word.startswith(section)):
            skip = True
            continue
        if parameter.model and word.startswith(f"{parameter.option}=") and not dropped:
            dropped = True  # the first model replaced, the others kept
            continue
        kept.append(word)
    return kept


def _cases() -> list[tuple[PathParameter, str]]:
    return [
        (parameter, kind)
        for parameter in PARAMETERS
        for kind in HOSTILE_PATHS
        if not is_valid(parameter, kind)
    ]


@pytest.fixture(scope="module")
def runs(masked_run, decomposition) -> dict[str, object]:
    return {"masked": masked_run, "decomposition": decomposition}


@pytest.mark.parametrize(("parameter", "kind"), _cases(), ids=[f"{p.id}-{k}" for p, k in _cases()])
def test_hostile_path(
    parameter: PathParameter,
    kind: str,
    runs: dict[str, object],
    sweep_server: SweepServer,
    tmp_path: Path,
) -> None:
    root = tmp_path / "case"
    root.mkdir()
    value = hostile_path(root, kind)
    args = [*parameter.command, *parameter.given(str(value)), *_base(parameter, root, runs)]
    env = {"LMALGEBRA_CACHE": str(runs["decomposition"].cache), "HOME": str(root)}
    rules = Rules(
        culprits=[value.name, parameter.option or parameter.name.upper(), "a-file"],
        marks_before=complete_marks(root),
        watched=root,
    )
    try:
        outcome = sweep_server.run(args, timeout=90, env=env, bound=kind in UNREADABLE)
    finally:
        readable_again(root)
    broken = broken_rules(outcome, rules)
    assert not broken, f"{'; '.join(broken)}\n{outcome.shown()}"
    if os.path.lexists(root):
        shutil.rmtree(root)
