"""The public surface: every exported name resolves, every name the README and the documentation
tell users to use exists, every API call runs quietly, and experimental features say so wherever
users meet them."""

from __future__ import annotations

import importlib
import inspect
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import lmalgebra
from lmalgebra.api.runtime import ENTRY_POINT
from lmalgebra.core import plugins

ROOT = Path(__file__).resolve().parents[2]
FILE_SUFFIXES = (".json", ".lock", ".yaml", ".csv", ".md", ".html")


def _manual() -> str:
    """README.md and every page of the documentation site (docs/), as one text."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return "\n".join(page.read_text(encoding="utf-8") for page in pages)


def _resolve(dotted: str) -> Any:
    """The object ``dotted`` names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[cut:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_every_exported_name_resolves() -> None:
    for module in (lmalgebra, importlib.import_module("lmalgebra.experimental")):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"
    assert set(lmalgebra.__all__) >= {"decompose_recipe", "merge_plan", "TrainingSpec", "quiet"}
    assert set(lmalgebra.__all__) >= {"DecomposeConfig", "MergeRecipe", "LinearDecomposition"}


def test_every_name_the_manual_uses_resolves() -> None:
    text = _manual()
    dotted = set(re.findall(r"(?<![\w/.\-])lmalgebra(?:\.\w+)+", text))
    dotted = {d for d in dotted if not d.endswith(FILE_SUFFIXES)}
    imported = re.findall(r"^\s*from (lmalgebra[\w.]*) import ([\w, ]+)$", text, re.MULTILINE)
    names = dotted | {
        f"{module}.{n.strip()}" for module, found in imported for n in found.split(",")
    }
    assert {"lmalgebra.decompose", "lmalgebra.experimental.select_teachers"} <= names
    names -= {plugins.CAUSAL_LOSSES, plugins.EMBEDDING_INITS}  # entry-point groups, not names
    missing = []
    for name in sorted(names):
        try:
            _resolve(name)
        except (AttributeError, ModuleNotFoundError):
            missing.append(name)
    assert not missing, f"names in README.md or docs/ that do not resolve: {missing}"


def test_experimental_names_point_to_their_new_home() -> None:
    for name in ("select_teachers", "TeacherSelection"):
        assert name not in lmalgebra.__all__
        with pytest.raises(AttributeError, match=rf"use lmalgebra\.experimental\.{name}"):
            getattr(lmalgebra, name)


def _help(*args: str) -> str:
    """``lmalgebra ARGS --help`` as one line of words (no frame, no wrapping)."""
    from typer.testing import CliRunner

    from lmalgebra.cli import app

    output = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "300"}).output
    return " ".join(re.sub(r"[│╭╮╰╯─]", " ", output).split())


def test_experimental_features_say_so_where_users_meet_them() -> None:
    from lmalgebra.distill.run.starter_recipe import STARTER
    from lmalgebra.distill.student import MaskedStudentSpec
    from lmalgebra.experimental import FEATURES
    from lmalgebra.train.config import CausalTrainingSpec

    manual = _manual()
    for feature in FEATURES:
        heading = rf"^#+ {re.escape(feature.section)}$"
        assert re.search(heading, manual, re.MULTILINE) or f"**{feature.section}**" in manual
    assert "(experimental: its score's Spearman" in _help("experimental", "select")
    assert "MinED-KL and ULD are experimental" in _help("demo")
    seeding = MaskedStudentSpec.model_fields["init_embeddings"].description or ""
    assert "teachers is experimental" in seeding
    losses = CausalTrainingSpec.model_fields["objective_mix"].description or ""
    assert "mined_kl and uld are experimental" in losses
    assert "init_embeddings: random      # teachers (experimental)" in STARTER


def _public_callables() -> list[tuple[str, Any]]:
    """Every public function of the API and public method of its result classes."""
    found = []
    for module, names in (
        (lmalgebra, lmalgebra.__all__),
        (
            importlib.import_module("lmalgebra.experimental"),
            ["select_teachers", "TeacherSelection"],
        ),
    ):
        for name in names:
            value = getattr(module, name)
            if not getattr(value, "__module__", "").startswith("lmalgebra.api."):
                continue
            if inspect.isfunction(value):
                found.append((name, value))
            elif inspect.isclass(value):
                for attr, member in vars(value).items():
                    function = getattr(member, "__func__", member)  # classmethods
                    if not attr.startswith("_") and inspect.isfunction(function):
                        found.append((f"{name}.{attr}", function))
    return found


