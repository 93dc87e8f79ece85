"""The encoder's last layer on the masked rows only: the model's own logits, for every architecture
it trims, and the untrimmed path for the others."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    BertConfig,
    BertForMaskedLM,
    CamembertConfig,
    CamembertForMaskedLM,
    DistilBertConfig,
    DistilBertForMaskedLM,
    ElectraConfig,
    ElectraForMaskedLM,
    RobertaConfig,
    RobertaForMaskedLM,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
)

from lmalgebra.train.last_layer import RowsLayer, trimmable_layers
from lmalgebra.train.masked_head import masked_logits

VOCAB = 300
SHAPE = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    num_hidden_layers=3,
    num_attention_heads=4,
    intermediate_size=128,
    max_position_embeddings=80,
)
FAMILY = {
    "bert": (BertForMaskedLM, BertConfig),
    "roberta": (RobertaForMaskedLM, RobertaConfig),
    "xlm-roberta": (XLMRobertaForMaskedLM, XLMRobertaConfig),
    "camembert": (CamembertForMaskedLM, CamembertConfig),
    "electra": (ElectraForMaskedLM, ElectraConfig),
}


def family_model(name: str, dropout: float = 0.0) -> torch.nn.Module:
    cls, config = FAMILY[name]
    extra = {"embedding_size": 32} if name == "electra" else {}
    torch.manual_seed(3)
    return cls(
        config(**SHAPE, **extra, hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    )


def masked_batch(seed: int = 0, shuffle: bool = False) -> dict[str, torch.Tensor]:
    """Padded examples of uneven lengths and uneven masked counts, one with none masked."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [40, 7, 23, 31, 12]
    ids = torch.randint(5, VOCAB, (len(lengths), max(lengths)), generator=gen)
    attention = (torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]).long()
    rows, cols = [], []
    for row, (length, count) in enumerate(zip(lengths, [6, 1, 0, 5, 3], strict=True)):
        picked = torch.randperm(length, generator=gen)[:count]
        rows += [row] * count
        cols += picked.tolist()
    rows_t, cols_t = torch.tensor(rows), torch.tensor(cols)
    if shuffle:
        order = torch.randperm(len(rows), generator=gen)
        rows_t, cols_t = rows_t[order], cols_t[order]
    return {"input_ids": ids, "attention_mask": attention, "rows": rows_t, "cols": cols_t}


def hf_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Reference: the model's own forward at every position, then the masked rows."""
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return out.logits[batch["rows"], batch["cols"]]


@pytest.fixture
def counted_rows_layer() -> object:
    original = RowsLayer.forward
    calls: list[int] = []

    def counted(self: RowsLayer, *args: object, **kwargs: object) -> torch.Tensor:
        calls.append(1)
        return original(self, *args, **kwargs)

    RowsLayer.forward = counted  # type: ignore[method-assign]
    yield calls
    RowsLayer.forward = original  # type: ignore[method-assign]


@pytest.mark.parametrize("name", sorted(FAMILY))
@pytest.mark.parametrize("shuffle", [False, True])
def test_trimmed_logits_are_the_models_own(
    name: str, shuffle: bool, counted_rows_layer: list[int]
) -> None:
    model = family_model(name).eval()
    batch = masked_batch(shuffle=shuffle)
    layers = trimmable_layers(model)
    assert layers is not None
    last = layers[-1]
    with torch.inference_mode():
        expected = hf_logits(model, batch)
        trimmed = masked_logits(model, batch)
        untrimmed = masked_logits(model, batch, trim_last_layer=False)
    assert counted_rows_layer == [1]  # the trimmed path ran, once
    assert layers[-1] is last  # and the layer list is as it was
    scale = expected.abs().max()
    assert torch.allclose(trimmed, expected, rtol=0, atol=1e-5 * scale)
    assert torch.allclose(untrimmed, expected, rtol=0, atol=1e-5 * scale)


def test_gradients_through_the_trimmed_layer_match(counted_rows_layer: list[int]) -> None:
    batch = masked_batch(seed=1)
    grads = []
    for trim in (False, True):
        model = family_model("bert").train()  # dropout 0: the same function in both
        loss = masked_logits(model, batch, trim_last_layer=trim).logsumexp(-1).sum()
        loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert counted_rows_layer == [1]
    assert grads[0].keys() == grads[1].keys()
    largest = max(float(g.abs().max()) for g in grads[0].values())
    for name, grad in grads[0].items():
        # the key biases' gradients are zero but for rounding (softmax ignores them): a floor
        scale = max(float(grad.abs().max()), 1e-3 * largest)
        assert torch.allclose(grads[1][name], grad, rtol=0, atol=1e-5 * scale), name


def test_dropout_in_training_reaches_the_trimmed_layer() -> None:
    model = family_model("bert", dropout=0.3).train()
    batch = masked_batch(seed=2)
    first = masked_logits(model, batch)
    second = masked_logits(model, batch)
    assert not torch.allclose(first, second)
    model.eval()
    with torch.inference_mode():
        assert torch.equal(masked_logits(model, batch), masked_logits(model, batch))


def test_other_architectures_run_untrimmed(counted_rows_layer: list[int]) -> None:
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=VOCAB, dim=64, n_layers=2, n_heads=4, hidden_dim=128)
    model = DistilBertForMaskedLM(config).eval()
    batch = masked_batch()
    assert trimmable_layers(model) is None
    with torch.inference_mode():
        expected = hf_logits(model, batch)
        got = masked_logits(model, batch)
    assert counted_rows_layer == []
    assert torch.allclose(got, expected, rtol=0, atol=1e-5 * expected.abs().max())


def test_a_same_named_layer_from_outside_transformers_is_not_trimmed() -> None:
    model = family_model("bert").eval()
    layers = trimmable_layers(model)
    assert layers is not None
    # a class of the same name defined elsewhere (remote code): its forward is unknown
    foreign = type("BertLayer", (type(layers[-1]),), {"__module__": "remote_model"})
    layers[-1].__class__ = foreign
    assert trimmable_layers(model) is None


def test_the_layer_is_put_back_when_the_forward_fails() -> None:
    model = family_model("bert").eval()
    layers = trimmable_layers(model)
    assert layers is not None
    last = layers[-1]
    batch = masked_batch()
    batch["cols"] = batch["cols"] + 1000  # past the width: the gather raises inside the layer
    with pytest.raises(IndexError), torch.inference_mode():
        masked_logits(model, batch)
    assert layers[-1] is last
    assert not any(isinstance(m, RowsLayer) for m in model.modules())


def test_bfloat16_trimmed_logits_stay_close_to_float32() -> None:
    model = family_model("roberta").eval()
    batch = masked_batch(seed=4)
    with torch.inference_mode():
        expected = hf_logits(model, batch)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = masked_logits(model, batch, float32_head=True)
    assert got.dtype == torch.float32
    # bfloat16 keeps 8 bits of mantissa: a few units of 2^-8 of the logits' scale
    assert (got - expected).abs().max() <= 0.05 * expected.abs().max()
