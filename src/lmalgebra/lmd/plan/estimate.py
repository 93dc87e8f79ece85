"""A decomposition planned before any work: each phase's peak memory and time, per method.

For the models' widths (:func:`lmalgebra.lmd.plan.table.model_shapes`, no weights read) and the
span counts asked for, the plan lays out the exact method with float64 and float32 statistics and
the reduced and sketch methods at their ``k`` (the run's, else ``PLAN_K``), and says which fit the
memory available (``scale.memory_gib``, else what the machine has free now). A run whose chosen
method does not fit is refused before any embedding (:func:`check_plan`), naming what would fit.

The model behind the figures, all estimates:

- **Memory** at a phase's peak: the arrays it holds (``D x D`` statistics of every split; the
  inverse over the basis columns; per-model ``d x d`` covariances or ``d x s`` sketches; shard
  buffers) plus ``OVERHEAD`` for the interpreter and libraries. Statistics kept per block of
  spans (bootstrap, k-fold) multiply theirs by the blocks. Where the exact statistics of every
  split would not fit in memory, the run keeps one split's at a time and writes the covariances
  to files it maps into memory (``spilled``): their pages are the kernel's to evict.
- **Time**: the FLOPs of each phase's dense kernels over this machine's rates, measured by short
  probes (:func:`measure_speeds`: float32 and float64 matrix products, a Cholesky inverse, a
  symmetric eigendecomposition), plus embeddings read back at ``READ_RATE``. Embedding costs
  2 FLOPs per layer weight and token (about ``T`` tokens per span) at the float32 product rate;
  a model already cached costs nothing (the plan does not look).
- Not counted: reading the corpus and cutting spans, checking and writing files, and the studies
  beyond the main fits (alpha selection, bootstrap replicates, attribution, sweeps).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.sources.model_files import ModelShape
from lmalgebra.stats.principal import ITERATIONS, OVERSAMPLE

GIB = 2**30
OVERHEAD = 0.6 * GIB  # the interpreter with torch, numpy and transformers loaded
READ_RATE = 1e9  # bytes per second of embeddings read back (cache or precomputed files)
SHARD_ROWS = 2048  # rows per shard, the unit the passes stream
PLAN_K = 1024  # components the plan shows for the approximations when the run names none
ACTIVATIONS = 8  # float32 (batch, tokens, hidden) tensors a layer holds at once while embedding
BATCH_TOKENS = 2  # special tokens a span gets beyond its T


@dataclass(frozen=True)
class Speeds:
    """This machine's rates: FLOP/s of float32 and float64 products, of a Cholesky inverse
    (``D^3`` FLOPs counted) in each precision, of a symmetric eigendecomposition (``d^3``)."""

    product32: float
    product64: float
    inverse32: float
    inverse64: float
    eigh: float

    def rate(self, kernel: str) -> float:
        return READ_RATE if kernel == "read" else float(getattr(self, kernel))


def _best(run: Callable[[], object], repeats: int = 3) -> float:
    best = math.inf
    for _ in range(repeats):
        clock = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - clock)
    return max(best, 1e-9)


def _inverse_copy(matrix: np.ndarray) -> object:
    from lmalgebra.stats.symmetric_kernels import spd_inverse

    return spd_inverse(matrix.copy())


@functools.cache
def measure_speeds(size: int = 1024) -> Speeds:
    """Probe the rates on ``size``-wide matrices (best of three; a few seconds in all)."""
    rng = np.random.default_rng(0)
    a64 = rng.normal(size=(size, size))
    spd = a64 @ a64.T + size * np.eye(size)
    products = [
        2 * size**3 / _best(functools.partial(np.matmul, a, a))
        for a in (a64.astype(np.float32), a64)
    ]
    inverses = [
        size**3 / _best(functools.partial(_inverse_copy, spd.astype(dtype)), repeats=5)
        for dtype in (np.float32, np.float64)
    ]
    eigh = size**3 / _best(lambda: np.linalg.eigh(spd), repeats=1)
    return Speeds(products[0], products[1], inverses[0], inverses[1], eigh)


Work = dict[str, float]  # kernel (a Speeds field, or "read" for bytes) -> FLOPs (bytes)


@dataclass(frozen=True)
class Phase:
    """One phase of one method: its peak memory and the disk it takes (bytes), its work."""

    method: str
    precision: str
    components: int | None
    phase: str
    peak: float
    work: Work
    disk: float = 0.0
    model: str = ""

    def seconds(self, speeds: Speeds | None) -> float:
        if speeds is None:
            return float("nan")
        return sum(amount / speeds.rate(kernel) for kernel, amount in self.work.items())


@dataclass(frozen=True)
class Layout:
    """The sizes every phase is computed from: the widths of the blocks, the spans per split,
    the blocks of spans kept per split (1: none), the learning curve's prefixes (0: none) and
    whether CKA and CCA are computed."""

    widths: list[int]
    spans: dict[str, int]
    parts: dict[str, int]
    curve: int = 0
    similarity: bool = True

    @property
    def dim(self) -> int:
        return sum(self.widths)

    @property
    def rows(self) -> int:
        return sum(self.spans.values())


def layout_of(config: DecomposeConfig, shapes: Sequence[ModelShape]) -> Layout:
    """The run's layout: its models' widths, the span counts asked for, the blocks it keeps."""
    study = config.study
    parts = {s: study.blocks for s in SPLITS} if study.keeps_blocks else {}
    spans = dict(zip(SPLITS, config.spans.counts, strict=True))
    curve = len(study.train_sizes or [])
    return Layout([s.width for s in shapes], spans, parts, curve, study.similarity)


def _bytes(precision: str) -> int:
    return 4 if precision == "float32" else 8


def statistics_bytes(layout: Layout, columns: int, precision: str, spilled: bool) -> float:
    """The ``columns x columns`` statistics held once a pass is over: every split's (one split's
    when spilled), each block of spans its own, and the learning curve's prefixes."""
    square = columns * columns * _bytes(precision)
    per_split = [max(1, layout.parts.get(s, 1)) * square for s in SPLITS]
    return (max(per_split) if spilled else sum(per_split)) + layout.curve * square


