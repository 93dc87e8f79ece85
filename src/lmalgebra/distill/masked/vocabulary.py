"""The vocab stage of a masked recipe: the union student vocabulary of the teachers' tokenizers,
the teacher->student id maps, the student tokenizer and a report (``vocab/``, stamped complete
after the rest; ``distill.vocab.union``)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.text_files import not_a_directory
from lmalgebra.distill.examples import examples_set, require
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.teachers import Teacher
from lmalgebra.distill.vocab.union import REPORT, read_report, sealed_report
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.completion import CompletionStamp

REPORT_TEXTS = 2000  # texts per language whose tokens the report counts


def build_vocabulary(recipe: MaskedRecipe, teachers: dict[str, Teacher]) -> None:
    """The union vocabulary, id maps, student tokenizer and report; nothing when a vocabulary
    built from the same tokenizers is complete and reads back (one whose files no longer match
    their checksums is built again)."""
    from lmalgebra.distill.vocab.union import build_union, tokens_per_language

    out = RunLayout(recipe.output_dir).vocab
    if (out.exists() or out.is_symlink()) and not out.is_dir():  # named, not a traceback
        raise UserInputError(f"vocabulary directory {out} {not_a_directory(out)}")
    stamp = vocab_stamp(recipe, teachers)
    if stamp.done() and _reads_back(out):
        return
    texts = {}
    for lang in recipe.languages:  # read first: a missing stage is refused before any write
        shards = examples_set(recipe, lang)
        require(shards, "prepare")
        texts[lang] = pa.concat_tables(shards.tables()).column("text").to_pylist()[:REPORT_TEXTS]
    stamp.clear()
    tokenizers = {name: t.tokenizer for name, t in teachers.items()}
    union = build_union(tokenizers)
    vocabulary = union.save(out)
    report = union.report(tokenizers)
    report["tokens_per_language"] = tokens_per_language(texts, union.student_tokenizer())
    write_json_atomic(out / REPORT, sealed_report(report, vocabulary))
    stamp.mark()


def _reads_back(directory: Path) -> bool:
    """Whether the saved vocabulary in ``directory`` matches the checksums it records."""
    from lmalgebra.distill.vocab.union import UnionVocab

    try:
        UnionVocab.load(directory)
        return read_report(directory) is not None
    except (UserInputError, OSError, ValueError, KeyError, TypeError):
        return False


def vocab_stamp(recipe: MaskedRecipe, teachers: dict[str, Teacher]) -> CompletionStamp:
    """The vocabulary's completion mark, keyed by the teachers' tokenizers."""
    key = sha256_json({name: t.hashes["tokenizer"] for name, t in teachers.items()})
    return CompletionStamp(RunLayout(recipe.output_dir).vocab, key)
