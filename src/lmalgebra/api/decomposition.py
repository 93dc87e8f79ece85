"""``Decomposition``: the result of a decomposition as labelled DataFrames, computed now or read
back from a run directory (``Decomposition.load``), saved as the command line saves it, and shown
in a notebook.

Every table comes from the run's tidy tables (``fits.csv`` and the rest, see
:mod:`lmalgebra.lmd.rundir.schema`), so a result computed in memory and the same run read from disk
give equal DataFrames.
"""

from __future__ import annotations

import dataclasses
import functools
import html
import json
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from lmalgebra.api.frames import computed_frames, group_frame, pairwise_frame, read_frames
from lmalgebra.api.runtime import library_entry
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import plain
from lmalgebra.core.recipe_files import yaml_problem
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.run.decompose import check_output_directory, claim_copy, save_result
from lmalgebra.lmd.run.outputs import summary as summary_of
from lmalgebra.lmd.run.pipeline import RunResult
from lmalgebra.lmd.rundir.files import read_summary
from lmalgebra.lmd.rundir.schema import CONFIG, PAIRWISE_HEATMAP, SUMMARY
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.storage.atomic import write_atomic
from lmalgebra.storage.lockfile import run_directory_lock

if TYPE_CHECKING:  # pandas is imported with the first table asked for
    import pandas as pd


