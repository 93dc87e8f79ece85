"""Merge teachers from a recipe: MergeDistill's stages (examples, teacher store, union vocabulary,
student training) from Python, after a look at the plan.

    lmalgebra merge init merge.yaml          # a commented starter recipe: name your teachers
    python examples/merge_teachers.py merge.yaml --steps 200
    python examples/merge_teachers.py demo-output/merge.yaml --student sm3-again   # after make demo

Each stage resumes from what an earlier call left in the recipe's ``output_dir``; then evaluate
the student with ``examples/evaluate_student.py``.
"""

from __future__ import annotations

import argparse

import lmalgebra

STAGES = ["prepare", "teach", "vocab", "train"]


def main(argv: list[str] | None = None) -> lmalgebra.MergeRun:
    parser = argparse.ArgumentParser(description="Merge teachers from a recipe.")
    parser.add_argument("recipe", help="a MergeDistill recipe (YAML)")
    parser.add_argument("--student", default="student", help="the student's name in the run")
    parser.add_argument("--steps", type=int, help="training steps (default: the recipe's)")
    parser.add_argument("--gold-only", action="store_true", help="no distillation: a baseline")
    args = parser.parse_args(argv)

    print(lmalgebra.merge_plan(args.recipe).to_string(index=False))  # counts, bytes and times first
    training = {"steps": args.steps} if args.steps else {}
    if args.gold_only:
        training["gold_only"] = True
    run = lmalgebra.merge(args.recipe, STAGES, students={args.student: training or None})
    print(f"\n{run}")
    for name, directory in run.students.items():
        print(f"{name}: {directory} (a transformers model directory, with its tokenizer)")
    return run


if __name__ == "__main__":
    main()
