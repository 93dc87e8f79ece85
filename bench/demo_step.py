"""The demo's BERT (2 x 128, batch 32 x 64) and one synthetic masked batch with teacher top-k,
for the benchmarks that time its training step."""

from __future__ import annotations

from typing import Any


def demo_bert_batch(vocab: int, dropout: float) -> dict[str, Any]:
    """A seeded demo BERT over ``vocab`` tokens in training mode, fused AdamW, and a batch: its
    ``inputs`` (ids, attention mask, masked ``rows`` and ``cols``, 15% of positions),
    ``labels``, the teacher's ``topk`` ids and ``teacher`` log-probabilities."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=vocab, hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=512, max_position_embeddings=128, hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )  # fmt: skip
    model = BertForMaskedLM(config).train()
    ids = torch.randint(5, vocab, (32, 64))
    rows, cols = (torch.rand(32, 64) < 0.15).nonzero(as_tuple=True)
    n = len(rows)
    return {
        "model": model,
        "inputs": {"input_ids": ids, "attention_mask": torch.ones_like(ids), "rows": rows,
                   "cols": cols},
        "labels": torch.randint(5, vocab, (n,)),
        "topk": torch.randint(5, vocab, (n, 8)),
        "teacher": torch.log_softmax(torch.randn(n, 8), -1),
    }  # fmt: skip
