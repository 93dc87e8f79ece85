"""The teacher's top-k projected onto the student's vocabulary by first-token prefix, at chunk
starts, with its remaining mass as one bucket.

Where both tokenisations start a chunk, teacher and student predict the continuation of the same
byte prefix. A teacher token whose text begins with the student token ``u`` continues the text
with ``u`` as far as the student is concerned, so the teacher's probability of the student's next
token being ``u`` is (to the extent that the student would cut that text at ``u``) the sum of its
probabilities of the tokens beginning with ``u`` (``distill.vocab.prefix_map``). The KL is then
``tail_kl``'s: top-k plus tail, so the target is a distribution.
"""

from __future__ import annotations

import torch

from lmalgebra.train.cross_tokenizer.common import CausalLoss, LossBatch, Mean
from lmalgebra.train.cross_tokenizer.tail import tail_kl


def term(logits: torch.Tensor, batch: LossBatch, temperature: float, mean: Mean) -> torch.Tensor:
    if batch.prefix_ids is None:
        raise ValueError("the prefix_kl loss needs a batch with the prefix-mapped top-k")
    return tail_kl(
        logits, batch.chunk_start, batch.prefix_ids, batch.topk_logprobs, batch.mask, mean
    )


LOSS = CausalLoss(
    "prefix_kl",
    term,
    frozenset({"chunks", "prefix"}),
    tempered=False,
    summary="the teacher's top-k plus tail projected by first-token prefix, at chunk starts",
)
