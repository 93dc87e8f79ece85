"""Sweep (b): every file of a finished run (a masked and a causal MergeDistill run, a
decomposition and its cache) damaged each way of ``sweep_cases.DAMAGES`` (deleted, emptied, cut
to half, a byte changed with its time kept, replaced by ``{}``, a directory, a link to nothing, a
FIFO), then every command that reads it: ``merge verify``, the stage after the one that wrote it,
``merge evaluate``, ``report``, a decomposition resumed from the cache.

Files alike (the shards of one set, of another language or teacher, the checkpoints of other
steps) are one role (``role_of``); the first file of each role is damaged. Besides the rules of
``sweep_helpers.broken_rules``: ``merge verify`` passes no damaged file that a later command then
refuses.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from lmalgebra.distill.layout import EVALUATION, HASHES, RECIPE, SHARD_SETS, VOCAB
from sweep_cases import DAMAGES, readable_again
from sweep_helpers import Outcome, Rules, SweepServer, broken_rules, complete_marks, report

pytestmark = pytest.mark.sweep

NUMBERED = re.compile(r"\d{3,}")
HASHED = re.compile(r"^[0-9a-f]{2}$|[0-9a-f]{16,}")
READ_BY_TRAINING = ("topk", "logprobs", "tokens", VOCAB)


def role_of(relative: Path) -> str:
    """Files alike as one role: numbers and hashes in names, and the language and teacher
    directories of a shard set, left out."""
    parts = list(relative.parts)
    if parts[0] in SHARD_SETS:
        parts = [parts[0], *("*" for _ in parts[1:-1]), parts[-1]]
    return "/".join(NUMBERED.sub("N", HASHED.sub("H", part)) for part in parts)


def roles(root: Path) -> dict[str, Path]:
    """The first file of each role under ``root`` (links and directories left out)."""
    found: dict[str, Path] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        found.setdefault(role_of(path.relative_to(root)), path.relative_to(root))
    return found


def _copied_run(recipe: Path, target: Path) -> tuple[Path, Path]:
    """The run of ``recipe`` and its inputs copied to ``target``, the recipe pointing at the
    copy; (run, recipe)."""
    shutil.copytree(recipe.parent, target, symlinks=True)
    run, copied = target / "run", target / recipe.name
    data = yaml.safe_load(copied.read_text(encoding="utf-8"))
    copied.write_text(yaml.safe_dump({**data, "output_dir": str(run)}), encoding="utf-8")
    return run, copied


def merge_readers(part: str, run: Path, recipe: Path) -> list[list[str]]:
    """The commands that read a file of ``part`` (the run's top-level name), verify first."""
    verify = ["merge", "verify", str(run)]
    stages = ["merge", "run", str(recipe), "--no-progress"]
    evaluate = ["merge", "evaluate", str(run)]
    if part in READ_BY_TRAINING:
        return [verify, stages, ["merge", "train", str(recipe), "--name", "again", "--no-progress"]]
    if part in (*SHARD_SETS, HASHES, RECIPE):
        return [verify, stages, evaluate]
    if part == EVALUATION:
        return [verify, ["merge", "inspect", str(run)], evaluate]
    return [verify, evaluate, ["merge", "train", str(recipe), "--no-progress"]]  # a student


def _culprits(damaged: Path, top: Path) -> list[str]:
    """What a refusal may name: the damaged file or a directory holding it, up to ``top``."""
    names, path = [], damaged
    while path != top.parent:
        names.append(str(path))
        path = path.parent
    return names


def _checked(
    server: SweepServer, commands: list[list[str]], damaged: Path, top: Path, env: dict[str, str]
) -> Iterator[tuple[Outcome, list[str]]]:
    """Each command run in turn on the damaged copy; its outcome and the rules it broke, the
    verifier's pass of a file a later command refuses among them."""
    watched = top.parent
    verified = None
    for number, args in enumerate(commands):
        if verified is False and number > 1:
            break  # verify named the damage: the stage after it is enough to check further
        rules = Rules(culprits=_culprits(damaged, top), marks_before=complete_marks(watched))
        rules.watched = watched
        outcome = server.run(args, timeout=90, env=env)
        broken = broken_rules(outcome, rules)
        if args[:2] == ["merge", "verify"]:
            verified = outcome.code == 0
        elif verified and outcome.code == 2:
            broken.append("merge verify passed what this command refuses")
        yield outcome, broken


def _merge_faults(server: SweepServer, recipe: Path, damage: str, tmp_path: Path) -> list:
    faults = []
    for role, relative in roles(recipe.parent / "run").items():
        root = tmp_path / NUMBERED.sub("N", role).replace("/", "_")
        run, copied = _copied_run(recipe, root)
        DAMAGES[damage](run / relative)
        commands = merge_readers(relative.parts[0], run, copied)
        for outcome, broken in _checked(server, commands, run / relative, run, {}):
            if broken:
                faults.append((f"{role} {damage}", outcome, broken))
        readable_again(root)
        shutil.rmtree(root)
    return faults


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_masked_run(damage: str, masked_run, sweep_server, tmp_path: Path) -> None:
    faults = _merge_faults(sweep_server, masked_run.recipe, damage, tmp_path)
    assert not faults, report(faults)


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_causal_run(damage: str, causal_run, sweep_server, tmp_path: Path) -> None:
    faults = _merge_faults(sweep_server, causal_run.recipe, damage, tmp_path)
    assert not faults, report(faults)


@pytest.mark.parametrize("damage", DAMAGES)
def test_damaged_decomposition(damage: str, decomposition, sweep_server, tmp_path: Path) -> None:
    """A file of the outputs, read by ``report`` and by the same decomposition again; a file of
    the cache, read by the decomposition into a new output directory."""
    faults = []
    for place in ("out", "cache"):
        source = getattr(decomposition, place)
        for role, relative in roles(source).items():
            root = tmp_path / f"{place}-{NUMBERED.sub('N', role).replace('/', '_')}"
            out, cache = root / "out", root / "cache"
            shutil.copytree(decomposition.out, out)
            shutil.copytree(decomposition.cache, cache)
            damaged = root / place / relative
            DAMAGES[damage](damaged)
            again = [*decomposition.args, "--out", str(out if place == "out" else root / "new")]
            commands = [["report", str(out), "--out", str(root / "report")], again]
            env = {"LMALGEBRA_CACHE": str(cache)}
            for outcome, broken in _checked(sweep_server, commands, damaged, root / place, env):
                if broken:
                    faults.append((f"{place}/{role} {damage}", outcome, broken))
            readable_again(root)
            shutil.rmtree(root)
    assert not faults, report(faults)
