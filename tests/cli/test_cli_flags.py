"""Flags generated from the configs: one per recipe key, help from the field, aliases kept.

The commands run through ``lmalgebra.cli.main`` up to the library call, which is replaced by one
that keeps the config it was given, so no model is loaded.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from pydantic import BaseModel
from rich.markup import escape

from lmalgebra.cli import main
from lmalgebra.cli.app import app
from lmalgebra.cli.config_options import default_text
from lmalgebra.cli.lmd import DECOMPOSE_FLAGS
from lmalgebra.cli.merge import TRAINING_FLAGS
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.spans.draw import SpanPlanSpec
from lmalgebra.train.config import CausalTrainingSpec, TrainingSpec

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class CapturedCallError(Exception):
    """Raised in place of the library call, carrying the config the command built."""

    def __init__(self, *configs: Any) -> None:
        super().__init__("captured")
        self.configs = configs


def leaf_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, field) of every field, nested configs included (the containers too)."""
    for name, field in model.model_fields.items():
        yield prefix + name, field
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            yield from leaf_fields(annotation, f"{prefix}{name}.")


def is_container(field: Any) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def command_options(*path: str) -> dict[str, Any]:
    """Option string -> click parameter, for ``lmalgebra PATH...``."""
    command: Any = typer.main.get_command(app)
    for name in path:
        command = command.commands[name]
    return {opt: p for p in command.params for opt in (*p.opts, *p.secondary_opts)}


def lookup(config: BaseModel, key: str) -> Any:
    value: Any = config
    for part in key.split("."):
        value = getattr(value, part)
    return value


@pytest.fixture
def run_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> Callable[..., tuple[int | str | None, str, str]]:
    def run(*args: str) -> tuple[int | str | None, str, str]:
        monkeypatch.setattr(sys, "argv", ["lmalgebra", *args])
        capsys.readouterr()
        try:
            main()
        except SystemExit as stop:
            code = stop.code
        else:
            code = 0
        captured = capsys.readouterr()
        return code, ANSI.sub("", captured.out), ANSI.sub("", captured.err)

    return run


@pytest.fixture
def decompose_config(
    monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any]
) -> Callable[..., DecomposeConfig]:
    """``lmalgebra decompose ARGS`` -> the config it would run."""
    import lmalgebra.api.decompose

    def keep(config: DecomposeConfig, overwrite: bool = False) -> None:
        raise CapturedCallError(config)

    monkeypatch.setattr(lmalgebra.api.decompose, "decompose_recipe", keep)

    def run(*args: str) -> DecomposeConfig:
        with pytest.raises(CapturedCallError) as caught:
            run_cli("decompose", *args)
        return caught.value.configs[0]

    return run


@pytest.fixture
def recipe(tmp_path: Path) -> Path:
    data = {
        "models": [{"name": n, "path": f"./models/{n}"} for n in ("a", "b", "c")],
        "corpus": {"paths": ["docs.txt"], "text_column": "body"},
        "spans": {"length": 16, "counts": [40, 8, 8]},
        "alpha": 0.5,
        "exclude_special": True,
        "study": {"bootstrap": 10, "nulls": True},
        "progress": False,
        "out": str(tmp_path / "out"),
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


MODELS = ["--models", "a=./models/a", "--models", "b=./models/b", "--models", "c=./models/c"]
FLAGS = [*MODELS, "--corpus.paths", "docs.txt"]


# --- one flag per field -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "config"), [(("decompose",), DecomposeConfig), (("spans",), SpanPlanSpec)]
)
def test_every_field_has_its_dotted_flag_with_its_description_as_help(
    command: tuple[str, ...], config: type[BaseModel]
) -> None:
    options = command_options(*command)
    for key, field in leaf_fields(config):
        assert field.description, f"{config.__name__}.{key} has no description"
        if is_container(field):
            continue  # its fields have the flags
        assert f"--{key}" in options, f"no flag --{key}"
        assert options[f"--{key}"].help.startswith(escape(field.description)), key


def test_training_flags_of_merge_train() -> None:
    options = command_options("merge", "train")
    # every setting of either objective's students, a causal student's own included
    for key, field in CausalTrainingSpec.model_fields.items():
        assert options[f"--training.{key}"].help.startswith(escape(field.description or ""))
    assert "--steps" not in options and "--gold-only" not in options


