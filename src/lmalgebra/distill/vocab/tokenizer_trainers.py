"""Tokenizers trained here by the `tokenizers` library on text: BERT's WordPiece for masked
teachers (``train_wordpiece``), the kinds of causal teachers and students
(``train_causal_tokenizer``), and the byte tokenizer of a byte-level student.

Four trained kinds, as the models people merge use them: ``bytelevel-bpe`` (GPT-2: BPE over
bytes, no unknown token), ``bpe`` and ``unigram`` (SentencePiece style: ``▁`` marks word
starts; unknown characters become ``<unk>``) and ``wordpiece`` (BERT's pieces, the toolkit's
deterministic trainer). Each gets a beginning-of-sequence token, prepended by the tokenizer's
post-processor (a causal LM predicts a text's first token after it), an end-of-text token and a
padding token. Training is deterministic: the same text gives the same vocabulary in every
process. ``byte_tokenizer`` trains nothing: one token per UTF-8 byte (id = byte value) and the
same start, end and padding tokens.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.vocab.token_forms import byte_alphabet
from lmalgebra.distill.vocab.tokenizer_choice import (
    TOKENIZER_KINDS,
    TokenizerKind,
    check_vocab_size,
)

WORDPIECE_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "unk": "<unk>"}
_WORDPIECE_SPECIALS = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "unk": "[UNK]"}
SHORT = 0.9  # a vocabulary below this share of the size asked is named (unigram's is "about")

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """The trainers run single-threaded, so that no sum depends on how work was split."""
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


_APPENDED_STEP = 1e-4  # the trainer's score step between the characters it appends


def _appended_characters(pieces: list[tuple[str, float]]) -> list[int]:
    """Indices in ``pieces`` of the characters the unigram trainer appended (those no piece
    covers): the longest chain of single characters whose scores step down by 1e-4 from the
    first, wherever trained pieces scored between them fell."""
    singles = sorted(((s, i) for i, (p, s) in enumerate(pieces) if len(p) == 1), reverse=True)
    longest: list[int] = []
    for first, (top, _) in enumerate(singles):
        chain: list[int] = []
        for score, index in singles[first:]:
            steps = (top - score) / _APPENDED_STEP
            if steps > len(chain) + 0.5:
                break  # a step is missing: the chain ends
            if abs(steps - len(chain)) < 1e-3:
                chain.append(index)
        if len(chain) > len(longest):
            longest = chain
    return longest if len(longest) > 1 else []


def _settled_unigram(tok: Any) -> Any:
    """The unigram model with scores rounded to 1e-9 and pieces in a canonical order.

    The trainer sums expected counts in hash-map order, so the same text gives scores that differ
    in their last bits from one process to the next; and it appends the characters no piece
    covers in hash-set order, each 1e-4 below the one before, trained pieces whose scores fall
    between them sorted among them. Those characters are given their scores in character order
    first, then rounded scores order every piece, ties by the piece.
    """
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    specials = len(SPECIALS)  # the trainer lists them first, unk among them
    pieces = [(str(p), float(s)) for p, s in vocab[specials:]]
    appended = _appended_characters(pieces)
    chars = sorted(pieces[i][0] for i in appended)
    scores = sorted((pieces[i][1] for i in appended), reverse=True)
    for index, char, score in zip(sorted(appended), chars, scores, strict=True):
        pieces[index] = (char, score)
    ordered = sorted(((p, round(s, 9)) for p, s in pieces), key=lambda e: (-e[1], e[0]))
    data["model"]["vocab"] = [*vocab[:specials], *([p, s] for p, s in ordered)]
    return Tokenizer.from_str(json.dumps(data))


def _backend(kind: TokenizerKind, texts: list[str], vocab_size: int) -> Any:
    """The trained ``tokenizers.Tokenizer`` of a kind other than wordpiece."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    specials = list(SPECIALS.values())
    if kind == "bytelevel-bpe":
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        trainer: Any = trainers.BpeTrainer(
            vocab_size=vocab_size, special_tokens=specials, initial_alphabet=alphabet
        )
    elif kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=SPECIALS["unk"]))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials)
    else:
        tok = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(
            vocab_size=vocab_size, special_tokens=specials, unk_token=SPECIALS["unk"]
        )
    if kind != "bytelevel-bpe":
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
    with _one_thread():
        tok.train_from_iterator(texts, trainer)
    return _settled_unigram(tok) if kind == "unigram" else tok


