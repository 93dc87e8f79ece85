"""Tiny models, tokenizers and texts for tests: built locally in seconds, no network."""

from __future__ import annotations

import random
from pathlib import Path

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
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers.trainers import WordPieceTrainer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok.train_from_iterator(
        sentences(400), WordPieceTrainer(vocab_size=200, special_tokens=specials)
    )
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=128,
    )
    fast.save_pretrained(directory)


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