def test_help_shows_the_defaults(
    monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any]
) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    code, out, _ = run_cli("decompose", "--help")
    assert code == 0
    lines = out.splitlines()

    def line_of(flag: str) -> str:
        (line,) = [x for x in lines if re.search(rf"\s{re.escape(flag)}[\s,]", x)]
        return line

    for flag in DECOMPOSE_FLAGS:
        shown = default_text(flag)
        if shown is not None:
            assert f"[default: {shown}]" in line_of(f"--{flag.key}"), flag.key
    assert "[default: 0.01]" in line_of("--alpha")
    assert "[default: 64]" in line_of("--spans.length")
    assert "[default: 4000,500,500]" in line_of("--spans.counts")
    assert "[default: relative]" in line_of("--alpha_mode")
    assert "[default: no-study.nulls]" in line_of("--study.nulls")
    assert "[default: progress]" in line_of("--progress")
    assert "[default: 50 values, 1e-05 to 100]" in line_of("--study.alpha_grid")
    assert "[default: 0.95]" in line_of("--study.level")
    assert "mean|first|last" in line_of("--pooling")
    # brackets of the model syntax are shown, not taken for markup
    assert "[NAME=][random:]PATH_OR_HUB_ID[@REVISION]" in out


# --- flags and recipes ------------------------------------------------------------------------


def test_given_flags_override_the_recipe_and_only_those(
    recipe: Path, decompose_config: Callable[..., DecomposeConfig]
) -> None:
    base = decompose_config(str(recipe))
    assert base.spans.length == 16 and base.alpha == 0.5 and not base.progress
    config = decompose_config(
        str(recipe),
        "--spans.length",
        "8",
        "--alpha",
        "0.25",
        "--study.bootstrap",
        "20",
        "--no-study.nulls",
    )
    assert config.spans.length == 8
    assert config.alpha == 0.25
    assert config.study.bootstrap == 20
    assert config.study.nulls is False
    # the rest of the recipe stands, nested keys beside an overridden one included
    assert config.spans.counts == (40, 8, 8)
    assert config.corpus.text_column == "body"
    assert config.exclude_special is True
    assert config.progress is False  # not given: the recipe's value, not the flag's default
    unchanged = {"spans", "alpha", "study"}
    for key in DecomposeConfig.model_fields:
        if key not in unchanged:
            assert getattr(config, key) == getattr(base, key), key


def test_every_new_flag_sets_its_field(decompose_config: Callable[..., DecomposeConfig]) -> None:
    config = decompose_config(
        *FLAGS,
        *("--reference_tokenizer", "b", "--max_length", "48", "--spans.seed", "3"),
        *("--corpus.doc_sep", "line", "--corpus.split", "validation"),
        *("--study.level", "0.9", "--study.null_seed", "7", "--study.seed", "5"),
        *("--study.attribution_split", "test"),
        *("--study.bootstrap", "10", "--study.nulls", "--study.attribution"),  # what they set
    )
    assert config.reference_tokenizer == "b"
    assert config.max_length == 48
    assert config.spans.seed == 3
    assert config.corpus.doc_sep == "line"
    assert config.corpus.split == "validation"
    assert config.study.level == 0.9
    assert config.study.null_seed == 7
    assert config.study.seed == 5
    assert config.study.attribution_split == "test"


# every flag the README and the tests use, by its one name: (arguments, dotted key, value)
NAMED: list[tuple[list[str], str, Any]] = [
    (["-T", "8"], "spans.length", 8),
    (["--spans.length", "8"], "spans.length", 8),
    (["--spans.counts", "20,5,5"], "spans.counts", (20, 5, 5)),
    (["--spans.fractions", "0.6,0.2,0.2"], "spans.fractions", (0.6, 0.2, 0.2)),
    (["--spans.per_doc", "2"], "spans.per_doc", 2),
    (["--corpus.text_column", "abstract"], "corpus.text_column", "abstract"),
    (["--corpus.language_column", "lang"], "corpus.language_column", "lang"),
    (["--layer", "-2"], "layer", -2),
    (["--pooling", "last"], "pooling", "last"),
    (["--exclude_special"], "exclude_special", True),
    (["--dtype", "bfloat16"], "dtype", "bfloat16"),
    (["--batch_size", "4"], "batch_size", 4),
    (["--alpha", "1e-6"], "alpha", 1e-6),
    (["--alpha_mode", "absolute"], "alpha_mode", "absolute"),
    (["--target", "a", "--basis", "b", "--basis", "c"], "basis", ["b", "c"]),
    (["--target", "a", "--basis", "b,c"], "basis", ["b", "c"]),
    (["--save_weights"], "save_weights", True),
    (["--out", "runs/x"], "out", Path("runs/x")),
    (["--cache_dir", "/tmp/cache"], "cache_dir", Path("/tmp/cache")),
    (["--no-progress"], "progress", False),
    (["--study.lengths", "16,32,64"], "study.lengths", [16, 32, 64]),
    (["--study.layers"], "study.layers", True),
    (["--study.layer_map", "a,b"], "study.layer_map", ["a", "b"]),
    (["--study.train_sizes", "100,400"], "study.train_sizes", [100, 400]),
    (["--study.languages"], "study.languages", True),
    (["--study.bootstrap", "1000"], "study.bootstrap", 1000),
    (["--study.bootstrap", "10", "--study.blocks", "8"], "study.blocks", 8),
    (["--study.alpha_select", "gcv"], "study.alpha_select", "gcv"),
    (
        ["--study.alpha_select", "gcv", "--study.alpha_grid", "0.1,1"],
        "study.alpha_grid",
        [0.1, 1.0],
    ),
    (["--study.alpha_select", "kfold", "--study.folds", "3"], "study.folds", 3),
    (["--study.nulls"], "study.nulls", True),
    (["--study.attribution"], "study.attribution", True),
]


