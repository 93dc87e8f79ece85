"""Every loss of the table (``train.cross_tokenizer.LOSSES``) against an independent reference, and
the cases that pin a loss down: a teacher identical to the student, the student shifted by one
position, and the biases of what a store keeps of a teacher (top-k renormalised, with its tail,
drawn tokens).

A loss registered without a reference here fails ``test_every_loss_has_a_reference``.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import test_cross_tokenizer_losses as naive
import torch
from test_cross_tokenizer_losses import SAMPLES, B, K, S, T, V

from lmalgebra.distill.causal.logprobs import draw_samples
from lmalgebra.distill.vocab.byte_alignment import chunk_ids, chunk_start_alignment
from lmalgebra.train.cross_tokenizer import LOSSES, batch_mean, ce_loss, tail_kl

# example b's chunks: ((teacher rows), (student positions)); row 0 of example 0 is NaN
FOUND = [
    [((0, 2), (0, 1)), ((2, 3), (1, 4)), ((3, 5), (4, 6))],
    [((0, 1), (0, 2)), ((1, 3), (2, 4)), ((3, 5), (4, 6))],
]


def _batch(seed: int = 0) -> SimpleNamespace:
    """A batch as ``CausalBatch`` holds one: ids already in student ids (collisions on purpose)."""
    gen = torch.Generator().manual_seed(seed)
    full = torch.log_softmax(torch.randn(B, T, V, generator=gen, dtype=torch.float64), -1)
    top = full.topk(K, dim=-1)
    values = top.values.clone()
    values[0, 0] = float("nan")
    values[1, 2, -1] = -math.inf
    ids = [chunk_ids(f, T, S) for f in FOUND]
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 5] = False
    samples = torch.randint(0, V, (B, T, SAMPLES), generator=gen)
    samples[0, 1, 2:] = -1
    next_logprob = torch.log(torch.rand(B, T, generator=gen, dtype=torch.float64))
    next_logprob[0, 0] = float("nan")
    # a target at every student position: a top-K with its tail (a chunk start), renormalised
    # (inside a teacher token: an entry left out repeats a kept id at probability 0), or none
    at = torch.log_softmax(torch.randn(B, S, V, generator=gen, dtype=torch.float64), -1)
    head = at.topk(K, dim=-1)
    position_ids, position_logprobs = head.indices.clone(), head.values.clone()
    position_logprobs[:, 1::2] = position_logprobs[:, 1::2].log_softmax(-1)
    position_ids[0, 3, -1], position_logprobs[0, 3, -1] = position_ids[0, 3, 0], -math.inf
    position_logprobs[0, 3] = position_logprobs[0, 3].log_softmax(-1)
    position_ids[1, 4], position_logprobs[1, 4] = -1, float("nan")
    return SimpleNamespace(
        logits=torch.randn(B, S, V, generator=gen, dtype=torch.float64, requires_grad=True),
        targets=torch.randint(0, V, (B, S), generator=gen),
        mask=mask,
        mined=torch.tensor([[0, 1, -1, 2, 2, 4], [3, -1, 0, 1, 2, 4]]),
        chunk_start=torch.from_numpy(np.stack([chunk_start_alignment(f, S) for f in FOUND])),
        student_chunk=torch.from_numpy(np.stack([s for _, s in ids])),
        teacher_chunk=torch.from_numpy(np.stack([t for t, _ in ids])),
        next_logprob=next_logprob,
        topk_ids=top.indices,
        topk_logprobs=values,
        prefix_ids=torch.tensor([0, 1, 1, 3, 4, 4, 6])[top.indices],  # another map's collisions
        position_ids=position_ids,
        position_logprobs=position_logprobs,
        sample_ids=samples,
    )


def _positions(batch: SimpleNamespace) -> torch.Tensor:
    """Each student position aligned to its own target row, where it has one."""
    return torch.where(batch.position_ids[..., 0] >= 0, torch.arange(S).expand(B, S), -1)


def _as_dict(batch: SimpleNamespace, aligned: torch.Tensor, **changes: Any) -> dict[str, Any]:
    """``batch`` in the dictionary the naive references of ``test_cross_tokenizer_losses`` read."""
    return {
        **vars(batch),
        "student_ids": batch.targets,
        "aligned": aligned,
        "vocab_map": torch.arange(V),
        **changes,
    }


def naive_tail_kl(batch: dict[str, Any]) -> torch.Tensor:
    """Top-k plus tail KL, position by position: the teacher's masses on the student ids its top-k
    land on and the rest, against the student's masses on the same partition."""
    total, count = 0.0, 0
    for b, s, t in naive._rows(batch):
        values = [float(v) for v in batch["topk_logprobs"][b, t]]
        if any(math.isnan(v) for v in values):
            continue
        teacher: dict[int, float] = {}
        for j, v in enumerate(values):
            u = int(batch["topk_ids"][b, t, j])
            teacher[u] = teacher.get(u, 0.0) + math.exp(v)
        q = torch.softmax(batch["logits"][b, s], -1)
        kl = sum(p * (math.log(p) - torch.log(q[u])) for u, p in teacher.items() if p > 0)
        p_tail = 1 - sum(teacher.values())
        if p_tail > 0:
            q_tail = 1 - sum(q[u] for u in teacher)
            kl = kl + p_tail * (math.log(p_tail) - torch.log(q_tail))
        total, count = total + kl, count + 1
    return total / count


