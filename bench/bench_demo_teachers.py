"""Demo teachers: the demo's four teachers trained side by side vs one after another.

The demo's first step at its full sizes (``demo.plan.FULL``): three small BERT teachers (2 x 128,
WordPiece 3,000, 1,000 steps of 32 x 64 tokens) on the packaged English, French and Spanish
Wikipedia leads, and the head-only English teacher (the packaged MiniLM with a masked-LM head
fitted for 300 steps). Baseline: the four one after another in one process on all of torch's
threads (the demo before side-by-side steps). Ours: ``demo.side_by_side``, as ``make demo`` runs
them, torch's threads shared out among processes (two processes of one thread on two cores).
Both train the same models on the same data; the weights differ in rounding only (thread
counts differ).

    python bench/bench_demo_teachers.py [--teacher-steps 1000] [--no-write]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from dataclasses import replace
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from harness import WORK, Session, fastest, figure, parse_args, run_contender

NAME = "bench_demo_teachers"
MEASURED = ("src/lmalgebra/demo", "src/lmalgebra/distill/pretrain", "src/lmalgebra/train")


def contender(which: str, teacher_steps: int) -> Any:
    """The work of one contender; its teachers' directory emptied first (untimed)."""
    from lmalgebra.demo import workflow
    from lmalgebra.demo.plan import FULL
    from lmalgebra.demo.side_by_side import side_by_side

    plan = replace(FULL, teacher_steps=teacher_steps)
    root = WORK / "demo-teachers"
    corpora = workflow.write_corpora(root / "data", plan)
    shutil.rmtree(root / "teachers", ignore_errors=True)
    logging.getLogger("lmalgebra").setLevel(logging.ERROR)
    specs = workflow.teacher_specs(root / "teachers", corpora, plan)
    jobs = {name: (workflow._pretrain, (spec, False)) for name, spec in specs.items()}

    def work() -> dict[str, Any]:
        side_by_side(jobs, threads=1 if which == "in turn" else None)
        return {}

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--teacher-steps", type=int, default=1000, help="steps per teacher")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)
    results = {
        which: fastest(
            lambda w=which: run_contender(
                "bench_demo_teachers:contender", {"which": w, "teacher_steps": args.teacher_steps}
            ),
            args.attempts,
            label=which,
        )
        for which in ("in turn", "side by side")
    }
    base, ours = results["in turn"], results["side by side"]
    figures = [
        figure(
            "four demo teachers: side by side vs one after another",
            "s",
            base["seconds"],
            ours["seconds"],
            peak_mib=(base["peak_rss_mib"], ours["peak_rss_mib"]),
            others_share=(base["others_share"], ours["others_share"]),
        )
    ]
    notes = [
        "Peak memory is the parent process's: the side-by-side job processes are not counted "
        "(each holds one teacher's training, a few hundred MiB).",
        f"Hypervisor steal during each: {base.get('steal_share', 0):.0%} / "
        f"{ours.get('steal_share', 0):.0%} of the CPUs.",
    ]
    sizes = {"teachers": 4, "teacher_steps": args.teacher_steps, "head_steps": 300}
    session.save(__doc__, sizes, figures, notes=notes, write=not args.no_write)


if __name__ == "__main__":
    main()
