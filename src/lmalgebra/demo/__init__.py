"""The offline demo: teachers pre-trained here, merged by MergeDistill, evaluated, decomposed."""

from __future__ import annotations

from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    """A module of the demo as an attribute without its own import
    (``lmalgebra.demo.workflow.run_demo``, as docs/getting-started.md spells it)."""
    from lmalgebra.api import submodule

    return submodule(__name__, name)
