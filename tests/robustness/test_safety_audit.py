"""Safety audit: no pickle in the toolkit's own code, ``torch.load`` only with
``weights_only=True``, ``trust_remote_code`` only when asked for, and said in the log."""

from __future__ import annotations

import io
import logging
import re
import tokenize
from pathlib import Path

import pytest

from lmalgebra.distill.teachers import load_lm
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef

ROOT = Path(__file__).resolve().parents[2]
PICKLERS = r"(?:pickle|cPickle|_pickle|dill|cloudpickle|joblib|shelve|marshal)"
UNSAFE = {
    "pickle-like module": re.compile(rf"^\s*(?:import|from)\s+{PICKLERS}\b", re.MULTILINE),
    "pickle-like call": re.compile(rf"\b{PICKLERS}\.(?:loads?|dumps?|Unpickler|Pickler|open)\b"),
    "pandas pickle": re.compile(r"\b(?:read_pickle|to_pickle)\s*\("),
    "torch.save": re.compile(r"\btorch\.save\s*\("),
    "torch.load without weights_only=True": re.compile(
        r"\btorch\.load\s*\((?![^)]*weights_only\s*=\s*True)"
    ),
    "allow_pickle=True": re.compile(r"\ballow_pickle\s*=\s*True\b"),
    "pickle_module": re.compile(r"\bpickle_module\s*="),
    "trust_remote_code=True": re.compile(r"\btrust_remote_code\s*=\s*True\b"),
}


def code_of(text: str) -> str:
    """``text`` (Python source) with its strings and comments blanked, lines kept: a message
    that tells a user to pass ``trust_remote_code=True`` is no call that passes it."""
    lines = text.splitlines(keepends=True)
    kept = [list(line) for line in lines]
    skipped = {tokenize.STRING, tokenize.COMMENT}
    skipped |= {getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in skipped:
            continue
        (row, col), (end_row, end_col) = token.start, token.end
        for r in range(row, end_row + 1):
            first = col if r == row else 0
            last = end_col if r == end_row else len(kept[r - 1])
            for c in range(first, last):
                if kept[r - 1][c] != "\n":
                    kept[r - 1][c] = " "
    return "".join("".join(line) for line in kept)


def violations(text: str) -> list[str]:
    """Names of the unsafe patterns found in the code of ``text`` (Python source)."""
    code = code_of(text)
    return [name for name, pattern in UNSAFE.items() if pattern.search(code)]


def test_the_scanner_catches_each_pattern() -> None:
    samples = {
        "pickle-like module": "import pickle\n",
        "pickle-like call": "data = joblib.load(path)\n",
        "pandas pickle": "frame.to_pickle(path)\n",
        "torch.save": "torch.save(model.state_dict(), path)\n",
        "torch.load without weights_only=True": "state = torch.load(path, map_location='cpu')\n",
        "allow_pickle=True": "array = np.load(path, allow_pickle=True)\n",
        "pickle_module": "torch.load(f, weights_only=True, pickle_module=p)\n",
        "trust_remote_code=True": "AutoModel.from_pretrained(d, trust_remote_code=True)\n",
    }
    for name, sample in samples.items():
        assert name in violations(sample), name
    safe = (
        '"""Checkpoints without pickle: safetensors and JSON."""\n'
        "state = torch.load(path, weights_only=True)\n"
        "AutoModel.from_pretrained(d, trust_remote_code=ref.trust_remote_code)\n"
    )
    assert violations(safe) == []
    told = 'raise ValueError("pass trust_remote_code=True")  # or import pickle\n'
    assert violations(told) == []
    assert violations(told + "AutoModel.from_pretrained(d, trust_remote_code=True)\n")


def test_no_unsafe_serialisation_in_the_toolkit() -> None:
    # the toolkit and its benchmarks; tests may write hostile files (a pickled .npy) on purpose
    files = [*sorted((ROOT / "src").rglob("*.py")), *sorted((ROOT / "bench").glob("*.py"))]
    assert len(files) > 50
    found = {str(p.relative_to(ROOT)): v for p in files if (v := violations(p.read_text()))}
    assert found == {}


@pytest.mark.parametrize("allowed", [True, False])
def test_trust_remote_code_is_logged_when_used(
    bert_dir: Path, teacher_dirs, caplog: pytest.LogCaptureFixture, allowed: bool
) -> None:
    """The tiny models ship no code: the switch is logged as running nothing, never as running
    code (a model that ships some: tests/robustness/test_hostile_messages.py)."""
    from lmalgebra.core.remote_code import new_call

    caplog.set_level(logging.INFO)
    new_call()  # as a library call begins
    ref = ModelRef(name="tiny", path=str(bert_dir), trust_remote_code=allowed)
    source_of(ref, bert_dir).load_tokenizer()
    source_of(ref, bert_dir).load()
    teacher = ModelRef(name="wp", path=str(teacher_dirs["wp"]), trust_remote_code=allowed)
    load_lm(teacher, teacher_dirs["wp"], "masked")
    messages = [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if "running code shipped" in m]
    lines = [m for m in messages if "ships no code" in m]
    if not allowed:
        assert lines == []
        return
    nothing = "ships no code of its own: --trust-remote-code runs nothing for it"
    # once per model (its tokenizer and its weights had said so twice)
    assert lines == [
        f"model 'tiny' from {bert_dir} {nothing}",
        f"model 'wp' from {teacher_dirs['wp']} {nothing}",
    ]


def test_trust_remote_code_is_off_unless_asked_for() -> None:
    assert ModelRef.parse("a=some/model").trust_remote_code is False
    assert ModelRef(name="a", path="x").trust_remote_code is False