@pytest.mark.parametrize(("args", "key", "value"), NAMED, ids=[" ".join(c[0]) for c in NAMED])
def test_named_flags_set_their_field(
    decompose_config: Callable[..., DecomposeConfig], args: list[str], key: str, value: Any
) -> None:
    assert lookup(decompose_config(*FLAGS, *args), key) == value


@pytest.mark.parametrize(
    "old", ["--model", "--corpus", "--seq-len", "--spans", "--batch-size", "--bootstrap", "--steps"]
)
def test_a_setting_has_one_name(old: str) -> None:
    """The spellings before the flags were the recipe keys are no flags (CHANGELOG.md)."""
    names = {n for flags in (DECOMPOSE_FLAGS, TRAINING_FLAGS) for f in flags for n in f.names}
    assert old not in names
    assert all(n.startswith("--") or n == "-T" for n in names)


def test_models_and_corpus_flags(decompose_config: Callable[..., DecomposeConfig]) -> None:
    config = decompose_config(
        "--models",
        "a=./models/a@v1",
        "--models",
        "null=random:./models/b",
        "--corpus.paths",
        "one,two.txt",  # a path with a comma is one path
        "--corpus.paths",
        "three.txt",
        "--trust-remote-code",
    )
    assert [(m.name, m.path, m.revision, m.random_init) for m in config.models] == [
        ("a", "./models/a", "v1", False),
        ("null", "./models/b", None, True),
    ]
    assert all(m.trust_remote_code for m in config.models)
    assert config.corpus.paths == ["one,two.txt", "three.txt"]


