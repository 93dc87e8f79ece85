"""The Python API: what the command line does, callable from a notebook with labelled results.

``decompose.py`` (decompose, spans), ``decomposition.py`` (the result, and runs read back),
``model_inputs.py`` (models and texts as Python values), ``frames.py`` (tables as DataFrames),
``merge.py`` (MergeDistill stages), ``runtime.py`` (thread pinning and quiet logging per call).
``lmalgebra`` re-exports the public names.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def submodule(package: str, name: str) -> ModuleType:
    """Module ``name`` of ``package``, imported on first use, for a package's ``__getattr__``;
    AttributeError where there is none."""
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as err:
        if err.name != f"{package}.{name}":
            raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None


def __getattr__(name: str) -> ModuleType:
    """A module of the API as an attribute without its own import (``lmalgebra.api.pretrain``,
    as the documentation spells its calls), imported on first use."""
    return submodule(__name__, name)
