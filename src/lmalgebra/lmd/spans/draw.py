"""A run's spans: drawn once, by the same code for a decomposition and for ``lmalgebra spans``.

The exporter writes every span (split, index, text, sha256) in the row order a precomputed
embeddings file must follow, and the order digest that vouches for that order (see
``sources/precomputed.py``).
"""

from __future__ import annotations

import glob
import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import UserInputError, either
from lmalgebra.core.fingerprint import order_digest, sha256_texts, span_sha256
from lmalgebra.core.recipe_files import validate
from lmalgebra.core.settings import Settings
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.settings.recipe import REFERENCE_TOKENIZER_HELP, DecomposeConfig, load_config
from lmalgebra.lmd.settings.spans import Span, SpanSpec, draw_spans, span_texts
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.model_source import ModelSource
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.tokenizers import load_reference_tokenizer
from lmalgebra.storage.atomic import make_directories, remove_file, write_atomic, write_text_atomic
from lmalgebra.storage.lockfile import directory_held
from lmalgebra.storage.output_paths import check_file, refuse_inside_other_output, tidy_on_failure

log = logging.getLogger(__name__)


class SpanPlanSpec(Settings):
    """The part of a decomposition recipe that decides the spans (one model is enough)."""

    model_config = ConfigDict(extra="forbid")

    models: list[ModelRef] = Field(
        default_factory=list,
        description="Models, as in a decomposition; one supplies the tokenizer unless "
        "reference_tokenizer names another. On the command line, one flag per model: "
        "[NAME=][random:]PATH_OR_HUB_ID[@REVISION], [NAME=]gguf:FILE, "
        "[NAME=]onnx:FILE[#TOKENIZER] or [NAME=]precomputed:FILE.",
    )
    corpus: CorpusSpec = Field(description="The text the spans are cut from.")
    spans: SpanSpec = Field(
        default_factory=SpanSpec, description="How documents become spans, and how many per split."
    )
    reference_tokenizer: str | None = Field(default=None, description=REFERENCE_TOKENIZER_HELP)

    @model_validator(mode="after")
    def _check(self) -> SpanPlanSpec:
        if not self.models and self.reference_tokenizer is None:
            raise UserInputError(
                f"name a model ({either('--models', 'models=')}) or a reference_tokenizer whose "
                "tokenizer cuts the spans"
            )
        return self


@dataclass(frozen=True)
class RunSpans:
    """The spans of a run: documents, spans and their texts per split, and their hashes.

    ``hashes`` holds ``corpus``, ``spans_<split>`` (the keys of the embedding cache) and
    ``spans_order`` (the order digest precomputed files are checked against).
    """

    docs: list[str]
    spans: dict[str, list[Span]]
    texts: dict[str, list[str]]
    reference: str
    hashes: dict[str, str]

    @property
    def counts(self) -> dict[str, int]:
        return {s: len(t) for s, t in self.texts.items()}

    @property
    def order_digest(self) -> str:
        return self.hashes["spans_order"]


def reference_model(
    models: list[ModelRef],
    reference_tokenizer: str | None,
    sources: Mapping[str, ModelSource] | None = None,
) -> ModelRef | None:
    """The model whose tokenizer cuts the spans: the one ``reference_tokenizer`` names, else the
    first with a tokenizer; None when ``reference_tokenizer`` is no model's name (then it names
    a tokenizer by reference, see :func:`span_tokenizer`).

    ``sources``: the run's models by name (default: what each reference names).
    """
    if reference_tokenizer is not None:
        ref = next((m for m in models if m.name == reference_tokenizer), None)
        if ref is not None and not _source(ref, sources).has_tokenizer:
            raise UserInputError(
                f"reference_tokenizer {ref.name!r} has no tokenizer (precomputed embeddings): "
                "name a model that has a tokenizer, or a tokenizer directory, hub id or "
                "package:NAME"
            )
        return ref
    for ref in models:
        if _source(ref, sources).has_tokenizer:
            return ref
    raise UserInputError(
        "no model has a tokenizer to cut the spans (precomputed embeddings only): set "
        "reference_tokenizer to a tokenizer directory, hub id or package:NAME (the same one "
        "used when the spans were exported)"
    )