def test_spans_command_reads_the_same_flags(
    monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    import lmalgebra.lmd.spans.draw

    def keep(config: SpanPlanSpec) -> None:
        raise CapturedCallError(config)

    monkeypatch.setattr(lmalgebra.lmd.spans.draw, "draw_run_spans", keep)
    args = ["spans", "--models", "a=./models/a", "--corpus.paths", "docs.txt", "-T", "8"]
    with pytest.raises(CapturedCallError) as caught:
        run_cli(*args, "--spans.counts", "20,5,5", "--spans.per_doc", "2", "--out", "s.jsonl")
    (plan,) = caught.value.configs
    assert isinstance(plan, SpanPlanSpec)
    assert (plan.spans.length, plan.spans.counts, plan.spans.per_doc) == (8, (20, 5, 5), 2)
    assert [m.name for m in plan.models] == ["a"]


def test_merge_train_flags_override_the_recipe_training(
    monkeypatch: pytest.MonkeyPatch, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    from lmalgebra.distill.masked.objective import MaskedObjective

    def keep(
        objective: Any, name: str, training: TrainingSpec, progress: bool, restart: bool = False
    ) -> None:
        raise CapturedCallError(name, training, progress)

    monkeypatch.setattr(MaskedObjective, "train", keep)
    data = {
        "languages": {"xx": {"corpus": {"paths": ["xx.txt"]}, "teachers": ["t"]}},
        "teachers": {"t": {"path": "./teacher"}},
        "training": {"steps": 50, "batch_size": 4, "lr": 0.002},
    }
    path = tmp_path / "merge.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    args = ["merge", "train", str(path), "--name", "sm2", "--no-progress"]
    with pytest.raises(CapturedCallError) as caught:
        run_cli(*args, "--training.steps", "7", "--training.gold_only", "--training.lr", "0.01")
    name, training, progress = caught.value.configs
    assert (name, progress) == ("sm2", False)
    assert (training.steps, training.gold_only, training.lr) == (7, True, 0.01)
    assert training.batch_size == 4  # from the recipe
    with pytest.raises(CapturedCallError) as caught:
        run_cli("merge", "train", str(path))
    assert caught.value.configs[1] == TrainingSpec(steps=50, batch_size=4, lr=0.002)


@pytest.mark.parametrize(
    ("given", "teachers"),
    [("t", ["t"]), ("t,u", ["t", "u"]), ("[t, u]", ["t", "u"]), ("{xx: [t]}", {"xx": ["t"]})],
)
def test_merge_train_takes_training_teachers_as_a_list_or_a_mapping(
    given: str,
    teachers: Any,
    monkeypatch: pytest.MonkeyPatch,
    run_cli: Callable[..., Any],
    tmp_path: Path,
) -> None:
    """``--training.teachers``, a list or a mapping in a recipe, had refused every value it
    was given ("Input should be a valid list", ``t`` and ``[t]`` alike)."""
    from lmalgebra.distill.masked.objective import MaskedObjective

    def keep(objective: Any, name: str, training: TrainingSpec, *_: Any, **__: Any) -> None:
        raise CapturedCallError(name, training)

    monkeypatch.setattr(MaskedObjective, "train", keep)
    data = {
        "languages": {"xx": {"corpus": {"paths": ["xx.txt"]}, "teachers": ["t", "u"]}},
        "teachers": {"t": {"path": "./t"}, "u": {"path": "./u"}},
    }
    path = tmp_path / "merge.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(CapturedCallError) as caught:
        run_cli("merge", "train", str(path), "--training.teachers", given)
    assert caught.value.configs[1].teachers == teachers


# --- bad values -------------------------------------------------------------------------------

BAD: dict[str, tuple[list[str], list[str]]] = {
    "tuple_too_short": (["--spans.counts", "20,5"], ["--spans.counts", "'20,5'", "3 values"]),
    "not_a_number": (["-T", "eight"], ["--spans.length", "-T", "'eight'", "integer"]),
    "not_a_choice": (["--pooling", "max"], ["--pooling", "'max'", "'mean'"]),
    "below_minimum": (["--batch_size", "0"], ["--batch_size", "'0'", "greater than"]),
    "list_item_not_a_number": (
        ["--study.lengths", "16,x"],
        ["--study.lengths", "'16,x'", "item 2:", "integer", "got 'x'"],
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_flag_values_name_the_flag(
    run_cli: Callable[..., Any], tmp_path: Path, case: str
) -> None:
    args, needles = BAD[case]
    code, _, err = run_cli("decompose", *FLAGS, *args, "--out", str(tmp_path / "out"))
    assert code == 2, err
    lines = re.findall(r"^error: .*$", err, flags=re.MULTILINE)
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("{xx: [t, 3]}", "key 'xx.1': Input should be a valid string, got 3"),
        ("{xx: t}", "key 'xx': Input should be a valid list, got 't'"),
    ],
)
def test_a_mapping_flag_names_the_key_inside_it(
    given: str, said: str, run_cli: Callable[..., Any], tmp_path: Path
) -> None:
    """``--training.teachers '{xx: [t, 3]}'`` (a mapping whose list holds a number) was refused
    as "Input should be a valid list", the first member of the union it tried: the flag's line
    names the key inside the value and what it holds, as a recipe's line does."""
    data = {
        "languages": {"xx": {"corpus": {"paths": ["xx.txt"]}, "teachers": ["t"]}},
        "teachers": {"t": {"path": "./t"}},
    }
    path = tmp_path / "merge.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    code, _, err = run_cli("merge", "train", str(path), "--training.teachers", given)
    assert code == 2 and f"--training.teachers {given!r}: {said}" in err, err


def test_every_flag_a_commands_help_names_is_its_own() -> None:
    """``pretrain head-only --help`` said every key has a flag, such as
    ``--tokenizer.vocab_size``, which head-only has not (it reads the encoder's tokenizer): a
    flag a command's description names is one of that command's options."""
    import re

    def leaves(command: Any, path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
        if not hasattr(command, "commands"):
            return [(path, command)]
        return [
            leaf
            for name in command.commands
            for leaf in leaves(command.commands[name], (*path, name))
        ]

    for path, command in leaves(typer.main.get_command(app), ()):
        if not path or path[0] == "demo":  # the demos' help names the commands they run
            continue
        said = (command.help or "").split("Example")[0]  # an example may run another command
        named = set(re.findall(r"(?<![\w`-])(--[a-z][\w.-]*[\w])", said))
        assert named <= set(command_options(*path)), (path, named - set(command_options(*path)))


def test_every_trust_remote_code_switch_takes_the_same_spelling() -> None:
    """``pretrain head-only`` named its switch by its key alone, ``--trust_remote_code``, and
    refused ``--trust-remote-code``, every other command's spelling, as no such option."""
    for path in (("decompose",), ("evaluate-pos",), ("pretrain", "head-only")):
        options = command_options(*path)
        assert "--trust-remote-code" in options and "--no-trust-remote-code" in options, path
    assert "--trust_remote_code" in command_options("pretrain", "head-only")  # the key's, kept
