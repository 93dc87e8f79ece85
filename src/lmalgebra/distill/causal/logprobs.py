"""Offline causal-teacher inference: at every position of an example, the log-probability of the
actual next token, the top-k of the next-token distribution and optionally K tokens drawn from it.

Row ``i`` of an example with tokens ``t_0..t_{n-1}`` is the teacher's distribution over token
``i`` given the start token and ``t_0..t_{i-1}`` (the model reads ``[start, t_0, ..., t_{n-2}]``).
Log-probabilities are exact: logits minus the log-sum-exp over the full vocabulary, computed a
chunk of positions at a time (``train.causal_head``: no ``(batch, positions, vocabulary)`` logits).
Drawn tokens come from ``numpy`` generators seeded per example (inverse CDF in float64), so they do
not depend on batching, on torch's generator or on the process that computes the shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lmalgebra.core.allocator import reuse_freed_memory
from lmalgebra.core.precision import compute_context, module_device
from lmalgebra.train.causal_head import NextTokenStats, batch_stats, body_states, inverse_cdf

# one example's teacher outputs (``n`` tokens): the next-token statistics of its positions
CausalOutput = NextTokenStats


def draw_samples(
    logprobs: torch.Tensor, count: int, seed: Sequence[int]
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` draws per row of ``logprobs (n, vocab)``: ``(n, count)`` ids (ascending per row)
    and their log-probabilities, from ``numpy.random.default_rng(seed)``."""
    return inverse_cdf(logprobs, _uniform(seed, logprobs.shape[0], count))


def _uniform(seed: Sequence[int], rows: int, count: int) -> np.ndarray:
    """``(rows, count) float64`` in [0, 1): the points an example's draws invert the CDF at."""
    return np.random.default_rng(list(seed)).random((rows, count))


def _example_output(
    logits: torch.Tensor, tokens: np.ndarray, k: int, samples: int, seed: Sequence[int]
) -> CausalOutput:
    """Outputs from ``logits (n, vocab)`` (any float dtype, any device; log-probabilities are
    taken in float32), row i predicting ``tokens[i]``."""
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    actual = torch.from_numpy(tokens.astype(np.int64)).unsqueeze(1).to(logprobs.device)
    values, indices = logprobs.topk(k, dim=-1)
    drawn = draw_samples(logprobs.cpu(), samples, seed) if samples else (None, None)
    return CausalOutput(
        logprobs.gather(1, actual).squeeze(1).cpu().numpy(),
        indices.cpu().numpy(),
        values.cpu().numpy(),
        *drawn,
    )


def _inputs(tokens: np.ndarray, start_id: int) -> np.ndarray:
    return np.concatenate([[start_id], tokens[:-1]]).astype(np.int64)


@torch.inference_mode()
def causal_outputs(
    model: Any,
    examples: Sequence[np.ndarray],
    start_id: int,
    k: int,
    samples: int = 0,
    seeds: Sequence[Sequence[int]] | None = None,
    batch_size: int = 32,
    dtype: torch.dtype = torch.float32,
    tokens: int | None = None,
) -> list[CausalOutput]:
    """Teacher outputs of each example (``(n,)`` token ids), batched by length, in input order;
    ``tokens``: the teacher tokenizer's size, its top-k and draws taken among those ids (a
    model's table padded past them, as many are, had stored ids that name no token).

    ``seeds``: one seed sequence per example for its drawn tokens (needed when ``samples``).
    Batches are right-padded; a causal model's outputs at real positions ignore the padding.
    The model runs where its weights are, under autocast when ``dtype`` is bfloat16.
    """
    reuse_freed_memory()  # each chunk of logits (up to 256 MB) faulted in once, not per chunk
    device = module_device(model) or torch.device("cpu")
    if samples and seeds is None:
        raise ValueError("drawing samples needs one seed per example")
    order = sorted(range(len(examples)), key=lambda i: -len(examples[i]))
    out: list[CausalOutput | None] = [None] * len(examples)
    for start in range(0, len(order), batch_size):
        chosen = [i for i in order[start : start + batch_size] if len(examples[i])]
        if not chosen:
            continue
        width = len(examples[chosen[0]])
        ids = torch.full((len(chosen), width), start_id, dtype=torch.long)
        mask = torch.zeros((len(chosen), width), dtype=torch.long)
        for row, i in enumerate(chosen):
            n = len(examples[i])
            ids[row, :n] = torch.from_numpy(_inputs(examples[i], start_id))
            mask[row, :n] = 1
        with compute_context(device, dtype):
            hidden = body_states(model, ids.to(device), mask.to(device))
        targets = [examples[i] for i in chosen]
        uniforms = None
        if samples and seeds is not None:
            uniforms = [_uniform(seeds[i], len(examples[i]), samples) for i in chosen]
        stats = batch_stats(model, hidden, targets, k, uniforms, dtype, tokens)
        for i, example in zip(chosen, stats, strict=True):
            out[i] = example
    return [o if o is not None else _empty(k, samples) for o in out]


def _empty(k: int, samples: int) -> CausalOutput:
    """The outputs of an example with no token (a text its tokenizer maps to nothing)."""
    drawn = (np.zeros((0, samples), np.int64), np.zeros((0, samples), np.float32))
    return CausalOutput(
        np.zeros(0, np.float32),
        np.zeros((0, k), np.int64),
        np.zeros((0, k), np.float32),
        *(drawn if samples else (None, None)),
    )
