"""Masked-LM logits at masked positions only, for any ``*ForMaskedLM``.

The vocabulary projection dominates a masked LM's cost when applied at every position. The encoder
runs on the whole batch; a forward hook on the base model replaces its output by the hidden states
gathered at the masked positions, so the model's own head (whatever its structure) runs on those
rows only. Used by teacher inference and by student training alike.
"""

from __future__ import annotations

from typing import Any

import torch


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