class Decomposition:
    """What a decomposition found: pairwise and group R^2, every fit, similarities, studies.

    Build it with :func:`lmalgebra.decompose` or :meth:`load`. Tables are pandas DataFrames
    labelled by model name; ``summary`` is the run's ``summary.json``, ``config`` its resolved
    configuration (``config.yaml``) as a dict.

    A result computed now makes its DataFrames on first use (``tables``): a caller that reads
    the summary alone, as the command line does, never imports pandas.
    """

    def __init__(
        self,
        summary: dict[str, Any],
        config: dict[str, Any],
        tables: dict[str, pd.DataFrame] | None,
        run_dir: Path | None = None,
        result: RunResult | None = None,
    ) -> None:
        if tables is None and result is None:
            raise ValueError("a Decomposition needs its tables or the result they come from")
        self.summary = summary
        # what its directory must still hold: the summary as read or made, whatever a caller
        # does to ``summary`` (a key popped to print it had been taken for the run rewritten)
        self._identity = _canonical(summary)
        self.config = config
        self._tables = tables
        self.run_dir = None if run_dir is None else Path(run_dir).absolute()  # after os.chdir too
        self._result = result

    @property
    def tables(self) -> dict[str, pd.DataFrame]:
        """Every table of the run by its file's stem (``fits``, ``similarity``, ...)."""
        if self._tables is None:
            assert self._result is not None
            self._tables = computed_frames(self._result.tables)
        return self._tables

    @classmethod
    @library_entry
    def from_result(cls, result: RunResult, run_dir: Path | None = None) -> Decomposition:
        """A result computed now (written to ``run_dir`` when it was given an output)."""
        config = result.config.model_dump(mode="json")
        return cls(summary_of(result), config, None, run_dir, result)

    @classmethod
    @library_entry
    def load(cls, run_dir: str | Path) -> Decomposition:
        """Read a complete run directory (written by ``lmalgebra decompose --out`` or ``save``)."""
        directory = Path(run_dir)
        summary = read_summary(directory)  # refuses a missing or incomplete run, naming it
        _check_fields(summary, directory / SUMMARY)
        config_path = directory / CONFIG
        config: Any = {}
        if config_path.is_file():
            try:
                config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
            except yaml.YAMLError as err:
                raise UserInputError(
                    f"{config_path} is not readable YAML: {yaml_problem(err)}"
                ) from None
            except UnicodeDecodeError as err:
                raise UserInputError(f"{config_path} is not readable YAML: {err}") from None
        tables = read_frames(directory)
        if "fits" not in tables:
            raise UserInputError(f"{directory} holds no fits.csv and no pairwise or group tables")
        if tables["fits"].empty:  # an IndexError from its repr had followed
            raise UserInputError(
                f"{directory} holds no fit (its tables have no row): compute it again"
            )
        return cls(summary, config if isinstance(config, dict) else {}, tables, directory)

    # -- labelled results ---------------------------------------------------------------------
    @property
    def names(self) -> list[str]:
        """The models, in the run's order."""
        return [str(n) for n in self.summary["models"]]

    @property
    def alpha(self) -> float:
        """The ridge strength the fits used (chosen by the study when ``alpha_select`` is set)."""
        alpha = self.summary["alpha"]
        return float(alpha["value"] if isinstance(alpha, dict) else alpha)

    @property
    def spans(self) -> dict[str, int]:
        """Spans per split."""
        return {str(k): int(v) for k, v in self.summary.get("spans", {}).items()}

    @property
    def fits(self) -> pd.DataFrame:
        """Every fit per split, the columns of ``fits.csv``: kind (pairwise, group, single),
        target, basis (models joined by ``+``), split, r2, ci_low/ci_high (bootstrap),
        adjusted_r2 (train rows)."""
        return self.tables["fits"]

    @library_entry
    def pairwise(self, split: str = "test", diagonal: float = 1.0) -> pd.DataFrame:
        """R^2 of each target (rows, index ``target``) from each single model (columns,
        ``basis``) on ``split``.

        The diagonal is not a fit: it holds ``diagonal``, by default 1.0 (a model explains itself
        exactly); pass ``float('nan')`` for the empty diagonal of ``pairwise_r2_{split}.csv``.
        """
        if split not in SPLITS:
            raise UserInputError(
                f"Decomposition.pairwise(): split must be one of {', '.join(SPLITS)}, got {split!r}"
            )
        return pairwise_frame(self.fits, self.names, split, diagonal)

    @property
    def group(self) -> pd.DataFrame:
        """R^2 of each model (index ``target``) from all the others; one column per split.
        Their mean over models, the group dependency, is ``summary['group_dependency']``."""
        return group_frame(self.fits, self.names)

    @property
    def heatmap(self) -> Path | None:
        """The heatmap of pairwise test R^2 (``pairwise_r2_test.png``) of a run written to a
        directory, drawn there the first time it is asked for (a run draws its figures itself
        only with ``figures: true``); None for a run not written to a directory."""
        return self._heatmap()

    @library_entry
    def _heatmap(self) -> Path | None:
        """:attr:`heatmap`, as an API call (one at a time in the process, its errors in one
        line): it draws into the run directory."""
        if self.run_dir is None:
            return None
        path = self._own_run("heatmap") / PAIRWISE_HEATMAP
        if not path.is_file():
            from lmalgebra.lmd.figures.heatmaps import pairwise_heatmap

            matrix = self.pairwise("test", float("nan")).to_numpy()
            # drawn into the run, as report draws its figures: not while a run writes there
            with run_directory_lock(self.run_dir, "report"):
                pairwise_heatmap(matrix, list(self.names), path)
        return path

    @property
    def similarity(self) -> pd.DataFrame:
        """Per ordered pair and split: LMD R^2 (a from b), linear CKA and mean CCA."""
        return self._table("similarity")

    @property
    def nulls(self) -> pd.DataFrame:
        """Null baselines: shuffled pairing (always), random-initialised copies (``nulls``)."""
        return self._table("nulls")

    @property
    def method(self) -> dict[str, Any]:
        """How the statistics were made: ``name`` (exact, reduced or sketch) and ``precision``;
        for a reduced run also ``components`` (k per model), ``retained_variance`` and
        ``error_estimate`` per split (see ``reduction``)."""
        return dict(self.summary.get("method") or {"name": "exact", "precision": "float64"})

    @property
    def reduction(self) -> pd.DataFrame:
        """A reduced run's ``reduction.csv``: per model and split, its width, the principal
        coordinates and tail probes kept, the share of variance they hold, its group R^2 and the
        same with every basis model at half its coordinates."""
        return self._table("reduction")

    def _table(self, stem: str) -> pd.DataFrame:
        if stem not in self.tables:
            raise UserInputError(
                f"Decomposition.{stem}: this decomposition has no {stem} table (it has "
                f"{', '.join(sorted(self.tables)) or 'none'})"
            )
        return self.tables[stem]

    # -- files ----------------------------------------------------------------------------------
    @library_entry
    def save(self, directory: str | Path, overwrite: bool = False) -> Path:
        """Write the run directory ``lmalgebra decompose --out`` writes (tables, statistics,
        figures, ``config.yaml``, ``summary.json`` last). ``directory`` must be empty or absent,
        or hold this same run; ``overwrite`` replaces a run of another configuration."""
        target = Path(directory)
        check_output_directory(target, "Decomposition.save() directory")
        if self._result is None:
            return self._copy_to(target, overwrite)
        config: DecomposeConfig = self._result.config.model_copy(update={"out": target})
        save_result(dataclasses.replace(self._result, config=config), overwrite)
        self.run_dir = target.absolute()
        return target

    def _copy_to(self, target: Path, overwrite: bool) -> Path:
        source = self._own_run("save()")
        if target.exists() and target.resolve() == source.resolve():
            return target  # where it was read from: there already (overwrite would remove it)
        with run_directory_lock(target, "decompose"):  # as a run there would hold it
            claim_copy(source, target, overwrite)

            def left_out(directory: str, names: list[str]) -> list[str]:
                """Hidden files (the lock), the configuration (copied by the claim) and the
                completion mark (copied last)."""
                top = Path(directory) == source
                return [n for n in names if n.startswith(".") or (top and n in (CONFIG, SUMMARY))]

            # each file written whole, or not at all: a full disk is one error naming it (a
            # copy's own errors are gathered into one list of every file, written on cut short)
            shutil.copytree(
                source, target, ignore=left_out, dirs_exist_ok=True, copy_function=_copy
            )
            _copy(source / SUMMARY, target / SUMMARY)
        return target

    @library_entry
    def report(self, path: str | Path | None = None) -> Path:
        """Write the HTML report (``lmalgebra report``) to ``path``; default
        ``RUN_DIR/report.html`` for a run that has a directory. Returns the page's path."""
        from lmalgebra.report.lmd_page import write_report

        if self.run_dir is not None:
            return write_report(self._own_run("report()"), None if path is None else Path(path))
        if path is None:
            raise UserInputError(
                "Decomposition.report(): this decomposition was not saved: give report(path), "
                "or save(directory) first"
            )
        with tempfile.TemporaryDirectory(prefix="lmalgebra-") as scratch:
            run_dir = Path(scratch) / "run"
            Decomposition(self.summary, self.config, self._tables, None, self._result).save(run_dir)
            return write_report(run_dir, Path(path))

    def _own_run(self, call: str) -> Path:
        """The run directory, refused (naming ``call``) unless it still holds this decomposition:
        one written again since (another configuration, or this one computed anew) or removed had
        had this object's heatmap drawn into it (made anew if removed), and been reported and
        copied as this decomposition."""
        assert self.run_dir is not None
        try:
            found = read_summary(self.run_dir)
        except UserInputError as err:
            raise UserInputError(
                f"Decomposition.{call}: {self.run_dir} no longer holds this decomposition ({err}): "
                "Decomposition.load a copy save() wrote of it, or compute it again"
            ) from None
        if _canonical(found) != self._identity:
            raise UserInputError(
                f"Decomposition.{call}: {self.run_dir} holds another decomposition than this one "
                "(written again since this one was read or saved): Decomposition.load it again, "
                "or save() this one to another directory"
            )
        return self.run_dir

    # -- display --------------------------------------------------------------------------------
    def _headline(self) -> str:
        spans = " / ".join(f"{s} {n}" for s, n in self.spans.items())
        alpha = self.summary["alpha"]
        mode = alpha.get("mode", "") if isinstance(alpha, dict) else ""  # a number: older runs
        line = f"{len(self.names)} models, spans {spans}, alpha {self.alpha:.3g} {mode}".rstrip()
        return line + method_line(self.method)

    def __repr__(self) -> str:
        group = self.group
        split = "test" if "test" in group.columns else group.columns[-1]
        scores = ", ".join(f"{t} {v:.3f}" for t, v in group[split].items())
        where = f", saved in {self.run_dir}" if self.run_dir is not None else ""
        return f"<Decomposition: {self._headline()}; group R^2 ({split}): {scores}{where}>"

    def _repr_html_(self) -> str:
        pairwise = self.pairwise("test").to_html(float_format=lambda v: f"{v:.3f}")
        group = self.group.to_html(float_format=lambda v: f"{v:.3f}")
        return (
            f"<p><b>Decomposition</b>: {html.escape(self._headline())}</p>"
            f"<p>Group R&sup2; (each model from all the others)</p>{group}"
            f"<p>Pairwise R&sup2; on test (row from column; diagonal 1 by definition)</p>"
            f"{pairwise}"
        )


