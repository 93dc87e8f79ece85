"""``decompose`` and ``spans``: Language Model Decomposition from Python; ``decompose_recipe``,
what ``lmalgebra decompose`` runs.

Both take the models as a mapping (name -> reference string, model object or array of
embeddings) and the texts as a list of documents or a corpus path, plus the options of
``lmalgebra decompose`` as keyword arguments (the fields of ``DecomposeConfig`` and of its
``study``). Nothing is written unless ``out`` is given; models named by reference keep using the
embedding cache (``cache_dir``, default ``$LMALGEBRA_CACHE`` or ``~/.cache/lmalgebra``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from lmalgebra.api.decomposition import Decomposition
from lmalgebra.api.model_inputs import corpus_input, model_entries
from lmalgebra.api.runtime import library_call
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import validate
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.config import DecomposeConfig, load_config
from lmalgebra.lmd.given_models import GivenArrays
from lmalgebra.lmd.pipeline import RunInputs, run_decomposition
from lmalgebra.lmd.run import decompose as decompose_to_directory
from lmalgebra.lmd.span_plan import SpanPlanSpec, plan_spans, span_tokenizer
from lmalgebra.lmd.study_config import StudySpec
from lmalgebra.sources.corpus import CorpusSpec, DocSep, read_documents
from lmalgebra.sources.models import load_tokenizer, resolve_directory
from lmalgebra.sources.precomputed import span_sha256
from lmalgebra.storage.output_paths import check_directory

SOURCE = "decompose()"
# keyword -> (recipe section, key): options that live below the top level of the recipe
_NESTED = {
    "fractions": ("spans", "fractions"),
    "per_doc": ("spans", "per_doc"),
    "split_seed": ("spans", "seed"),
    "text_column": ("corpus", "text_column"),
    "doc_sep": ("corpus", "doc_sep"),
    "language_column": ("corpus", "language_column"),
    "dataset_split": ("corpus", "split"),
    **{key: ("study", key) for key in StudySpec.model_fields},
}
_TOP = set(DecomposeConfig.model_fields) - {"models", "corpus", "spans", "study", "out"}


def _recipe(
    models: Any,
    texts: Any,
    seq_len: int,
    spans: Sequence[int],
    options: dict[str, Any],
) -> tuple[dict[str, Any], RunInputs]:
    """The recipe (as ``lmalgebra decompose`` would read it) and the inputs given as objects."""
    trust = bool(options.pop("trust_remote_code", False))
    entries, given = model_entries(models, trust)
    sections: dict[str, dict[str, Any]] = {"spans": {}, "corpus": {}, "study": {}}
    data: dict[str, Any] = {}
    for key, value in options.items():
        if key in _NESTED:
            section, field = _NESTED[key]
            sections[section][field] = value
        elif key in _TOP:
            data[key] = value
        else:
            known = ", ".join(sorted([*_TOP, *_NESTED, "trust_remote_code"]))
            raise UserInputError(f"{SOURCE}: unknown option {key!r} (options: {known})")
    corpus, docs = corpus_input(texts, sections.pop("corpus"))
    if not isinstance(spans, Sequence) or isinstance(spans, str) or len(spans) != len(SPLITS):
        raise UserInputError(f"{SOURCE}: spans must be three counts (train, validation, test)")
    data.update(
        models=entries,
        corpus=corpus,
        spans={"length": seq_len, "counts": list(spans), **sections["spans"]},
        study=sections["study"],
    )
    return data, RunInputs(docs, given)


def decompose(
    models: Any,
    texts: Any,
    *,
    seq_len: int = 64,
    spans: Sequence[int] = (4000, 500, 500),
    alpha: float = 0.01,
    alpha_mode: str = "relative",
    out: str | Path | None = None,
    overwrite: bool = False,
    **options: Any,
) -> Decomposition:
    """Decompose every model on the others: pairwise and group R^2 on train, validation, test.

    Args:
        models: name -> model: a reference string as on the command line (``package:minilm``,
            a directory, a hub id, ``random:PATH``, ``gguf:FILE``, ``onnx:FILE#TOKENIZER``,
            ``precomputed:FILE``), a ``(PreTrainedModel, tokenizer)`` pair (a fast tokenizer),
            a ``SentenceTransformer`` (its own pooling and normalisation, through ``encode``),
            or a 2-D array of span embeddings, one row per span in the order :func:`spans`
            lists them. The first model with a tokenizer cuts the spans, unless the option
            ``reference_tokenizer`` names another model or a tokenizer (a directory, hub id or
            ``package:NAME``): then a run of arrays alone embeds nothing.
        texts: a list of documents (strings), or a corpus path as on the command line.
        seq_len: span length T in tokens of the reference tokenizer.
        spans: at most this many spans for train, validation and test.
        alpha, alpha_mode: ridge strength, relative to each basis model's variance or absolute.
        out: write the run directory ``lmalgebra decompose --out`` writes (locked while
            running); nothing is written without it.
        overwrite: replace a run of another configuration in ``out``.
        options: any other field of the decomposition recipe (``layer``, ``pooling``,
            ``batch_size``, ``target``/``basis``, ``cache_dir``, ``progress``, ...), of its
            ``study`` (``bootstrap``, ``nulls``, ``attribution``, ``lengths``, ...), the span
            options ``fractions``, ``per_doc``, ``split_seed``, the corpus options
            ``text_column``, ``doc_sep``, ``language_column``, ``dataset_split``, and
            ``trust_remote_code``.

    Models given as Python objects are embedded on every call (no cache); their weight
    hashes are recorded in the run's provenance.
    """
    options = {**options, "alpha": alpha, "alpha_mode": alpha_mode}
    data, inputs = _recipe(models, texts, seq_len, spans, options)
    if out is not None:
        data["out"] = str(out)
    config = validate(DecomposeConfig, data, SOURCE)
    arrays = [n for n, m in inputs.given.items() if isinstance(m, GivenArrays)]
    if arrays and (config.study.lengths or config.study.languages):
        raise UserInputError(
            f"model {arrays[0]!r} is an array of embeddings of this run's spans; "
            "the span-length and language studies draw other spans"
        )
    if out is not None:
        return decompose_recipe(config, overwrite, inputs)
    with library_call():
        check_directory(config.cache_dir, "cache directory")
        return Decomposition.from_result(run_decomposition(config, inputs))


def decompose_recipe(
    recipe: DecomposeConfig | str | Path, overwrite: bool = False, inputs: RunInputs | None = None
) -> Decomposition:
    """The decomposition a recipe describes, written to its ``out`` (``lmalgebra decompose``).

    Args:
        recipe: a validated ``DecomposeConfig`` or a YAML recipe path.
        overwrite: replace a run of another configuration in ``out``.
        inputs: documents and models given as Python objects (:func:`decompose`'s own).
    """
    config = recipe if isinstance(recipe, DecomposeConfig) else load_config(Path(recipe), {})
    with library_call():
        result = decompose_to_directory(config, overwrite, inputs)
    return Decomposition.from_result(result, config.out)


def spans(
    models: Any,
    texts: Any,
    *,
    seq_len: int = 64,
    spans: Sequence[int] = (4000, 500, 500),
    **options: Any,
) -> pd.DataFrame:
    """The spans :func:`decompose` embeds with the same arguments, one row per span in the row
    order an array of embeddings must follow: train, then validation, then test.

    Columns ``row``, ``split``, ``index`` (within the split), ``sha256`` (of the text) and
    ``text``, as ``lmalgebra spans`` exports them; ``attrs['spans_sha256']`` is the order digest.
    Models given as arrays may be left out (they do not cut spans; with
    ``reference_tokenizer=`` naming a tokenizer, ``models`` may be empty); any other option of
    :func:`decompose` is accepted and those that do not change the spans are ignored.
    """
    data, inputs = _recipe(models, texts, seq_len, spans, dict(options))
    plan_spec: dict[str, Any] = {k: data[k] for k in ("models", "corpus", "spans")}
    plan_spec["reference_tokenizer"] = data.get("reference_tokenizer")
    spec = validate(SpanPlanSpec, plan_spec, "spans()")
    with library_call():
        name, tokenizer = span_tokenizer(
            spec.models,
            spec.reference_tokenizer,
            lambda r: (
                inputs.given[r.name].tokenizer
                if r.name in inputs.given
                else load_tokenizer(r, resolve_directory(r))
            ),
            lambda r: (
                inputs.given[r.name].tokenizer is not None
                if r.name in inputs.given
                else r.kind != "precomputed"
            ),
        )
        docs = inputs.docs if inputs.docs is not None else read_documents(spec.corpus)
        plan = plan_spans(docs, tokenizer, spec.spans, name)
    rows = [
        {"split": split, "index": i, "sha256": span_sha256(text), "text": text}
        for split in SPLITS
        for i, text in enumerate(plan.texts[split])
    ]
    table = pd.DataFrame(rows, columns=["split", "index", "sha256", "text"])
    table.insert(0, "row", range(len(table)))
    table.attrs["spans_sha256"] = plan.order_digest
    return table


def read_texts(
    path: str | Path,
    text_column: str = "text",
    doc_sep: DocSep = "auto",
    dataset_split: str = "train",
) -> list[str]:
    """The documents of a corpus as a list of strings, read as ``decompose`` reads a corpus path
    (``.txt``, ``.jsonl``, ``.json``, ``.csv``, ``.parquet``, a saved dataset, ``package:NAME``);
    empty documents are dropped."""
    spec = validate(
        CorpusSpec,
        {
            "paths": [str(path)],
            "text_column": text_column,
            "doc_sep": doc_sep,
            "split": dataset_split,
        },
        "read_texts()",
    )
    return read_documents(spec)
