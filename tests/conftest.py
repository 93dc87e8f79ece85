"""Session fixtures: tiny local models and corpora (see ``tiny.py``), built once per session."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread for the suite and the processes it starts with its environment (set before
# torch loads): the tests' models are tiny, and on a shared machine torch's default of one thread
# per core spends most of its time waiting for a core (a test that embeds with MiniLM ran several
# times slower on two threads than on one, on two busy cores).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tiny import build_bert, build_gpt2, documents, sentences

__all__ = ["build_bert", "build_gpt2", "documents", "sentences"]


@pytest.fixture(autouse=True)
def _environment_kept() -> Iterator[None]:
    """Each test leaves the environment as it found it: a command run in-process sets variables
    (the command line quiets Hugging Face through them) that would reach every process a later
    test starts."""
    saved = dict(os.environ)
    yield
    if os.environ != saved:
        os.environ.clear()
        os.environ.update(saved)


# The longest modules first (measured with --durations): the two workers take whole modules in
# collection order (``--dist loadfile``), so a long module collected last leaves one worker
# running it alone at the end; first, the short ones fill in around it.
LONGEST_FIRST = (
    "test_kill_points.py",
    "test_causal_demo.py",
    "test_demo_quick.py",
    "test_faults.py",
    "test_causal_faults.py",
    "test_packaged_end_to_end.py",
    "test_report.py",
    "test_distributed.py",
    "test_side_by_side.py",
    "test_cli_errors.py",
    "test_cli_startup.py",
    "test_hostile_permissions.py",
    "test_report_browser.py",
    "test_hostile_verifier.py",
    "test_hostile_outputs.py",
    "test_merge_run.py",
    "test_precomputed.py",
    "test_pos_tagging.py",
    "test_bench_wide.py",
)


SWEEP = Path(__file__).parent / "robustness" / "sweep"


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The hostile-input sweep's folder not even collected by a run that leaves the sweep out
    (the default ``-m 'not slow and not sweep'``): its cases are generated from the command tree
    and the settings classes as it is collected."""
    if collection_path == SWEEP and "not sweep" in str(config.getoption("markexpr", "")):
        return True
    return None


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order kept within
    needs_device = [item for item in items if "gpu" in item.keywords]
    if needs_device:
        import torch

        if not torch.cuda.is_available():
            for item in needs_device:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device (marker gpu)"))


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bert(tmp_path_factory.mktemp("bert"))


@pytest.fixture(scope="session")
def bert2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Same tokenizer family, other weights and width."""
    return build_bert(tmp_path_factory.mktemp("bert2"), hidden=24, seed=1)


@pytest.fixture(scope="session")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_gpt2(tmp_path_factory.mktemp("gpt2"))


@pytest.fixture(scope="session")
def corpus_txt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """120 blank-line separated documents."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join(documents(120)) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def teacher_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny masked-LM teachers: 'wp' (BERT, WordPiece) and 'sp' (RoBERTa, SentencePiece BPE)."""
    from merge_fixtures import build_teachers

    return build_teachers(tmp_path_factory.mktemp("teachers"))


@pytest.fixture(scope="session")
def causal_teacher_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny causal teachers: 'bl' (byte-level BPE), 'uni' (unigram), 'wp' (WordPiece)."""
    from causal_fixtures import build_causal_teachers

    return build_causal_teachers(tmp_path_factory.mktemp("causal-teachers"))


@pytest.fixture
def cpu_without_bf16(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The CPU's flags read from a file that lists no bfloat16 instruction, and no override."""
    from lmalgebra.core import precision

    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\n", encoding="utf-8")
    monkeypatch.setattr(precision, "CPUINFO", path)
    monkeypatch.delenv(precision.ALLOW_SLOW_BF16, raising=False)
    return path


@pytest.fixture
def slow_bf16_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """bfloat16 allowed on any CPU (emulated where the flags are missing): numerics tests."""
    from lmalgebra.core import precision

    monkeypatch.setenv(precision.ALLOW_SLOW_BF16, "1")


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``cli([ARGS])``: ``lmalgebra ARGS`` run in-process (``hostile_helpers.run_cli``): exit
    status and stderr without colours."""
    from hostile_helpers import run_cli

    def run(args: list[str]) -> tuple[int, str]:
        return run_cli(args, monkeypatch, capsys)

    return run