def _source(ref: ModelRef, sources: Mapping[str, ModelSource] | None) -> ModelSource:
    return ref.source if sources is None else sources[ref.name]


def span_tokenizer(
    models: list[ModelRef],
    reference_tokenizer: str | None,
    sources: Mapping[str, ModelSource] | None = None,
) -> tuple[str, Any]:
    """The tokenizer that cuts the spans, and what it is (a model's name, or the reference).

    ``sources``: the run's models by name, whose tokenizers are loaded (default: what each
    reference names); a ``reference_tokenizer`` that names no model is loaded by reference
    (directory, hub id, ``package:NAME``) and nothing is embedded for it.
    """
    ref = reference_model(models, reference_tokenizer, sources)
    if ref is not None:
        return ref.name, _source(ref, sources).load_tokenizer()
    assert reference_tokenizer is not None  # reference_model returns None for it alone
    names = [m.name for m in models]
    return reference_tokenizer, load_reference_tokenizer(reference_tokenizer, names)


def draw_run_spans(
    config: DecomposeConfig | SpanPlanSpec,
    docs: list[str] | None = None,
    spec: SpanSpec | None = None,
) -> RunSpans:
    """Cut the corpus into the run's spans with the reference tokenizer.

    ``docs``: the documents (default: read ``config.corpus``); ``spec``: span settings (default
    ``config.spans``; a sweep passes its own). Every decomposition measurement and the span
    exporter call this, so an exported list is exactly what a run embeds.
    """
    name, tokenizer = span_tokenizer(config.models, config.reference_tokenizer)
    if docs is None:
        docs = read_documents(config.corpus)
    return plan_spans(docs, tokenizer, spec or config.spans, name)


def plan_spans(
    docs: list[str], tokenizer: Any, spec: SpanSpec, reference: str, corpus: str | None = None
) -> RunSpans:
    """The spans of ``docs`` cut with ``tokenizer`` (``reference``: a model's name or the
    reference tokenizer's), and their hashes (``corpus``: the documents', when known)."""
    return plan_of(docs, draw_spans(docs, tokenizer, spec), reference, corpus)


def plan_of(
    docs: list[str], spans: dict[str, list[Span]], reference: str, corpus: str | None = None
) -> RunSpans:
    """The plan of ``spans`` (drawn from ``docs``, or read back from the span cache)."""
    texts = {split: span_texts(docs, spans[split]) for split in SPLITS}
    hashes = {
        "corpus": corpus or sha256_texts(docs),
        **{f"spans_{s}": sha256_texts(texts[s]) for s in SPLITS},
        "spans_order": order_digest(texts),
    }
    return RunSpans(docs, spans, texts, reference, hashes)


def load_span_config(recipe: Path | None, overrides: dict[str, Any]) -> SpanPlanSpec:
    """A recipe (validated as the decomposition it describes) or flags alone, flags on top."""
    if recipe is not None:
        full = load_config(recipe, overrides)
        return SpanPlanSpec(
            models=full.models,
            corpus=full.corpus,
            spans=full.spans,
            reference_tokenizer=full.reference_tokenizer,
        )
    return validate(SpanPlanSpec, dict(overrides), "command line")


