"""Lane dropout (``train.dropout``): the masks' probability, independence and seeding against the
binomial they stand for, the gradient against autograd's of an explicit product, and the swap of
a model's dropout modules for the span of a training run."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM

from lmalgebra.train.config import OptimisationSpec
from lmalgebra.train.dropout import (
    LANE,
    LaneDropout,
    _Scaled,
    drop_threshold,
    keep_mask,
    lane_dropout,
    lane_dropout_function,
)
from lmalgebra.train.run_fingerprint import training_part

COUNT = 1 << 20  # 1,048,576 elements: the keep rate's standard error is 2.9e-4 at p = 0.1


def _within(observed: float, expected: float, n: int) -> bool:
    """``observed`` (a proportion of ``n`` Bernoulli draws) within 5 standard errors."""
    return abs(observed - expected) <= 5 * math.sqrt(expected * (1 - expected) / n)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9, 0.01])
def test_the_keep_rate_is_the_binomial_one_in_every_lane(p: float) -> None:
    torch.manual_seed(0)
    kept = keep_mask((COUNT,), p)
    keep = 1 - drop_threshold(p) / LANE
    assert abs(keep - (1 - p)) <= 0.5 / LANE
    assert _within(kept.double().mean().item(), keep, COUNT)
    # each of the four lanes of a 64-bit draw (the sign bit's lane too) keeps at that rate
    by_lane = kept.view(-1, 4).double().mean(0)
    assert all(_within(v.item(), keep, COUNT // 4) for v in by_lane)


def test_neighbouring_elements_are_independent() -> None:
    torch.manual_seed(1)
    kept = keep_mask((COUNT,), 0.5).double()
    for lag in (1, 2, 3, 4, 5):  # inside one draw (1-3), across draws (4, 5)
        a, b = kept[:-lag] - kept.mean(), kept[lag:] - kept.mean()
        corr = (a * b).mean() / kept.var()
        assert abs(corr.item()) <= 5 / math.sqrt(COUNT)


def test_kept_elements_are_scaled_so_the_expectation_is_the_input() -> None:
    torch.manual_seed(2)
    x = torch.randn(64, 4096)
    out = lane_dropout_function(x, 0.1)
    scale = LANE / (LANE - drop_threshold(0.1))
    kept = out != 0
    assert torch.equal(out[kept], x[kept] * scale)
    ones = lane_dropout_function(torch.ones(COUNT), 0.3)  # mean over many draws of 1 * mask
    keep = 1 - drop_threshold(0.3) / LANE
    assert abs(ones.double().mean().item() - 1) <= 5 * math.sqrt((1 - keep) / keep / COUNT)


def test_the_gradient_is_the_mask_and_passes_gradcheck() -> None:
    torch.manual_seed(3)
    x = torch.randn(8, 33, requires_grad=True)
    out = lane_dropout_function(x, 0.25)
    grad = torch.randn_like(out)
    out.backward(grad)
    scale = LANE / (LANE - drop_threshold(0.25))
    assert x.grad is not None
    assert torch.equal(x.grad, grad * (out != 0) * scale)
    mask = keep_mask((5, 7), 0.25).double() * scale
    assert torch.autograd.gradcheck(
        lambda t: _Scaled.apply(t, mask),
        (torch.randn(5, 7, dtype=torch.float64, requires_grad=True),),
    )


def test_masks_follow_the_seed_and_the_generator_state() -> None:
    x = torch.ones(1000)
    torch.manual_seed(4)
    first = lane_dropout_function(x, 0.5)
    state = torch.get_rng_state()
    second = lane_dropout_function(x, 0.5)
    torch.set_rng_state(state)
    assert torch.equal(lane_dropout_function(x, 0.5), second)
    torch.manual_seed(4)
    assert torch.equal(lane_dropout_function(x, 0.5), first)
    assert not torch.equal(first, second)


def test_no_dropout_outside_training_at_p_zero_and_everything_dropped_at_one() -> None:
    x = torch.randn(3, 5)
    assert lane_dropout_function(x, 0.5, training=False) is x
    assert lane_dropout_function(x, 0.0) is x
    assert torch.equal(lane_dropout_function(x, 1.0), torch.zeros_like(x))
    module = LaneDropout(0.5).eval()
    assert module(x) is x


def _bert() -> BertForMaskedLM:
    config = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=16,
    )
    return BertForMaskedLM(config)


def test_a_models_dropout_modules_are_swapped_for_the_block_and_put_back() -> None:
    model = _bert().train()
    before = {name: m for name, m in model.named_modules() if type(m) is torch.nn.Dropout}
    with lane_dropout(model) as swapped:
        assert swapped == len(before) > 0
        inside = dict(model.named_modules())
        assert all(type(inside[name]) is LaneDropout for name in before)
        assert all(inside[name].p == m.p and inside[name].training for name, m in before.items())
        ids = torch.randint(0, 50, (2, 8))
        torch.manual_seed(5)
        a = model(input_ids=ids).logits
        torch.manual_seed(5)
        assert torch.equal(model(input_ids=ids).logits, a)  # seeded
    after = dict(model.named_modules())
    assert all(after[name] is m for name, m in before.items())


def test_a_model_off_the_cpu_keeps_its_dropout() -> None:
    with torch.device("meta"):
        model = _bert()
    with lane_dropout(model) as swapped:
        assert swapped == 0
        assert not any(type(m) is LaneDropout for m in model.modules())


def test_torchs_masks_are_fingerprinted_as_runs_before_the_setting() -> None:
    assert "dropout_masks" not in training_part(OptimisationSpec(dropout_masks="torch"))
    assert training_part(OptimisationSpec())["dropout_masks"] == "lanes"
