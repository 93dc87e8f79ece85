"""Evaluate a distilled student against its teachers: held-out scores and RDT (relative deviation
from the teachers), then how much of each teacher the student carries, by LMD on your text.

    python examples/evaluate_student.py runs/merge
    python examples/evaluate_student.py demo-output/merge --students sm3-distilled sm2-gold \
        --texts package:wiki-en --text-column extract

RDT is positive when the student beats its teachers; the LMD table is the test R^2 of each
teacher's span embeddings fitted on each student's.
"""

from __future__ import annotations

import argparse

import lmalgebra


def main(argv: list[str] | None = None) -> lmalgebra.MergeRun:
    parser = argparse.ArgumentParser(description="Evaluate a MergeDistill student.")
    parser.add_argument("run_dir", help="the run directory (the recipe's output_dir)")
    parser.add_argument("--students", nargs="+", help="default: the students saved in the run")
    parser.add_argument("--texts", help="a corpus for the LMD comparison (default: none)")
    parser.add_argument("--text-column", default="text", help="for .jsonl/.csv/.parquet")
    parser.add_argument("--length", type=int, default=32, help="tokens per span")
    parser.add_argument("--counts", default="1000,200,200", help="spans: train,validation,test")
    args = parser.parse_args(argv)

    run = lmalgebra.MergeRun.load(args.run_dir).evaluate(args.students)
    print(run.scores.round(4).to_string(index=False))
    print("\nRDT (%), per language:")
    print(run.rdt.round(2).to_string())
    if args.texts:
        students = {name: str(path) for name, path in run.students.items()}
        if args.students:
            students = {name: students[name] for name in args.students}
        teachers = {name: spec.path for name, spec in run.recipe.teachers.items()}
        texts = lmalgebra.read_texts(args.texts, text_column=args.text_column)
        spans = {"length": args.length, "counts": tuple(int(n) for n in args.counts.split(","))}
        result = lmalgebra.decompose({**teachers, **students}, texts, spans=spans)
        print("\nTest R^2 of each teacher (row) from each student (column):")
        print(result.pairwise("test").loc[list(teachers), list(students)].round(3).to_string())
    return run


if __name__ == "__main__":
    main()