def export_spans(plan: RunSpans, out: Path) -> Path:
    """Write ``out`` (JSON lines: row, split, index, sha256, text) and its order digest.

    The digest goes to ``out`` with the suffix ``.sha256`` (``spans.jsonl`` -> ``spans.sha256``);
    copy it to ``VECTORS.npy.spans.sha256`` next to a ``.npy`` of embeddings of these rows, or
    into the ``spans_sha256`` metadata of a ``.safetensors`` file. Returns the digest's path.
    """

    def write(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as handle:
            row = 0
            for split in SPLITS:
                for index, text in enumerate(plan.texts[split]):
                    record = {
                        "row": row,
                        "split": split,
                        "index": index,
                        "sha256": span_sha256(text),
                        "text": text,
                    }
                    handle.write(json.dumps(record, ensure_ascii=False) + "\n")
                    row += 1

    digest_path = _digest_path(out)
    with tidy_on_failure(out.parent, deep=False):
        make_directories(out.parent)
        with directory_held(out.parent):  # two exports there: each pair written whole
            remove_file(digest_path)  # a list stopped before its digest keeps no older one's
            write_atomic(out, write)
            write_text_atomic(digest_path, plan.order_digest + "\n")
    return digest_path


def _is_span_list(head: bytes) -> bool:
    """Whether a file's first bytes are those of a span list ``export_spans`` wrote."""
    return head.startswith(b'{"row": 0, "split": ')


def _is_digest(head: bytes) -> bool:
    """Whether a file's first bytes are an order digest (64 hexadecimal digits, a newline)."""
    return re.fullmatch(rb"[0-9a-f]{64}\n?", head) is not None


def _digest_path(out: Path) -> Path:
    digest_path = out.with_suffix(".sha256")
    if digest_path == out:
        raise UserInputError(f"--out {out}: name the span list .jsonl; its digest gets .sha256")
    return digest_path


def _refuse_shared_digest(out: Path, digest_path: Path) -> None:
    """Refuse a digest that is another span list's: ``s.json`` and ``s.jsonl`` both keep theirs
    in ``s.sha256``, and the second export had left the first list beside another's digest."""
    if not digest_path.is_file():
        return
    for other in sorted(out.parent.glob(f"{glob.escape(out.stem)}.*")):
        if other in (out, digest_path) or other.with_suffix(".sha256") != digest_path:
            continue
        if other.is_file() and not other.is_symlink() and _is_span_list(_head(other)):
            raise UserInputError(
                f"span order digest {digest_path} is the digest of span list {other}: "
                f"exporting {out} would leave {other} with another list's digest; name the "
                f"span list otherwise (its digest goes to the list's name with .sha256)"
            )


def _head(path: Path) -> bytes:
    """A file's first bytes, enough to tell a span list (none when it cannot be read)."""
    try:
        with path.open("rb") as handle:
            return handle.read(64)
    except OSError:
        return b""


# the span length as a remedy both the command line and the Python API name (``-T`` spells it too)
SPAN_LENGTH = either("--spans.length", 'spans={"length": N}')
PER_DOC = either("--spans.per_doc", 'spans={"per_doc": N}')


def shortfall(requested: Sequence[int], got: Mapping[str, int]) -> str | None:
    """What to do about the splits that drew fewer spans than ``requested`` (train, validation,
    test) asks, naming those alone ("train 300 of 300" had read as short); None when none did."""
    short = {s: (got.get(s, 0), n) for s, n in zip(SPLITS, requested, strict=True)}
    if all(have >= want for have, want in short.values()):
        return None
    counts = ", ".join(f"{s} {have} of {want}" for s, (have, want) in short.items() if have < want)
    return (
        f"fewer spans than requested ({counts}): the corpus has too few documents or tokens "
        f"for these counts at this span length; use a larger corpus, a smaller {SPAN_LENGTH} "
        f"or a larger {PER_DOC}"
    )


def warn_if_short(requested: Sequence[int], got: Mapping[str, int]) -> None:
    """Log ``shortfall``'s line, as a decomposition of these spans records it in its warnings."""
    if (short := shortfall(requested, got)) is not None:
        log.warning("%s", short)


def write_run_spans(config: SpanPlanSpec, out: Path) -> tuple[RunSpans, Path]:
    """``lmalgebra spans``: the run's spans (``draw_run_spans``) written to ``out`` with their
    order digest (``export_spans``); the spans and the digest's path. ``out`` and the digest's
    path are checked before any model is loaded; a digest another span list keeps there is
    refused."""
    refuse_inside_other_output(out, "span list")
    check_file(out, "span list", _is_span_list)
    check_file(_digest_path(out), "span order digest", _is_digest)
    _refuse_shared_digest(out, _digest_path(out))
    plan = draw_run_spans(config)
    warn_if_short(config.spans.counts, plan.counts)
    return plan, export_spans(plan, out)
