"""Achieved FLOP/s as a share of the machine's own matrix-multiply peak, measured in the same run.

The peak is the best rate of square ``n x n x n`` products (``torch.matmul``) in the dtype and
with the thread count of the stage, in a fresh interpreter started by the harness
(:func:`measure_peak`). A stage's FLOPs are counted analytically from its shapes
(:func:`bert_forward_flops`, :func:`gram_flops`); :func:`counted_flops` counts the matrix
products of one real call with ``torch.utils.flop_counter.FlopCounterMode`` so a benchmark can
check the formula on the model it runs. Only matrix products count (2 FLOPs per multiply-add):
normalisation, softmax, activations and element-wise work are left out, which is what a matrix
unit's peak can be compared with. :func:`utilisation_table` is the table every benchmark records,
and :func:`require_bf16` the guard in front of a bfloat16 contender on the CPU.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from harness import fastest, run_contender, table

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def peak_contender(
    dtype: str, threads: int, n: int = 2048, repeats: int = 5, device: str = "cpu"
) -> Callable[[], dict[str, Any]]:
    """Harness contender: the matrix-product rate of ``dtype`` (GFLOP/s), best of ``repeats``."""
    torch.set_num_threads(threads)
    if device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32, not TF32
    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device).to(DTYPES[dtype])
    b = torch.randn(n, n, generator=gen, device=device).to(DTYPES[dtype])
    for _ in range(2):
        a @ b
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def work() -> dict[str, Any]:
        best = float("inf")
        for _ in range(repeats):
            sync()
            clock = time.perf_counter()
            a @ b
            sync()
            best = min(best, time.perf_counter() - clock)
        return {"gflops": 2 * n**3 / best / 1e9, "n": n, "dtype": dtype, "threads": threads}

    return work


def measure_peak(dtypes: Sequence[str], threads: int, attempts: int = 3) -> dict[str, float]:
    """GFLOP/s of each dtype's square products on this machine now, each in a fresh interpreter
    (fastest of ``attempts`` after waiting for idle CPUs)."""
    peaks = {}
    for dtype in dtypes:
        kwargs = {"dtype": dtype, "threads": threads}
        best = fastest(
            lambda k=kwargs: run_contender("utilisation:peak_contender", k),
            attempts,
            label=f"peak {dtype}",
        )
        peaks[dtype] = float(best["output"]["gflops"])
    return peaks


def bert_forward_flops(
    lengths: Sequence[int],
    *,
    layers: int,
    hidden: int,
    intermediate: int,
    head_rows: int = 0,
    vocab: int = 0,
    attention: bool = True,
    last_layer_rows: int | None = None,
) -> float:
    """Matrix-product FLOPs of one BERT-style encoder forward over sequences of ``lengths``
    (padded lengths: what the kernels run), plus an MLM head (dense transform + decoder) on
    ``head_rows`` rows.

    Per layer and sequence of length T with width d and feed-forward width f: Q, K, V and output
    projections 8 T d^2, feed-forward 4 T d f, attention scores and values 4 T^2 d (left out
    with ``attention=False``: torch's FLOP counter does not see fused attention kernels on CPU).
    ``last_layer_rows``: the last layer runs for that many rows only (``train.last_layer``): keys
    and values 4 T d^2 per sequence, queries, output and feed-forward 4 d^2 + 4 d f per row, its
    attention 4 T d per row (T the mean length).
    """
    d, f, a = hidden, intermediate, 4 if attention else 0
    per_layer = sum(8 * t * d * d + 4 * t * d * f + a * t * t * d for t in lengths)
    head = 2 * head_rows * d * d + 2 * head_rows * d * vocab
    if last_layer_rows is None or not lengths:
        return float(layers * per_layer + head)
    mean = sum(lengths) / len(lengths)
    last = 4 * d * d * sum(lengths) + last_layer_rows * (4 * d * d + 4 * d * f + a * mean * d)
    return float((layers - 1) * per_layer + last + head)


def padded_lengths(lengths: Sequence[int], batch: int) -> list[int]:
    """Each sequence's padded length under length-sorted batches of ``batch``: its batch's
    longest (what the kernels run)."""
    order = sorted(lengths, reverse=True)
    return [order[s] for s in range(0, len(order), batch) for _ in order[s : s + batch]]


def encoder_flops(
    shape: dict[str, int],
    lengths: Sequence[int],
    head_rows: int = 0,
    vocab: int = 0,
    last_layer_rows: int | None = None,
) -> float:
    """:func:`bert_forward_flops` of a shape given as ``{"layers", "hidden", "intermediate"}``."""
    return bert_forward_flops(
        lengths,
        layers=shape["layers"],
        hidden=shape["hidden"],
        intermediate=shape["intermediate"],
        head_rows=head_rows,
        vocab=vocab,
        last_layer_rows=last_layer_rows,
    )


def gram_flops(rows: int, width: int, panels: int = 6) -> float:
    """FLOPs the Gram update ``X^T X`` of ``(rows, width)`` runs as ``stats.moments.add_gram``
    does it: BLAS ``syrk`` where SciPy is installed (one triangle, diagonal included:
    rows width (width + 1)), else the upper block triangle of ``panels x panels`` column panels
    (2 rows width^2 (panels + 1) / (2 panels))."""
    if GRAM_BY_SYRK:
        return float(rows) * width * (width + 1)
    return 2.0 * rows * width * width * (panels + 1) / (2 * panels)


GRAM_BY_SYRK = importlib.util.find_spec("scipy") is not None
GRAM_FORMULA = (
    "rows x D x (D + 1), one triangle by BLAS syrk"
    if GRAM_BY_SYRK
    else "2 x rows x D^2 x 7/12, the upper block triangle of 6 x 6 panels"
)


def counted_flops(call: Callable[[], Any]) -> float:
    """Matrix-product FLOPs of one call, counted by torch's ``FlopCounterMode``."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        call()
    return float(counter.get_total_flops())


def share(flops: float, seconds: float, peak_gflops: float) -> float:
    """Achieved rate as a share of the peak."""
    return flops / seconds / 1e9 / peak_gflops


def utilisation_rows(
    stage: str, runs: dict[str, dict[str, Any]], peak: dict[str, float], unit: Callable[..., str]
) -> list[list[Any]]:
    """One row per run (``{"seconds", "flops", "dtype"}``): its rate in ``unit(run)``, TFLOP,
    GFLOP/s and share of the peak of its dtype."""
    rows = []
    for name, r in runs.items():
        rate = r["flops"] / r["seconds"] / 1e9
        rows.append(
            [
                stage,
                name,
                unit(r),
                f"{r['flops'] / 1e12:.3g}",
                f"{rate:,.0f}",
                f"{rate / peak[r['dtype']]:.0%} of {r['dtype']}",
            ]
        )
    return rows


def utilisation_table(
    rows: list[list[Any]], peak: dict[str, float], stage: str = "stage"
) -> dict[str, Any]:
    """The table of :func:`utilisation_rows`, its title naming the peaks it compares with."""
    peaks = ", ".join(f"{dtype} {gflops:,.0f} GFLOP/s" for dtype, gflops in peak.items())
    return table(
        "Utilisation (matrix-product FLOPs over time, against the peak of the same dtype "
        f"measured in this run: {peaks})",
        [stage, "run", "rate", "TFLOP", "GFLOP/s", "share of peak"],
        rows,
    )


def require_bf16(owner: str, remedy: str) -> None:
    """Stop (exit status 2, one line) before a bfloat16 contender on a CPU without native
    bfloat16, unless ``LMALGEBRA_ALLOW_SLOW_BF16=1``: emulated, its figures would measure the
    emulation. ``owner``: the benchmark; ``remedy``: its option that leaves bfloat16 out."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.core.precision import check_bf16

    try:
        check_bf16(torch.device("cpu"), owner, remedy)
    except UserInputError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(2) from None
