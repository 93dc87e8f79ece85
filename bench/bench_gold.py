"""Side by side with TRL's GOLD trainer (ULD across tokenizers): one language, one teacher of the
causal demo, the same student architecture and tokenizer, training texts, batch and steps.

Needs a finished ``lmalgebra demo --causal`` directory and ``pip install .[bench-gold]`` (trl).
TRL's cross-tokenizer ULD accepts only byte-level BPE tokenizers on both sides (trl 1.16.0 raises
``NotImplementedError`` for the unigram and BPE teachers), so the comparison runs on English with
the byte-level English teacher, whose tokenizer the student shares. GOLD: off-policy (``lmbda``
0, no generation), ``0.5 * CE + 0.5 * ULD``; ours: ``(1 - 0.5) * CE + 0.5 * L`` for ULD and ALM,
and CE only, from an English-only causal store. Reported: held-out bits per byte
(``evaluate.bits_per_byte``, the demo's held-out English examples) and training tokens/s (GOLD:
student tokens of the batches over the wall time of ``train()``; ours: the loop's logged median).

    python bench/bench_gold.py --demo-dir demo-output [--steps 80]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np

from lmalgebra.demo.causal_workflow import causal_recipe, model_spec
from lmalgebra.demo.plan import CAUSAL_FULL
from lmalgebra.distill.causal.bits_per_byte import bits_per_byte
from lmalgebra.distill.examples import heldout_texts

LANG = "en"
# GOLD renders chat messages; a template that only concatenates keeps the text as it is.
TEMPLATE = "{% for m in messages %}{{ m['content'] }}{% endfor %}"


def run_gold(demo: Path, work: Path, steps: int) -> dict[str, Any]:
    """Train a fresh student with TRL's GOLD trainer; its bits per byte and tokens/s."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl.experimental.gold import GOLDConfig, GOLDTrainer

    from lmalgebra.distill.causal.student_model import build_causal_lm
    from lmalgebra.distill.examples import training_examples
    from lmalgebra.sources.corpus import CorpusSpec

    plan = CAUSAL_FULL
    teacher_dir = demo / "teachers" / f"teacher-{LANG}"
    tokenizers = [AutoTokenizer.from_pretrained(teacher_dir) for _ in range(2)]
    for tok in tokenizers:
        tok.chat_template = TEMPLATE
    student_tok, teacher_tok = tokenizers
    teacher_tok.save_pretrained(work / "teacher-tokenizer")
    student = build_causal_lm(model_spec(plan), student_tok, seed=0)
    teacher = AutoModelForCausalLM.from_pretrained(teacher_dir)
    corpus = CorpusSpec(paths=[str(demo / "data" / f"{LANG}.txt")], doc_sep="line")
    _, texts = training_examples(corpus, LANG, plan.heldout_fraction)
    texts = [t.encode()[: plan.example_bytes].decode(errors="ignore") for t in texts]
    rows = [
        {
            "messages": [
                {"role": "user", "content": t[:40]},
                {"role": "assistant", "content": t[40:]},
            ]
        }
        for t in texts
    ]
    args = GOLDConfig(
        output_dir=str(work / "gold"),
        max_steps=steps,
        per_device_train_batch_size=plan.batch_size,
        learning_rate=3e-3,
        warmup_steps=steps // 10,
        lmbda=0.0,
        use_uld_loss=True,
        uld_crossentropy_weight=plan.lambda_value,
        uld_distillation_weight=1 - plan.lambda_value,
        teacher_tokenizer_name_or_path=str(work / "teacher-tokenizer"),
        max_length=plan.example_bytes,
        report_to=[],
        use_cpu=True,
        logging_steps=10,
        save_strategy="no",
        seed=0,
    )
    trainer = GOLDTrainer(
        model=student,
        teacher_model=teacher,
        args=args,
        train_dataset=Dataset.from_list(rows),
        processing_class=student_tok,
    )
    clock = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - clock
    student.save_pretrained(work / "gold-student")
    student_tok.save_pretrained(work / "gold-student")
    tokens = float(np.mean([len(student_tok(t)["input_ids"]) for t in texts]))
    score = bits_per_byte(work / "gold-student", heldout_texts(demo / "merge", [LANG]))[LANG]
    return {
        "bits_per_byte": score.bits_per_byte,
        "tokens_per_s": steps * plan.batch_size * tokens / seconds,
        "seconds": seconds,
    }


def run_ours(demo: Path, steps: int) -> dict[str, dict[str, float]]:
    """CE only, ULD and ALM students from an English-only store of the same teacher."""
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.pipeline import train_student
    from lmalgebra.distill.recipe import MergeRecipe

    plan = CAUSAL_FULL
    corpora = {LANG: demo / "data" / f"{LANG}.txt"}
    teachers = {LANG: demo / "teachers" / f"teacher-{LANG}"}
    recipe = MergeRecipe.model_validate(
        causal_recipe(demo / f"merge-{LANG}", corpora, teachers, plan)
    )
    pipeline.prepare(recipe, False)
    pipeline.teach(recipe, False)
    out = {}
    for loss in ("ce", "uld", "alm"):
        spec = recipe.training.model_copy(
            update={"objective_mix": {loss: 1.0}, "seed": 0, "steps": steps}
        )
        train_student(recipe, loss, spec, False)
        lines = (recipe.output_dir / loss / "train_log.jsonl").read_text().splitlines()
        speeds = [
            r[f"tokens_per_s/{LANG}"] for r in map(json.loads, lines) if f"tokens_per_s/{LANG}" in r
        ]
        texts = heldout_texts(recipe.output_dir, [LANG])
        score = bits_per_byte(recipe.output_dir / loss / "model", texts)[LANG]
        out[loss] = {"bits_per_byte": score.bits_per_byte, "tokens_per_s": float(np.median(speeds))}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=CAUSAL_FULL.student_steps)
    args = parser.parse_args()
    work = args.demo_dir / "bench-gold"
    result = {
        "ours": run_ours(args.demo_dir, args.steps),
        "gold": run_gold(args.demo_dir, work, args.steps),
    }
    (work / "result.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
