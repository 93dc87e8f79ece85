"""Command-line start-up: help and a refused recipe, idle and beside a competing process.

What a user waits for before anything is computed: ``lmalgebra --help``, ``lmalgebra decompose
--help`` and ``lmalgebra decompose absent.yaml`` (refused in one line, exit status 2), each as a
whole command (``python -m lmalgebra``) in a fresh interpreter. Baseline: the command line at
commit ``--baseline`` (checked out from git into bench/_work; it imported torch, and with it
numpy's and torch's thread pools, before parsing its arguments). Ours: this checkout, which
imports torch only in the commands that compute. Each figure is the median of ``--repeats``
runs, idle (after waiting for idle CPUs) and with one competing process spinning on one core
(what another job does to a shared two-core host).

    python bench/bench_startup.py [--baseline 535291d] [--repeats 7] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from harness import (
    ROOT,
    WORK,
    Session,
    competing_process,
    figure,
    goal,
    parse_args,
    run_command,
    wait_for_idle,
)

NAME = "bench_startup"
MEASURED = ("src/lmalgebra/cli", "src/lmalgebra/core", "src/lmalgebra/lmd/config.py")
CASES = {
    "lmalgebra --help": ["--help"],
    "lmalgebra decompose --help": ["decompose", "--help"],
    "lmalgebra decompose absent.yaml (refused)": ["decompose", "absent.yaml"],
}


def baseline_source(commit: str) -> Path:
    """``src/`` of ``commit``, exported into bench/_work once."""
    target = WORK / f"startup-{commit}"
    if not (target / "src" / "lmalgebra" / "cli").is_dir():
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        archive = subprocess.run(
            ["git", "archive", commit, "src"], cwd=ROOT, capture_output=True, check=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "src"


def timed(source: Path, args: list[str], repeats: int) -> dict[str, Any]:
    """The median wall time of ``repeats`` runs of ``python -m lmalgebra ARGS`` on ``source``,
    with other processes' largest share of those runs."""
    env = {**os.environ, "PYTHONPATH": str(source), "HF_HUB_OFFLINE": "1"}
    refused = args[-1].endswith(".yaml")
    # output discarded (the terminal's speed is not the command's); status 2 is what a refusal
    # should give, so it counts as success there
    script = '"$@" >/dev/null 2>&1; s=$?' + ("; [ $s -eq 2 ] && s=0" if refused else "")
    command = ["sh", "-c", script + "; exit $s", "sh", sys.executable, "-m", "lmalgebra", *args]
    runs = [run_command(command, env=env) for _ in range(repeats)]
    return {
        "seconds": statistics.median(r["seconds"] for r in runs),
        "others_share": max(r["others_share"] for r in runs),
    }


def measure(sources: dict[str, Path], repeats: int, loaded: bool) -> dict[tuple[str, str], Any]:
    """Every case for both contenders, idle or beside one competing process."""
    found: dict[tuple[str, str], Any] = {}
    for case, args in CASES.items():
        for who, source in sources.items():
            if loaded:
                with competing_process():
                    found[case, who] = timed(source, args, repeats)
            else:
                wait_for_idle()
                found[case, who] = timed(source, args, repeats)
            print(
                f"  {case}, {who}, {'loaded' if loaded else 'idle'}: "
                f"{found[case, who]['seconds']:.3f} s",
                flush=True,
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default="535291d", help="commit of the baseline CLI")
    parser.add_argument("--repeats", type=int, default=7, help="runs per figure (median)")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)
    sources = {"baseline": baseline_source(args.baseline), "ours": ROOT / "src"}
    figures = []
    for loaded in (False, True):
        found = measure(sources, args.repeats, loaded)
        for case in CASES:
            base, ours = found[case, "baseline"], found[case, "ours"]
            label = f"{case}, {'one competing process' if loaded else 'idle'}"
            figures.append(
                figure(
                    label,
                    "s",
                    base["seconds"],
                    ours["seconds"],
                    others_share=(base["others_share"], ours["others_share"]),
                )
            )
    idle = max(f["ours"] for f in figures if f["case"].endswith("idle"))
    loaded = max(f["ours"] for f in figures if not f["case"].endswith("idle"))
    targets = [
        goal("help and a refusal in under 0.5 s idle", idle < 0.5, f"slowest {idle:.2f} s"),
        goal("... and under 1 s beside a competing process", loaded < 1, f"slowest {loaded:.2f} s"),
    ]
    sizes = {"baseline commit": args.baseline, "repeats": args.repeats}
    notes = [
        "Others: the competing process is counted among other processes when loaded.",
        "Peak RSS is not recorded: wait4's ru_maxrss of the command counts the pages of the "
        "benchmark process that forked it.",
    ]
    session.save(__doc__, sizes, figures, targets=targets, notes=notes, write=not args.no_write)


if __name__ == "__main__":
    main()