def _buffer(columns: int) -> float:
    """A group of shards joined, and its centred float32 copy."""
    rows = max(SHARD_ROWS, min(8192, (256 * 2**20) // (4 * max(columns, 1))))
    return 2 * rows * columns * 4


def group_weights_bytes(bases: list[int], tails: list[int], precision: str) -> float:
    """The group fits' weights, held from the group fits to the end of the run: each model's
    ``(d_t, d_basis)`` matrix on all the other models' basis columns, in the statistics'
    precision (about ``heads^2`` numbers, as many as the inverse)."""
    heads = sum(bases)
    pairs = sum((b + t) * (heads - b) for b, t in zip(bases, tails, strict=True))
    return float(_bytes(precision) * pairs)


def fit_phases(
    layout: Layout,
    bases: list[int],
    tails: list[int],
    precision: str,
    held: float,
    label: tuple[str, str, int | None],
) -> list[Phase]:
    """The main fits over statistics of blocks with ``bases[m]`` basis columns and ``tails[m]``
    target-only columns, ``held`` bytes of statistics in memory: pairwise (a float64 Cholesky
    per model, the factors kept; per basis model its coefficients on every column and two
    float64 working copies of its covariance rows, one more while solving), group (one inverse,
    the operators of one target, held-out quadratic forms, tails; every fit's weights kept to
    the end), similarity."""
    heads, columns, p = sum(bases), sum(bases) + sum(tails), _bytes(precision)
    kernel = "product32" if precision == "float32" else "product64"
    widest = max(bases) if bases else 0
    held_out = len(SPLITS) - 1
    squares = sum(b * b for b in bases)
    weights = group_weights_bytes(bases, tails, precision)
    group = {
        "inverse32" if precision == "float32" else "inverse64": float(heads) ** 3,
        kernel: held_out * float(heads) ** 3 + 2 * squares * heads,
        "product64": 2.0 * len(SPLITS) * sum(tails) * heads * heads,
    }
    similarity = {
        "eigh": len(SPLITS) * float(sum(b**3 for b in bases)),
        "product64": 2.0 * len(SPLITS) * sum(a * a * b for a in bases for b in bases),
    }
    pairwise_peak = held + 8.0 * (4 * widest * columns + squares)
    # the inverse, one target's operator and its product, quadratic-form panels, the tails'
    # cross-covariance (gathered) and its product with the inverse, every weight so far
    group_peak = (
        held
        + p * (heads * heads + 2 * widest * heads + 2 * heads * sum(tails))
        + 2 * heads * 512 * 8
        + weights
    )
    phases = [
        Phase(*label, "pairwise fits", pairwise_peak, {"product64": 6.0 * squares * columns}),
        Phase(*label, "group fits", group_peak, group),
    ]
    if layout.similarity:
        phases.append(
            Phase(
                *label,
                "similarity (CKA, CCA)",
                held + weights + 3 * widest * widest * 8,
                similarity,
            )
        )
    return phases


def exact_phases(layout: Layout, precision: str, spilled: bool) -> list[Phase]:
    """The exact method: one pass into ``D x D`` statistics, then the fits on them."""
    dim, rows = layout.dim, layout.rows
    label = ("exact", precision, None)
    held = statistics_bytes(layout, dim, precision, spilled)
    disk = 0.0 if not spilled else statistics_bytes(layout, dim, precision, False)
    work = {"product32": float(rows) * dim * dim, "read": 4.0 * rows * dim}
    pass_phase = Phase(*label, "statistics pass", held + _buffer(dim), work, disk)
    in_memory = 0.0 if spilled else held
    return [
        pass_phase,
        *fit_phases(layout, layout.widths, [0] * len(layout.widths), precision, in_memory, label),
    ]


def reduced_phases(layout: Layout, method: str, k: int, probes: int, precision: str) -> list[Phase]:
    """A reduced method at ``k`` coordinates per model: the first pass over the training rows,
    the principal coordinates, the second pass, the fits, and the fits at ``k / 2``."""
    widths, dim, rows = layout.widths, layout.dim, layout.rows
    train = layout.spans.get("train", 0)
    ks = [min(k, w) for w in widths]
    tails = [0 if c >= w else probes for c, w in zip(ks, widths, strict=True)]
    sizes = [min(w, c + OVERSAMPLE) for c, w in zip(ks, widths, strict=True)]
    columns = sum(ks) + sum(tails)
    label = (method, precision, k)
    if method == "reduced":
        first_held = 8.0 * sum(w * w for w in widths)
        first = {"product32": float(train) * sum(w * w for w in widths)}
        widest = max(widths)
        basis_peak = first_held + 4.0 * widest * widest + 32.0 * widest * max(sizes)
        basis = {
            "product32": 2.0
            * (ITERATIONS + 1)
            * sum(w * w * s for w, s in zip(widths, sizes, strict=True)),
            "product64": 2.0
            * sum(w * w * s + w * s * s for w, s in zip(widths, sizes, strict=True)),
            "eigh": float(sum(s**3 for s in sizes)),
        }
    else:
        first_held = 12.0 * sum(w * s for w, s in zip(widths, sizes, strict=True))
        first = {"product32": 4.0 * train * sum(w * s for w, s in zip(widths, sizes, strict=True))}
        basis_peak = first_held + 48.0 * max(w * s for w, s in zip(widths, sizes, strict=True))
        basis = {"product64": 6.0 * sum(w * s * s for w, s in zip(widths, sizes, strict=True))}
    first["read"] = 4.0 * train * dim
    projection = sum(w * (c + t) for w, c, t in zip(widths, ks, tails, strict=True))
    held = statistics_bytes(layout, columns, precision, False)
    second = {
        "product32": float(rows) * (2 * projection + columns * columns),
        "read": 4.0 * rows * dim,
    }
    second_peak = held + 12.0 * projection + 4.0 * SHARD_ROWS * (dim + columns)
    # each model's principal coordinates and probes (float64) stay held through the fits
    held += 8.0 * projection
    half = [max(1, c // 2) for c in ks]
    half_tails = [c - h + t for c, h, t in zip(ks, half, tails, strict=True)]
    # the fits at k/2 run while the run's own group fits (their weights) are held
    at_half = fit_phases(
        layout, half, half_tails, precision, held + group_weights_bytes(ks, tails, precision), label
    )
    return [
        Phase(*label, "pass 1: training rows", first_held + SHARD_ROWS * dim * 4, first),
        Phase(*label, "principal coordinates", basis_peak, basis),
        Phase(*label, "pass 2: projected rows", second_peak, second),
        *fit_phases(layout, ks, tails, precision, held, label),
        Phase(
            *label,
            "fits at k/2 (error estimate)",
            max(p.peak for p in at_half),
            _summed(at_half[:2]),
        ),
    ]


def _summed(phases: Sequence[Phase]) -> Work:
    total: Work = {}
    for phase in phases:
        for kernel, amount in phase.work.items():
            total[kernel] = total.get(kernel, 0.0) + amount
    return total


def embed_phases(
    shapes: Sequence[ModelShape], layout: Layout, tokens: int, batch: int
) -> list[Phase]:
    """Embedding each model that embeds here (and the cache it fills), or reading its file."""
    phases = []
    for shape in shapes:
        cache = 4.0 * layout.rows * shape.width
        if not shape.embeds:
            continue
        activations = 4.0 * batch * tokens * (ACTIVATIONS * shape.hidden + shape.intermediate)
        work = {"product32": 2.0 * shape.parameters * layout.rows * tokens}
        peak = (
            shape.weight_bytes
            + activations
            + cache / max(1, layout.rows) * layout.spans.get("train", 0)
        )
        disk = cache if shape.cached else 0.0
        phases.append(Phase("all", "", None, "embed", peak, work, disk, shape.name))
    return phases


@dataclass
class Plan:
    """Every phase of every method for one run, and the memory it may use.

    ``chosen``: the run's own ``(method, precision, k)``; ``spilled``: the exact methods whose
    statistics would be spilled to disk (they do not fit in memory otherwise).
    """

    phases: list[Phase]
    available: float
    chosen: tuple[str, str, int | None]
    layout: Layout
    spilled: dict[str, bool]

    def methods(self) -> list[tuple[str, str, int | None]]:
        seen: list[tuple[str, str, int | None]] = []
        for p in self.phases:
            key = (p.method, p.precision, p.components)
            if p.method != "all" and key not in seen:
                seen.append(key)
        return seen

    def peak(self, method: tuple[str, str, int | None]) -> float:
        """The method's peak memory after embedding (what the run is held to)."""
        own = [p.peak for p in self.phases if (p.method, p.precision, p.components) == method]
        return OVERHEAD + max(own)

    def fits(self, method: tuple[str, str, int | None]) -> bool:
        return self.peak(method) <= self.available


def plan_run(config: DecomposeConfig, shapes: Sequence[ModelShape], available: float) -> Plan:
    """The plan of ``config`` for models of ``shapes`` with ``available`` bytes of memory."""
    layout = layout_of(config, shapes)
    scale = config.scale
    phases = embed_phases(shapes, layout, config.spans.length + BATCH_TOKENS, config.batch_size)
    spilled = {}
    for precision in ("float64", "float32"):
        in_memory = exact_phases(layout, precision, spilled=False)
        too_big = OVERHEAD + max(p.peak for p in in_memory) > available
        spilled[precision] = too_big and not layout.parts and not layout.curve
        phases += exact_phases(layout, precision, True) if spilled[precision] else in_memory
    widest = max(layout.widths)
    k = min(scale.components or PLAN_K, widest)
    for method in ("reduced", "sketch"):
        shown = k
        if method == scale.method and scale.components is None:
            shown = widest  # k chosen by retained variance: at most every dimension
        phases += reduced_phases(layout, method, shown, scale.probes, scale.precision)
    chosen_k = None if scale.method == "exact" else (scale.components or widest)
    chosen_k = None if chosen_k is None else min(chosen_k, widest)
    return Plan(phases, available, (scale.method, scale.precision, chosen_k), layout, spilled)


def largest_k(plan: Plan, method: str, precision: str, probes: int) -> int | None:
    """The most components per model at which ``method`` fits the plan's memory (None: not
    even 16)."""
    low, high, best = 16, max(plan.layout.widths), None
    while low <= high:
        k = (low + high) // 2
        phases = reduced_phases(plan.layout, method, k, probes, precision)
        if OVERHEAD + max(p.peak for p in phases) <= plan.available:
            best, low = k, k + 1
        else:
            high = k - 1
    return best


def _apart(need: float, available: float) -> tuple[str, str]:
    """Two sizes in GiB to one decimal, or as many more (up to 3) as tell them apart: a need
    just above what is available is not "needs 0.6 GiB but 0.6 GiB are available"."""
    places = 1
    while places < 3 and f"{need:.{places}f}" == f"{available:.{places}f}":
        places += 1
    return f"{need:.{places}f}", f"{available:.{places}f}"


def check_plan(plan: Plan, probes: int) -> None:
    """Refuse a run whose chosen method does not fit, in one line naming what would."""
    from lmalgebra.core.errors import UserInputError

    method, precision, k = plan.chosen
    if plan.fits(plan.chosen):
        return
    remedies = []
    if method == "exact" and precision == "float64" and plan.fits(("exact", "float32", None)):
        peak = plan.peak(("exact", "float32", None)) / GIB
        remedies.append(
            f'--scale.precision float32 (scale={{"precision": "float32"}}; needs {peak:.1f} GiB)'
        )
    for option in ("reduced", "sketch"):
        best = largest_k(plan, option, precision, probes)
        if best is not None and (option == "reduced" or method == "sketch"):
            keyword = f'scale={{"method": "{option}", "components": {best}}}'
            remedies.append(
                f"--scale.method {option} --scale.components {best} ({keyword}; k at most {best})"
            )
            break
    what = f"the {method} method" + (f" at k = {k}" if k else "") + f" with {precision} statistics"
    layout = plan.layout
    need, available = _apart(plan.peak(plan.chosen) / GIB, plan.available / GIB)
    raise UserInputError(
        f"decompose: {what} needs {need} GiB at its peak "
        f"({len(layout.widths)} models, D = {layout.dim:,} columns, {layout.rows:,} spans) but "
        f"{available} GiB are available; use "
        + (" or ".join(remedies) if remedies else "fewer or narrower models")
        + " (lmalgebra decompose --dry-run or decompose_plan() shows the plan; "
        '--scale.memory_gib (scale={"memory_gib": GIB}) sets the memory)'
    )
