"""Files of a decomposition run: CSV tables, weights, summary, resolved config, heatmap."""

from __future__ import annotations

import csv
import io
import platform
from pathlib import Path
from typing import Any

import numpy as np
from rich.table import Table

from lmalgebra import __version__
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.config import config_yaml
from lmalgebra.lmd.pipeline import Decomposition
from lmalgebra.storage.atomic import write_atomic, write_json_atomic, write_text_atomic

SUMMARY = "summary.json"
CONFIG = "config.yaml"

# Tidy tables of a run (file stem -> columns); see the README's description of a run directory.
_SWEEP = ["setting", "kind", "target", "basis", "split", "r2"]
TABLE_COLUMNS: dict[str, list[str]] = {
    "fits": ["kind", "target", "basis", "split", "r2", "ci_low", "ci_high", "adjusted_r2"],
    "nulls": ["kind", "target", "basis", "split", "r2"],
    "similarity": ["model_a", "model_b", "split", "lmd_r2", "cka", "mean_cca"],
    "alpha_curve": ["target", "alpha", "criterion", "value"],
    "attribution": ["target", "method", "model", "step", "split", "value"],
    "sweeps/length": _SWEEP,
    "sweeps/layer": _SWEEP,
    "sweeps/layer_map": ["model_a", "layer_a", "model_b", "layer_b", "split", "r2"],
    "sweeps/train_size": _SWEEP,
    "sweeps/language": _SWEEP,
}


def _csv_text(rows: list[list[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def tidy_csv(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as CSV with the given columns; floats at full precision, NaN and missing as blank."""

    def cell(value: Any) -> Any:
        if isinstance(value, float | np.floating):
            return "" if np.isnan(value) else repr(float(value))
        return value

    return _csv_text([columns, *([cell(r.get(c, "")) for c in columns] for r in rows)])


def _cell(value: float | np.floating) -> str:
    return "" if np.isnan(value) else f"{value:.6f}"


def versions() -> dict[str, str]:
    import numpy
    import torch
    import transformers

    return {
        "lmalgebra": __version__,
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
    }


def summary(result: Decomposition) -> dict[str, Any]:
    names = result.names
    off_diagonal = ~np.eye(len(names), dtype=bool)
    group = {f.target: f.r2 for f in result.group}
    return {
        "status": "complete",
        "models": names,
        "spans": result.spans,
        "group_dependency": {s: float(np.mean([g[s] for g in group.values()])) for s in SPLITS},
        "group_r2": group,
        "mean_pairwise_r2": {s: float(result.pairwise[s][off_diagonal].mean()) for s in SPLITS},
        "tokens_per_span": {n: round(r.mean_tokens, 3) for n, r in result.tokens.items()},
        "truncated_spans": {n: r.truncated for n, r in result.tokens.items()},
        "single_fit": None
        if result.single is None
        else {
            "target": result.single.target,
            "basis": list(result.single.basis),
            "r2": result.single.r2,
        },
        "alpha": {
            "value": result.alpha,
            "mode": result.config.alpha_mode,
            "selected_by": result.alpha_selected_by,
        },
        "tables": sorted(f"{stem}.csv" for stem in result.tables),
        "seconds": {k: round(v, 3) for k, v in result.timings.items()},
    }


def write_outputs(result: Decomposition) -> Path:
    """Write every output; ``summary.json`` goes last and marks the run complete."""
    out = result.config.out
    names = result.names
    for split in SPLITS:
        rows: list[list[Any]] = [["target \\ basis", *names]]
        rows += [[t, *(_cell(v) for v in result.pairwise[split][i])] for i, t in enumerate(names)]
        write_text_atomic(out / f"pairwise_r2_{split}.csv", _csv_text(rows))
    group_rows: list[list[Any]] = [["target", *SPLITS]]
    group_rows += [[f.target, *(_cell(f.r2[s]) for s in SPLITS)] for f in result.group]
    group_rows.append(["mean", *(_cell(np.mean([f.r2[s] for f in result.group])) for s in SPLITS)])
    write_text_atomic(out / "group_r2.csv", _csv_text(group_rows))
    if result.config.save_weights:
        _write_weights(result, out / "weights.safetensors")
    write_text_atomic(out / CONFIG, config_yaml(result.config))
    provenance = {"versions": versions(), "hashes": result.hashes, "models": result.fingerprints}
    write_json_atomic(out / "provenance.json", provenance)
    heatmap(result.pairwise["test"], names, out / "pairwise_r2_test.png")
    for stem, table_rows in result.tables.items():
        write_text_atomic(out / f"{stem}.csv", tidy_csv(table_rows, TABLE_COLUMNS[stem]))
    from lmalgebra.lmd.figures import write_plots

    write_plots(out, chosen=result.alpha)
    write_json_atomic(out / SUMMARY, summary(result))
    return out


def _write_weights(result: Decomposition, path: Path) -> None:
    from safetensors.numpy import save_file

    fits = [("group", f) for f in result.group] + (
        [("fit", result.single)] if result.single else []
    )
    tensors, meta = {}, {}
    for kind, f in fits:
        tensors[f"{kind}.{f.target}.weight"] = np.ascontiguousarray(f.weight)
        tensors[f"{kind}.{f.target}.bias"] = f.bias
        meta[f"{kind}.{f.target}.basis"] = ",".join(f.basis)
    write_atomic(path, lambda tmp: save_file(tensors, str(tmp), metadata=meta))


def heatmap(matrix: np.ndarray, names: list[str], path: Path) -> None:
    """Pairwise R^2 as a heatmap PNG (rows = target, columns = basis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    size = max(4.0, 0.6 * len(names) + 2)
    fig, ax = plt.subplots(figsize=(size + 1, size))
    image = ax.imshow(np.ma.masked_invalid(matrix), vmin=0, vmax=1, cmap="viridis")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("basis")
    ax.set_ylabel("target")
    for i in range(len(names)):
        for j in range(len(names)):
            if not np.isnan(matrix[i, j]):
                ax.text(
                    j,
                    i,
                    f"{matrix[i, j]:.2f}",
                    ha="center",
                    va="center",
                    color="white" if matrix[i, j] < 0.6 else "black",
                    fontsize=8,
                )
    fig.colorbar(image, ax=ax, label="held-out R$^2$ (test)")
    ax.set_title("Pairwise R$^2$: target from one basis model")
    fig.tight_layout()
    write_atomic(path, lambda tmp: fig.savefig(tmp, format="png", dpi=120))
    plt.close(fig)


def table(result: Decomposition) -> Table:
    """Group R^2 per model and split, plus tokens per span, as a rich table."""
    view = Table(title=f"Group R^2: each model from all the others ({result.config.out})")
    view.add_column("model")
    for split in SPLITS:
        view.add_column(f"{split} R^2", justify="right")
    view.add_column("tokens/span", justify="right")
    view.add_column("truncated", justify="right")
    for f in result.group:
        tok = result.tokens[f.target]
        view.add_row(
            f.target,
            *(f"{f.r2[s]:.3f}" for s in SPLITS),
            f"{tok.mean_tokens:.1f}",
            str(tok.truncated),
        )
    means = [np.mean([f.r2[s] for f in result.group]) for s in SPLITS]
    view.add_row("[bold]mean (group dependency)", *(f"[bold]{m:.3f}" for m in means), "", "")
    if result.single is not None:
        s = result.single
        view.caption = f"{s.target} from {' + '.join(s.basis)}: " + ", ".join(
            f"{k} R^2 {v:.3f}" for k, v in s.r2.items()
        )
    return view
