"""``lmalgebra decompose`` as a user runs it: bad input -> exit 2 and one clear line, no traceback.

Each bad input runs in-process (``lmalgebra.cli.main`` with a patched ``sys.argv``, fast); a subset
also runs as ``python -m lmalgebra`` in a subprocess, exactly the way a user does.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from lmalgebra.cli import main

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
OUTPUTS = [
    "pairwise_r2_train.csv",
    "pairwise_r2_validation.csv",
    "pairwise_r2_test.csv",
    "group_r2.csv",
    "summary.json",
    "config.yaml",
    "pairwise_r2_test.png",
]
SMALL = ["-T", "8", "--spans.counts", "20,5,5"]  # enough to reach the embedding stage quickly


@dataclass(frozen=True)
class Fixtures:
    bert: Path
    bert2: Path
    gpt2: Path
    nan_bert: Path
    corpus: Path
    bad: Path  # directory of broken inputs
    cache: Path

    def models(self, *extra: str) -> list[str]:
        return ["--models", f"a={self.bert}", "--models", f"b={self.bert2}", *extra]

    def recipe(self, name: str, **changes: object) -> Path:
        """A valid recipe (two models, the corpus), with top-level keys changed or added."""
        data: dict[str, object] = {
            "models": [
                {"name": "a", "path": str(self.bert)},
                {"name": "b", "path": str(self.bert2)},
            ],
            "corpus": {"paths": [str(self.corpus)]},
            "spans": {"length": 8, "counts": [20, 5, 5]},
        }
        data.update(changes)
        path = self.bad / name
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path


def _nan_model(source: Path, target: Path) -> Path:
    """A copy of a tiny BERT whose embedding LayerNorm weight is NaN (every embedding would be
    NaN): refused when it is loaded, naming the weight."""
    import torch
    from transformers import AutoTokenizer, BertModel

    model = BertModel.from_pretrained(source)
    with torch.no_grad():
        model.embeddings.LayerNorm.weight.fill_(float("nan"))
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return target


@pytest.fixture(scope="session")
def fx(
    tmp_path_factory: pytest.TempPathFactory,
    bert_dir: Path,
    bert2_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
) -> Fixtures:
    bad = tmp_path_factory.mktemp("bad-inputs")
    (bad / "empty.txt").write_bytes(b"")
    (bad / "blank.txt").write_text("\n \n\t\n", encoding="utf-8")
    (bad / "latin1.txt").write_bytes("caf\xe9 au lait\n".encode("latin-1"))
    (bad / "not-a-model").mkdir()
    (bad / "not-a-model" / "model.safetensors").write_bytes(b"\0" * 16)
    (bad / "not-a-dataset").mkdir()
    return Fixtures(
        bert=bert_dir,
        bert2=bert2_dir,
        gpt2=gpt2_dir,
        nan_bert=_nan_model(bert_dir, tmp_path_factory.mktemp("nan-bert")),
        corpus=corpus_txt,
        bad=bad,
        cache=tmp_path_factory.mktemp("cli-cache"),
    )


def run_subprocess(args: list[str], fx: Fixtures, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "LMALGEBRA_CACHE": str(fx.cache),
        "TOKENIZERS_PARALLELISM": "false",
        "NO_COLOR": "1",
    }
    return subprocess.run(
        [sys.executable, "-m", "lmalgebra", "decompose", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture
def in_process(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], fx: Fixtures
) -> Callable[[list[str]], tuple[int | str | None, str]]:
    """Run ``lmalgebra decompose ARGS`` through ``cli.main``; return (exit code, stderr)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(fx.cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def run(args: list[str]) -> tuple[int | str | None, str]:
        monkeypatch.setattr(sys, "argv", ["lmalgebra", "decompose", *args])
        capsys.readouterr()
        try:
            main()
        except SystemExit as stop:
            code = stop.code
        else:
            code = 0
        return code, capsys.readouterr().err

    return run


def assert_user_error(code: int | str | None, stderr: str, out: Path, needles: list[str]) -> None:
    """Exit 2; the last thing on stderr is one ``error:`` line naming the culprit; no summary."""
    stderr = ANSI.sub("", stderr)
    assert code == 2, stderr
    assert "Traceback" not in stderr, stderr
    lines = re.findall(r"^error: .*$", stderr, flags=re.MULTILINE)
    assert len(lines) == 1, stderr
    assert stderr.rstrip().endswith(lines[0]), f"error message spans several lines:\n{stderr}"
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert not (out / "summary.json").exists()


# --- bad input ------------------------------------------------------------------------------

Case = Callable[[Fixtures, Path], tuple[list[str], list[str]]]

CASES: dict[str, Case] = {
    "missing_model_directory": lambda fx, tmp: (
        [*fx.models(), "--models", f"c={tmp / 'no-such-model'}", "--corpus.paths", str(fx.corpus)],
        ["model 'c'", str(tmp / "no-such-model"), "does not exist"],
    ),
    "directory_is_not_a_model": lambda fx, tmp: (
        [
            *fx.models()[:2],
            "--models",
            f"b={fx.bad / 'not-a-model'}",
            "--corpus.paths",
            str(fx.corpus),
        ],
        ["model 'b'", str(fx.bad / "not-a-model"), "config.json"],
    ),
    "corpus_missing": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(tmp / "nowhere.txt")],
        [str(tmp / "nowhere.txt"), "does not exist"],
    ),
    "corpus_empty": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.bad / "empty.txt")],
        [str(fx.bad / "empty.txt"), "no text"],
    ),
    "corpus_only_blank_lines": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.bad / "blank.txt")],
        [str(fx.bad / "blank.txt"), "no text"],
    ),
    "corpus_not_utf8": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.bad / "latin1.txt")],
        [str(fx.bad / "latin1.txt"), "UTF-8"],
    ),
    "corpus_directory_not_a_dataset": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.bad / "not-a-dataset")],
        [str(fx.bad / "not-a-dataset"), "state.json"],
    ),
    "corpus_missing_column": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(_jsonl(tmp)), "--corpus.text_column", "abstract"],
        [str(tmp / "docs.jsonl"), "'abstract'"],
    ),
    "span_length_zero": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "-T", "0"],
        ["span length T", "got 0"],
    ),
    "span_length_negative": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "-T", "-3"],
        ["span length T", "got -3"],
    ),
    "spans_too_long_for_the_documents": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "-T", "5000"],
        ["no training span of 5000 tokens"],
    ),
    "one_model": lambda fx, tmp: (
        ["--models", f"a={fx.bert}", "--corpus.paths", str(fx.corpus)],
        ["at least two models", "got 1"],
    ),
    "no_model": lambda fx, tmp: (
        ["--corpus.paths", str(fx.corpus)],
        ["command line: missing --models"],
    ),
    "duplicate_model_names": lambda fx, tmp: (
        ["--models", f"a={fx.bert}", "--models", f"a={fx.bert2}", "--corpus.paths", str(fx.corpus)],
        ["unique", "repeated: a"],
    ),
    "fractions_sum_above_one": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--spans.fractions", "0.5,0.5,0.5"],
        ["fractions", "[0.5, 0.5, 0.5]"],
    ),
    "fractions_negative": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--spans.fractions", "1.2,-0.1,-0.1"],
        ["fractions", "-0.1"],
    ),
    "fractions_not_numbers": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--spans.fractions", "most,some,rest"],
        ["--spans.fractions", "'most,some,rest'"],
    ),
    "target_not_among_models": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--target", "zeta", "--basis", "a"],
        ["target 'zeta'", "a, b"],
    ),
    "basis_contains_target": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--target", "a", "--basis", "b,a"],
        ["basis contains the target 'a'"],
    ),
    "basis_model_unknown": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--target", "a", "--basis", "omega"],
        ["basis model 'omega'"],
    ),
    "target_without_basis": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--target", "a"],
        ["--target and --basis"],
    ),
    "recipe_unknown_key": lambda fx, tmp: (
        [str(fx.recipe("unknown-key.yaml", bogus_key=3))],
        [str(fx.bad / "unknown-key.yaml"), "unknown key", "'bogus_key'"],
    ),
    "recipe_unknown_nested_key": lambda fx, tmp: (
        [str(fx.recipe("nested-key.yaml", spans={"lenght": 8}))],
        [str(fx.bad / "nested-key.yaml"), "unknown key", "'spans.lenght'"],
    ),
    "recipe_bad_value": lambda fx, tmp: (
        [str(fx.recipe("bad-value.yaml", pooling="max"))],
        [str(fx.bad / "bad-value.yaml"), "'pooling'"],
    ),
    "recipe_missing": lambda fx, tmp: (
        [str(tmp / "no-recipe.yaml")],
        [str(tmp / "no-recipe.yaml"), "does not exist"],
    ),
    "hub_id_offline": lambda fx, tmp: (
        [*fx.models()[:2], "--models", "x=some-org/some-model", "--corpus.paths", str(fx.corpus)],
        [
            "model 'x': 'some-org/some-model' could not be reached",
            "hub is offline (HF_HUB_OFFLINE is set)",
            "local directory or a package: model",
            "`lmalgebra packaged`",
        ],
    ),
    "reference_tokenizer_offline": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--reference_tokenizer", "some-org/tok"],
        ["reference_tokenizer 'some-org/tok': 'some-org/tok' could not be reached", "offline"],
    ),
    "reference_tokenizer_missing_directory": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--reference_tokenizer", str(tmp / "tok")],
        [f"reference_tokenizer '{tmp / 'tok'}'", "does not exist", "model of this run: a, b"],
    ),
    "layer_out_of_range": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), *SMALL, "--layer", "7"],
        ["layer 7", "'a'", "0..2 or -3..-1"],
    ),
    "layer_out_of_range_negative": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), *SMALL, "--layer", "-4"],
        ["layer -4", "'a'"],
    ),
    "nan_embeddings": lambda fx, tmp: (
        [*fx.models(), "--models", f"sick={fx.nan_bert}", "--corpus.paths", str(fx.corpus), *SMALL],
        ["model 'sick'", "holds NaN or inf", "embeddings.LayerNorm.weight"],
    ),
    # studies
    "study_lengths_empty": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), *SMALL, "--study.lengths", ""],
        ["list of span lengths T is empty"],
    ),
    "study_length_zero": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), *SMALL, "--study.lengths", "8,0"],
        ["span length T", "0"],
    ),
    "study_alpha_grid_not_positive": lambda fx, tmp: (
        [
            *fx.models(),
            "--corpus.paths",
            str(fx.corpus),
            *SMALL,
            "--study.alpha_select",
            "gcv",
            "--study.alpha_grid",
            "0.1,-1",
        ],
        ["alpha grid", "-1"],
    ),
    "study_layer_map_unknown_model": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), *SMALL, "--study.layer_map", "a,zz"],
        ["layer_map model 'zz'"],
    ),
    "study_by_language_without_languages": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), *SMALL, "--study.languages"],
        ["LANG=PATH", "language_column"],
    ),
    "study_length_sweep_with_precomputed_model": lambda fx, tmp: (
        [
            *fx.models("--models", f"c=precomputed:{tmp / 'c.npy'}"),
            "--corpus.paths",
            str(fx.corpus),
            *SMALL,
            "--study.lengths",
            "4,8",
        ],
        ["model 'c'", "precomputed", "span-length"],
    ),
    "study_folds_above_blocks": lambda fx, tmp: (
        [
            *fx.models(),
            "--corpus.paths",
            str(fx.corpus),
            *SMALL,
            "--study.alpha_select",
            "kfold",
            "--study.blocks",
            "4",
            "--study.folds",
            "9",
        ],
        ["folds", "9"],
    ),
    # a switch given a value (docs/scale.md had `--study.similarity false`): `false` had been
    # read as the recipe, "recipe false does not exist" alone; the switch is named
    "switch_given_a_value": lambda fx, tmp: (
        [*fx.models(), "--corpus.paths", str(fx.corpus), "--study.similarity", "false"],
        ["--study.similarity is a switch and takes no value", "'false'"],
    ),
}

