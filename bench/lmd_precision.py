"""The LMD check of ``bench_embedding.py``: ``lmalgebra.decompose`` (the Python API) on the
packaged MiniLM and MiniLM-SRE over packaged ``wiki-en``, in float32 and in bfloat16, each in a
fresh interpreter with an empty embedding cache of its own (nothing reused), and every R^2 of the
two runs compared."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Sequence
from typing import Any

import pandas as pd
import torch

from harness import WORK, fastest, goal, run_contender, table

MODELS = {"minilm": "package:minilm", "minilm-sre": "package:minilm-sre"}
GROUP_TARGET = 0.005  # largest |group R^2 difference| bfloat16 may make
KEYS = ["kind", "target", "basis", "split"]


def contender(
    dtype: str, spans: list[int], length: int, threads: int, cache_dir: str
) -> Callable[[], dict[str, Any]]:
    """Untimed: the imports and the documents. The work: one ``decompose`` call in ``dtype``
    (loading the models, embedding, statistics, fits); every fit's R^2."""
    import lmalgebra

    torch.set_num_threads(threads)
    texts = lmalgebra.read_texts("package:wiki-en", text_column="extract")

    def work() -> dict[str, Any]:
        result = lmalgebra.decompose(
            MODELS,
            texts,
            spans={"length": length, "counts": tuple(spans)},
            dtype=dtype,
            cache_dir=cache_dir,
            progress=False,
        )
        return {"fits": result.fits[[*KEYS, "r2"]].to_dict("records"), "spans": result.spans}

    return work


def measure(spans: Sequence[int], length: int, threads: int) -> dict[str, dict[str, Any]]:
    """The decomposition in float32 and in bfloat16 (one attempt each: a check, not a race)."""
    runs = {}
    for dtype in ("float32", "bfloat16"):
        WORK.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=WORK) as cache:
            kwargs = {"dtype": dtype, "spans": list(spans), "length": length}
            kwargs |= {"threads": threads, "cache_dir": cache}
            runs[dtype] = fastest(
                lambda k=kwargs: run_contender("lmd_precision:contender", k),
                1,
                label=f"decompose, {dtype}",
            )
    return runs


def compared(runs: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """Every fit of both runs side by side: ``KEYS``, ``float32``, ``bfloat16``, ``diff`` (abs)."""
    frames = {
        dtype: pd.DataFrame(r["output"]["fits"]).set_index(KEYS)["r2"].rename(dtype)
        for dtype, r in runs.items()
    }
    both = pd.concat(frames.values(), axis=1, join="outer").reset_index()
    both["diff"] = (both["float32"] - both["bfloat16"]).abs()
    return both


def record(
    runs: dict[str, dict[str, Any]], spans: Sequence[int], length: int
) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The target (group R^2 within :data:`GROUP_TARGET`), the table (test-split fits and the
    largest difference of each kind over all splits) and a note on the time of each run."""
    both = compared(runs)
    if both["diff"].isna().any():
        missing = both[both["diff"].isna()][KEYS].to_dict("records")
        raise SystemExit(f"FAILED: fits present in one dtype only: {missing}")
    largest = both.groupby("kind")["diff"].max()
    test = both[both["split"] == "test"]
    rows = [
        [r.kind, r.target, r.basis, f"{r.float32:.4f}", f"{r.bfloat16:.4f}", f"{r.diff:.1e}"]
        for r in test.itertuples()
    ]
    rows += [[kind, "every fit", "all splits", "", "", f"{d:.1e}"] for kind, d in largest.items()]
    group = float(largest.get("group", float("nan")))
    target = goal(
        f"LMD group R^2 in bfloat16 within {GROUP_TARGET} of float32 (every model and split)",
        group <= GROUP_TARGET,
        f"largest difference {group:.1e}; pairwise {float(largest.get('pairwise', 0.0)):.1e}",
    )
    title = (
        f"LMD in float32 and bfloat16: `lmalgebra.decompose` on {', '.join(MODELS.values())}, "
        f"{'/'.join(f'{n:,}' for n in spans)} spans of {length} tokens (test split; "
        "differences are absolute)"
    )
    columns = ["fit", "target", "basis", "R^2 float32", "R^2 bfloat16", "difference"]
    seconds = {dtype: r["seconds"] for dtype, r in runs.items()}
    note = (
        f"LMD check: one `decompose` call each (loading, embedding into an empty cache, "
        f"statistics, fits): float32 {seconds['float32']:.1f} s, bfloat16 "
        f"{seconds['bfloat16']:.1f} s ({seconds['float32'] / seconds['bfloat16']:.2f}x)."
    )
    return target, table(title, columns, rows), note
