"""The encoder's last layer run for the masked rows only.

A masked LM's prediction at a position reads the last layer's output at that position alone. That
layer's keys and values come from every position, but its queries, attention output and
feed-forward block are per position: run for the masked rows only (15% of a batch), the layer
costs about 30% of a full one. For a 12-layer teacher that is ~6% of the encoder's matrix
products, for a 4-layer student ~18%.

Only encoder layers of the BERT family are trimmed (BERT, RoBERTa, XLM-R, CamemBERT, ELECTRA:
``attention.self`` with ``query``/``key``/``value``, ``attention.output``, ``intermediate``,
``output``, post-layer-norm, absolute positions). The layer's own modules run on the chosen rows;
attention is ``softmax(q k^T * scaling + mask) v`` by torch's fused kernel, as those models compute
it. Any other architecture, or a model whose encoder was replaced, runs unchanged.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch.nn.functional import scaled_dot_product_attention

FAMILY = ("Bert", "Roberta", "XLMRoberta", "Camembert", "Electra")
# their ``model_type`` in config.json (for estimates made from a config alone)
TRIMMED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
_LAYERS = {f"{name}Layer" for name in FAMILY}
_ATTENTIONS = {f"{name}SelfAttention" for name in FAMILY}


def trimmable_layers(model: Any) -> torch.nn.ModuleList | None:
    """The encoder's layer list when its last layer can run on chosen rows, else None."""
    encoder = getattr(getattr(model, "base_model", None), "encoder", None)
    layers = getattr(encoder, "layer", None)
    if not isinstance(layers, torch.nn.ModuleList) or len(layers) == 0:
        return None
    last = layers[-1]
    attention = getattr(getattr(last, "attention", None), "self", None)
    if type(last).__name__ not in _LAYERS or type(attention).__name__ not in _ATTENTIONS:
        return None
    if not type(last).__module__.startswith("transformers.models."):  # remote code, same names
        return None
    if getattr(last, "is_decoder", False) or hasattr(last, "crossattention"):
        return None
    return layers


class RowsLayer(torch.nn.Module):
    """``layer`` computed at ``(rows, cols)`` only: ``forward`` returns ``(1, n_rows, hidden)``.

    Stands in for the last layer inside the encoder's layer list. The mask the encoder passes
    (prepared for its attention implementation) is ignored: attention reads ``attention_mask``
    ``(batch, width)`` (1 = a real token), the mask the model was called with.
    """

    def __init__(
        self,
        layer: torch.nn.Module,
        rows: torch.Tensor,
        cols: torch.Tensor,
        attention_mask: torch.Tensor,
    ):
        super().__init__()
        self.layer = layer
        self.rows, self.cols, self.attention_mask = rows, cols, attention_mask

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        layer: Any = self.layer  # a BERT-family layer (``trimmable_layers``)
        rows = self.rows
        batch, width, _ = hidden_states.shape
        attention = layer.attention.self
        heads, size = attention.num_attention_heads, attention.attention_head_size
        chosen = hidden_states[rows, self.cols]  # (n, hidden): every per-row product runs on these
        # attention alone needs the rows by example: each row's slot among its example's rows
        counts = torch.bincount(rows, minlength=batch)
        starts = torch.cumsum(counts, 0) - counts
        order = torch.argsort(rows, stable=True)
        slots = torch.empty_like(rows)
        slots[order] = torch.arange(len(rows), device=rows.device) - starts[rows[order]]
        query = attention.query(chosen)
        queries = query.new_zeros(batch, max(int(counts.max()), 1), heads * size)
        queries[rows, slots] = query

        def by_head(x: torch.Tensor) -> torch.Tensor:  # (batch, len, heads * size) -> per head
            return x.view(batch, x.shape[1], heads, size).transpose(1, 2)

        context = scaled_dot_product_attention(
            by_head(queries),
            by_head(attention.key(hidden_states)),
            by_head(attention.value(hidden_states)),
            attn_mask=self.attention_mask.bool()[:, None, None, :width],
            dropout_p=attention.dropout.p if attention.training else 0.0,
            scale=getattr(attention, "scaling", size**-0.5),
        )
        context = context.transpose(1, 2)[rows, slots].reshape(len(rows), heads * size)
        out = layer.attention.output(context, chosen)
        return layer.output(layer.intermediate(out), out).unsqueeze(0)


def last_layer_on_rows(
    model: Any, batch: dict[str, torch.Tensor], stack: contextlib.ExitStack
) -> bool:
    """Swap ``model``'s last encoder layer for a ``RowsLayer`` at ``batch['rows'], ['cols']``
    until ``stack`` closes; False (nothing swapped) where the architecture is not supported."""
    layers = trimmable_layers(model)
    if layers is None or batch["rows"].numel() == 0:
        return False
    last = layers[-1]
    layers[-1] = RowsLayer(last, batch["rows"], batch["cols"], batch["attention_mask"])

    def put_back() -> None:
        layers[-1] = last

    stack.callback(put_back)
    return True
