"""Compare your models with Language Model Decomposition: how much of each one's embedding a ridge
fit on the others explains, on held-out spans of your text.

    python examples/compare_models.py          # two packaged encoders, two to three minutes
    python examples/compare_models.py --model mine=./my_model --model ref=package:minilm \
        --model null=random:./my_model --corpus texts.jsonl --text-column text --out runs/mine

A model is any reference the command line takes: a directory, a hub id, package:NAME, gguf:FILE,
onnx:FILE#TOKENIZER, precomputed:FILE, or random:PATH (the same architecture, untrained: a null).
"""

from __future__ import annotations

import argparse

import lmalgebra

PACKAGED = ["minilm=package:minilm", "minilm-sre=package:minilm-sre"]


def main(argv: list[str] | None = None) -> lmalgebra.Decomposition:
    parser = argparse.ArgumentParser(description="Compare models with LMD.")
    parser.add_argument("--model", action="append", metavar="NAME=REFERENCE", help="repeat")
    parser.add_argument("--corpus", default="package:wiki-en", help="a corpus path")
    parser.add_argument(
        "--text-column", help="for .jsonl/.csv/.parquet (default: extract for package:wiki-en)"
    )
    parser.add_argument("--length", type=int, default=32, help="tokens per span")
    parser.add_argument("--counts", default="1000,200,200", help="spans: train,validation,test")
    parser.add_argument("--out", help="also write the run directory and its HTML report here")
    args = parser.parse_args(argv)

    models = dict(entry.split("=", 1) for entry in args.model or PACKAGED)
    column = args.text_column or ("extract" if args.corpus == "package:wiki-en" else "text")
    texts = lmalgebra.read_texts(args.corpus, text_column=column)
    counts = tuple(int(n) for n in args.counts.split(","))
    result = lmalgebra.decompose(
        models, texts, out=args.out, spans={"length": args.length, "counts": counts}
    )
    print(result)
    print("\nTest R^2 of each target (row) from each single basis model (column):")
    print(result.pairwise("test").round(3).to_string())
    print("\nEach model from all the others (group R^2), per split:")
    print(result.group.round(3).to_string())
    if args.out:
        print(f"\nreport: {result.report()}")
    return result


if __name__ == "__main__":
    main()
