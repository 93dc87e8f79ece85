"""Cross-tokenizer losses against naive per-token references written as plain loops.

Each reference walks the batch position by position with scalar torch operations (so autograd
gives its gradient too); the losses must agree to 1e-6 in value and gradient, in float64.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmalgebra.distill.vocab.byte_alignment import chunk_ids
from lmalgebra.experimental.losses import mined_kl, uld_loss
from lmalgebra.train import cross_tokenizer as ctl

B, S, V, T, K, VT, SAMPLES = 2, 6, 7, 5, 3, 9, 4


@pytest.fixture
def batch() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    topk_logprobs = torch.log_softmax(torch.randn(B, T, VT, generator=gen, dtype=torch.float64), -1)
    topk = topk_logprobs.topk(K, dim=-1)
    values = topk.values.clone()
    values[0, 0] = float("nan")  # a row without context
    values[1, 2, -1] = -math.inf  # an entry of probability 0
    aligned = torch.tensor([[0, 1, -1, 2, 2, 4], [3, -1, 0, 1, 2, 4]])
    mask = torch.ones(B, S, dtype=torch.bool)
    mask[1, 5] = False  # padding
    sample_ids = torch.randint(0, VT, (B, T, SAMPLES), generator=gen)
    sample_ids[0, 1, 2:] = -1  # padded samples
    return {
        "logits": torch.randn(B, S, V, generator=gen, dtype=torch.float64, requires_grad=True),
        "student_ids": torch.randint(0, V, (B, S), generator=gen),
        "mask": mask,
        "aligned": aligned,
        "topk_ids": topk.indices,
        "topk_logprobs": values,
        "vocab_map": torch.tensor([0, 1, 1, 2, 3, 3, 3, 5, 6]),  # collisions on purpose
        "next_logprob": torch.log(torch.rand(B, T, generator=gen, dtype=torch.float64)),
        "sample_ids": sample_ids,
        "sample_counts": torch.randint(0, 3, (B, T, SAMPLES), generator=gen),
    }


def _grad(loss: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    (grad,) = torch.autograd.grad(loss, logits)
    return grad


def _agree(fast: torch.Tensor, naive: torch.Tensor, logits: torch.Tensor) -> None:
    assert fast.item() == pytest.approx(naive.item(), abs=1e-6, rel=1e-6)
    torch.testing.assert_close(_grad(fast, logits), _grad(naive, logits), atol=1e-6, rtol=1e-6)


def _rows(batch: dict[str, torch.Tensor]):
    """(b, s, teacher row) of every aligned student position that counts."""
    for b in range(B):
        for s in range(S):
            t = int(batch["aligned"][b, s])
            if batch["mask"][b, s] and t >= 0:
                yield b, s, t


# -- naive references ------------------------------------------------------------------------
def naive_ce(batch):
    total, count = 0.0, 0
    for b in range(B):
        for s in range(S):
            if batch["mask"][b, s]:
                row = torch.log_softmax(batch["logits"][b, s], -1)
                total = total - row[int(batch["student_ids"][b, s])]
                count += 1
    return total / count


def naive_mined_kl(batch, temperature=1.0):
    total, count = 0.0, 0
    for b, s, t in _rows(batch):
        values = [float(v) for v in batch["topk_logprobs"][b, t]]
        if any(math.isnan(v) for v in values):
            continue
        top = max(values)
        weights = [math.exp((v - top) / temperature) for v in values]
        merged: dict[int, float] = {}
        for j, w in enumerate(weights):
            u = int(batch["vocab_map"][int(batch["topk_ids"][b, t, j])])
            merged[u] = merged.get(u, 0.0) + w / sum(weights)
        log_q = torch.log_softmax(batch["logits"][b, s] / temperature, -1)
        kl = sum(p * (math.log(p) - log_q[u]) for u, p in merged.items() if p > 0)
        total, count = total + kl, count + 1
    return total / count


def naive_uld(batch, student_top=None):
    total, count = 0.0, 0
    for b, s, t in _rows(batch):
        values = [float(v) for v in batch["topk_logprobs"][b, t]]
        if any(math.isnan(v) for v in values):
            continue
        teacher = sorted((math.exp(v) for v in values), reverse=True)
        probs = torch.softmax(batch["logits"][b, s], -1)
        student = sorted(probs, key=lambda p: p.item(), reverse=True)[: student_top or V]
        width = max(len(teacher), len(student))
        teacher += [0.0] * (width - len(teacher))
        student += [0.0] * (width - len(student))
        total = total + sum(abs(x - y) for x, y in zip(teacher, student, strict=True))
        count += 1
    return total / count


def naive_alm(batch, found_per_example, temperature=1.0, epsilon=1e-6):
    total, count = 0.0, 0
    for b, found in enumerate(found_per_example):
        log_q = torch.log_softmax(batch["logits"][b], -1)
        for (a, e), (c, d) in found:
            l_t = sum(float(batch["next_logprob"][b, i]) for i in range(a, e))
            if math.isnan(l_t) or not all(batch["mask"][b, c:d]):
                continue
            l_s = sum(log_q[s, int(batch["student_ids"][b, s])] for s in range(c, d))
            x_t = l_t / temperature - epsilon
            x_s = l_s / temperature - epsilon
            p_t, p_s = math.exp(x_t), torch.exp(x_s)
            kl = p_t * (math.log(p_t) - torch.log(p_s))
            kl = kl + (1 - p_t) * (math.log(1 - p_t) - torch.log(1 - p_s))
            total, count = total + kl, count + 1
    return total / count


def naive_sampled(batch, counts=False):
    total, count = 0.0, 0
    for b, s, t in _rows(batch):
        log_q = torch.log_softmax(batch["logits"][b, s], -1)
        acc, weight = 0.0, 0.0
        for j in range(SAMPLES):
            x = int(batch["sample_ids"][b, t, j])
            w = float(batch["sample_counts"][b, t, j]) if counts else 1.0
            if x >= 0 and w > 0:
                acc = acc - w * log_q[int(batch["vocab_map"][x])]
                weight += w
        if weight > 0:
            total, count = total + acc / weight, count + 1
    return total / count


# -- equality with the references -----------------------------------------------------------
def test_ce_loss(batch) -> None:
    fast = ctl.ce_loss(batch["logits"], batch["student_ids"], batch["mask"])
    _agree(fast, naive_ce(batch), batch["logits"])


@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_mined_kl(batch, temperature: float) -> None:
    args = [
        batch[k] for k in ("logits", "aligned", "topk_ids", "topk_logprobs", "vocab_map", "mask")
    ]
    fast = mined_kl(*args, temperature=temperature)
    _agree(fast, naive_mined_kl(batch, temperature), batch["logits"])


@pytest.mark.parametrize("student_top", [None, 2, 5, 100])
def test_uld_loss(batch, student_top: int | None) -> None:
    args = [batch[k] for k in ("logits", "aligned", "topk_logprobs", "mask")]
    fast = uld_loss(*args, student_top=student_top)
    _agree(fast, naive_uld(batch, student_top), batch["logits"])


@pytest.mark.parametrize("temperature", [1.0, 3.0])
def test_alm_loss(batch, temperature: float) -> None:
    # example 0: teacher row 0 is NaN; example 1: student token 5 is padding (both chunks skipped)
    found = [
        [((0, 2), (0, 1)), ((2, 3), (1, 4)), ((3, 5), (4, 6))],
        [((0, 1), (0, 2)), ((1, 3), (2, 4)), ((3, 5), (4, 6))],
    ]
    batch["next_logprob"][0, 0] = float("nan")
    ids = [chunk_ids(f, T, S) for f in found]
    teacher_chunk = torch.from_numpy(np.stack([t for t, _ in ids]))
    student_chunk = torch.from_numpy(np.stack([s for _, s in ids]))
    args = (
        batch["logits"],
        batch["student_ids"],
        batch["mask"],
        student_chunk,
        batch["next_logprob"],
        teacher_chunk,
    )
    fast = ctl.alm_loss(*args, temperature=temperature)
    _agree(fast, naive_alm(batch, found, temperature), batch["logits"])


@pytest.mark.parametrize("counts", [False, True])
def test_sampled_ce(batch, counts: bool) -> None:
    args = [batch[k] for k in ("logits", "aligned", "sample_ids", "vocab_map", "mask")]
    fast = ctl.sampled_ce(*args, sample_counts=batch["sample_counts"] if counts else None)
    _agree(fast, naive_sampled(batch, counts), batch["logits"])


# -- invariants -----------------------------------------------------------------------------
def _student_as_teacher(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's own full distribution stored as a teacher top-V, in shuffled order."""
    logprobs = torch.log_softmax(logits.detach(), -1)
    order = torch.randperm(V, generator=torch.Generator().manual_seed(1)).expand(B, S, V)
    return order.clone(), logprobs.gather(-1, order)