# name -> (batch, temperature) -> the loss, computed by a reference that shares no code with it
REFERENCES = {
    "ce": lambda b, _: naive.naive_ce(_as_dict(b, b.mined)),
    "mined_kl": lambda b, temp: naive.naive_mined_kl(_as_dict(b, b.mined), temp),
    "uld": lambda b, _: naive.naive_uld(_as_dict(b, b.chunk_start)),
    "alm": lambda b, temp: naive.naive_alm(_as_dict(b, b.mined), FOUND, temp),
    "sampled": lambda b, _: naive.naive_sampled(_as_dict(b, b.mined)),
    "tail_kl": lambda b, _: naive_tail_kl(_as_dict(b, b.mined)),
    "prefix_kl": lambda b, _: naive_tail_kl(_as_dict(b, b.chunk_start, topk_ids=b.prefix_ids)),
    "prefix_all_kl": lambda b, _: naive_tail_kl(
        _as_dict(b, _positions(b), topk_ids=b.position_ids, topk_logprobs=b.position_logprobs)
    ),
}


def test_every_loss_has_a_reference() -> None:
    assert set(REFERENCES) == set(LOSSES)


@pytest.mark.parametrize("name", list(LOSSES))
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_each_loss_equals_its_reference(name: str, temperature: float) -> None:
    """Value and gradient, float64, to 1e-6; a loss the temperature does not change ignores it."""
    batch = _batch()
    fast = LOSSES[name].term(batch.logits, batch, temperature, batch_mean)
    reference = REFERENCES[name](batch, temperature if LOSSES[name].tempered else 1.0)
    naive._agree(fast, reference, batch.logits)


def _self_teacher(logits: torch.Tensor, shift: int, draws: int) -> SimpleNamespace:
    """A batch whose teacher is the student itself (``shift`` 0) or the student one position on
    (``shift`` 1): its full distribution as a top-V in shuffled order, its log-probability of the
    next token, ``draws`` tokens drawn from it, one chunk per token."""
    gen = torch.Generator().manual_seed(7)
    logprobs = torch.log_softmax(logits.detach(), -1).roll(-shift, dims=1)
    targets = torch.randint(0, V, (B, S), generator=gen)
    order = torch.argsort(torch.rand(B, S, V, generator=gen), dim=-1)
    positions = torch.arange(S).expand(B, S)
    drawn = [
        torch.from_numpy(draw_samples(logprobs[b].float(), draws, [b, shift])[0]) for b in range(B)
    ]
    return SimpleNamespace(
        targets=targets,
        mask=torch.ones(B, S, dtype=torch.bool),
        mined=positions,
        chunk_start=positions,
        student_chunk=positions,
        teacher_chunk=positions,
        next_logprob=logprobs.gather(-1, targets.roll(-shift, dims=1)[..., None])[..., 0],
        topk_ids=order,
        topk_logprobs=logprobs.gather(-1, order),
        prefix_ids=order,
        position_ids=order,
        position_logprobs=logprobs.gather(-1, order),
        sample_ids=torch.stack(drawn),
    )


def _value_and_gradient(name: str, logits: torch.Tensor, batch: SimpleNamespace):
    loss = LOSSES[name].term(logits, batch, 1.0, batch_mean)
    (grad,) = torch.autograd.grad(loss, logits)
    return loss.item(), grad


