"""MinED map: the vocabulary map of the packaged Gemma-3-270M onto SmolLM2-135M, numpy vs rapidfuzz.

The map a causal recipe builds before a student trains on a teacher with another tokenizer
(``distill.vocab.mined_map``): for each of Gemma-3's 262,144 tokens (SentencePiece) the closest
of SmolLM2's 49,152 (byte-level BPE) in Levenshtein distance over their canonical forms, ties to
the smaller length difference, then the smaller id; exact matches by a dictionary, the rest by a
search over student tokens in order of length difference that stops once no farther length can
be closer. Baseline: that search with distances from the numpy dynamic programme lmalgebra had
(``numpy_levenshtein.py``, one thread). Ours: the same search with rapidfuzz's bit-parallel
Levenshtein (``process.cdist``), each pair stopping past every query's best so far, on one thread
and on two. Each run is a fresh interpreter; the maps must be identical. Cases: a seeded sample of
the teacher's tokens (all three contenders) and the whole vocabulary (ours on two threads; the
baseline too with ``--full-baseline``, about 7 minutes).

    python bench/bench_mined_map.py [--sample 20000] [--full-baseline] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from harness import WORK, Session, figure, goal, parse_args, run_contender, table

NAME = "bench_mined_map"
MEASURED = (
    "src/lmalgebra/distill/vocab/mined_map.py",
    "src/lmalgebra/distill/vocab/edit_distance.py",
)
TEACHER, STUDENT = "gemma3-270m", "smollm2-135m"


def forms() -> tuple[list[str], list[bool], list[str], list[bool]]:
    """Canonical forms and special flags of the teacher's and the student's tokens, as
    ``mined_map`` compares them."""
    from lmalgebra.distill.vocab import mined_map as mm
    from lmalgebra.distill.vocab.union import canonical_vocabulary
    from lmalgebra.sources.kinds import source_of
    from lmalgebra.sources.models import ModelRef

    tokenizers = {}
    for name in (TEACHER, STUDENT):
        ref = ModelRef(name=name, path=f"package:{name}")
        tokenizers[name] = source_of(ref, ref.source.resolve(weights=False)).load_tokenizer()
    student = canonical_vocabulary("student", tokenizers[STUDENT])
    student_forms, student_special = mm.vocabulary_forms(student, lowercase=False)
    teacher = canonical_vocabulary("teacher", tokenizers[TEACHER])
    teacher_forms, teacher_special = mm.vocabulary_forms(teacher, student.lowercase)
    return teacher_forms, teacher_special, student_forms, student_special


def contender(way: str, sample: int, threads: int, out: str) -> Any:
    """Work computing the map of ``sample`` teacher tokens (0: all) ``way`` (``numpy`` or
    ``rapidfuzz``) on ``threads``; it saves ``(ids, distances)`` to ``out`` and returns the
    number of tokens mapped."""
    import torch

    import numpy_levenshtein
    from lmalgebra.distill.vocab import mined_map as mm

    torch.set_num_threads(threads)
    teacher_forms, teacher_special, student_forms, student_special = forms()
    if sample:
        rng = np.random.default_rng(0)
        chosen = np.sort(rng.choice(len(teacher_forms), sample, replace=False))
        teacher_forms = [teacher_forms[i] for i in chosen]
        teacher_special = [teacher_special[i] for i in chosen]
    if way == "numpy":
        original = mm.nearest_strings
        mm.nearest_strings = lambda queries, pool, workers=1: numpy_levenshtein.nearest_strings(
            queries, pool
        )

    def work() -> int:
        try:
            ids, distances = mm.compute_map(
                teacher_forms, teacher_special, student_forms, student_special, threads
            )
        finally:
            if way == "numpy":
                mm.nearest_strings = original
        np.savez(out, ids=ids, distances=distances)
        return len(teacher_forms)

    return work


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=20_000, help="teacher tokens sampled")
    parser.add_argument("--full-baseline", action="store_true", help="the baseline on all tokens")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)
    WORK.mkdir(parents=True, exist_ok=True)
    runs: dict[tuple[str, str], dict[str, Any]] = {}
    maps: dict[tuple[str, str], Any] = {}
    cases = {"sample": args.sample, "full": 0}
    ways = [("numpy", 1), ("rapidfuzz", 1), ("rapidfuzz", 2)]
    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        for case, sample in cases.items():
            for way, threads in ways:
                if case == "full" and (way, threads) == ("rapidfuzz", 1):
                    continue
                if case == "full" and way == "numpy" and not args.full_baseline:
                    continue
                label = f"{way}, {threads} thread{'s' if threads > 1 else ''}"
                out = str(Path(tmp) / f"{case}-{way}-{threads}.npz")
                kwargs = {"way": way, "sample": sample, "threads": threads, "out": out}
                result = run_contender("bench_mined_map:contender", kwargs)
                print(f"  {case}, {label}: {result['seconds']:.1f} s", flush=True)
                runs[case, label] = result
                with np.load(out) as saved:
                    maps[case, label] = (saved["ids"].copy(), saved["distances"].copy())
    base = "numpy, 1 thread"
    same = {
        key: all(np.array_equal(a, b) for a, b in zip(value, maps[key[0], base], strict=True))
        for key, value in maps.items()
        if (key[0], base) in maps
    }
    if not all(same.values()):
        raise SystemExit(f"the maps differ: {same}")
    figures, rows = [], []
    for case, sample in cases.items():
        tokens = sample or runs[case, "rapidfuzz, 2 threads"]["output"]
        for (c, label), r in runs.items():
            if c == case:
                rows.append([case, f"{tokens:,}", label, round(r["seconds"], 1),
                             round(r["peak_rss_mib"]), f"{r['others_share']:.0%}"])  # fmt: skip
        if (case, base) not in runs:
            continue
        b = runs[case, base]
        for label in ("rapidfuzz, 1 thread", "rapidfuzz, 2 threads"):
            if (case, label) in runs:
                o = runs[case, label]
                figures.append(
                    figure(f"{tokens:,} of Gemma-3's tokens onto SmolLM2's 49,152, ours {label}",
                           "s", b["seconds"], o["seconds"],
                           peak_mib=(b["peak_rss_mib"], o["peak_rss_mib"]),
                           others_share=(b["others_share"], o["others_share"]))
                )  # fmt: skip
    full = runs["full", "rapidfuzz, 2 threads"]
    distances = maps["full", "rapidfuzz, 2 threads"][1]
    checked = ", ".join(f"{c}: {label}" for (c, label), ok in same.items() if ok)
    targets = [goal("the same map as the numpy search", all(same.values()), checked)]
    notes = [
        f"Whole map (262,144 tokens, two threads): {full['seconds']:.1f} s, "
        f"{100 * float((distances == 0).mean()):.1f}% exact, median distance of the others "
        f"{float(np.median(distances[distances > 0])):.0f}, largest {int(distances.max())}.",
        "Times include neither loading the tokenizers nor their canonical forms (untimed set-up "
        "of each contender's interpreter); peak RSS is the contender's whole life.",
    ]
    sizes = {"teacher": f"package:{TEACHER} (262,144 tokens)",
             "student": f"package:{STUDENT} (49,152 tokens)", "sample": args.sample,
             "full baseline": args.full_baseline}  # fmt: skip
    columns = ["case", "teacher tokens", "contender", "seconds", "peak RSS (MiB)", "others"]
    session.save(__doc__, sizes, figures, targets=targets,
                 tables=[table("Runs", columns, rows)], notes=notes,
                 write=not args.no_write)  # fmt: skip


if __name__ == "__main__":
    main()
