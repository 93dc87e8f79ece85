"""The fast part of the hostile-input sweep, in the default run: every path argument that is all
its command needs (``merge verify RUN_DIR``, ``decompose RECIPE``...; found in the command tree
by ``sweep_cases.lone_arguments``) given the three hostile paths that have hung or looped readers,
in this process, each within a deadline. The whole sweep runs with ``make test-sweep``
(``tests/robustness/sweep/``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from hostile_helpers import deadline, run_main
from sweep_cases import HOSTILE_PATHS, hostile_path, is_valid, lone_arguments
from sweep_helpers import Outcome, Rules, broken_rules, complete_marks

# three of the hostile paths, those that have hung or looped a reader: a FIFO (open blocks
# until a writer comes), /dev/zero (endless), a link to itself
KINDS = ("fifo", "dev_zero", "link_loop")
CASES = [(p, k) for p in lone_arguments() for k in KINDS if not is_valid(p, k)]


def test_the_lone_arguments_are_found() -> None:
    """The command tree's walk finds the commands whose one path argument is all they need,
    and not one that needs a flag besides (``evaluate-pos`` needs ``--models``)."""
    found = {p.command for p in lone_arguments()}
    assert {("merge", "verify"), ("merge", "train"), ("decompose",), ("report",)} <= found
    assert ("evaluate-pos",) not in found
    assert set(KINDS) <= set(HOSTILE_PATHS)


@pytest.mark.parametrize(("parameter", "kind"), CASES, ids=[f"{p.id}-{k}" for p, k in CASES])
def test_a_hostile_lone_argument(
    parameter, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    value = hostile_path(tmp_path, kind)
    rules = Rules(
        culprits=[value.name, parameter.name.upper(), "a-file"],
        marks_before=complete_marks(tmp_path),
        watched=tmp_path,
    )
    args = [*parameter.command, *parameter.given(str(value))]
    with deadline(30):
        code, out, err = run_main(args, monkeypatch, capsys)
    outcome = Outcome(tuple(args), code, out + err, 0.0)
    broken = broken_rules(outcome, rules)
    assert not broken, f"{'; '.join(broken)}\n{outcome.shown()}"
