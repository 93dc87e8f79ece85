"""Time estimates of the model-running stages (teach, train, evaluate), from a stated model.

The model, every figure of which is an estimate and shown as one:

- **Work.** A forward pass over a batch of ``rows`` examples padded to ``width`` tokens, with
  ``masked`` masked positions, costs ``2 rows width P + 4 L rows width^2 H + 2 masked (H E + E V)``
  FLOPs: ``P = L (4 H^2 + 2 H I)`` are the layers' weights (attention projections, feed-forward;
  biases, norms and embedding look-ups left out), the second term is attention (scores and
  weighted sums), the last the masked-LM head, which runs at masked positions only
  (``train.masked_head``). L layers, H hidden, I feed-forward, E embedding width (H unless
  factorised, then ``2 rows width E H`` more), V vocabulary. Where the last layer runs at the
  masked rows only (``train.last_layer``: the BERT family), it costs ``4 rows width H^2`` (keys,
  values) ``+ 2 masked (2 H^2 + 2 H I)`` (queries, output, feed-forward) ``+ 4 masked width H``
  (attention) instead. A training step costs three forward passes (the backward pass costs two).
- **Speed.** FLOPs are divided by the rate of float32 matmuls of the model's shape on this machine,
  ``(tokens, H) @ (H, I)``, measured by a probe (best of three). Each batch also pays, per layer
  and for the embeddings and the head, the time one tiny transformer layer takes to run (forward,
  or forward and backward when training), measured likewise: small models are bound by
  per-operation overhead, not arithmetic.
- **Loading.** Each model a stage loads costs ``LOAD_SECONDS`` plus its weight files read at
  ``READ_RATE`` (constants measured once on a small machine, not probed).
- **Not counted:** writing files, hashing weights, and start-up (imports) of the process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from lmalgebra.sources.model_files import config_int, config_sizes
from lmalgebra.train.last_layer import TRIMMED_MODEL_TYPES

LOAD_SECONDS = 0.1  # building a model object and its tokenizer, beyond reading the files
READ_RATE = 1e9  # bytes per second read from disk
_PROBE_TOKENS = 2048  # most rows of a probe matmul: the rate no longer changes beyond
_PROBE_FLOPS = 1e9  # and at most this much work per call, so a wide model's probe stays short
_REPEATS = 3  # a probe's timings: the best is kept (the machine may be busy)


@dataclass(frozen=True)
class ModelShape:
    """The sizes the estimate needs: layers, hidden, feed-forward and embedding widths,
    vocabulary; ``weight_bytes`` of the files a load reads (0 when unknown); ``trimmed``: the
    last layer runs at the masked rows only."""

    layers: int
    hidden: int
    intermediate: int
    embedding: int
    vocab: int
    weight_bytes: int = 0
    trimmed: bool = False

    @classmethod
    def from_config(cls, config: dict[str, Any], vocab: int, weight_bytes: int = 0) -> ModelShape:
        """From a Hugging Face ``config.json`` (BERT, RoBERTa, ALBERT, DistilBERT... names)."""
        layers, hidden, intermediate = config_sizes(config)
        return cls(
            layers=layers,
            hidden=hidden,
            intermediate=intermediate,
            embedding=config_int(config, ("embedding_size",)) or hidden,
            vocab=config_int(config, ("vocab_size",)) or vocab,
            weight_bytes=weight_bytes,
            trimmed=config.get("model_type") in TRIMMED_MODEL_TYPES
            and not config.get("is_decoder", False),
        )

    @property
    def known(self) -> bool:
        return self.layers > 0 and self.hidden > 0

    @property
    def load_seconds(self) -> float:
        """The time a stage spends loading the model (``LOAD_SECONDS`` + files at ``READ_RATE``)."""
        return LOAD_SECONDS + self.weight_bytes / READ_RATE

    def forward_flops(self, rows: int, width: int, masked: int) -> float:
        """FLOPs of one forward pass over ``rows`` x ``width`` tokens, head at ``masked`` rows."""
        h, e = self.hidden, self.embedding
        tokens = rows * width
        layer_weights = 4 * h * h + 2 * h * self.intermediate
        full = self.layers - 1 if self.trimmed and self.layers else self.layers
        flops = full * (2.0 * tokens * layer_weights + 4.0 * rows * width * width * h)
        if full < self.layers:
            flops += 4.0 * tokens * h * h + 2.0 * masked * (layer_weights - 2 * h * h)
            flops += self.last_layer_attention(width, masked)
        flops += 2.0 * masked * (h * e + e * self.vocab)
        return flops + (2.0 * tokens * e * h if e != h else 0.0)

    def last_layer_attention(self, width: int, masked: int) -> float:
        """The attention FLOPs of a trimmed last layer (0 when the last layer is not trimmed)."""
        return 4.0 * masked * width * self.hidden if self.trimmed and self.layers else 0.0


@dataclass
class Speed:
    """What the probes measured on one device: matmul FLOP rates per model shape and the time
    of one tiny transformer layer's forward (and forward + backward)."""

    device: str
    layer_forward: float = 0.0
    layer_training: float = 0.0
    rates: dict[tuple[int, int, int], float] = field(default_factory=dict)

    def rate(self, tokens: int, hidden: int, intermediate: int) -> float:
        """FLOP/s of ``(tokens, hidden) @ (hidden, intermediate)`` (probed once per shape)."""
        cap = max(16, int(_PROBE_FLOPS / (2 * hidden * intermediate)))
        key = (min(max(tokens, 1), _PROBE_TOKENS, cap), hidden, intermediate)
        if key not in self.rates:
            a = torch.randn(key[0], hidden, device=self.device)
            b = torch.randn(hidden, intermediate, device=self.device)
            seconds = _best_time(lambda: a @ b, self.device)
            self.rates[key] = 2.0 * key[0] * hidden * intermediate / seconds
        return self.rates[key]

    def batch_seconds(
        self, shape: ModelShape, batches: list[tuple[int, int, int]], training: bool = False
    ) -> float:
        """Seconds for ``batches`` of ``(rows, width, masked)`` through ``shape``."""
        if not batches or not shape.known:
            return 0.0
        tokens = int(np.median([rows * width for rows, width, _ in batches]))
        rate = self.rate(tokens, shape.hidden, shape.intermediate)
        flops = sum(shape.forward_flops(*batch) for batch in batches)
        overhead = self.layer_training if training else self.layer_forward
        calls = len(batches) * (shape.layers + 2)  # the layers, the embeddings and the head
        return (3.0 if training else 1.0) * flops / rate + calls * overhead


def measure_speed(device: str = "cpu") -> Speed:
    """Probe ``device``: the overhead of one tiny transformer layer, forward and training."""
    speed = Speed(device)
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
    layer = layer.to(device).train()  # the unfused path: one call per operation, as in models
    x = torch.randn(1, 8, 16, device=device)
    with torch.no_grad():
        speed.layer_forward = _best_time(lambda: layer(x), device)

    def step() -> None:
        layer(x).sum().backward()

    speed.layer_training = _best_time(step, device)
    return speed


def _best_time(work: Any, device: str) -> float:
    """Best of a few timings of ``work()`` (each a loop of at least 10 ms), in seconds per call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    work()  # warm-up: first calls allocate
    best = float("inf")
    for _ in range(_REPEATS):
        sync()
        start, calls = time.perf_counter(), 0
        while True:
            work()
            calls += 1
            sync()
            elapsed = time.perf_counter() - start
            if elapsed > 0.01:
                break
        best = min(best, elapsed / calls)
    return best
