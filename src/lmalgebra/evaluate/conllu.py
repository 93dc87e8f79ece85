"""CoNLL-U treebanks: read sentences as (form, UPOS) pairs, and find a treebank's three splits.

Only what POS tagging needs is kept. Comment lines, multiword token ranges (``3-4``) and empty nodes
(``5.1``) are skipped; every other line must be a well-formed word line, or the reader stops with a
:class:`UserInputError` naming the file and line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import absent, not_a_directory, read_lines, read_text
from lmalgebra.storage.atomic import write_text_atomic

Sentence = list[tuple[str, str]]
"""One sentence: its syntactic words in order, each ``(form, upos)``."""

SPLITS = ("train", "dev", "test")
_FIELDS = 10
_RANGE = re.compile(r"^[0-9]+-[0-9]+$")
_EMPTY_NODE = re.compile(r"^[0-9]+\.[0-9]+$")


def read_conllu(path: Path) -> list[Sentence]:
    """Sentences of a CoNLL-U file, in file order; a malformed line raises, naming ``file:line``."""
    path = Path(path)
    sentences: list[Sentence] = []
    current: Sentence = []
    for number, line in enumerate(read_lines(path, "CoNLL-U file"), start=1):
        if not line.strip():
            if current:
                sentences.append(current)
                current = []
            continue
        if line.startswith("#"):
            continue
        word = _parse_word(line, len(current) + 1, f"{path}:{number}")
        if word is not None:
            current.append(word)
    if current:
        sentences.append(current)
    if not sentences:
        raise UserInputError(f"CoNLL-U file {path} holds no sentences")
    return sentences


def _parse_word(line: str, expected_id: int, where: str) -> tuple[str, str] | None:
    """``(form, upos)`` of a word line; None for a multiword range or an empty node."""
    fields = line.split("\t")
    if len(fields) != _FIELDS:
        raise UserInputError(
            f"{where}: expected {_FIELDS} tab-separated fields, found {len(fields)}"
        )
    token_id, form, upos = fields[0], fields[1], fields[3]
    if not (token_id.isascii() and token_id.isdigit()):  # [0-9]+, without a regex per word
        if _RANGE.match(token_id) or _EMPTY_NODE.match(token_id):
            return None
        raise UserInputError(f"{where}: word id {token_id!r} is not an integer")
    if int(token_id) != expected_id:
        # a missing blank line between sentences shows up here
        raise UserInputError(
            f"{where}: word id {token_id} out of sequence (expected {expected_id})"
        )
    if not form:
        raise UserInputError(f"{where}: word {token_id} has an empty FORM")
    if upos in ("", "_"):
        raise UserInputError(f"{where}: word {token_id} ({form!r}) has no UPOS tag")
    return form, upos


@dataclass(frozen=True)
class TreebankSplits:
    """The three CoNLL-U files of one treebank."""

    train: Path
    dev: Path
    test: Path


def find_splits(directory: Path) -> TreebankSplits:
    """Train, dev and test files of a treebank directory.

    A split is found as UD names it (``*-ud-train.conllu``) or as a file named ``train``,
    ``train.conllu`` (likewise ``dev``, ``test``). None or several candidates for a split is an
    error naming the split.
    """
    directory = Path(directory)
    if not directory.is_dir():
        why = not_a_directory(directory) if directory.exists() else absent(directory)
        raise UserInputError(f"treebank directory {directory} {why}")
    found: dict[str, Path] = {}
    for split in SPLITS:
        patterns = (f"*-ud-{split}.conllu", f"{split}.conllu", split)
        candidates = sorted(
            {p for pattern in patterns for p in directory.glob(pattern) if p.is_file()}
        )
        if not candidates:
            odd = sorted(p for pattern in patterns for p in directory.glob(pattern))
            if odd:  # a FIFO, a link to nothing or a directory under a split's name
                why = "is a directory" if odd[0].is_dir() else absent(odd[0])
                raise UserInputError(f"treebank {directory}: {split} split {odd[0]} {why}")
            raise UserInputError(
                f"treebank {directory}: no {split} split (looked for {', '.join(patterns)})"
            )
        if len(candidates) > 1:
            names = ", ".join(p.name for p in candidates)
            raise UserInputError(f"treebank {directory}: several {split} files ({names})")
        found[split] = candidates[0]
    return TreebankSplits(**found)


def split_by_document(source: Path, out: Path, name: str = "treebank") -> TreebankSplits:
    """Split a one-file treebank into train/dev/test by document (``# sent_id = DOC-N``): of the
    documents in sorted order, every sixth goes to test and another sixth to dev, so no document
    is shared between splits. Writes ``<name>-ud-{split}.conllu`` under ``out``."""
    blocks = [b for b in read_text(source, "CoNLL-U file").split("\n\n") if b.strip()]
    documents = []
    for number, block in enumerate(blocks, 1):
        found = re.search(r"# sent_id = (.*)-\d+", block)
        if found is None:
            raise UserInputError(f"{source}: sentence {number} has no '# sent_id = DOC-N' line")
        documents.append(found.group(1))
    order = sorted(set(documents))
    roles = ("test", "train", "train", "dev", "train", "train")
    role = {doc: roles[i % len(roles)] for i, doc in enumerate(order)}
    paths = {}
    for split in ("train", "dev", "test"):
        chosen = [b for b, d in zip(blocks, documents, strict=True) if role[d] == split]
        paths[split] = out / f"{name}-ud-{split}.conllu"
        write_text_atomic(paths[split], "\n\n".join(chosen) + "\n\n")
    return TreebankSplits(paths["train"], paths["dev"], paths["test"])
