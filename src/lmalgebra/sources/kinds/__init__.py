"""The kinds of model a reference names, one module each, registered in :data:`KINDS`.

A reference's kind is looked up here once, where it is parsed (``ModelRef.source``); everything
else asks the source (:class:`~lmalgebra.sources.model_source.ModelSource`). Adding a kind is a
module with a :class:`~lmalgebra.sources.model_source.ReferencedModel` subclass and its line here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from lmalgebra.sources.kinds.onnx import OnnxModel
from lmalgebra.sources.kinds.precomputed import PrecomputedFile
from lmalgebra.sources.kinds.python_objects import ObjectReference
from lmalgebra.sources.kinds.transformers import TransformersModel
from lmalgebra.sources.model_source import ModelFields, ModelSource, ReferencedModel

KINDS: dict[str, type[ReferencedModel]] = {
    "transformers": TransformersModel,
    "onnx": OnnxModel,
    "precomputed": PrecomputedFile,
    "memory": ObjectReference,
}


def source_of(
    ref: ModelFields, directory: Path | None = None, weights: bool = True
) -> ReferencedModel:
    """The model ``ref`` names, as its kind's class: found in ``directory``, else resolved on
    first use (``weights=False``: enough to plan a run)."""
    return KINDS[ref.kind](ref, directory, weights)


def bound_sources(
    refs: Iterable[ModelFields], given: Mapping[str, ModelSource]
) -> dict[str, ModelSource]:
    """Each model by name: the Python object ``given`` for it, else what its reference names."""
    return {r.name: given[r.name] if r.name in given else source_of(r) for r in refs}
