"""Does LMD complementarity predict which pair of teachers makes the better student?

Six English-capable teachers made offline, differing in what they know: ``en-a`` (a small BERT
pre-trained by the toolkit on English Wikipedia part A), ``en-a-seed1`` (the same, another seed: a
near-duplicate), ``en-b`` (the same size on part B), ``fr`` (the same size on French Wikipedia),
and head-only teachers on the real encoders ``package:minilm`` and ``package:minilm-sre`` (a
fine-tune of it: another near-duplicate). Every teacher uses the packaged MiniLM WordPiece
tokenizer, so every student has the same vocabulary and is scored on the same masked positions.

``experimental select`` scores all 15 pairs on the held-out part of the distillation text (part C);
every pair is then distilled into a student with the same budget (architecture, steps, data, seed)
and the student's held-out masked-token accuracy (every chosen position shown as the mask token) is
measured on the same held-out examples. Reported: Spearman correlation between the pair's score and
the student's accuracy with a bootstrap interval over pairs, and where the recommended pair's
student ranks among the 15.

    python experiments/teacher_pairs.py [--quick] [--out experiments/results]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from dataclasses import asdict, dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

HERE = Path(__file__).resolve().parent
TOKENIZER = "package:minilm"


@dataclass(frozen=True)
class Plan:
    docs: int  # documents per Wikipedia part
    teacher_steps: int
    head_steps: int
    student_steps: int
    example_length: int
    batch_size: int
    select_spans: tuple[int, int, int]


FULL = Plan(1000, 300, 200, 200, 64, 32, (3000, 300, 800))
QUICK = Plan(300, 20, 20, 20, 48, 16, (300, 50, 100))


def corpora(work: Path, plan: Plan) -> dict[str, Path]:
    """Disjoint parts of English Wikipedia (A, B: teachers; C: the distillation text) and French
    Wikipedia, one document per line."""
    from lmalgebra import read_texts

    en = read_texts("package:wiki-en", text_column="extract")
    fr = read_texts("package:wiki-fr", text_column="extract")
    n = plan.docs
    parts = {"en-a": en[:n], "en-b": en[n : 2 * n], "en-c": en[2 * n : 4 * n], "fr": fr[:n]}
    out = {}
    for name, docs in parts.items():
        path = work / "text" / f"{name}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [" ".join(d.split()) for d in docs]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        out[name] = path
    return out


def teachers(work: Path, text: dict[str, Path], plan: Plan) -> dict[str, Path]:
    """The six teachers (each made once; a later run reuses the finished directories)."""
    from lmalgebra.api.pretrain import HeadOnlySpec, MaskedPretrainSpec, pretrain

    size = {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "intermediate_size": 512}

    def common(name: str, part: str, lang: str, steps: int, seed: int) -> dict[str, Any]:
        training = {"steps": steps, "batch_size": plan.batch_size, "lr": 1e-3, "seed": seed}
        training |= {"warmup_steps": steps // 10, "checkpoint_every": steps}
        return {
            "corpus": {"paths": [str(text[part])], "doc_sep": "line"},
            "language": lang,
            "out": work / "teachers" / name,
            "example_length": plan.example_length,
            "training": training,
        }

    made: dict[str, Path] = {}
    for name, part, seed, lang in (
        ("en-a", "en-a", 0, "en"),
        ("en-a-seed1", "en-a", 1, "en"),
        ("en-b", "en-b", 0, "en"),
        ("fr", "fr", 0, "fr"),
    ):
        spec = MaskedPretrainSpec.model_validate(
            {
                **common(name, part, lang, plan.teacher_steps, seed),
                "tokenizer": {"path": TOKENIZER},
                "model": size,
            }
        )
        made[name] = pretrain(spec, keep_saved=True)
    for name, encoder in (("minilm", "package:minilm"), ("minilm-sre", "package:minilm-sre")):
        data = {**common(name, "en-a", "en", plan.head_steps, 0), "encoder": encoder}
        made[name] = pretrain(HeadOnlySpec.model_validate(data), keep_saved=True)
    return made


def recipe(
    work: Path, text: dict[str, Path], made: dict[str, Path], plan: Plan, names: list[str], run: str
) -> dict[str, Any]:
    return {
        "languages": {
            "en": {"corpus": {"paths": [str(text["en-c"])], "doc_sep": "line"}, "teachers": names}
        },
        "teachers": {n: {"path": str(made[n])} for n in names},
        "example_length": plan.example_length,
        "heldout_fraction": 0.2,
        "output_dir": str(work / "runs" / run),
        "student": {"hidden_size": 128, "num_layers": 2, "num_heads": 2, "intermediate_size": 512},
        "training": {
            "steps": plan.student_steps,
            "batch_size": plan.batch_size,
            "lr": 1e-3,
            "warmup_steps": plan.student_steps // 10,
            "checkpoint_every": plan.student_steps,
            "seed": 0,
        },
    }


def student_quality(config: Any, student: Path) -> tuple[float, float]:
    """Held-out masked-token accuracy and loss (nats) of a student, on positions that do not
    depend on the pair."""
    from lmalgebra.distill.examples import language_examples
    from lmalgebra.distill.masked.teachers import open_masked_teacher
    from lmalgebra.distill.recipe import MaskedRecipe, TeacherSpec
    from lmalgebra.experimental.selection.teacher_quality import held_out_quality

    recipe_: MaskedRecipe = config
    held = [e for e in language_examples(recipe_, "en") if e.heldout]
    ref = TeacherSpec(path=str(student)).ref("student")
    teacher = open_masked_teacher(ref, example_length=recipe_.example_length)
    quality = held_out_quality("en", teacher, ref, held, recipe_.masking, recipe_.example_length)
    return quality.accuracy, quality.loss


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    from scipy.stats import spearmanr  # scikit-learn's dependency

    return float(spearmanr(x, y).statistic)


def bootstrap_spearman(x: np.ndarray, y: np.ndarray, reps: int = 2000) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    values = []
    for _ in range(reps):
        pick = rng.integers(0, len(x), len(x))
        if np.ptp(x[pick]) > 0 and np.ptp(y[pick]) > 0:
            values.append(spearman(x[pick], y[pick]))
    if not values:  # every resample constant: no correlation to speak of
        return float("nan"), float("nan")
    low, high = np.quantile(values, [0.025, 0.975])
    return float(low), float(high)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the script runs")
    parser.add_argument("--work", type=Path, default=HERE / "_work" / "teacher_pairs")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    from lmalgebra.demo.workflow import run_workflow

    plan = QUICK if args.quick else FULL
    work = args.work / ("quick" if args.quick else "full")
    run_workflow(work, lambda: measure(work, plan, args.out, args.quick))


def measure(work: Path, plan: Plan, out: Path, quick: bool) -> dict[str, Any]:
    """Teachers, the selection, every pair's student (through ``lmalgebra.merge``), the report."""
    from lmalgebra import merge
    from lmalgebra.api.merge import recipe_of
    from lmalgebra.experimental import select_teachers

    clock = time.perf_counter()
    text = corpora(work, plan)
    made = teachers(work, text, plan)
    seconds = {"teachers": time.perf_counter() - clock}
    names = sorted(made)
    clock = time.perf_counter()
    found = select_teachers(
        recipe(work, text, made, plan, names, "select"),
        size=2,
        spans={"counts": plan.select_spans},
        bootstrap=500,
        cache_dir=work / "cache",
    )
    seconds["select"] = time.perf_counter() - clock
    scores = found.sets[found.sets.language == "en"].set_index("members")
    rows = []
    clock = time.perf_counter()
    for pair in combinations(names, 2):
        label = "+".join(pair)
        config = recipe_of(recipe(work, text, made, plan, list(pair), label))
        run = merge(config, stages=["prepare", "teach", "vocab", "train"], keep_saved=True)
        accuracy, loss = student_quality(config, run.students["student"])
        row = scores.loc[label]
        rows.append(
            {
                "pair": label,
                "score": float(row.score),
                "complementarity": float(row.complementarity),
                "quality": float(row.quality),
                "student_accuracy": accuracy,
                "student_loss": loss,
            }
        )
        print(
            f"{label}: score {row.score:.3f}, student accuracy {accuracy:.4f}, loss {loss:.3f}",
            flush=True,
        )
    seconds["students"] = time.perf_counter() - clock
    return report(rows, found, plan, seconds, out, quick)