def test_uld_and_kl_vanish_on_identical_distributions(batch) -> None:
    ids, values = _student_as_teacher(batch["logits"])
    aligned = torch.arange(S).expand(B, S)
    identity = torch.arange(V)
    uld = uld_loss(batch["logits"], aligned, values, batch["mask"])
    kl = mined_kl(batch["logits"], aligned, ids, values, identity, batch["mask"])
    assert abs(uld.item()) < 1e-12 and abs(kl.item()) < 1e-12
    # ULD ignores token identities: the same probabilities on other tokens cost nothing either
    shifted = torch.log_softmax(batch["logits"].detach().roll(1, dims=-1), -1)
    assert abs(uld_loss(batch["logits"], aligned, shifted, batch["mask"]).item()) < 1e-12
    assert (
        mined_kl(batch["logits"], aligned, ids, shifted.gather(-1, ids), identity, batch["mask"])
        > 1e-3
    )


def test_alm_vanishes_when_chunk_likelihoods_agree(batch) -> None:
    logits, student_ids = batch["logits"], batch["student_ids"]
    picked = torch.log_softmax(logits.detach(), -1).gather(-1, student_ids[..., None])[..., 0]
    # one chunk per two student tokens; the teacher splits each chunk's likelihood in three
    student_chunk = (torch.arange(S) // 2).expand(B, S)
    teacher_chunk = torch.arange(3).repeat_interleave(3).expand(B, 9)
    per_chunk = picked.reshape(B, 3, 2).sum(-1)
    next_logprob = (per_chunk / 3).repeat_interleave(3, dim=1)
    mask = torch.ones(B, S, dtype=torch.bool)
    args = (logits, student_ids, mask, student_chunk)
    assert abs(ctl.alm_loss(*args, next_logprob, teacher_chunk).item()) < 1e-9
    assert ctl.alm_loss(*args, next_logprob - 0.5, teacher_chunk) > 1e-3


def test_sampled_ce_with_exact_counts_is_the_cross_entropy(batch) -> None:
    # counts proportional to the teacher's probabilities make the estimate exact
    probs = torch.tensor([0.5, 0.25, 0.25])
    sample_ids = torch.tensor([1, 4, 8]).expand(B, T, 3)
    counts = (probs * 4).expand(B, T, 3)
    aligned = torch.zeros(B, S, dtype=torch.long)
    got = ctl.sampled_ce(
        batch["logits"], aligned, sample_ids, batch["vocab_map"], batch["mask"], counts
    )
    log_q = torch.log_softmax(batch["logits"].detach(), -1)
    mapped = batch["vocab_map"][torch.tensor([1, 4, 8])]
    expected = -(probs * log_q[..., mapped]).sum(-1)[batch["mask"]].mean()
    assert got.item() == pytest.approx(expected.item(), abs=1e-12)


def test_no_gradient_reaches_the_teacher(batch) -> None:
    values = batch["topk_logprobs"].clone().requires_grad_(True)
    next_logprob = batch["next_logprob"].clone().requires_grad_(True)
    chunk = torch.zeros(B, S, dtype=torch.long)
    loss = mined_kl(
        batch["logits"],
        batch["aligned"],
        batch["topk_ids"],
        values,
        batch["vocab_map"],
        batch["mask"],
    )
    loss = loss + uld_loss(batch["logits"], batch["aligned"], values, batch["mask"])
    student = (batch["logits"], batch["student_ids"], batch["mask"], chunk)
    loss = loss + ctl.alm_loss(*student, next_logprob, chunk[:, :T])
    loss.backward()
    assert values.grad is None and next_logprob.grad is None
    assert batch["logits"].grad is not None and torch.isfinite(batch["logits"].grad).all()


def test_nothing_aligned_gives_zero_not_nan(batch) -> None:
    none = torch.full((B, S), -1)
    loss = uld_loss(batch["logits"], none, batch["topk_logprobs"], batch["mask"])
    assert loss.item() == 0.0
    loss.backward()
    assert (batch["logits"].grad == 0).all()


def test_float32_inputs_compute_in_float32(batch) -> None:
    logits = batch["logits"].detach().float().requires_grad_(True)
    loss = ctl.ce_loss(logits, batch["student_ids"], batch["mask"])
    assert loss.dtype == torch.float32
    assert loss.item() == pytest.approx(naive_ce(batch).item(), rel=1e-5)


def test_log1mexp_is_accurate_at_both_ends() -> None:
    x = torch.tensor([-1e-12, -1e-6, -0.5, -1.0, -30.0, -800.0], dtype=torch.float64)
    expected = [
        math.log(-math.expm1(v)) if v > -1 else math.log1p(-math.exp(v)) for v in x.tolist()
    ]
    torch.testing.assert_close(ctl.log1mexp(x), torch.tensor(expected, dtype=torch.float64))
