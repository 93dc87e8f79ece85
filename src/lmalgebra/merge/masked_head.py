"""Masked-LM logits at masked positions only, for any ``*ForMaskedLM``.

The vocabulary projection dominates a masked LM's cost when applied at every position. The encoder
runs on the whole batch; a forward hook on the base model replaces its output by the hidden states
gathered at the masked positions, so the model's own head (whatever its structure) runs on those
rows only. Used by teacher inference and by student training alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmalgebra.merge.masking import MaskedCopy


def pad_batch(copies: Sequence[MaskedCopy], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` ``(batch, width) int64`` and the masked
    positions as ``rows``/``cols`` ``(n_masked,) int64`` in copy order."""
    width = max(len(c.input_ids) for c in copies)
    ids = torch.full((len(copies), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(copies), width), dtype=torch.long)
    for row, c in enumerate(copies):
        ids[row, : len(c.input_ids)] = torch.as_tensor(c.input_ids)
        attention[row, : len(c.input_ids)] = 1
    rows = torch.cat([torch.full((len(c.positions),), r) for r, c in enumerate(copies)])
    cols = torch.cat([torch.as_tensor(c.positions, dtype=torch.long) for c in copies])
    return {"input_ids": ids, "attention_mask": attention, "rows": rows, "cols": cols}


def masked_logits(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``(n_masked, vocab)`` logits of ``model`` at ``batch['rows'], batch['cols']``."""
    rows, cols = batch["rows"], batch["cols"]

    def gather(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        picked = hidden[rows, cols].unsqueeze(0)  # (1, n_masked, hidden)
        if isinstance(output, tuple):
            return (picked, *output[1:])
        output.last_hidden_state = picked
        return output

    inner = getattr(model, "module", model)  # under data parallelism DDP wraps the model
    handle = inner.base_model.register_forward_hook(gather)
    try:
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    finally:
        handle.remove()
    return out.logits[0]
