"""Library entry point of ``lmalgebra decompose``: run, then write outputs, complete or nothing."""

from __future__ import annotations

from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import read_yaml
from lmalgebra.distributed import is_main
from lmalgebra.lmd.config import DecomposeConfig
from lmalgebra.lmd.outputs import write_outputs
from lmalgebra.lmd.pipeline import Decomposition, run_decomposition
from lmalgebra.lmd.run_schema import SUMMARY
from lmalgebra.storage.lockfile import holding_lock


def mark_incomplete(recipe: Path | None, out: Path | None) -> None:
    """Remove the completion marker of the run a failed command was aimed at."""
    if out is None:
        try:
            data = read_yaml(recipe) if recipe is not None else {}
        except UserInputError:
            data = {}
        out = Path(data.get("out", DecomposeConfig.model_fields["out"].default))
    (out / SUMMARY).unlink(missing_ok=True)


@holding_lock("decompose", lambda config, **_: config.out)
def decompose(config: DecomposeConfig) -> Decomposition:
    """Run a decomposition and write its outputs under ``config.out``.

    A previous ``summary.json`` is removed first, so a failed run never looks complete.
    """
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / SUMMARY).unlink(missing_ok=True)
    result = run_decomposition(config)
    if is_main():  # under several processes every rank holds the result; one writes it
        write_outputs(result)
    return result
