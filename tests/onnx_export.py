"""ONNX exports of the tiny test models (the legacy TorchScript exporter: needs only onnx)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

_DYNAMIC = {0: "batch", 1: "sequence"}


def _wrapper(model: Any, inputs: tuple[str, ...], outputs: str) -> Any:
    """A module taking ``inputs`` positionally and returning what ``outputs`` names."""
    import torch

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: torch.Tensor) -> Any:
            feeds = dict(zip(inputs, args, strict=True))
            if "attention_mask" not in feeds:
                feeds["attention_mask"] = torch.ones_like(feeds["input_ids"])
            result = self.model(**feeds, output_hidden_states=outputs == "all")
            if outputs == "pooled":
                return result.last_hidden_state.mean(1)  # 2-D: no hidden state to pool
            if outputs == "all":
                return (result.last_hidden_state, *result.hidden_states)
            return result.last_hidden_state

    return Wrapper()


def export_onnx(
    model_dir: Path,
    target: Path,
    inputs: tuple[str, ...] = ("input_ids", "attention_mask"),
    outputs: str = "last",
    dynamic: bool = True,
) -> Path:
    """Export a tiny BERT as ``target`` (a .onnx file).

    ``outputs``: ``last`` (``last_hidden_state``), ``all`` (plus ``hidden_states.0..N``), or
    ``pooled`` (a 2-D output only, for the refusal test); ``dynamic=False``: every axis of the
    example's size (batch 2, sequence 5), as an export without dynamic axes gives.
    """
    import torch
    from transformers import BertModel

    model = BertModel.from_pretrained(model_dir).eval()
    example = torch.tensor([[2, 5, 6, 7, 3], [2, 8, 3, 0, 0]])
    args = {
        "input_ids": example,
        "attention_mask": (example != 0).long(),
        "token_type_ids": torch.zeros_like(example),
    }
    names = ["last_hidden_state"]
    if outputs == "all":
        names += [f"hidden_states.{i}" for i in range(model.config.num_hidden_layers + 1)]
    if outputs == "pooled":
        names = ["pooled"]
    target.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation notices of the legacy exporter
        torch.onnx.export(
            _wrapper(model, inputs, outputs),
            tuple(args[n] for n in inputs),
            str(target),
            dynamo=False,
            input_names=list(inputs),
            output_names=names,
            dynamic_axes={n: _DYNAMIC if n != "pooled" else {0: "batch"} for n in [*inputs, *names]}
            if dynamic
            else None,
            opset_version=17,
        )
    return target