# the ones also run as a real `python -m lmalgebra` subprocess (about 5 s each: most of them
# under `make test-slow`, every one also in-process above)
SLOW = pytest.mark.slow
SUBPROCESS_CASES = [
    "missing_model_directory",
    pytest.param("corpus_empty", marks=SLOW),
    pytest.param("span_length_zero", marks=SLOW),
    "recipe_unknown_key",
    pytest.param("hub_id_offline", marks=SLOW),
    pytest.param("reference_tokenizer_offline", marks=SLOW),
    pytest.param("layer_out_of_range", marks=SLOW),
    "nan_embeddings",
    pytest.param("study_lengths_empty", marks=SLOW),
]


def _jsonl(tmp: Path) -> Path:
    path = tmp / "docs.jsonl"
    path.write_text(json.dumps({"text": "some words here"}) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_in_process(
    case: str, fx: Fixtures, tmp_path: Path, in_process: Callable[..., tuple[int, str]]
) -> None:
    args, needles = CASES[case](fx, tmp_path)
    out = tmp_path / "out"
    code, stderr = in_process([*args, "--out", str(out)])
    assert_user_error(code, stderr, out, needles)


@pytest.mark.parametrize("case", SUBPROCESS_CASES)
def test_bad_input_subprocess(case: str, fx: Fixtures, tmp_path: Path) -> None:
    args, needles = CASES[case](fx, tmp_path)
    out = tmp_path / "out"
    proc = run_subprocess([*args, "--out", str(out)], fx, tmp_path)
    assert_user_error(proc.returncode, proc.stderr, out, needles)
    assert "error" not in proc.stdout.lower()


# --- a successful run -----------------------------------------------------------------------


@pytest.fixture(scope="session")
def good_run(
    fx: Fixtures, tmp_path_factory: pytest.TempPathFactory
) -> tuple[subprocess.CompletedProcess[str], Path]:
    work = tmp_path_factory.mktemp("good-run")
    out = work / "out"
    args = [
        *fx.models("--models", f"c={fx.gpt2}"),
        "--corpus.paths",
        str(fx.corpus),
        "-T",
        "8",
        "--spans.counts",
        "200,25,25",
        "--figures",
        "--out",
        str(out),
    ]
    return run_subprocess(args, fx, work), out


def _rows(path: Path) -> list[list[str]]:
    with path.open(encoding="utf-8", newline="") as handle:
        return list(csv.reader(handle))


def test_successful_run_writes_every_output(
    good_run: tuple[subprocess.CompletedProcess[str], Path],
) -> None:
    proc, out = good_run
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not re.search(r"^error:", ANSI.sub("", proc.stderr), flags=re.MULTILINE)
    for name in OUTPUTS:
        assert (out / name).is_file(), name
        assert (out / name).stat().st_size > 0, name
    assert (out / "pairwise_r2_test.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    for split in ("train", "validation", "test"):
        rows = _rows(out / f"pairwise_r2_{split}.csv")
        assert rows[0] == ["target \\ basis", "a", "b", "c"]
        assert [r[0] for r in rows[1:]] == ["a", "b", "c"]
        for i, row in enumerate(rows[1:], start=1):
            assert row[i] == ""  # a model is not fitted on itself
            others = [float(v) for j, v in enumerate(row[1:], start=1) if j != i]
            assert all(v <= 1 for v in others)
    group = _rows(out / "group_r2.csv")
    assert group[0] == ["target", "train", "validation", "test"]
    assert [r[0] for r in group[1:]] == ["a", "b", "c", "mean"]
    train = [float(r[1]) for r in group[1:4]]
    assert all(0 < v <= 1 for v in train)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete"
    assert summary["models"] == ["a", "b", "c"]
    assert summary["spans"] == {"train": 200, "validation": 25, "test": 25}
    assert summary["group_r2"]["a"]["train"] == pytest.approx(train[0], abs=1e-6)

    config = yaml.safe_load((out / "config.yaml").read_text())
    assert [m["name"] for m in config["models"]] == ["a", "b", "c"]
    assert config["spans"]["length"] == 8
    assert config["spans"]["counts"] == [200, 25, 25]
    provenance = json.loads((out / "provenance.json").read_text())
    assert set(provenance["models"]) == {"a", "b", "c"}
    assert "torch" in provenance["versions"]
    assert "outputs in" in proc.stdout


@pytest.mark.parametrize("override_length", [False, True])
def test_yaml_recipe_gives_the_same_results_as_flags(
    good_run: tuple[subprocess.CompletedProcess[str], Path],
    fx: Fixtures,
    tmp_path: Path,
    in_process: Callable[..., tuple[int, str]],
    override_length: bool,
) -> None:
    proc, flags_out = good_run
    assert proc.returncode == 0, proc.stderr
    recipe = {
        "models": [
            {"name": "a", "path": str(fx.bert)},
            {"name": "b", "path": str(fx.bert2)},
            {"name": "c", "path": str(fx.gpt2)},
        ],
        "corpus": {"paths": [str(fx.corpus)]},
        # flags given on the command line win over the recipe
        "spans": {"length": 16 if override_length else 8, "counts": [200, 25, 25]},
        "out": str(tmp_path / "ignored-out") if override_length else str(tmp_path / "out"),
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    args = [str(path)]
    if override_length:
        args += ["-T", "8", "--out", str(tmp_path / "out")]
    code, stderr = in_process(args)
    assert code == 0, stderr
    out = tmp_path / "out"
    assert not (tmp_path / "ignored-out").exists()
    assert (out / "group_r2.csv").read_text() == (flags_out / "group_r2.csv").read_text()
    for split in ("train", "validation", "test"):
        name = f"pairwise_r2_{split}.csv"
        assert (out / name).read_text() == (flags_out / name).read_text()


RERUN_FAILURES: dict[str, Callable[[Fixtures, Path], list[str]]] = {
    "missing_model": lambda fx, tmp: [*fx.models(), "--models", f"c={tmp / 'gone'}"],
    "bad_layer": lambda fx, tmp: [*fx.models(), *SMALL, "--layer", "7"],
    "empty_corpus": lambda fx, tmp: [*fx.models(), "--corpus.paths", str(fx.bad / "empty.txt")],
}


@pytest.mark.parametrize(
    "failure",
    [
        *RERUN_FAILURES,
        pytest.param("invalid_option"),
    ],
)
def test_failed_rerun_leaves_the_finished_run_untouched(
    good_run: tuple[subprocess.CompletedProcess[str], Path],
    fx: Fixtures,
    tmp_path: Path,
    in_process: Callable[..., tuple[int, str]],
    failure: str,
) -> None:
    proc, good_out = good_run
    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    shutil.copytree(good_out, out)
    assert (out / "summary.json").is_file()
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    if failure == "invalid_option":
        args = [*fx.models(), "-T", "0"]
    else:
        args = RERUN_FAILURES[failure](fx, tmp_path)
    if "--corpus.paths" not in args:
        args += ["--corpus.paths", str(fx.corpus)]
    code, stderr = in_process([*args, "--out", str(out)])
    assert code == 2, stderr
    # a rejected or failed command never touches the finished run it was aimed at
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


# --- bugs -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["data[v2].txt", "notes[bold].txt", "drafts[/old].txt"])
def test_error_message_keeps_brackets_in_paths(
    fx: Fixtures, tmp_path: Path, in_process: Callable[..., tuple[int, str]], name: str
) -> None:
    missing = tmp_path / name
    out = tmp_path / "out"
    code, stderr = in_process([*fx.models(), "--corpus.paths", str(missing), "--out", str(out)])
    assert_user_error(code, stderr, out, [str(missing), "does not exist"])


@pytest.mark.parametrize("name", ["notes[bold]", "drafts[/old]"])
def test_what_a_command_prints_keeps_brackets_in_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A command's lines and tables print paths and names as written: rich had read their
    brackets as styles (``notes.yaml`` shown for ``notes[bold].yaml``, the plan's ``[this
    run]`` dropped) or stopped with a traceback at ``[/old]``, once the work was done."""
    from hostile_helpers import run_main

    monkeypatch.chdir(tmp_path)
    code, out, err = run_main(["merge", "init", f"{name}.yaml"], monkeypatch, capsys)
    assert code == 0 and "Traceback" not in err, err
    assert f"then lmalgebra merge run {name}.yaml" in " ".join(out.split())


def test_misspelled_recipe_key_is_named(
    fx: Fixtures, tmp_path: Path, in_process: Callable[..., tuple[int, str]]
) -> None:
    recipe = fx.recipe("typo.yaml")
    data = yaml.safe_load(recipe.read_text())
    data["corpuss"] = data.pop("corpus")
    recipe.write_text(yaml.safe_dump(data), encoding="utf-8")
    out = tmp_path / "out"
    code, stderr = in_process([str(recipe), "--out", str(out)])
    assert_user_error(code, stderr, out, [str(recipe), "unknown key", "'corpuss'"])
