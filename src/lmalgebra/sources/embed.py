"""The one embedding loop: text spans -> pooled hidden states of one model, for any model family.

Spans are tokenised once, sorted by length so each batch pads only to its own longest member, run
through the model, pooled over real tokens, and put back in input order.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import compute_context
from lmalgebra.sources.embed_spec import EmbedSpec, Pooling, TokenReport

log = logging.getLogger(__name__)


def pool(hidden: torch.Tensor, mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """Pool ``hidden (batch, seq, d)`` over positions where ``mask (batch, seq)`` is 1.

    ``mean`` averages the masked positions; ``first`` takes position 0; ``last`` takes the last
    masked position (right padding). Returns ``(batch, d) float32``.
    """
    hidden = hidden.float()
    if pooling == "first":
        return hidden[:, 0]
    if pooling == "last":
        last = mask.long().cumsum(1).argmax(1)  # index of the last 1 in each row
        return hidden[torch.arange(hidden.shape[0]), last]
    weights = mask.to(hidden.dtype).unsqueeze(-1)
    return (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)


def max_tokens(model: Any, tokenizer: Any, requested: int | None, owner: str = "the model") -> int:
    """Longest input the model accepts: the smallest of the request, tokenizer and positions.
    A request above what the model reads is cut to it, and said, naming both (``owner``: the
    model, as messages name it): the run records the value asked for."""
    found = _model_limit(model, tokenizer)
    if requested and found is not None and requested > found:
        _say_cut(owner, found, requested)
    limits = [v for v in (requested, found) if v]
    return min(limits) if limits else 512


@functools.cache
def _say_cut(owner: str, found: int, requested: int) -> None:
    """Say that ``owner`` reads fewer tokens than asked, once a process (each split embeds)."""
    log.warning(
        "%s reads at most %d tokens (its positions or its tokenizer's limit): --max_length %d "
        "(max_length=%d) is cut to %d for it",
        *(owner, found, requested, requested, found),
    )


def _model_limit(model: Any, tokenizer: Any) -> int | None:
    """The fewest tokens of the tokenizer's limit and the model's positions (None: neither)."""
    limits = []
    if 0 < getattr(tokenizer, "model_max_length", 0) < 1_000_000:
        limits.append(tokenizer.model_max_length)
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions:
        # RoBERTa-style models reserve padding_idx + 1 position slots
        offset = (
            (model.config.pad_token_id or 0) + 1
            if model.config.model_type in ("roberta", "xlm-roberta", "camembert", "longformer")
            else 0
        )
        limits.append(positions - offset)
    return min(limits) if limits else None


def tokenize(
    texts: list[str], tokenizer: Any, limit: int
) -> tuple[list[list[int]], list[list[int]], TokenReport]:
    """Token ids and special-token masks per span (truncated at ``limit``), and a report."""
    enc = tokenizer(
        texts,
        add_special_tokens=True,
        truncation=False,
        return_special_tokens_mask=True,
        verbose=False,
    )
    ids, special, truncated = [], [], 0
    for row, smask in zip(enc["input_ids"], enc["special_tokens_mask"], strict=True):
        if len(row) > limit:
            truncated += 1
            # keep the closing special tokens, cut text tokens from the end
            tail = 0
            while tail < len(row) and smask[len(row) - 1 - tail]:
                tail += 1
            tail = min(tail, limit - 1)
            row = row[: limit - tail] + row[len(row) - tail :]
            smask = smask[: limit - tail] + smask[len(smask) - tail :]
        ids.append(row)
        special.append(smask)
    mean = float(np.mean([len(r) for r in ids])) if ids else 0.0
    return ids, special, TokenReport(mean, truncated, len(texts))


def _table_rows(model: Any) -> int | None:
    """The rows of ``model``'s token embeddings; None for a model without a readable table (an
    ONNX graph)."""
    getter = getattr(model, "get_input_embeddings", None)
    try:
        rows = getattr(getter(), "num_embeddings", None) if callable(getter) else None
    except (AttributeError, NotImplementedError):
        rows = None
    return rows if isinstance(rows, int) else None


def padding_id(pad: int | None, model: Any) -> int:
    """The id that fills a batch's padded positions: the tokenizer's pad token ``pad``, or 0
    when it has none or its pad token lies past the rows of ``model``'s token embeddings (a pad
    token added to the tokenizer alone, which torch had reported as an index out of range).
    Padded positions are masked, so any row of the table gives the same outputs."""
    rows = _table_rows(model)
    return 0 if pad is None or (rows is not None and pad >= rows) else int(pad)


def refuse_foreign_ids(owner: str, model: Any, ids: Iterable[Sequence[int]]) -> None:
    """Refuse token ids past the rows of ``model``'s token embeddings (a tokenizer of another
    model beside its weights), which torch reports as an index out of range deep in the
    forward pass; ``owner`` starts the message. A model without a readable table (an ONNX
    graph: its runtime's error is read instead) passes."""
    rows = _table_rows(model)
    if rows is None:
        return
    largest = max((max(row) for row in ids if len(row)), default=-1)
    if largest >= rows:
        raise UserInputError(
            f"{owner}: the tokenizer gives token id {largest}, beyond the {rows} rows of the "
            "model's token embeddings: is it this model's own tokenizer?"
        )


@torch.inference_mode()
def embed(
    texts: list[str],
    model: Any,
    tokenizer: Any,
    spec: EmbedSpec,
    progress: Callable[[int], None] | None = None,
    owner: str = "the model",
) -> tuple[np.ndarray, TokenReport]:
    """Embed spans with one model. Returns ``(len(texts), hidden) float32`` in input order.

    With ``spec.layers`` the pooled vectors of those layers are concatenated:
    ``(len(texts), len(layers) * hidden)``, layer by layer. The forward pass runs on
    ``spec.device`` (where ``model`` must be) in ``spec.dtype``; hidden states are pooled in
    float32.
    """
    device = input_device(model, torch.device(spec.device))
    context = compute_context(device, getattr(torch, spec.dtype))
    limit = max_tokens(model, tokenizer, spec.max_length, owner)
    ids, special, report = tokenize(texts, tokenizer, limit)
    refuse_foreign_ids(owner, model, ids)
    pad_id = padding_id(tokenizer.pad_token_id, model)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    hidden_size = model.config.hidden_size
    layers = spec.layers if spec.layers is not None else (spec.layer,)
    out = np.empty((len(ids), len(layers) * hidden_size), dtype=np.float32)
    need_all_layers = layers != (-1,)
    for start in range(0, len(order), spec.batch_size):
        batch = order[start : start + spec.batch_size]
        width = len(ids[batch[0]])
        input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        pool_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            n = len(ids[i])
            input_ids[row, :n] = torch.tensor(ids[i])
            attention[row, :n] = 1
            keep = [0 if s else 1 for s in special[i]] if spec.exclude_special else [1] * n
            pool_mask[row, :n] = torch.tensor(keep)
        with context:
            outputs = model(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                output_hidden_states=need_all_layers,
            )
        chosen = [outputs.hidden_states[k] for k in layers] if need_all_layers else None
        hidden = chosen or [_last_hidden(outputs)]
        # pooled where the states are (an ONNX graph returns them on the CPU whatever the device)
        pooled = [pool(h, pool_mask.to(h.device), spec.pooling) for h in hidden]
        out[batch] = torch.cat(pooled, dim=1).float().cpu().numpy()
        if progress is not None:
            progress(len(batch))
    return out, report


def input_device(model: Any, default: torch.device) -> torch.device:
    """Where a batch's inputs go: the device of the model's input embeddings when the model is
    spread over several devices (``device_map``), else ``default``."""
    if getattr(model, "hf_device_map", None) is None:
        return default
    return torch.device(model.get_input_embeddings().weight.device)


def _last_hidden(outputs: Any) -> torch.Tensor:
    hidden = getattr(outputs, "last_hidden_state", None)
    if hidden is None:
        hidden = outputs.hidden_states[-1] if outputs.hidden_states else outputs[0]
    return hidden
