"""Each language's corpus as text examples with stable ids and a held-out portion per language,
stored as one shard set per language (``examples/<lang>/``), shared by both objectives: the
masked copies and the causal teacher store are row-aligned with it.

An example's id is ``<language>-<first 16 hex of sha256(text)>``: stable across runs and corpus
re-orderings, and identical texts collapse to one example. Whether an example is held out depends
only on its id.

A causal recipe cuts each document to its first ``causal.example_bytes`` UTF-8 bytes (at a
character boundary) and stores the cut text: every teacher tokenises exactly those bytes. The id
stays that of the whole document, so the held-out split is the same for both objectives and for
``lmalgebra pretrain``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_texts, unit_hash
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.run.store_check import examples_problems, missing_set, stale_key
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.storage.shard_set import ShardSet

WRITTEN = "written"  # an example id's mark between language and hash: a teacher wrote it


@dataclass(frozen=True)
class Example:
    id: str
    text: str
    heldout: bool


def example_id(language: str, text: str) -> str:
    return f"{language}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def is_heldout(identifier: str, fraction: float) -> bool:
    return unit_hash(identifier, "heldout") < fraction


def language_examples(
    recipe: MergeRecipe, language: str, written: Sequence[str] = ()
) -> list[Example]:
    """The language's examples in corpus order (first occurrence of each distinct text), then
    those of ``written`` (text a teacher wrote: ``distill.causal.teacher_text``), which are
    training examples only."""
    spec = recipe.languages[language]
    seen: set[str] = set()
    out = []
    for text in read_documents(spec.corpus):
        text = text.strip()
        identifier = example_id(language, text)
        if identifier in seen:
            continue
        seen.add(identifier)
        heldout = is_heldout(identifier, recipe.heldout_fraction)
        out.append(Example(identifier, recipe.example_text(text), heldout))
        if spec.max_examples is not None and len(out) == spec.max_examples:
            break
    if not any(not e.heldout for e in out):
        raise UserInputError(
            f"language {language!r}: no training example left after the held-out split"
        )
    for text in written:
        identifier = written_id(language, text.strip())
        if text.strip() and identifier not in seen:
            seen.add(identifier)
            out.append(Example(identifier, recipe.example_text(text.strip()), False))
    return out


def heldout_examples(recipe: MergeRecipe, language: str) -> dict[str, str]:
    """The texts of the language's held-out examples by id, from its corpus."""
    return {e.id: e.text for e in language_examples(recipe, language) if e.heldout}


def written_id(language: str, text: str) -> str:
    """The id of an example a teacher wrote: ``<language>-written-<first 16 hex of sha256>``
    (``student_data.validation_rows`` draws no validation example from these)."""
    return f"{language}-{WRITTEN}-{hashlib.sha256(text.encode()).hexdigest()[:16]}"


def is_written(identifier: str, language: str) -> bool:
    """Whether ``identifier`` (an example of ``language``) is text a teacher wrote."""
    return str(identifier).startswith(f"{language}-{WRITTEN}-")


def training_examples(
    corpus: CorpusSpec, language: str, heldout_fraction: float
) -> tuple[list[str], list[str]]:
    """Ids and texts of the corpus's documents that a recipe with the same language and held-out
    fraction would not hold out (what a teacher pre-trained here trains on)."""
    docs = [d.strip() for d in read_documents(corpus)]
    ids = [example_id(language, d) for d in docs]
    keep = [i for i, ident in enumerate(ids) if not is_heldout(ident, heldout_fraction)]
    if not keep:
        raise UserInputError(
            f"corpus for {language!r} has no text left after holding out examples "
            f"(heldout_fraction {heldout_fraction} holds out all {len(docs)} of its documents): "
            "lower heldout_fraction, or give more text"
        )
    return [ids[i] for i in keep], [docs[i] for i in keep]


def examples_set(recipe: MergeRecipe, lang: str) -> ShardSet:
    spec = recipe.languages[lang]
    key = {
        "stage": "examples",
        "rules": "ids-sha256/heldout-blake2b-salted",  # bump when these rules change
        "language": lang,
        "corpus": spec.corpus.model_dump(mode="json"),
        "max_examples": spec.max_examples,
        "heldout": recipe.heldout_fraction,
        "shard_rows": recipe.shard_rows,
    }
    key.update(recipe.example_cut())  # a causal recipe's examples are cut by text
    written = recipe.written_text(lang)
    if written is not None:  # what its teacher text is made from (the text: its own set)
        key["teacher_text"] = {**written.model_dump(mode="json"), **written.decoding}
    return ShardSet(RunLayout(recipe.output_dir).examples(lang), key)


def write_examples(recipe: MergeRecipe, lang: str, written: Sequence[str] = ()) -> pa.Table:
    """The language's examples (``id``, ``text``, ``heldout``), written once, then read back;
    ``written``: text a teacher wrote for it (``language_examples``).

    Examples already written are kept only while the corpus still gives the very same ones (ids,
    texts, held-out flags): a corpus edited since is refused, naming it, and the run is left as
    it was (everything downstream was computed from the stored examples). A set whose manifest's
    counts disagree with its shards (``store_check.examples_problems``) is written again."""
    shards = examples_set(recipe, lang)
    found = language_examples(recipe, lang, written)
    stored = stored_examples(shards)
    if stored is not None:
        _check_same_examples(recipe, lang, stored, found)
        return stored
    shards.restart()  # the examples are drawn again as a whole, so every shard is rewritten
    table = examples_table(found)
    for index, start in enumerate(range(0, table.num_rows, recipe.shard_rows)):
        shards.write(index, table.slice(start, recipe.shard_rows))
    shards.finish(examples=table.num_rows, heldout=int(np.sum(table.column("heldout").to_numpy())))
    return table


