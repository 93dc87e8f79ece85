"""The figures, targets, tables and plot of ``bench_wide.py`` from its stored measurements."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from harness import figure, goal, table
from lmalgebra.core.splits import SPLITS

GB = 1e9  # the targets' gigabytes
MIB = 2**20
MEMORY_TARGET = 16 * GB
TIME_TARGET = 30 * 60.0
R2_TARGET = 0.005
PLOT = "wide_scaling.png"


def peak_mib(run: dict[str, Any]) -> float:
    """A run's peak RSS: the child's own (``life_peak_rss_mib``); for records made before the
    harness kept it, the work's peak (``work_peak_rss_mib``, from the child's ``VmHWM``), as
    ``peak_rss_mib`` (``wait4``'s ``ru_maxrss``) also counted the parent's pages at fork."""
    for key in ("life_peak_rss_mib", "work_peak_rss_mib", "peak_rss_mib"):
        value = run.get(key)
        if value is not None and value == value:  # not NaN
            return float(value)
    return float("nan")


def label(run: dict[str, Any]) -> str:
    scale = run["scale"] or {}
    method = scale.get("method", "exact")
    text = method + (f" k={scale['components']}" if scale.get("components") else "")
    return text + (" float32" if scale.get("precision") == "float32" else "")


def differences(run: dict[str, Any], exact: dict[str, Any]) -> dict[str, float]:
    """Largest |R^2 - exact R^2| of the pairwise and the group fits, on test and on any split."""
    out: dict[str, float] = {}
    for kind in ("pairwise", "group"):
        per_split = {
            s: float(
                np.nanmax(
                    np.abs(
                        np.array(run["output"][kind][s], dtype=float)
                        - np.array(exact["output"][kind][s], dtype=float)
                    )
                )
            )
            for s in SPLITS
        }
        out[f"{kind}_test"], out[f"{kind}_any"] = per_split["test"], max(per_split.values())
    return out


def _planned(run: dict[str, Any]) -> str:
    """The dry run's figures for the same run, beside the measured ones."""
    if "plan_peak_mib" not in run:
        return ""
    return f"{run['plan_peak_mib']:,.0f} MiB / {_minutes(run['plan_seconds'])}"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 120 else f"{seconds:.0f} s"


def accuracy_rows(
    runs: list[dict[str, Any]],
) -> tuple[list[list[Any]], dict[str, dict[str, float]]]:
    exact = runs[0]
    rows, found = [], {}
    for run in runs:
        diff = differences(run, exact)
        found[label(run)] = diff
        method = run["output"]["method"]
        kept = method.get("retained_variance", {})
        share = np.mean([v["train"] for v in kept.values()]) if kept else 1.0
        estimate = method.get("error_estimate", {}).get("test")
        rows.append(
            [
                label(run),
                f"{100 * share:.1f}%",
                _minutes(run["seconds"]),
                f"{run['own_cpu_s'] / 60:.1f}",
                f"{peak_mib(run):,.0f}",
                f"{diff['pairwise_test']:.1e} / {diff['group_test']:.1e}",
                f"{diff['pairwise_any']:.1e} / {diff['group_any']:.1e}",
                "" if estimate is None else f"{estimate:.1e}",
                _planned(run),
            ]
        )
    return rows, found


def scaling_plot(runs: list[dict[str, Any]], out: Path) -> Path:
    from lmalgebra.figures.canvas import figure as canvas
    from lmalgebra.figures.canvas import save

    fig, axes = canvas(2, 2, 4.2, 3.2)
    d_runs = [r for r in runs if r["train"] == runs[0]["train"]]
    n_runs = [
        r for r in runs if r["models"] == runs[-1]["models"] and r["width"] == runs[-1]["width"]
    ]
    for column, (subset, key, name) in enumerate(
        (
            (d_runs, lambda r: r["models"] * r["width"], "D (columns)"),
            (n_runs, lambda r: r["train"], "training spans"),
        )
    ):
        for method in sorted({label(r) for r in subset}):
            points = sorted(((key(r), r) for r in subset if label(r) == method), key=lambda p: p[0])
            xs = [p[0] for p in points]
            axes[0, column].loglog(xs, [p[1]["seconds"] for p in points], "o-", label=method)
            axes[1, column].loglog(xs, [peak_mib(p[1]) for p in points], "o-", label=method)
        for row, unit in enumerate(("wall time (s)", "peak RSS (MiB)")):
            axes[row, column].set_xlabel(name)
            axes[row, column].set_ylabel(unit)
            axes[row, column].grid(True, which="both", alpha=0.3)
            axes[row, column].legend(fontsize=8)
    fig.suptitle("bench_wide: time and memory against D and against the spans (log-log)")
    return save(fig, out)


def record(
    stored: dict[str, list[dict[str, Any]]], bench: Path
) -> tuple[
    list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]], list[str], dict[str, Any]
]:
    """``(figures, targets, tables, notes, sizes)`` for ``Session.save``."""
    figures, targets, tables, notes = [], [], [], []
    sizes: dict[str, Any] = {}
    found: dict[str, dict[str, float]] = {}
    if "accuracy" in stored:
        runs = stored["accuracy"]
        exact = runs[0]
        size = f"{exact['models']} x {exact['width']}, {exact['train']:,} training spans"
        sizes["accuracy"] = size
        rows, found = accuracy_rows(runs)
        columns = [
            "method",
            "variance kept (train, mean)",
            "wall",
            "own CPU (min)",
            "peak RSS (MiB)",
            "max |dR^2| test: pairwise / group",
            "max |dR^2| any split",
            "error estimate (test)",
            "plan: peak / time",
        ]
        tables.append(table(f"Accuracy against exact float64 ({size})", columns, rows))
        for run in runs[1:]:
            figures.append(
                figure(
                    f"{size}: {label(run)}",
                    "s",
                    exact["seconds"],
                    run["seconds"],
                    peak_mib=(peak_mib(exact), peak_mib(run)),
                    others_share=(exact["others_share"], run["others_share"]),
                )
            )
    if "scaling" in stored:
        runs = stored["scaling"]
        rows = [
            [
                r["models"] * r["width"],
                f"{r['train']:,}",
                label(r),
                f"{r['seconds']:.1f}",
                f"{peak_mib(r):,.0f}",
            ]
            for r in runs
        ]
        tables.append(
            table(
                "Scaling (plotted)",
                ["D", "training spans", "method", "wall (s)", "peak RSS (MiB)"],
                rows,
            )
        )
        # beside RESULTS.md, and under docs/ where the documentation site's results page (which
        # includes RESULTS.md) finds the same relative link
        shutil.copyfile(scaling_plot(runs, bench / PLOT), bench.parent / "docs" / PLOT)
        notes.append(f"![time and memory against D and against the spans]({PLOT})")
    if "regime" in stored:
        tables.append(regime_table(stored["regime"]))
    if "full" in stored:
        runs = stored["full"]
        rows = []
        for run in runs:
            dim = run["models"] * run["width"]
            rows.append(
                [
                    f"{run['models']} x {run['width']} (D = {dim:,})",
                    label(run),
                    _minutes(run["seconds"]),
                    f"{run['own_cpu_s'] / 60:.1f}",
                    f"{peak_mib(run):,.0f}",
                    f"{run['others_share']:.0%}",
                    _planned(run),
                ]
            )
        columns = [
            "models",
            "method",
            "wall",
            "own CPU (min)",
            "peak RSS (MiB)",
            "others' CPU share",
            "plan: peak / time",
        ]
        tables.append(table(f"Full size ({runs[0]['train']:,} training spans)", columns, rows))
        sizes["full"] = ", ".join(f"{r['models']} x {r['width']}" for r in runs)
        targets += full_targets(runs, found)
    codes = {
        part: sorted({str(r.get("code", "not recorded")) for r in runs})
        for part, runs in stored.items()
    }
    notes.append(
        "Each part keeps its last measurement; the code each was measured at: "
        + "; ".join(f"{part} {', '.join(found_codes)}" for part, found_codes in codes.items())
        + "."
    )
    return figures, targets, tables, notes, sizes


