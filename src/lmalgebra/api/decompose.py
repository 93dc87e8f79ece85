"""``decompose`` and ``spans``: Language Model Decomposition from Python; ``decompose_recipe``,
what ``lmalgebra decompose`` runs.

Both take the models as a mapping (name -> reference string, model object or array of embeddings)
and the texts as a list of documents or a corpus path, plus the keys of ``lmalgebra decompose``'s
recipe as keyword arguments, named as in the recipe (a section such as ``spans`` as a mapping of its
keys). Nothing is written unless ``out`` is given; models named by reference keep using the
embedding cache (``cache_dir``, default ``$LMALGEBRA_CACHE`` or ``~/.cache/lmalgebra``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

from lmalgebra.api.decomposition import Decomposition
from lmalgebra.api.model_inputs import corpus_input, model_entries
from lmalgebra.api.runtime import library_call, library_entry
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import span_sha256
from lmalgebra.core.recipe_files import Call, validate
from lmalgebra.core.settings import revalidated
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.plan.estimate import GIB, Plan, check_plan, measure_speeds
from lmalgebra.lmd.plan.table import model_rows, plan_for, plan_rows
from lmalgebra.lmd.run.decompose import decompose as decompose_to_directory
from lmalgebra.lmd.run.pipeline import RunInputs, run_decomposition
from lmalgebra.lmd.settings.recipe import DecomposeConfig, load_config
from lmalgebra.lmd.spans.draw import (
    SpanPlanSpec,
    plan_spans,
    reference_model,
    span_tokenizer,
    warn_if_short,
)
from lmalgebra.sources.corpus import CorpusSpec, DocSep, corpus_paths, read_documents
from lmalgebra.sources.kinds import bound_sources
from lmalgebra.storage.output_paths import cache_root

if TYPE_CHECKING:  # pandas is imported by the calls that make a table
    import pandas as pd

    from lmalgebra.sources.model_source import ModelSource

SOURCE = Call("decompose()")
# the recipe's keys a call gives as keywords: every key but the models (given as ``models``),
# plus trust_remote_code, which applies to the models given by reference
_KEYS = (set(DecomposeConfig.model_fields) - {"models"}) | {"trust_remote_code"}


def _recipe(
    models: Any, texts: Any, options: dict[str, Any], source: str = SOURCE
) -> tuple[dict[str, Any], RunInputs]:
    """The recipe (as ``lmalgebra decompose`` would read it) and the inputs given as objects.

    ``options``: keys of the recipe; a section (``corpus``, ``spans``, ``study``) is a mapping
    of its keys or its config object. ``source``: the call, as messages name it."""
    unknown = sorted(set(options) - _KEYS)
    if unknown:
        known = ", ".join(sorted(_KEYS))
        raise UserInputError(f"{source}: unknown option {unknown[0]!r} (options: {known})")
    data = {k: v.model_dump() if isinstance(v, BaseModel) else v for k, v in options.items()}
    entries, given = model_entries(models, bool(data.pop("trust_remote_code", False)))
    corpus = data.pop("corpus", None) or {}
    if not isinstance(corpus, Mapping) or "paths" in corpus:
        raise UserInputError(
            f"{source}: corpus must be a mapping of corpus keys but paths (give the corpus as "
            "texts)"
        )
    data["corpus"], docs = corpus_input(texts, dict(corpus))
    data["models"] = entries
    return data, RunInputs(docs, given)


@library_entry
def decompose(
    models: Any,
    texts: Any,
    *,
    out: str | Path | None = None,
    overwrite: bool = False,
    **options: Any,
) -> Decomposition:
    """Decompose every model on the others: pairwise and group R^2 on train, validation, test.

    Args:
        models: name -> model: a reference string as on the command line (``package:minilm``,
            a directory, a hub id, ``random:PATH``, ``gguf:FILE``, ``onnx:FILE#TOKENIZER``,
            ``precomputed:FILE``), a mapping of model keys (``{"path": ..., "revision": ...}``),
            a ``(PreTrainedModel, tokenizer)`` pair (a fast tokenizer), a
            ``SentenceTransformer`` (its own pooling and normalisation, through ``encode``), or
            a 2-D array of span embeddings, one row per span in the order :func:`spans` lists
            them. The first model with a tokenizer cuts the spans, unless ``reference_tokenizer``
            names another model or a tokenizer (a directory, hub id, ``package:NAME`` or
            ``gguf:FILE``): then a run of arrays alone embeds nothing.
        texts: a list of documents (strings), or a corpus path as on the command line.
        out: write the run directory ``lmalgebra decompose --out`` writes (locked while
            running); nothing is written without it.
        overwrite: replace a run of another configuration in ``out``.
        options: any other key of the decomposition recipe, named as in the recipe:
            ``layer``, ``pooling``, ``batch_size``, ``alpha``, ``alpha_mode``,
            ``target``/``basis``, ``cache_dir``, ``progress``, ...; the sections ``spans``
            (``{"length": 64, "counts": (4000, 500, 500), "per_doc": 4, ...}``), ``study``
            (``{"bootstrap": 1000, "nulls": True, ...}``) and ``corpus`` (its keys but
            ``paths``: ``text_column``, ``doc_sep``, ``split``, ``language_column``), each a
            mapping of the keys it sets; and ``trust_remote_code``.

    Models given as Python objects are embedded on every call (no cache); their weight
    hashes are recorded in the run's provenance.
    """
    data, inputs = _recipe(models, texts, dict(options))
    if out is not None:
        data["out"] = str(out)
    config = validate(DecomposeConfig, data, SOURCE)
    _check_arrays(config, inputs)
    if out is not None:
        return decompose_recipe(config, overwrite, inputs)
    return Decomposition.from_result(run_decomposition(config, inputs))


@library_entry
def decompose_plan(
    models: Any, texts: Any = None, *, timed: bool = True, overwrite: bool = False, **options: Any
) -> pd.DataFrame:
    """The plan of the :func:`decompose` call with the same arguments, before any work: per
    method (exact with float64 and float32 statistics, reduced, sketch) and phase, the peak
    memory and the time, and whether it fits the memory available. Nothing is embedded and no
    weights are read (widths come from the models' configurations and files' headers); the span
    counts are those asked for. ``texts`` may be left out.

    Columns: ``method``, ``precision``, ``components``, ``phase``, ``model`` (embedding rows),
    ``peak_gib``, ``seconds`` (NaN with ``timed=False``, which skips the few seconds of probes
    that measure this machine's rates), ``disk_gib``, ``fits`` and ``chosen`` (booleans on the
    ``total`` rows, missing on the phases': ``plan[plan.chosen]`` is the run's).
    ``attrs["models"]``: per model its width, parameters and embedding-cache size;
    ``attrs["available_gib"]``: the memory the plan is held to; ``attrs["refused"]``: the line
    the call refuses the plan with (its chosen method does not fit), else None. Given ``out``,
    what the call would refuse of that directory is refused here too (``overwrite`` as for the
    call), a finished run there of other documents or arrays included (models by reference are not
    compared: that reads their weights). Given ``texts``, what the call refuses of them without a
    tokenizer is refused too, as ``lmalgebra decompose --dry-run`` refuses it: a corpus path it
    cannot read, or spans longer than the documents can hold.
    """
    from lmalgebra.lmd.run.decompose import check_cache, check_claim, check_corpus

    given = ["."] if texts is None else texts
    data, inputs = _recipe(models, given, dict(options), "decompose_plan()")
    config = validate(DecomposeConfig, data, Call("decompose_plan()"))
    _check_arrays(config, inputs)
    if "out" in options:  # the call writes there: its refusals of the directory, nothing written
        check_claim(config, overwrite, inputs if texts is not None else None)
    else:  # a call without out writes its cache all the same (a file there had been planned)
        check_cache(config.resolved())
    docs = inputs.docs if inputs.docs is not None or texts is None else check_corpus(config)
    return plan_frame(config, inputs, timed, None if texts is None else docs)


def _check_arrays(config: DecomposeConfig, inputs: RunInputs) -> None:
    """Refuse what the arrays of embeddings among the models make the call ignore: a span-length
    or language study (other spans), and the settings of embedding where every model is given
    as its span embeddings, and those no Python object among them reads where every model is
    one (a pair is loaded already; a SentenceTransformer embeds through its own pipeline)."""
    arrays = [n for n, m in inputs.given.items() if m.fixed_spans]
    if arrays and (config.study.lengths or config.study.languages):
        raise UserInputError(
            f"model {arrays[0]!r} is an array of embeddings of this run's spans; "
            "the span-length and language studies draw other spans"
        )
    files = [m.name for m in config.models if m.source.fixed_spans]
    config.refuse_embedding_settings([*arrays, *files])
    unread = [  # a model given by reference: those of its kind (an ONNX graph's)
        inputs.given.get(m.name, m.source).IGNORES
        for m in config.models
        if m.name not in arrays and m.name not in files
    ]
    what = (
        "models the run loads or embeds itself (every model here is a Python object: a "
        "(model, tokenizer) pair is loaded already, a SentenceTransformer embeds through "
        "its own encode(), an array is its span embeddings; or an ONNX graph)"
    )
    config.refuse_unread(unread, what)


def _check_reference(config: DecomposeConfig, given: Mapping[str, ModelSource]) -> None:
    """A ``reference_tokenizer`` the run would refuse, refused as the run refuses it: a model
    of no tokenizer (precomputed embeddings, an array: ``given``, the models given as objects),
    or no model and no tokenizer the run could read: a hub id is read as a model's is (its
    tokenizer files, from the Hugging Face cache or the hub; one that cannot be reached is
    refused); a GGUF file or packaged model is read without writing to the cache."""
    from lmalgebra.sources.tokenizers import load_reference_tokenizer

    reference, names = config.reference_tokenizer, [m.name for m in config.models]
    if reference in names:
        reference_model(config.models, reference, given if reference in given else None)
    elif reference is not None:
        load_reference_tokenizer(reference, names, weights=False)


def plan_frame(
    config: DecomposeConfig,
    inputs: RunInputs | None = None,
    timed: bool = True,
    docs: list[str] | None = None,
) -> pd.DataFrame:
    """:func:`decompose_plan` of a validated configuration (``lmalgebra decompose --dry-run``).
    ``docs``: the documents the spans are cut from, where known: spans longer than they can
    hold are refused, after the models, as the run refuses them (``check_spans``)."""
    from lmalgebra.lmd.run.decompose import check_spans

    given = inputs.given if inputs is not None else {}
    if inputs is None or inputs.docs is None:
        corpus_paths(config.corpus)  # a corpus the run would refuse: refused here too
    config.embed_spec()  # a device or dtype this machine lacks: refused as the run refuses it
    with cache_root(config.cache_dir):
        _check_reference(config, given)
        with library_call():
            plan, shapes = plan_for(config, given, dry=True)
    unknown = [s.name for s in shapes if s.width <= 0]
    if unknown:
        raise UserInputError(
            f"model {unknown[0]!r}: its configuration names no hidden size, so its width "
            "is not known before it is loaded"
        )
    check_spans(config, docs, given)
    with library_call():
        speeds = measure_speeds() if timed else None
    import pandas as pd

    # yes/no on the total rows, missing on the phases': a mask of them, plan[plan.chosen],
    # had failed as "non-boolean array containing NA" with None in an object column
    rows = pd.DataFrame(plan_rows(plan, shapes, speeds))
    frame = rows.astype({"fits": "boolean", "chosen": "boolean"})
    frame.attrs["models"] = pd.DataFrame(model_rows(plan, shapes))
    frame.attrs["available_gib"] = plan.available / GIB
    frame.attrs["refused"] = _refusal(plan, config.scale.probes)
    return frame


def _refusal(plan: Plan, probes: int) -> str | None:
    """The line the run refuses ``plan`` with (its chosen method does not fit the memory),
    or None where it fits."""
    try:
        check_plan(plan, probes)
    except UserInputError as err:
        return str(err)
    return None


@library_entry
def decompose_recipe(
    recipe: DecomposeConfig | Mapping[str, Any] | str | Path,
    overwrite: bool = False,
    inputs: RunInputs | None = None,
) -> Decomposition:
    """The decomposition a recipe describes, written to its ``out`` (``lmalgebra decompose``).

    Args:
        recipe: a validated ``DecomposeConfig``, a mapping of its keys or a YAML recipe path.
        overwrite: replace a run of another configuration in ``out``.
        inputs: documents and models given as Python objects (:func:`decompose`'s own).
    """
    if isinstance(recipe, Mapping):
        recipe = validate(DecomposeConfig, dict(recipe), Call("decompose_recipe() recipe"))
    elif isinstance(recipe, DecomposeConfig):  # a copy pydantic did not check
        recipe = revalidated(recipe, "decompose_recipe() recipe")
    else:
        recipe = load_config(Path(recipe), {}, "decompose_recipe() recipe")
    result = decompose_to_directory(recipe, overwrite, inputs)
    return Decomposition.from_result(result, recipe.out)


@library_entry
def spans(models: Any, texts: Any, **options: Any) -> pd.DataFrame:
    """The spans :func:`decompose` embeds with the same arguments, one row per span in the row
    order an array of embeddings must follow: train, then validation, then test.

    Columns ``row``, ``split``, ``index`` (within the split), ``sha256`` (of the text) and
    ``text``, as ``lmalgebra spans`` exports them; ``attrs['spans_sha256']`` is the order digest.
    Models given as arrays may be left out (they do not cut spans; with
    ``reference_tokenizer=`` naming a tokenizer, ``models`` may be empty); any other option of
    :func:`decompose` is accepted and those that do not change the spans are ignored.
    """
    options.pop("overwrite", None)  # decompose's own argument: the spans do not depend on it
    data, inputs = _recipe(models, texts, dict(options), "spans()")
    plan_spec: dict[str, Any] = {k: data[k] for k in ("models", "corpus") if k in data}
    plan_spec["spans"] = data.get("spans", {})
    plan_spec["reference_tokenizer"] = data.get("reference_tokenizer")
    spec = validate(SpanPlanSpec, plan_spec, Call("spans()"))
    sources = bound_sources(spec.models, inputs.given)
    name, tokenizer = span_tokenizer(spec.models, spec.reference_tokenizer, sources)
    docs = inputs.docs if inputs.docs is not None else read_documents(spec.corpus)
    plan = plan_spans(docs, tokenizer, spec.spans, name)
    warn_if_short(spec.spans.counts, plan.counts)
    rows = [
        {"split": split, "index": i, "sha256": span_sha256(text), "text": text}
        for split in SPLITS
        for i, text in enumerate(plan.texts[split])
    ]
    import pandas as pd

    table = pd.DataFrame(rows, columns=["split", "index", "sha256", "text"])
    table.insert(0, "row", range(len(table)))
    table.attrs["spans_sha256"] = plan.order_digest
    return table


@library_entry
def read_texts(
    path: str | Path, text_column: str = "text", doc_sep: DocSep = "auto", split: str = "train"
) -> list[str]:
    """The documents of a corpus as a list of strings, read as ``decompose`` reads a corpus path
    (``.txt``, ``.jsonl``, ``.json``, ``.csv``, ``.parquet``, a saved dataset, ``package:NAME``);
    empty documents are dropped."""
    data = {"paths": [str(path)], "text_column": text_column, "doc_sep": doc_sep, "split": split}
    return read_documents(validate(CorpusSpec, data, Call("read_texts()")))
