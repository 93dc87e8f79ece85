"""Tiny models, tokenizers and texts for tests: built locally in seconds, no network."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np

WORDS = [
    "the",
    "a",
    "river",
    "city",
    "old",
    "new",
    "king",
    "queen",
    "language",
    "model",
    "text",
    "north",
    "south",
    "music",
    "film",
    "war",
    "peace",
    "science",
    "history",
    "small",
    "large",
    "red",
    "blue",
    "green",
    "early",
    "late",
    "people",
    "house",
    "school",
    "train",
    "bank",
    "light",
    "water",
    "fire",
    "stone",
    "iron",
    "gold",
    "silver",
    "paper",
    "book",
    "song",
    "dance",
    "road",
    "bridge",
    "tower",
    "island",
    "forest",
    "mountain",
    "valley",
    "lake",
    "sea",
    "star",
    "moon",
    "sun",
    "day",
    "night",
    "year",
    "century",
    "empire",
    "republic",
    "church",
]


def sentences(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
        words[0] = words[0].capitalize()
        out.append(" ".join(words) + rng.choice([".", "!", "?", ", and so on."]))
    return out


def documents(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    pool = sentences(count * 6, seed)
    return [" ".join(pool[i * 6 : i * 6 + rng.randint(3, 6)]) for i in range(count)]


def _wordpiece(directory: Path, lowercase: bool = True) -> None:
    """A 200-piece BERT WordPiece tokenizer, trained with the toolkit's own trainer."""
    from lmalgebra.distill.vocab.tokenizer_trainers import train_wordpiece

    train_wordpiece(sentences(400), 200, lowercase, 128).save_pretrained(directory)


def _bytelevel(directory: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        sentences(400, seed=1),
        BpeTrainer(
            vocab_size=300,
            special_tokens=["<eos>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", model_max_length=256)
    fast.save_pretrained(directory)


def build_tokenizer(directory: Path) -> Path:
    """The tiny BERT's WordPiece tokenizer alone: a directory with no model in it."""
    _wordpiece(directory)
    return directory


def build_bert(directory: Path, hidden: int = 32, seed: int = 0, layers: int = 2) -> Path:
    import torch
    from transformers import BertConfig, BertModel

    _wordpiece(directory)
    config = BertConfig(
        vocab_size=200,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    BertModel(config).save_pretrained(directory)
    return directory


def build_gpt2(directory: Path, hidden: int = 48, seed: int = 0) -> Path:
    import torch
    from transformers import GPT2Config, GPT2Model

    _bytelevel(directory)
    config = GPT2Config(vocab_size=300, n_embd=hidden, n_layer=2, n_head=4, n_positions=256)
    torch.manual_seed(seed)
    GPT2Model(config).save_pretrained(directory)
    return directory


def _sentencepiece_bpe(directory: Path, texts: list[str]) -> None:
    """A SentencePiece-style BPE tokenizer (Metaspace, ``▁`` word starts) with RoBERTa specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from tokenizers.trainers import BpeTrainer
    from transformers import PreTrainedTokenizerFast

    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(texts, BpeTrainer(vocab_size=260, special_tokens=specials))
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        cls_token="<s>",
        sep_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=128,
    )
    fast.save_pretrained(directory)


def build_tokenizer_kinds(directory: Path) -> dict[str, Path]:
    """One tokenizer of each kind teachers come with, each in its own subdirectory: WordPiece
    (``wp``, lower-cased), byte-level BPE (``bl``, GPT-2 style) and SentencePiece-style BPE
    (``sp``, with ``<unk>``)."""
    paths = {kind: directory / kind for kind in ("wp", "bl", "sp")}
    _wordpiece(paths["wp"])
    _bytelevel(paths["bl"])
    _sentencepiece_bpe(paths["sp"], sentences(400, seed=3))
    return paths


def build_bert_mlm(directory: Path, seed: int = 0) -> Path:
    """A tiny BERT masked LM (WordPiece) with its head saved: usable as a teacher."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    _wordpiece(directory)
    config = BertConfig(
        vocab_size=200,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    BertForMaskedLM(config).save_pretrained(directory)
    return directory


def build_roberta_mlm(directory: Path, texts: list[str] | None = None, seed: int = 0) -> Path:
    """A tiny RoBERTa masked LM with a SentencePiece-style BPE tokenizer: another family."""
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaForMaskedLM

    _sentencepiece_bpe(directory, texts or sentences(400, seed=3))
    tok = AutoTokenizer.from_pretrained(directory)
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=130,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    RobertaForMaskedLM(config).save_pretrained(directory)
    return directory


def correlated_models(
    n: int, seed: int, dims: tuple[int, ...] = (5, 7, 3, 6), latent: int = 8, noise: float = 0.5
) -> np.ndarray:
    """``(n, sum(dims))`` embeddings of correlated 'models' of different widths, offsets and
    scales: model k mixes a shared latent (scale k + 1), adds noise (scale ``noise + k``) and
    an offset of ``10 (k - 1)``."""
    rng = np.random.default_rng(seed)
    shared = rng.normal(size=(n, latent))
    parts = []
    for k, dim in enumerate(dims):
        mix = rng.normal(size=(latent, dim)) * (k + 1)
        parts.append(shared @ mix + rng.normal(scale=noise + k, size=(n, dim)) + 10 * (k - 1))
    return np.hstack(parts)
