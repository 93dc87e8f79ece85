"""Teacher selection: what `experimental select` costs next to the teacher inference it comes
before.

One language (English Wikipedia lead paragraphs, ``package:wiki-en``), three candidate teachers:
random-initialised ``BertForMaskedLM`` of the MiniLM shape (6 x 384, the packaged MiniLM
tokenizer, 30,522 tokens), seeds 0, 1, 2; ``example_length`` 128, held-out fraction 0.05.
Baseline: ``merge prepare`` + ``merge teach`` of the recipe (every example, every teacher, top-8
store). Ours: ``select_teachers`` with sets of 2 (held-out masked-token accuracy of each candidate,
the LMD run of the candidates on held-out spans of 32 tokens with the embedding cache empty, 200
bootstrap replicates). The ratio is selection's cost as a share of the stages it precedes; both
scale with the text they read (all examples vs the held-out share).

    python bench/bench_selection.py [--examples 3000] [--no-write]
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from harness import WORK, Session, fastest, figure, parse_args, run_contender

NAME = "bench_selection"
MEASURED = ("src/lmalgebra/experimental/selection", "src/lmalgebra/stats", "src/lmalgebra/distill")
SEEDS = (0, 1, 2)


def make_teachers(root: Path) -> dict[str, Path]:
    """Three MiniLM-shaped masked LMs with the packaged MiniLM tokenizer (weights random)."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from lmalgebra.sources.packaged import asset_path

    tokenizer = AutoTokenizer.from_pretrained(asset_path("minilm"))
    out = {}
    for seed in SEEDS:
        target = root / f"teacher-{seed}"
        if not (target / "config.json").exists():
            config = BertConfig(
                vocab_size=len(tokenizer),
                hidden_size=384,
                num_hidden_layers=6,
                num_attention_heads=12,
                intermediate_size=1536,
                pad_token_id=tokenizer.pad_token_id,
            )
            torch.manual_seed(seed)
            BertForMaskedLM(config).save_pretrained(target)
            tokenizer.save_pretrained(target)
        out[f"t{seed}"] = target
    return out


def recipe(root: Path, examples: int) -> dict[str, Any]:
    teachers = make_teachers(root / "teachers")
    return {
        "languages": {
            "en": {
                "corpus": {"paths": ["package:wiki-en"], "text_column": "extract"},
                "teachers": sorted(teachers),
                "max_examples": examples,
            }
        },
        "teachers": {name: {"path": str(path)} for name, path in teachers.items()},
        "example_length": 128,
        "heldout_fraction": 0.05,
        "top_k": 8,
        "output_dir": str(root / "run"),
    }


def contender(which: str, examples: int) -> Any:
    """The work of one contender, its run directory and cache emptied first (untimed)."""
    from lmalgebra import merge
    from lmalgebra.experimental import select_teachers

    root = WORK / "selection"
    data = recipe(root, examples)
    shutil.rmtree(root / "run", ignore_errors=True)
    shutil.rmtree(root / "cache", ignore_errors=True)
    logging.getLogger("lmalgebra").setLevel(logging.ERROR)

    def teach() -> dict[str, Any]:
        merge(data, stages=["prepare", "teach"])
        return {}

    def select() -> dict[str, Any]:
        found = select_teachers(data, size=2, bootstrap=200, cache_dir=root / "cache")
        return {"seconds_by_part": found.seconds, "spans": found.selection.languages["en"].spans}

    return teach if which == "teach" else select


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=3000, help="English examples")
    args = parse_args(parser, attempts=1)
    session = Session(NAME, MEASURED)
    results = {
        which: fastest(
            lambda w=which: run_contender(
                "bench_selection:contender", {"which": w, "examples": args.examples}
            ),
            args.attempts,
            label=which,
        )
        for which in ("teach", "select")
    }
    base, ours = results["teach"], results["select"]
    figures = [
        figure(
            "experimental select vs merge prepare + teach (3 teachers)",
            "s",
            base["seconds"],
            ours["seconds"],
            peak_mib=(base["peak_rss_mib"], ours["peak_rss_mib"]),
            others_share=(base["others_share"], ours["others_share"]),
            cost=True,
        )
    ]
    parts = ours["output"]["seconds_by_part"]
    notes = [
        "Selection's parts (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in parts.items())
        + f"; held-out spans per split: {ours['output']['spans']}."
    ]
    sizes = {"examples": args.examples, "teachers": len(SEEDS), "example_length": 128}
    session.save(__doc__, sizes, figures, notes=notes, write=not args.no_write)


if __name__ == "__main__":
    main()
