"""Next-token log-probabilities of a causal LM, a chunk of positions at a time.

A causal LM's forward returns ``(batch, positions, vocabulary)`` logits: with Gemma 3's 262,144
tokens that is 1 MiB of float32 per position, 8 GiB for 32 examples of 256 tokens, before
``log_softmax`` copies it. Here the model's body runs once for its last hidden states, and its
output head is applied to a chunk of the real (not padding) positions at a time, so at most
``chunk x vocabulary`` logits exist at once, whatever the batch. From each chunk come the actual
next token's log-probability, the top-k, and tokens drawn by inverse CDF, as from full logits:
every row's log-softmax depends on that row alone.

The head is the model's output embedding (tied or not) followed by what the architecture does to
logits in its ``forward``: Gemma 2 and 3 soft-cap them (``final_logit_softcapping``), Cohere
multiplies them (``logit_scale``), Granite divides them (``logits_scaling``). The first use of a
model compares this head with the model's own forward on a few tokens and refuses a model whose
logits are made some other way.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.precision import compute_context

# At most this much float32 logits per chunk (256 positions of a 262,144-token vocabulary), and at
# most MAX_POSITIONS positions (a 49,152-token vocabulary: 96 MiB). Each chunk reads the whole
# head once (671 MB for Gemma 3 in float32): on 2 AVX2 cores Gemma's head took 1.05x the time of
# one product over 768 rows in chunks of 256, 1.35x in chunks of 128, 1.8x in chunks of 64; more
# rows only hold more memory. The logits and their log-softmax are held together for a moment,
# the float64 CDF of the draws a quarter chunk at a time: a peak of about 2.25 chunks.
CHUNK_BYTES = 256 << 20
MAX_POSITIONS = 512
_CHECKED: weakref.WeakSet[Any] = weakref.WeakSet()


class NextTokenStats(NamedTuple):
    """Per position (``n`` of them): the teacher's view of the next token.

    Attributes:
        next_logprob: ``(n,) float32`` log-probability of the actual next token.
        topk_ids: ``(n, k) int64`` the k most likely next tokens, most likely first.
        topk_logprobs: ``(n, k) float32`` their log-probabilities.
        sample_ids: ``(n, K) int64`` tokens drawn with replacement, ascending; None without draws.
        sample_logprobs: ``(n, K) float32`` their log-probabilities; None without draws.
    """

    next_logprob: np.ndarray
    topk_ids: np.ndarray
    topk_logprobs: np.ndarray
    sample_ids: np.ndarray | None
    sample_logprobs: np.ndarray | None


def body_states(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """``(batch, seq, hidden)`` last hidden states of a causal LM's body (its base model): what
    its forward feeds the output head."""
    out = model.base_model(input_ids=input_ids, attention_mask=attention_mask)
    return out[0] if isinstance(out, tuple) else out.last_hidden_state


def head_logits(model: Any, hidden: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(n, vocab) float32`` logits of ``hidden (n, hidden)``, the head computed under autocast
    when ``dtype`` is bfloat16 (as the model's forward would be)."""
    head = model.get_output_embeddings()
    config = model.config
    with compute_context(hidden.device, dtype):
        logits = head(hidden)
        cap = getattr(config, "final_logit_softcapping", None)
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        if getattr(config, "logit_scale", None) is not None:
            logits = logits * config.logit_scale
        if getattr(config, "logits_scaling", None) is not None:
            logits = logits / config.logits_scaling
    return logits.float()


def check_head(model: Any, owner: str = "model") -> None:
    """Refuse a model whose forward makes logits other than :func:`head_logits` does, once per
    model: a forward of four tokens in float32, compared to body then head."""
    if model in _CHECKED:
        return
    if model.get_output_embeddings() is None:
        raise UserInputError(f"{owner}: {type(model).__name__} has no output head")
    device = next(model.parameters()).device
    vocab = model.get_output_embeddings().weight.shape[0]
    ids = (torch.arange(4, device=device) % vocab).unsqueeze(0)
    mask = torch.ones_like(ids)
    # the model's own forward: under mixed-precision training Accelerate wraps ``forward`` in
    # bfloat16 autocast and keeps the float32 one as ``_original_forward``; the body and head
    # here run in float32 (a student scored on validation while it trains)
    forward = getattr(model, "_original_forward", model.forward)
    with torch.inference_mode():
        want = forward(input_ids=ids, attention_mask=mask).logits[0].float()
        got = head_logits(model, body_states(model, ids, mask)[0], torch.float32)
    scale = float(want.abs().max()) or 1.0
    if not torch.allclose(got, want, rtol=1e-4, atol=1e-5 * scale):
        raise UserInputError(
            f"{owner}: {type(model).__name__} computes its logits from its last hidden states in "
            "a way chunked inference does not know (output head, soft-capping, scaling)"
        )
    _CHECKED.add(model)


