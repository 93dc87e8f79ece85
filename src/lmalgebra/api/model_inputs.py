"""Models and texts as a notebook gives them, turned into a run's configuration and inputs.

A model is a reference string as on the command line (``package:minilm``, a directory, a hub id,
``random:...``, ``onnx:...``, ``precomputed:...``), a recipe entry (a mapping or ``ModelRef``), a
``(PreTrainedModel, tokenizer)`` pair, a ``SentenceTransformer``, or a 2-D array of precomputed
span embeddings. Texts are a list of documents, or a corpus path as on the command line.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import unencodable
from lmalgebra.sources.corpus import CorpusSpec
from lmalgebra.sources.kinds.python_objects import (
    GivenArrays,
    GivenModel,
    SentenceEncoder,
    TransformerPair,
)
from lmalgebra.sources.models import ModelRef, runs_own_code


def model_entries(
    models: Any, trust_remote_code: bool = False
) -> tuple[list[dict[str, Any]], dict[str, GivenModel]]:
    """Recipe entries of ``models`` (name -> reference), and the models given as objects."""
    if not isinstance(models, Mapping):
        raise UserInputError(
            f"models must be a mapping of name -> model, got {type(models).__name__} "
            "(e.g. {'minilm': 'package:minilm', 'mine': (model, tokenizer)})"
        )
    entries: list[dict[str, Any]] = []
    given: dict[str, GivenModel] = {}
    for name, value in models.items():
        if not isinstance(name, str) or not name.strip():
            raise UserInputError(f"model names must be non-empty strings, got {name!r}")
        obj = _given(name, value)
        if obj is not None:
            given[name] = obj
            entries.append({"name": name, "path": obj.description, "kind": obj.kind})
        else:
            entries.append(_reference(name, value, trust_remote_code))
    if trust_remote_code and not any(e.get("trust_remote_code") for e in entries):
        raise UserInputError(
            "trust_remote_code would be ignored: it applies to the models given by "
            "reference strings that run code of their own (Hugging Face models; a mapping or a "
            "ModelRef sets its own trust_remote_code), and none is given"
        )
    return entries, given


def _reference(name: str, value: Any, trust_remote_code: bool) -> dict[str, Any]:
    if isinstance(value, ModelRef):
        return {**value.model_dump(), "name": name}
    if isinstance(value, Mapping):
        return {**dict(value), "name": name}
    if isinstance(value, str | os.PathLike):
        text = os.fspath(value)
        if not text.strip():
            raise UserInputError(f"model {name!r}: the reference is empty")
        ref = ModelRef.parse(text)
        update: dict[str, Any] = {"name": name}
        if runs_own_code(ref.kind, ref.path):
            update["trust_remote_code"] = trust_remote_code
        return {**ref.model_dump(), **update}
    raise UserInputError(
        f"model {name!r}: a {type(value).__name__} is not a model; give a reference string, "
        "a (PreTrainedModel, tokenizer) pair, a SentenceTransformer or a 2-D array of embeddings"
    )


def _is_sentence_transformer(value: Any) -> bool:
    module = sys.modules.get("sentence_transformers")  # loaded already if value is one
    return module is not None and isinstance(value, module.SentenceTransformer)


def _given(name: str, value: Any) -> GivenModel | None:
    """The Python object behind ``value``, or None when it is a reference."""
    if _is_sentence_transformer(value):
        return SentenceEncoder(name, value)
    if isinstance(value, tuple):
        if len(value) != 2:
            raise UserInputError(
                f"model {name!r}: a tuple must be (PreTrainedModel, tokenizer), "
                f"got {len(value)} items"
            )
        return TransformerPair(name, value[0], value[1])
    if isinstance(value, np.ndarray):
        return GivenArrays(name, value)
    if type(value).__name__ == "Tensor" and hasattr(value, "detach"):  # a torch tensor
        if value.is_meta:
            raise UserInputError(
                f"model {name!r}: the tensor is on the meta device (a shape without values)"
            )
        if value.is_nested or str(value.layout) != "torch.strided":  # numpy takes neither
            kind = "nested" if value.is_nested else str(value.layout).removeprefix("torch.")
            raise UserInputError(
                f"model {name!r}: the tensor is {kind}; give its dense form (tensor.to_dense())"
            )
        tensor = value.detach().cpu()  # complex values stay complex, to be refused by name
        return GivenArrays(name, (tensor if tensor.is_complex() else tensor.float()).numpy())
    if hasattr(value, "config") and hasattr(value, "state_dict"):
        raise UserInputError(
            f"model {name!r}: a {type(value).__name__} needs its tokenizer: give (model, tokenizer)"
        )
    return None


def corpus_input(texts: Any, options: Mapping[str, Any]) -> tuple[dict[str, Any], list[str] | None]:
    """The recipe's ``corpus`` entry and, for a list of documents, the documents themselves."""
    if isinstance(texts, CorpusSpec):
        return {**texts.model_dump(), **options}, None
    if isinstance(texts, str | os.PathLike):
        return {"paths": [os.fspath(texts)], **options}, None
    binary = bytes | bytearray | memoryview
    if isinstance(texts, Mapping | binary) or not isinstance(texts, Iterable):
        # bytes (and a view of them) iterate as numbers: "texts[0] is a int" would name what the
        # caller never gave
        raise UserInputError(
            f"texts must be a list of documents (strings) or a corpus path, "
            f"got {type(texts).__name__}"
        )
    if isinstance(texts, set | frozenset):  # iterated in an order that changes per process
        raise UserInputError(
            f"texts is a {type(texts).__name__}, whose order changes from process to process "
            "(and with it the documents' hash, which a run resumed or read back compares): give "
            "a list, e.g. sorted(texts)"
        )
    if hasattr(texts, "columns") and hasattr(texts, "iloc"):  # a DataFrame iterates its columns
        raise UserInputError(
            f"texts is a {type(texts).__name__}, which iterates as its column names "
            f"({', '.join(map(str, list(texts.columns)[:3]))}): give its column of documents, "
            "e.g. frame['text'], or a corpus path"
        )
    docs = list(texts)
    for index, doc in enumerate(docs):
        if not isinstance(doc, str):
            kind = type(doc).__name__
            hint = "; give a corpus path alone, as a str or Path" if isinstance(doc, Path) else ""
            raise UserInputError(f"texts[{index}] is a {kind}, not a string{hint}")
        if (at := unencodable(doc)) is not None:  # a traceback from hashing the spans
            raise UserInputError(
                f"texts[{index}] holds {doc[at]!r} at position {at}, no UTF-8 character (a byte "
                "decoded with errors='surrogateescape'): decode the text as what it is"
            )
    if options:
        raise UserInputError(
            f"{sorted(options)[0]} applies to a corpus file; texts are a list of documents"
        )
    kept = [doc for doc in docs if doc.strip()]  # as files are read: empty documents dropped
    if not kept:
        raise UserInputError("texts hold no text (an empty list, or only blank strings)")
    return {"paths": []}, kept
