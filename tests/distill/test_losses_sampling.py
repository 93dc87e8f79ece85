"""Loss parity with a naive per-token loop, schedules, language sampling and multi-teacher modes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lmalgebra.distill.masked.store import TeacherCopies
from lmalgebra.distill.sampling import language_pool, language_probabilities
from lmalgebra.train.losses import combined_loss
from lmalgebra.train.schedules import kd_weight, learning_rate


def naive(logits, labels, topk_ids, topk_lp, weight, temperature):
    kd_terms, mlm_terms = [], []
    for i in range(logits.shape[0]):
        row = logits[i].double().tolist()
        top = max(row)
        lse = top + math.log(sum(math.exp(v - top) for v in row))
        mlm_terms.append(lse - row[labels[i]])
        scaled = [v / temperature for v in row]
        top_t = max(scaled)
        lse_t = top_t + math.log(sum(math.exp(v - top_t) for v in scaled))
        teacher = [math.exp(v / temperature) for v in topk_lp[i].tolist()]
        norm = sum(teacher)
        kd_terms.append(
            -sum(
                p / norm * (scaled[j] - lse_t)
                for p, j in zip(teacher, topk_ids[i].tolist(), strict=True)
            )
        )
    mlm, kd = sum(mlm_terms) / len(mlm_terms), sum(kd_terms) / len(kd_terms)
    return weight * kd + (1 - weight) * mlm, mlm, kd


def random_batch(rows: int, vocab: int, k: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=gen) * 3
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    topk_ids = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(rows)])
    topk_lp = torch.log_softmax(torch.randn(rows, vocab, generator=gen), -1).gather(1, topk_ids)
    return logits, labels, topk_ids, topk_lp


@pytest.mark.parametrize(("weight", "temperature"), [(0.0, 1.0), (0.3, 1.0), (1.0, 2.0)])
def test_fused_loss_matches_naive_loop(weight: float, temperature: float) -> None:
    logits, labels, topk_ids, topk_lp = random_batch(13, 50, 8, 0)
    parts = combined_loss(logits, labels, weight, topk_ids, topk_lp, temperature)
    total, mlm, kd = naive(logits, labels, topk_ids, topk_lp, weight, temperature)
    assert float(parts.total) == pytest.approx(total, rel=1e-6)
    assert float(parts.mlm) == pytest.approx(mlm, rel=1e-6)
    assert float(parts.kd) == pytest.approx(kd, rel=1e-6)
    gold = combined_loss(logits, labels, weight)
    assert not gold.has_kd and float(gold.total) == pytest.approx(mlm, rel=1e-6)


def separate(logits, labels, topk_ids, topk_lp, weight, temperature):
    """MLM and KD each from its own float64 log-softmax, differentiated by autograd."""
    z = logits.double()
    mlm = torch.nn.functional.cross_entropy(z, labels)
    teacher = torch.softmax(topk_lp.double() / temperature, -1)
    kd = -(teacher * torch.log_softmax(z / temperature, -1).gather(1, topk_ids)).sum(-1).mean()
    return weight * kd + (1 - weight) * mlm, mlm, kd


@pytest.mark.parametrize(
    ("weight", "temperature", "teacher"),
    [(0.0, 1.0, True), (0.3, 1.0, True), (1.0, 1.0, True), (0.5, 2.0, True), (0.5, 1.0, False)],
)
def test_fused_loss_gradients_match_separate_log_softmaxes(
    weight: float, temperature: float, teacher: bool
) -> None:
    logits, labels, topk_ids, topk_lp = random_batch(37, 300, 8, 1)
    logits.requires_grad_()
    ids, lp = (topk_ids, topk_lp) if teacher else (None, None)
    parts = combined_loss(logits, labels, weight, ids, lp, temperature)
    # each term alone and the mix: the backward pass weighs the two terms' gradients itself
    for ours, term in ((parts.total, 0), (parts.mlm, 1), *([(parts.kd, 2)] if teacher else [])):
        (grad,) = torch.autograd.grad(ours, logits, retain_graph=True)
        reference = separate(
            logits, labels, topk_ids, topk_lp, weight if teacher else 0.0, temperature
        )
        (expected,) = torch.autograd.grad(reference[term], logits)
        assert grad.dtype == torch.float32
        torch.testing.assert_close(grad, expected, rtol=0, atol=1e-6 * float(expected.abs().max()))
        assert float(ours.detach()) == pytest.approx(float(reference[term].detach()), rel=1e-6)


def test_fused_loss_keeps_the_logits_dtype_of_mixed_precision() -> None:
    logits, labels, topk_ids, topk_lp = random_batch(11, 64, 4, 2)
    half = logits.bfloat16().requires_grad_()
    parts = combined_loss(half, labels, 0.5, topk_ids, topk_lp)
    parts.total.backward()
    assert parts.total.dtype == torch.float32 and half.grad is not None
    assert half.grad.dtype == torch.bfloat16
    expected = separate(half.detach().float(), labels, topk_ids, topk_lp, 0.5, 1.0)[0]
    assert float(parts.total.detach()) == pytest.approx(float(expected), rel=1e-6)


def test_schedules() -> None:
    assert [kd_weight(s, 5, "linear", 0.5) for s in range(5)] == [1.0, 0.75, 0.5, 0.25, 0.0]
    assert kd_weight(0, 5, "cosine", 0.5) == 1.0 and kd_weight(
        4, 5, "cosine", 0.5
    ) == pytest.approx(0)
    assert kd_weight(2, 5, "cosine", 0.5) == pytest.approx(0.5)
    assert kd_weight(3, 5, "constant", 0.3) == 0.3
    rates = [learning_rate(s, 10, 1.0, 4) for s in range(10)]
    assert (
        rates[:4] == [0.25, 0.5, 0.75, 1.0]
        and rates[4] == 1.0
        and rates[-1] == pytest.approx(1 / 6)
    )


def test_language_probabilities_follow_smoothing() -> None:
    probs = language_probabilities({"en": 1000, "fr": 100}, 0.7)
    assert probs["en"] == pytest.approx(1000**0.7 / (1000**0.7 + 100**0.7))
    assert language_probabilities({"a": 10, "b": 10}, 0.7) == {"a": 0.5, "b": 0.5}


def copies(losses: list[float], heldout: list[bool]) -> TeacherCopies:
    n = len(losses)
    empty = np.zeros(0, dtype=np.int64)
    return TeacherCopies(
        np.array([f"e{i}" for i in range(n)], dtype=object),
        np.array(heldout),
        empty,
        np.zeros(n + 1, dtype=np.int64),
        empty,
        empty,
        np.zeros(n + 1, dtype=np.int64),
        np.zeros((0, 8), dtype=np.int64),
        np.zeros((0, 8), dtype=np.float32),
        np.array(losses, dtype=np.float32),
    )


def test_best_copy_picks_the_lowest_teacher_loss_and_all_keeps_every_copy() -> None:
    held = [False, False, True, False]
    a = copies([1.0, 5.0, 0.1, 2.0], held)
    b = copies([3.0, 0.5, 9.0, float("nan")], held)  # NaN loss (nothing masked) never wins
    best = language_pool([a, b], "best", "xx")
    assert best.source.tolist() == [0, 1, 0] and best.row.tolist() == [0, 1, 3]
    every = language_pool([a, b], "all", "xx")
    assert sorted(zip(every.source.tolist(), every.row.tolist(), strict=True)) == [
        (0, 0),
        (0, 1),
        (0, 3),
        (1, 0),
        (1, 1),
        (1, 3),
    ]
    assert best.examples == every.examples == 3