# pure accessors over tables already in memory: nothing of a third party runs in them
ACCESSORS = {"Decomposition.pairwise", "Decomposition.from_result", "quiet"}


def test_every_api_call_runs_inside_the_library_set_up() -> None:
    callables = dict(_public_callables())
    assert {"decompose", "merge", "Decomposition.load", "MergeRun.evaluate"} <= set(callables)
    bare = [n for n, f in callables.items() if n not in ACCESSORS and not hasattr(f, ENTRY_POINT)]
    assert not bare, f"API calls without library_call: {bare}"


QUIET_SCRIPT = """
import logging, sys
logging.basicConfig(level=logging.INFO)  # a notebook that shows every INFO record
from transformers.utils import logging as hf_logging
hf_logging.set_verbosity_info()
hf_logging.enable_progress_bar()
import lmalgebra
from sentence_transformers import SentenceTransformer
try:
    from sentence_transformers.sentence_transformer import modules
except ImportError:
    from sentence_transformers import models as modules
bert, bert2, corpus = sys.argv[1:4]

def encoder():
    word = modules.Transformer(bert, max_seq_length=64)
    width = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    return SentenceTransformer(modules=[word, modules.Pooling(width())], device="cpu")

logging.getLogger("sentence_transformers").setLevel(logging.INFO)
loaded = encoder()  # the caller's own load: transformers' bar shows
print("<<call>>", file=sys.stderr, flush=True)
lmalgebra.decompose({"st": loaded, "b": bert2}, corpus, spans={"length": 8, "counts": (30, 10, 10)})
lmalgebra.spans({"b": bert2}, corpus, spans={"length": 8, "counts": (30, 10, 10)})
with lmalgebra.quiet():
    encoder()
print("<<after>>", file=sys.stderr, flush=True)
assert hf_logging.get_verbosity() == hf_logging.INFO and hf_logging.is_progress_bar_enabled()
assert logging.getLogger("sentence_transformers").level == logging.INFO
encoder()  # the caller's settings are back: the bar shows again
"""


def test_calls_silence_transformers_and_sentence_transformers(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    pytest.importorskip("sentence_transformers")
    script = tmp_path / "notebook.py"
    script.write_text(QUIET_SCRIPT, encoding="utf-8")
    args = [sys.executable, str(script), str(bert_dir), str(bert2_dir), str(corpus_txt)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    before, rest = done.stderr.split("<<call>>\n")
    during, after = rest.split("<<after>>\n")
    assert "Loading weights" in before and "Loading weights" in after  # the check can see them
    leaked = [
        line
        for line in during.splitlines() + done.stdout.splitlines()
        if line.strip() and not line.startswith(("INFO:lmalgebra.", "WARNING:lmalgebra."))
    ]
    assert not leaked, leaked


def test_importing_experimental_warns_once_and_the_command_line_stays_silent() -> None:
    """``import lmalgebra.experimental`` warns once however often it is imported; the command
    line reads ``experimental select``'s settings without a warning (it warns when the command
    runs)."""
    import subprocess
    import sys

    code = (
        "import warnings; warnings.simplefilter('always');"
        "import lmalgebra.experimental; import lmalgebra.experimental as again;"
        "from lmalgebra.experimental import FEATURES; print(len(FEATURES))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("ExperimentalWarning") == 1 and done.stdout.strip() == "4"
    main = "from lmalgebra.cli import main; main()"
    cli = subprocess.run(
        [sys.executable, "-W", "always", "-c", main, "merge", "--help"],
        capture_output=True,
        text=True,
    )
    assert cli.returncode == 0 and "ExperimentalWarning" not in cli.stderr, cli.stderr


def test_the_documented_spellings_reach_their_modules_after_import_lmalgebra() -> None:
    """``lmalgebra.api.pretrain.pretrain`` (the API reference's spelling) and
    ``lmalgebra.experimental.select_teachers`` (which ``lmalgebra.select_teachers``'s refusal
    names) had raised ``AttributeError`` after ``import lmalgebra`` alone, and so had
    ``lmalgebra.demo.workflow.run_demo`` (docs/getting-started.md's)."""
    import subprocess
    import sys

    code = (
        "import lmalgebra; print(lmalgebra.api.pretrain.pretrain.__name__,"
        " lmalgebra.experimental.select_teachers.__name__, hasattr(lmalgebra.api, 'nothing'),"
        " lmalgebra.demo.workflow.run_demo.__name__, hasattr(lmalgebra.demo, 'nothing'))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["pretrain", "select_teachers", "False", "run_demo", "False"]