def train_wordpiece(texts: list[str], vocab_size: int, lowercase: bool, max_length: int) -> Any:
    """A BERT-style WordPiece ``PreTrainedTokenizerFast`` trained on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import PreTrainedTokenizerFast

    check_vocab_size("wordpiece", vocab_size, f"vocab_size {vocab_size}")
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    # The trainer numbers the "##" pieces in hash-map order, and those ids break ties between
    # equally frequent merges, so the same text gives another vocabulary in every process
    # (huggingface/tokenizers#1794). Listing the pieces first, sorted, fixes their ids; they are
    # then put back among the ordinary tokens.
    pieces = _continuing_pieces(tok, texts)
    trainer = WordPieceTrainer(vocab_size=vocab_size, special_tokens=WORDPIECE_SPECIALS + pieces)
    tok.train_from_iterator(texts, trainer)
    _warn_short(tok, vocab_size)
    vocab = tok.get_vocab()
    tok.model = models.WordPiece(vocab, unk_token="[UNK]")
    tok = _without_added(tok, WORDPIECE_SPECIALS)
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )


def _continuing_pieces(tok: Any, texts: list[str]) -> list[str]:
    """Every ``##c`` piece the WordPiece trainer would create for ``texts``, sorted."""
    chars: set[str] = set()
    for text in texts:
        for word, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text)):
            chars.update(word[1:])
    return [f"##{c}" for c in sorted(chars)]


def _without_added(tok: Any, specials: list[str]) -> Any:
    """``tok`` rebuilt from its own JSON with only ``specials`` as added tokens."""
    from tokenizers import Tokenizer

    data = json.loads(tok.to_str())
    data["added_tokens"] = [t for t in data["added_tokens"] if t["content"] in specials]
    return Tokenizer.from_str(json.dumps(data))


def train_causal_tokenizer(
    texts: list[str], kind: TokenizerKind, vocab_size: int, max_length: int
) -> Any:
    """A ``PreTrainedTokenizerFast`` of ``kind`` with about ``vocab_size`` entries, trained on
    ``texts``, whose encodings start with its beginning-of-sequence token."""
    if kind not in TOKENIZER_KINDS:
        raise UserInputError(f"tokenizer kind must be one of {', '.join(TOKENIZER_KINDS)}")
    check_vocab_size(kind, vocab_size, f"vocab_size {vocab_size}")
    if kind == "wordpiece":
        with _one_thread():
            backend = train_wordpiece(texts, vocab_size, False, max_length).backend_tokenizer
        names = _WORDPIECE_SPECIALS
    else:
        backend, names = _backend(kind, texts, vocab_size), SPECIALS
        _warn_short(backend, vocab_size)
    return _wrapped(backend, names, max_length)


def _warn_short(tok: Any, vocab_size: int) -> None:
    """Name a tokenizer trained to far fewer entries than asked: the text holds no more (it had
    been smaller than asked without a word, a teacher's head and embeddings sized to it)."""
    if (size := tok.get_vocab_size()) < SHORT * vocab_size:
        log.warning(
            "a tokenizer of %d entries was asked, but the text gives %d alone (every character "
            "and merge it holds): the tokenizer has %d; give more text, or ask for fewer",
            vocab_size,
            size,
            size,
        )


def _wrapped(backend: Any, names: dict[str, str], max_length: int) -> Any:
    """``backend`` as a ``PreTrainedTokenizerFast`` whose encodings start with ``names["bos"]``
    (``names`` without ``unk``: a tokenizer that has no unknown token)."""
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    bos = names["bos"]
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, backend.token_to_id(bos))]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos,
        eos_token=names["eos"],
        pad_token=names["pad"],
        unk_token=names.get("unk"),
        model_max_length=max_length,
    )


def byte_tokenizer(max_length: int) -> Any:
    """A ``PreTrainedTokenizerFast`` of raw UTF-8 bytes: byte ``b`` is id ``b`` (written as
    GPT-2's byte-level character, so it reads and decodes as byte-level BPE with no merges), then
    ``<pad>``, ``<s>`` and ``</s>`` (ids 256-258); every text is representable, so no unknown
    token. Encodings start with ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    names = {k: v for k, v in SPECIALS.items() if k != "unk"}
    vocab = {char: byte for byte, char in enumerate(byte_alphabet())}
    vocab |= {token: 256 + k for k, token in enumerate(names.values())}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(names.values()))
    return _wrapped(backend, names, max_length)