def regime_table(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per alpha: the exact and the reduced group R^2 (mean over models) per split, and how far
    the reduced ones are from the exact ones."""
    rows = []
    for run in runs:
        exact = next(r for r in runs if r["alpha"] == run["alpha"] and not r["scale"])
        group = run["output"]["group"]
        moved = [np.max(np.abs(np.subtract(group[s], exact["output"]["group"][s]))) for s in SPLITS]
        rows.append(
            [f"{run['alpha']:g}", label(run)]
            + [f"{np.mean(group[s]):.4f}" for s in SPLITS]
            + [" / ".join(f"{m:.1e}" for m in moved) if run["scale"] else ""]
        )
    first = runs[0]
    title = (
        f"Alpha and over-learning ({first['models']} x {first['width']}, {first['train']:,} "
        "training spans): group R^2, mean over models"
    )
    columns = ["alpha", "method", "train", "validation", "test", "max |dR^2| train / val / test"]
    return table(title, columns, rows)


def full_targets(
    runs: list[dict[str, Any]], found: dict[str, dict[str, float]]
) -> list[dict[str, Any]]:
    out = []
    twelve = next((r for r in runs if r["models"] == 12), None)
    if twelve is not None:
        peak = peak_mib(twelve) * MIB
        out.append(
            goal(
                "12 x 4,096 in at most 16 GB", peak <= MEMORY_TARGET, f"peak RSS {peak / GB:.1f} GB"
            )
        )
        idle = twelve["own_cpu_s"] / 2
        out.append(
            goal(
                "12 x 4,096 in at most 30 minutes on 2 cores",
                twelve["seconds"] <= TIME_TARGET,
                f"wall {_minutes(twelve['seconds'])} with other processes taking "
                f"{twelve['others_share']:.0%} of the CPUs; own CPU time / 2 cores = "
                f"{_minutes(idle)}",
            )
        )
        diff = found.get(label(twelve))
        if diff is not None:
            worst = max(diff["pairwise_any"], diff["group_any"])
            out.append(
                goal(
                    f"every R^2 within {R2_TARGET} of exact ({label(twelve)}, measured at "
                    "the accuracy size)",
                    worst <= R2_TARGET,
                    f"largest difference {worst:.1e}",
                )
            )
    widest = next((r for r in runs if r["models"] == 24), None)
    if widest is not None:
        out.append(
            goal(
                "24 x 4,096 runs to the end",
                True,
                f"{_minutes(widest['seconds'])}, peak RSS {peak_mib(widest) * MIB / GB:.1f} GB",
            )
        )
    return out
