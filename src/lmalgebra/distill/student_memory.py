"""A student too large for the machine that trains it, refused from its sizes before it is built.

Building a student allocates its weights layer by layer: a size far beyond the machine (a
trillion layers, a trillion-wide layer) would fill memory slowly until the system stops the
process, or fail deep inside torch. :func:`refuse_beyond_memory` counts the parameters its
sizes give and compares what training holds of them (weights, gradients and the optimiser's two
moments, in float32) with the memory of this machine (its RAM, and its GPU's when it has one).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from lmalgebra.core.errors import UserInputError

if TYPE_CHECKING:
    from lmalgebra.distill.student import ModelSpec

_TRAINED_BYTES = 16  # per parameter: float32 weights, gradients and AdamW's two moments


def parameters(hidden: int, layers: int, intermediate: int, vocab: int, positions: int) -> int:
    """About how many parameters a BERT- or GPT-2-style model of these sizes has: embeddings
    (tokens, positions) and, per layer, attention (four ``hidden x hidden``) and feed-forward
    (``hidden x intermediate`` twice)."""
    per_layer = 4 * hidden * hidden + 2 * hidden * intermediate
    return (vocab + positions) * hidden + layers * per_layer


def machine_bytes() -> int:
    """This machine's memory: physical RAM plus the first GPU's when torch sees one."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    import torch

    if torch.cuda.is_available():
        total += int(torch.cuda.get_device_properties(0).total_memory)
    return int(total)


def refuse_beyond_memory(spec: ModelSpec, vocab: int) -> None:
    """Refuse a student of ``spec`` over ``vocab`` tokens whose training state (weights,
    gradients, optimiser moments) exceeds this machine's memory, naming its sizes."""
    hidden, layers, intermediate = spec.hidden_size, spec.num_layers, spec.intermediate_size
    positions = spec.max_position_embeddings
    count = parameters(hidden, layers, intermediate, vocab, positions)
    needed, have = count * _TRAINED_BYTES, machine_bytes()
    if needed > have:
        raise UserInputError(
            f"the model to train (hidden_size {hidden}, num_layers {layers}, intermediate_size "
            f"{intermediate}, max_position_embeddings {positions}, {vocab} tokens) has about "
            f"{count:.3g} parameters: training it needs {needed / 2**30:.3g} GiB (weights, "
            f"gradients, optimiser state), more than this machine's {have / 2**30:.3g} GiB; "
            "make it smaller"
        )
