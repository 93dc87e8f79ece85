"""The command line parses, helps and refuses bad input without importing the heavy libraries.

Importing torch and transformers takes seconds on a loaded machine (numpy and pyarrow a third of a
second more); a user asking for ``--help`` or mistyping a recipe path should not wait for them. Each
case runs the command line in a fresh interpreter and lists the heavy modules it imported: a check
of what is imported, not a timing.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# typer.rich_utils: typer's help tables (about 60 ms), for a help or a usage error alone
HEAVY = ("torch", "transformers", "sklearn", "scipy", "pandas", "matplotlib", "numpy", "pyarrow")
HELP = "typer.rich_utils"

SCRIPT = f"""
import json, sys
from lmalgebra.cli import main
sys.argv = ["lmalgebra", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    code = stop.code
else:
    code = 0
heavy = [m for m in {(*HEAVY, HELP)!r} if m in sys.modules]
print("<<imports>>" + json.dumps({{"code": code, "heavy": heavy}}), file=sys.stderr)
"""


def _run(*args: str) -> tuple[int, list[str], str]:
    """Exit status, heavy modules imported and stderr of ``lmalgebra ARGS`` in a new process."""
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=120
    )
    head, _, tail = done.stderr.rpartition("<<imports>>")
    assert tail, done.stderr[-2000:]
    found = json.loads(tail)
    return int(found["code"] or 0), found["heavy"], head


@pytest.mark.parametrize(
    "command",
    [["--help"], ["decompose", "--help"], ["merge", "--help"], ["experimental", "select", "-h"]],
)
def test_help_imports_no_heavy_library(command: list[str]) -> None:
    code, heavy, _ = _run(*command)
    assert code == 0
    assert heavy == [HELP]


def test_missing_recipe_refused_without_heavy_library(tmp_path: Path) -> None:
    missing = tmp_path / "absent.yaml"
    code, heavy, err = _run("decompose", str(missing))
    assert code == 2
    assert "does not exist" in err and str(missing.name) in err
    assert heavy == []


def test_bad_flag_value_refused_without_heavy_library() -> None:
    code, heavy, _ = _run("decompose", "--spans.length", "many")
    assert code == 2
    assert heavy == []


def test_a_cached_decompose_imports_neither_torch_transformers_nor_pandas(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    """Run again over its cached embeddings, a decomposition computes with NumPy and SciPy alone:
    the first run embeds (torch), the second must not import torch or transformers, nor pandas
    (the command prints the summary; the DataFrames are made when asked for). Only under a
    CPU-only torch: elsewhere the device ``auto`` resolves to is torch's to say."""
    from lmalgebra.core.precision import _cpu_only_torch

    if not _cpu_only_torch():
        pytest.skip("a torch build with CUDA is asked whether a GPU is there")
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--cache_dir", str(tmp_path / "cache"), "--no-progress"]
    first, heavy, err = _run(*args, "--out", str(tmp_path / "first"))
    assert first == 0, err[-2000:]
    assert "torch" in heavy  # the models were embedded
    again, heavy, err = _run(*args, "--out", str(tmp_path / "again"))
    assert again == 0, err[-2000:]
    assert not {"torch", "transformers", "pandas"} & set(heavy), heavy
    assert "scipy" in heavy  # it did compute


def test_dequantising_a_gguf_file_draws_no_bar_of_transformers(
    gpt2_dir: Path, corpus_txt: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """transformers draws its GGUF dequantisation with tqdm directly, past its own progress-bar
    switch: the command line silences it as it does transformers' other bars."""
    from gguf_fixtures import tiny_llama, write_llama_gguf

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    path = write_llama_gguf(*tiny_llama(), tmp_path / "tiny-llama.gguf")
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={gpt2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    code, _, err = _run(*args, "--out", str(tmp_path / "run"), "--no-progress")
    assert code == 0, err[-2000:]
    assert (tmp_path / "cache" / "gguf").is_dir()  # it did dequantise
    assert "de-quantizing" not in err and "it/s" not in err, err[-2000:]