def report(
    rows: list[dict[str, Any]],
    found: Any,
    plan: Plan,
    seconds: dict[str, float],
    out: Path,
    quick: bool,
) -> dict[str, Any]:
    score = np.array([r["score"] for r in rows])
    accuracy = np.array([r["student_accuracy"] for r in rows])
    rho = spearman(score, accuracy)
    low, high = bootstrap_spearman(score, accuracy)
    loss = np.array([r["student_loss"] for r in rows])
    rho_loss = spearman(score, -loss)
    chosen = "+".join(found.recommended["en"])
    order = sorted(rows, key=lambda r: -r["student_accuracy"])
    rank = 1 + [r["pair"] for r in order].index(chosen)
    median = float(np.median(accuracy))
    chosen_accuracy = next(r["student_accuracy"] for r in rows if r["pair"] == chosen)
    result = {
        "plan": asdict(plan),
        "seconds": seconds,
        "pairs": rows,
        "spearman": rho,
        "spearman_interval": [low, high],
        "recommended": chosen,
        "recommended_rank": rank,
        "pairs_count": len(rows),
        "recommended_above_median": chosen_accuracy > median,
        "targets": {"spearman >= 0.5": rho >= 0.5, "chosen above median": chosen_accuracy > median},
    }
    out.mkdir(parents=True, exist_ok=True)
    stem = "teacher_pairs_quick" if quick else "teacher_pairs"
    from lmalgebra.core.fingerprint import plain  # NaN as null: strict JSON readers refuse NaN

    text = json.dumps(plain(result), indent=1, allow_nan=False)
    (out / f"{stem}.json").write_text(text + "\n", encoding="utf-8")
    lines = [
        "| pair | complementarity | quality | score | student accuracy | student loss |",
        "|---|---|---|---|---|---|",
        *(
            f"| {r['pair']} | {r['complementarity']:.3f} | {r['quality']:.3f} | {r['score']:.3f} "
            f"| {r['student_accuracy']:.4f} | {r['student_loss']:.3f} |"
            for r in sorted(rows, key=lambda r: -r["score"])
        ),
        "",
        f"Spearman(score, student accuracy) = {rho:.2f} (95% bootstrap interval over pairs "
        f"[{low:.2f}, {high:.2f}]); recommended pair {chosen}: its student ranks {rank} of "
        f"{len(rows)} (median accuracy {median:.4f}, its {chosen_accuracy:.4f}). "
        f"Spearman(score, -student loss) = {rho_loss:.2f}.",
    ]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return result


if __name__ == "__main__":
    from lmalgebra.cli import run_command

    run_command(main)  # bad input or a full disk: one line, exit status 2
