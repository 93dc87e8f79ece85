"""Masked inputs: one tokenizer call per shard vs per text, a squeezed head vs an indexed one.

Two costs of the demo's merge run, each measured both ways in one process, alternately.
Masking: `TeacherMasker.mask_many` on shards of 256 texts (one tokenizer call per shard, as
`merge prepare` runs it) against one call per text (what `prepare` did before), over the first
5,000 packaged English, French and Spanish Wikipedia leads with the packaged MiniLM's WordPiece
tokenizer (the demo's head-only teacher's), examples of 64 tokens; the copies must be the same.
Head: a training step (forward on the masked rows, KD + MLM loss, backward, AdamW) of the demo's
student (BERT 2 x 128) over its 34,150-token union vocabulary, batch 32 x 64, with the logits
taken as `masked_logits` takes them (a squeeze) against an index (`logits[0]`, what it did
before: its backward fills and copies a tensor of the logits' size); the gradients must be the
same.

    python bench/bench_masked_inputs.py [--rounds 3] [--steps 30] [--no-write]
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from harness import WORK, Session, figure, parse_args, peak_rss_mib

NAME = "bench_masked_inputs"
MEASURED = ("src/lmalgebra/distill/masked/masking.py", "src/lmalgebra/train/masked_head.py")
SHARD = 256


def masking_texts() -> tuple[Any, list[str], list[str]]:
    from transformers import AutoTokenizer

    from lmalgebra.demo.plan import FULL
    from lmalgebra.demo.workflow import write_corpora
    from lmalgebra.distill.masked.masking import TeacherMasker
    from lmalgebra.distill.recipe import MaskingSpec
    from lmalgebra.sources.packaged import asset_path

    corpora = write_corpora(WORK / "masked-inputs", FULL)
    texts = [t for p in corpora.values() for t in p.read_text(encoding="utf-8").splitlines()]
    tokenizer = AutoTokenizer.from_pretrained(asset_path("minilm"))
    masker = TeacherMasker("minilm", tokenizer, MaskingSpec(seed=0), 64)
    return masker, [f"d{i}" for i in range(len(texts))], texts


def student_step(vocab: int) -> tuple[Any, Any]:
    """A step function ``step(indexed) -> seconds`` and the gradients of one step each way."""
    import torch

    from demo_step import demo_bert_batch
    from lmalgebra.train.losses import combined_loss
    from lmalgebra.train.masked_head import masked_logits

    made = demo_bert_batch(vocab, 0.0)
    model, batch, labels = made["model"], made["inputs"], made["labels"]
    topk, teacher = made["topk"], made["teacher"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)

    def loss(indexed: bool) -> Any:
        logits = masked_logits(model, batch)
        if indexed:  # the index the head took before: a select over the (1, n, vocab) output
            logits = logits.unsqueeze(0)[0]
        return combined_loss(logits, labels, 0.5, topk, teacher).total

    def gradients(indexed: bool) -> list[Any]:
        model.zero_grad(set_to_none=True)
        loss(indexed).backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    def step(indexed: bool) -> float:
        clock = time.perf_counter()
        loss(indexed).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - clock

    same = all(torch.equal(a, b) for a, b in zip(gradients(False), gradients(True), strict=True))
    return step, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the two ways")
    parser.add_argument("--steps", type=int, default=30, help="training steps per way and round")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)

    masker, ids, texts = masking_texts()
    shards = [(ids[i : i + SHARD], texts[i : i + SHARD]) for i in range(0, len(texts), SHARD)]
    per_text, per_shard = [], []
    for _ in range(args.rounds):
        clock = time.perf_counter()
        alone = [[masker(i, t) for i, t in zip(a, b, strict=True)] for a, b in shards]
        per_text.append(time.perf_counter() - clock)
        clock = time.perf_counter()
        batched = [masker.mask_many(a, b) for a, b in shards]
        per_shard.append(time.perf_counter() - clock)
    same_copies = all(
        (x.input_ids == y.input_ids).all() and (x.positions == y.positions).all()
        for a, b in zip(alone, batched, strict=True)
        for x, y in zip(a, b, strict=True)
    )

    step, same_gradients = student_step(34150)
    for indexed in (False, True):  # warm-up
        step(indexed)
    indexed_s, squeezed_s = [], []
    for _ in range(args.rounds):
        indexed_s.append(sum(step(True) for _ in range(args.steps)) / args.steps)
        squeezed_s.append(sum(step(False) for _ in range(args.steps)) / args.steps)

    figures = [
        figure(f"masking {len(texts):,} texts", "s", min(per_text), min(per_shard)),
        figure(
            "demo student step, 34,150 tokens", "ms", min(indexed_s) * 1e3, min(squeezed_s) * 1e3
        ),
    ]
    notes = [
        f"Masking: the same copies both ways: {same_copies}; every round (per text / per shard): "
        + ", ".join(f"{a:.2f} / {b:.2f} s" for a, b in zip(per_text, per_shard, strict=True)),
        f"Head: the same gradients both ways: {same_gradients}; every round's mean step "
        "(indexed / squeezed): "
        + ", ".join(
            f"{a * 1e3:.0f} / {b * 1e3:.0f} ms" for a, b in zip(indexed_s, squeezed_s, strict=True)
        ),
        "Dropout is off in the step, so both ways compute the same numbers; the demo's student "
        "has dropout 0.1 (18 ms of its step, the same both ways).",
        "Fastest round of each way; both ways in one process, alternated; peak RSS of the "
        f"process {peak_rss_mib():.0f} MiB (the two ways share it).",
    ]
    sizes = {"texts": len(texts), "shard": SHARD, "example_length": 64, "vocab": 34150,
             "batch": "32 x 64", "steps": args.steps, "rounds": args.rounds}  # fmt: skip
    session.save(__doc__, sizes, figures, notes=notes, write=not args.no_write)
    if not (same_copies and same_gradients):
        raise SystemExit("the two ways disagree")


if __name__ == "__main__":
    main()