def positions_per_chunk(vocab: int) -> int:
    """How many positions' float32 logits fit in :data:`CHUNK_BYTES`, at most
    :data:`MAX_POSITIONS` and at least one."""
    return max(1, min(MAX_POSITIONS, CHUNK_BYTES // (4 * vocab)))


def logprob_chunks(
    model: Any, hidden: torch.Tensor, dtype: torch.dtype
) -> Iterator[tuple[int, torch.Tensor]]:
    """``(start, (p, vocab) float32 log-probabilities)`` for consecutive chunks of the rows of
    ``hidden (n, hidden)``."""
    check_head(model)
    step = positions_per_chunk(model.get_output_embeddings().weight.shape[0])
    for start in range(0, hidden.shape[0], step):
        logits = head_logits(model, hidden[start : start + step], dtype)
        # log_softmax, as the full-logits path took it: logits minus their log-sum-exp in place
        # would save a chunk but move log-probabilities by rounding, and so a rare draw
        yield start, torch.log_softmax(logits, dim=-1)


def inverse_cdf(logprobs: torch.Tensor, uniform: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Draws from each row of ``logprobs (n, vocab)`` by inverse CDF in float64 at
    ``uniform (n, K)`` in [0, 1): ``(n, K) int64`` ids, ascending per row, and their
    ``(n, K) float32`` log-probabilities. The float64 CDF is made for a block of rows at a time,
    a quarter of :data:`CHUNK_BYTES`."""
    logprobs = logprobs.cpu()
    n, vocab = logprobs.shape
    ids = torch.empty(uniform.shape, dtype=torch.int64)
    step = max(1, CHUNK_BYTES // (4 * 8 * vocab))  # a quarter chunk: elementwise, no reuse
    for lo in range(0, n, step):
        cdf = logprobs[lo : lo + step].double().exp_().cumsum_(dim=-1)
        # the total, not 1: rounding of the sum
        targets = torch.from_numpy(uniform[lo : lo + step]) * cdf[:, -1:]
        ids[lo : lo + step] = torch.searchsorted(cdf, targets, right=True).clamp_(max=vocab - 1)
    ids = ids.sort(dim=1).values
    return ids.numpy(), logprobs.gather(1, ids).float().numpy()


@torch.inference_mode()
def next_token_stats(
    model: Any,
    hidden: torch.Tensor,
    targets: np.ndarray,
    k: int,
    uniform: np.ndarray | None,
    dtype: torch.dtype,
    tokens: int | None = None,
) -> NextTokenStats:
    """The statistics of ``hidden (n, hidden)``'s next-token distributions, row ``i`` predicting
    ``targets[i]`` (``(n,)`` ids); draws at ``uniform (n, K)`` (None: no draws). ``tokens``:
    the tokenizer's size, where the model's table has rows past it (padded to a round size):
    the top-k and the draws are of its tokens, their log-probabilities of the whole table (the
    rows past it, which name no text, count in the rest of the mass)."""
    n = hidden.shape[0]
    actual = np.empty(n, np.float32)
    top_ids, top_values = np.empty((n, k), np.int64), np.empty((n, k), np.float32)
    drawn = uniform is not None
    count = uniform.shape[1] if uniform is not None else 0
    sample_ids, sample_values = np.empty((n, count), np.int64), np.empty((n, count), np.float32)
    wanted = torch.from_numpy(np.asarray(targets, dtype=np.int64)).to(hidden.device)
    for start, logprobs in logprob_chunks(model, hidden, dtype):
        rows = slice(start, start + logprobs.shape[0])
        actual[rows] = logprobs.gather(1, wanted[rows].unsqueeze(1)).squeeze(1).cpu().numpy()
        logprobs = logprobs[:, :tokens]  # the rows that name a token
        values, indices = logprobs.topk(k, dim=-1)
        top_ids[rows], top_values[rows] = indices.cpu().numpy(), values.cpu().numpy()
        if uniform is not None:
            sample_ids[rows], sample_values[rows] = inverse_cdf(logprobs, uniform[rows])
    return NextTokenStats(
        actual, top_ids, top_values, sample_ids if drawn else None, sample_values if drawn else None
    )


def batch_stats(
    model: Any,
    hidden: torch.Tensor,
    targets: Sequence[np.ndarray],
    k: int,
    uniforms: Sequence[np.ndarray] | None,
    dtype: torch.dtype,
    tokens: int | None = None,
) -> list[NextTokenStats]:
    """:func:`next_token_stats` of each row of ``hidden (batch, seq, hidden)`` (right-padded):
    row ``r``'s first ``len(targets[r])`` positions, draws at ``uniforms[r]``, of the first
    ``tokens`` ids. Short rows share chunks; padding positions get no head."""
    lengths = [len(t) for t in targets]
    rows = torch.cat([hidden[r, :n] for r, n in enumerate(lengths)])
    flat = np.concatenate(targets)
    drawn = np.concatenate(uniforms) if uniforms is not None else None
    stats = next_token_stats(model, rows, flat, k, drawn, dtype, tokens=tokens)
    bounds = np.cumsum([0, *lengths])
    return [
        NextTokenStats._make(None if a is None else a[lo:hi] for a in stats)
        for lo, hi in itertools.pairwise(bounds)
    ]


@torch.inference_mode()
def target_logprobs(
    model: Any, hidden: torch.Tensor, targets: np.ndarray, dtype: torch.dtype = torch.float32
) -> np.ndarray:
    """``(n,) float32`` log-probability of ``targets[i]`` after ``hidden[i]`` (``(n, hidden)``)."""
    wanted = torch.from_numpy(np.asarray(targets, dtype=np.int64)).to(hidden.device)
    out = np.empty(hidden.shape[0], np.float32)
    for start, logprobs in logprob_chunks(model, hidden, dtype):
        rows = slice(start, start + logprobs.shape[0])
        out[rows] = logprobs.gather(1, wanted[rows].unsqueeze(1)).squeeze(1).cpu().numpy()
    return out
