"""The batch format of the training loop and the protocol every data source follows.

A source is a pure function of the batch index: the same index gives the same batch, so a resumed
run needs only the step number to continue exactly where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Protocol

import torch


@dataclass
class Batch:
    """One micro-batch.

    Attributes:
        input_ids, attention_mask: ``(batch, width) int64``.
        rows, cols: ``(n_masked,) int64`` where the masked tokens are.
        labels: ``(n_masked,) int64`` gold ids.
        language: ``(n_masked,) int64`` index of each masked token's language.
        topk_ids: ``(n_masked, k) int64`` teacher ids, or None for gold-only batches.
        topk_logprobs: ``(n_masked, k) float32`` teacher log-probabilities, or None.
        tokens: ``(n_languages,) int64`` real input tokens per language (for throughput logs).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    rows: torch.Tensor
    cols: torch.Tensor
    labels: torch.Tensor
    language: torch.Tensor
    tokens: torch.Tensor
    topk_ids: torch.Tensor | None = None
    topk_logprobs: torch.Tensor | None = None

    def to(self, device: torch.device) -> Batch:
        moved: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            moved[f.name] = value.to(device) if value is not None else None
        return Batch(**moved)

    def head_inputs(self) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids,
            "attention_mask": self.attention_mask,
            "rows": self.rows,
            "cols": self.cols,
        }


class BatchSource(Protocol):
    languages: list[str]

    def batch(self, index: int) -> Any:
        """Micro-batch number ``index`` (deterministic): a :class:`Batch`, or, with a loop
        given its own ``step_loss``, what that reads (with ``to(device)`` and ``tokens``)."""
        ...
