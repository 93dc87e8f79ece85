"""The prefix projection at every student position: ``prefix_kl``'s target (the teacher's top-k
by first-token prefix, with its tail) where both tokenisations start a chunk, and inside a teacher
token the teacher's head conditioned on the bytes of it the student has already read
(``distill.vocab.position_targets``). With tokenizers that cut a language differently, chunk
starts are a share of the student's positions (about two thirds of SmolLM2's Spanish tokens
against Gemma's); this target covers nearly all of them. The KL is ``tail_kl``'s, position by
position; a conditioned target has no tail (it is renormalised over the head it keeps).

Experimental: in a one-seed pilot of the merge (``experiments/results/merge_pilot.json``, key
``every_position``) it scored worse than ``prefix_kl`` on validation and on development text.
"""

from __future__ import annotations

import torch

from lmalgebra.experimental import warn_feature
from lmalgebra.train.cross_tokenizer.common import CausalLoss, LossBatch, Mean
from lmalgebra.train.cross_tokenizer.tail import tail_kl

warn_feature("training.objective_mix: prefix_all_kl")


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    if batch.position_ids is None or batch.position_logprobs is None:
        raise ValueError("the prefix_all_kl loss needs a batch with a target at every position")
    ids = batch.position_ids
    positions = torch.arange(ids.shape[1], device=ids.device).expand(ids.shape[:2])
    aligned = torch.where(ids[..., 0] >= 0, positions, -1)
    return tail_kl(logits, aligned, ids.clamp(min=0), batch.position_logprobs, batch.mask, mean)


LOSS = CausalLoss(
    "prefix_all_kl",
    term,
    frozenset({"positions"}),
    tempered=False,
    summary="prefix_kl's target at chunk starts, and inside a teacher token its top-k "
    "conditioned on the bytes already read: a target at every student position",
)
