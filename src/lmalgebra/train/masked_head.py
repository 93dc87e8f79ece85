"""Masked-LM logits at masked positions only, for any ``*ForMaskedLM``.

The vocabulary projection dominates a masked LM's cost when applied at every position. The encoder
runs on the whole batch; a forward hook on the base model replaces its output by the hidden states
gathered at the masked positions, so the model's own head (whatever its structure) runs on those
rows only. Where the architecture allows it the encoder's last layer runs on those rows only too
(``last_layer``). Used by teacher inference and by student training alike.

Under autocast (bfloat16) the head may run in float32 (``float32_head``): the head is every child
module of the model other than its base model, and autocast is switched off around each of them.
Teacher inference does so: rounding the hidden states and the 30,000-entry projection to bfloat16
reorders near-tied candidates at the top-k boundary, and on the masked rows alone the float32 head
costs a few percent of the encoder's time.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from lmalgebra.train.last_layer import last_layer_on_rows


def masked_logits(
    model: Any,
    batch: dict[str, torch.Tensor],
    float32_head: bool = False,
    trim_last_layer: bool = True,
) -> torch.Tensor:
    """``(n_masked, vocab)`` logits of ``model`` at ``batch['rows'], batch['cols']``.

    ``float32_head``: under autocast, run the head in float32 on float32 hidden states (the
    encoder stays in the autocast dtype); without autocast it changes nothing.
    ``trim_last_layer``: run the encoder's last layer for the masked rows only where the
    architecture allows it (``last_layer``): the same logits up to float rounding.
    """
    rows, cols = batch["rows"], batch["cols"]
    device = batch["input_ids"].device.type
    in_float32 = float32_head and torch.is_autocast_enabled(device)

    trimmed = False

    def gather(module: Any, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        # (1, n_masked, hidden); a trimmed last layer returns the masked rows already
        picked = hidden if trimmed else hidden[rows, cols].unsqueeze(0)
        if in_float32:
            picked = picked.float()
        if isinstance(output, tuple):
            return (picked, *output[1:])
        output.last_hidden_state = picked
        return output

    inner = getattr(model, "module", model)  # under data parallelism DDP wraps the model
    with contextlib.ExitStack() as hooks:
        trimmed = trim_last_layer and last_layer_on_rows(inner, batch, hooks)
        hooks.callback(inner.base_model.register_forward_hook(gather).remove)
        if in_float32:
            _without_autocast(inner, device, hooks)
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    # squeeze, not [0]: indexing's backward fills a zero tensor of the logits' size and copies the
    # gradient into it (20 ms of a 256 ms step at 34,150 tokens); a squeeze's backward is a view
    return out.logits.squeeze(0)


def _without_autocast(model: Any, device: str, hooks: contextlib.ExitStack) -> None:
    """Switch autocast off around every child of ``model`` except its base model; hooks and any
    context a failed forward left open are undone when ``hooks`` closes."""
    opened: list[Any] = []

    def enter(module: Any, args: Any) -> None:
        context = torch.autocast(device, enabled=False)
        context.__enter__()
        opened.append(context)

    def leave(module: Any, args: Any, output: Any) -> None:
        opened.pop().__exit__(None, None, None)

    def close_open() -> None:  # a forward that raised inside the head
        while opened:
            opened.pop().__exit__(None, None, None)

    hooks.callback(close_open)
    for child in model.children():
        if child is not model.base_model:
            hooks.callback(child.register_forward_pre_hook(enter).remove)
            hooks.callback(child.register_forward_hook(leave).remove)