def stored_examples(shards: ShardSet) -> pa.Table | None:
    """The examples ``shards`` hold, when they are complete, intact and counted as their
    manifest says (else None: ``write_examples`` draws them again)."""
    if not shards.intact() or examples_problems(shards):
        return None
    return pa.concat_tables(shards.tables(verify=False))


def refuse_edited_corpus(recipe: MergeRecipe, lang: str) -> None:
    """What ``write_examples`` refuses, for a dry run that writes nothing: stored examples
    that the corpus, read now, no longer gives (the text a teacher wrote left out: its own key
    guards it). The corpus is read only when there are stored examples."""
    stored = stored_examples(examples_set(recipe, lang))
    if stored is None:
        return
    ids = stored.column("id").to_pylist()
    corpus = stored.filter(pa.array([not is_written(i, lang) for i in ids], pa.bool_()))
    _check_same_examples(recipe, lang, corpus, language_examples(recipe, lang))


def examples_table(found: list[Example]) -> pa.Table:
    """``found`` as the rows of ``examples/``: ``id``, ``text``, ``heldout``."""
    columns = {"id": [e.id for e in found], "text": [e.text for e in found]}
    return pa.table({**columns, "heldout": [e.heldout for e in found]})


def _check_same_examples(
    recipe: MergeRecipe, lang: str, stored: pa.Table, found: list[Example]
) -> None:
    """Refuse when ``found`` (the corpus read now) differs from the ``stored`` examples."""
    now = [(e.id, e.text, e.heldout) for e in found]
    columns = [stored.column(c).to_pylist() for c in ("id", "text", "heldout")]
    if now == list(zip(*columns, strict=True)):
        return
    before = set(columns[0])
    changed = len(before.symmetric_difference(e.id for e in found))
    paths = ", ".join(recipe.languages[lang].corpus.paths)
    if recipe.written_text(lang) is not None:
        paths += f", and the text teacher_text.{lang} wrote"
    raise UserInputError(
        f"language {lang!r}: its corpus ({paths}) has changed since this run drew its examples "
        f"from it ({stored.num_rows} stored, {len(found)} now, {changed} differ), and the "
        "run's store and students come from those: restore the text, or give the recipe "
        "another output_dir"
    )


def require(shards: ShardSet, command: str) -> None:
    """Refuse to go on when an earlier stage's shard set is missing or incomplete, or complete
    under another key (built with other settings or teachers: named so, with what changed)."""
    if not shards.complete:
        raise UserInputError(stale_key([shards], command) or missing_set(shards, command))


def heldout_texts(run_dir: Path, languages: Sequence[str] | None = None) -> dict[str, list[str]]:
    """The held-out examples' texts of each language of the run (of ``languages`` if given)."""
    return stored_texts(run_dir, languages, heldout=True)


def require_examples(run_dir: Path) -> list[str]:
    """The languages whose examples the run holds; refused when it holds none (not prepared)."""
    found = RunLayout(run_dir).languages()
    if not found:
        raise UserInputError(
            f"{run_dir} holds no examples: run `lmalgebra merge prepare RECIPE` first"
        )
    return found


def stored_texts(
    run_dir: Path, languages: Sequence[str] | None = None, heldout: bool = True
) -> dict[str, list[str]]:
    """The texts of each language's held-out (``heldout``) or training examples, in stored order;
    refused when the run has no examples, or a language none of that kind."""
    found = require_examples(run_dir)
    unknown = sorted(set(languages or []) - set(found))
    if unknown:
        raise UserInputError(
            f"language {unknown[0]!r} is not in {run_dir} (it has {', '.join(found)})"
        )
    kind = "held-out" if heldout else "training"
    texts = {}
    for lang in languages or found:
        kept = _texts(RunLayout(run_dir).examples(lang), heldout)
        if not kept:
            raise UserInputError(f"language {lang!r} of {run_dir} has no {kind} example")
        texts[lang] = kept
    return texts


def _texts(directory: Path, heldout: bool) -> list[str]:
    """The texts of the held-out (``heldout``) or training examples in ``directory``, in stored
    order; refused when the set is missing or incomplete."""
    shards = ShardSet.existing(directory)
    require(shards, "prepare")
    table = pa.concat_tables(shards.tables())
    chosen = table.column("heldout").to_numpy(zero_copy_only=False) == heldout
    return [t for t, keep in zip(table.column("text").to_pylist(), chosen, strict=True) if keep]


def heldout_digests(recipe: MergeRecipe) -> dict[str, str]:
    """Per language of the recipe, a digest of its held-out examples' texts (what an
    evaluation's rows are scored on); refused, naming the set, where a language's examples are
    missing or incomplete."""
    layout = RunLayout(recipe.output_dir)
    return {lang: sha256_texts(_texts(layout.examples(lang), True)) for lang in recipe.languages}