@pytest.mark.parametrize("name", [n for n, loss in LOSSES.items() if loss.needs])
def test_identical_teacher_is_the_floor_and_a_shifted_one_is_seen(name: str) -> None:
    """A teacher identical to the student: the loss at its floor, its gradient zero or pointing
    nowhere (at a kink, ULD's absolute values, a subgradient along which no step descends; for
    the sampled estimate, zero up to the draws' noise: small beside the shifted teacher's). The
    teacher one position on: a loss clearly above that floor."""
    logits = torch.randn(B, S, V, dtype=torch.float64, requires_grad=True)
    itself = _self_teacher(logits, 0, 4096)
    same, g_same = _value_and_gradient(name, logits, itself)
    shifted, g_shifted = _value_and_gradient(name, logits, _self_teacher(logits, 1, 4096))
    if name == "sampled":  # the floor is the student's entropy
        probs = torch.softmax(logits.detach(), -1)
        entropy = -(probs * probs.log()).sum(-1).mean().item()
        assert same == pytest.approx(entropy, abs=0.05)
        assert g_same.norm() < 0.2 * g_shifted.norm()
    else:
        assert abs(same) < 1e-9
        if g_same.abs().max() >= 1e-9:
            step = (logits - 1e-4 * g_same / g_same.norm()).detach()
            assert LOSSES[name].term(step, itself, 1.0, batch_mean).item() >= same
    assert shifted > same + 1e-2
    assert g_shifted.norm() > 1e-3


def _teacher_row(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A teacher's full log-distribution over V tokens and a student's logits, one position."""
    gen = torch.Generator().manual_seed(seed)
    teacher = torch.log_softmax(2 * torch.randn(V, generator=gen, dtype=torch.float64), -1)
    return teacher, torch.randn(V, generator=gen, dtype=torch.float64)


@pytest.mark.parametrize("seed", range(20))
def test_the_tail_bucket_target_is_the_teacher_coarse_grained(seed: int) -> None:
    """Top-k plus tail is exactly the KL between the full teacher and student coarse-grained to
    {each top-k token, the rest} (no mass dropped or moved), and zero for the teacher itself even
    with k < V, where the renormalised top-k (MinED-KL's target) is biased away from it."""
    teacher, student = _teacher_row(seed)
    k = 1 + seed % (V - 1)
    top = teacher.topk(k)
    one = torch.ones(1, 1, dtype=torch.long)
    ids, values = top.indices.view(1, 1, k), top.values.view(1, 1, k)
    mask = torch.ones(1, 1, dtype=torch.bool)
    got = tail_kl(student.view(1, 1, V), 0 * one, ids, values, mask)
    q = torch.softmax(student, -1)
    rest = torch.ones(V, dtype=torch.bool)
    rest[top.indices] = False
    p_parts = torch.cat([teacher.exp()[top.indices], teacher.exp()[rest].sum()[None]])
    q_parts = torch.cat([q[top.indices], q[rest].sum()[None]])
    expected = (p_parts * (p_parts.log() - q_parts.log())).sum()
    assert got.item() == pytest.approx(expected.item(), abs=1e-10)
    itself = tail_kl(teacher.view(1, 1, V), 0 * one, ids, values, mask)
    assert abs(itself.item()) < 1e-12
    renormalised = LOSSES["mined_kl"].term(
        teacher.view(1, 1, V),
        SimpleNamespace(mined=0 * one, topk_ids=ids, topk_logprobs=values, mask=mask),
        1.0,
        batch_mean,
    )
    assert renormalised.item() > 1e-6 or k == V or teacher.exp()[rest].sum() < 1e-9


def test_drawn_tokens_estimate_the_cross_entropy_without_bias() -> None:
    """Over many independent draws of K = 8 tokens (as the store draws them), the sampled loss
    averages to the full cross-entropy to the teacher, within four standard errors; the top-8
    renormalised target misses it."""
    teacher, student = _teacher_row(3)
    q = torch.log_softmax(student, -1)
    exact = -(teacher.exp() * q).sum().item()
    rows, draws = 4000, 8
    ids, _ = draw_samples(teacher.float().expand(rows, V), draws, [11])
    estimates = -q[torch.from_numpy(ids)].mean(-1)
    error = estimates.std().item() / math.sqrt(rows)
    assert abs(estimates.mean().item() - exact) < 4 * error
    top = teacher.topk(3)
    renormalised = -(torch.softmax(top.values, -1) * q[top.indices]).sum().item()
    assert abs(renormalised - exact) > 10 * error


def test_label_smoothing_equals_torch() -> None:
    batch = _batch()
    for smoothing in (0.0, 0.1, 0.3):
        ours = ce_loss(batch.logits, batch.targets, batch.mask, smoothing=smoothing)
        flat = batch.logits[batch.mask]
        theirs = torch.nn.functional.cross_entropy(
            flat, batch.targets[batch.mask], label_smoothing=smoothing
        )
        naive._agree(ours, theirs, batch.logits)