def _check_fields(summary: dict[str, Any], path: Path) -> None:
    """Refuse, naming ``path``, a summary whose fields this class reads are not what a run
    writes: one unchecked (of a release before its checksum) and edited had been read as
    models ``a``, ``,``, ``b`` or ended in a traceback from its ``repr``."""
    alpha = summary.get("alpha")
    value = alpha.get("value") if isinstance(alpha, dict) else alpha
    models = summary.get("models")
    wrong = {
        "models": not isinstance(models, list) or not all(isinstance(m, str) for m in models),
        "alpha": isinstance(value, bool) or not isinstance(value, int | float),
        "spans": not isinstance(summary.get("spans", {}), dict),
        "method": not isinstance(summary.get("method") or {}, dict),
    }
    for key in (k for k, bad in wrong.items() if bad):
        raise UserInputError(
            f"{path} is damaged: its {key!r} is {summary.get(key)!r}, not what a run writes; "
            "restore it, or compute the run again"
        )


def _canonical(summary: dict[str, Any]) -> str:
    """``summary`` as comparable text (a NaN read from an older release's file as None)."""
    return json.dumps(plain(summary), sort_keys=True)


def method_line(method: dict[str, Any]) -> str:
    """``; reduced, k 512-1024, error estimate 0.003 (test)`` for a reduced run, else ``""``."""
    if method.get("name", "exact") == "exact":
        return "" if method.get("precision", "float64") == "float64" else ", float32 statistics"
    ks = sorted(method.get("components", {}).values()) or [0]
    k = f"{ks[0]}" if ks[0] == ks[-1] else f"{ks[0]}-{ks[-1]}"
    error = method.get("error_estimate", {}).get("test")
    estimate = "" if error is None else f", error estimate {error:.3g} (test)"
    return f"; {method['name']}, k {k}{estimate}"


def _copy(source: str | Path, target: str | Path) -> None:
    """Copy the file ``source`` to ``target`` atomically (``write_atomic``)."""
    write_atomic(Path(target), functools.partial(shutil.copyfile, source))
