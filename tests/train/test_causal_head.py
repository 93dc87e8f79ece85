"""Chunked next-token statistics (``train.causal_head``) against each model's own full forward:
tiny Llama (tied), Gemma 3 (tied, soft-capped logits) and GPT-2, padded batches and chunks that
cross examples; draws; the head never sees more than a chunk; an unknown head is refused;
bfloat16 under autocast."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.logprobs import causal_outputs
from lmalgebra.train import causal_head

VOCAB, START, K, DRAWS = 97, 1, 5, 6
LENGTHS = [9, 3, 17, 1, 12, 6]


def _llama() -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config)


def _gemma3() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        sliding_window=4,  # shorter than the examples: the local layer's mask matters
        layer_types=["sliding_attention", "full_attention"],
        final_logit_softcapping=2.0,  # small, so the cap bends the logits
        tie_word_embeddings=True,
        initializer_range=0.2,
    )
    return Gemma3ForCausalLM(config)


def _gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4))


BUILDERS = {"llama": _llama, "gemma3": _gemma3, "gpt2": _gpt2}


@pytest.fixture(scope="module", params=list(BUILDERS))
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    torch.manual_seed(0)
    return BUILDERS[request.param]().eval()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Four positions per chunk, so chunks cross examples and batches."""
    monkeypatch.setattr(causal_head, "CHUNK_BYTES", 4 * 4 * VOCAB)
    return 4


def _examples() -> list[np.ndarray]:
    rng = np.random.default_rng(3)
    return [rng.integers(2, VOCAB, size=n).astype(np.int64) for n in LENGTHS]


def _seeds() -> list[list[int]]:
    return [[7, i] for i in range(len(LENGTHS))]


@torch.no_grad()
def _full_logprobs(model, tokens: np.ndarray, autocast: bool = False) -> torch.Tensor:
    """The model's own forward on one example alone (no padding): ``(n, vocab)``."""
    ids = torch.from_numpy(np.concatenate([[START], tokens[:-1]])).unsqueeze(0)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids).logits[0]
    return torch.log_softmax(logits.float(), -1)


def _assert_valid_topk(ids: np.ndarray, values: np.ndarray, full: torch.Tensor) -> None:
    """The k values are the k largest log-probabilities, each id has its value: a tie within
    rounding may list either id."""
    want = full.topk(K, dim=-1).values.numpy()
    np.testing.assert_allclose(values, want, rtol=0, atol=1e-5)
    np.testing.assert_allclose(full.gather(1, torch.from_numpy(ids)).numpy(), values, atol=1e-5)


def _assert_same_draws(ids: np.ndarray, full: torch.Tensor, seed: list[int]) -> int:
    """Rows whose every draw falls clear of a CDF step (farther than rounding can move it) draw
    the ids numpy's inverse CDF gives on the full distribution; returns how many rows were
    decidable."""
    cdf = np.cumsum(np.exp(full.double().numpy()), axis=-1)
    targets = np.random.default_rng(seed).random((full.shape[0], DRAWS)) * cdf[:, -1:]
    decidable = 0
    for row in range(full.shape[0]):
        want = np.minimum(np.searchsorted(cdf[row], targets[row], side="right"), VOCAB - 1)
        if np.abs(targets[row][:, None] - cdf[row][None, :]).min() > 1e-6:
            np.testing.assert_array_equal(ids[row], np.sort(want))
            decidable += 1
    return decidable


def test_chunked_outputs_equal_the_models_own_forward(model, small_chunks: int) -> None:
    examples, seeds = _examples(), _seeds()
    got = causal_outputs(model, examples, START, K, DRAWS, seeds, batch_size=4)
    decidable = 0
    for tokens, seed, out in zip(examples, seeds, got, strict=True):
        full = _full_logprobs(model, tokens)
        want_next = full.gather(1, torch.from_numpy(tokens).unsqueeze(1)).squeeze(1).numpy()
        np.testing.assert_allclose(out.next_logprob, want_next, rtol=0, atol=1e-5)
        _assert_valid_topk(out.topk_ids, out.topk_logprobs, full)
        assert out.sample_ids is not None and out.sample_logprobs is not None
        drawn = full.gather(1, torch.from_numpy(out.sample_ids)).numpy()
        np.testing.assert_allclose(out.sample_logprobs, drawn, rtol=0, atol=1e-5)
        decidable += _assert_same_draws(out.sample_ids, full, seed)
    assert decidable >= sum(LENGTHS) - 2  # a draw within 1e-6 of a step is rare


def test_target_logprobs_equal_the_models_own_forward(model, small_chunks: int) -> None:
    tokens = _examples()[2]
    ids = torch.from_numpy(np.concatenate([[START], tokens[:-1]])).unsqueeze(0)
    with torch.no_grad():
        hidden = causal_head.body_states(model, ids, torch.ones_like(ids))[0]
    got = causal_head.target_logprobs(model, hidden, tokens)
    want = _full_logprobs(model, tokens).gather(1, torch.from_numpy(tokens).unsqueeze(1))
    np.testing.assert_allclose(got, want.squeeze(1).numpy(), rtol=0, atol=1e-5)


def test_the_head_never_sees_more_than_a_chunk(model, small_chunks: int) -> None:
    causal_head.check_head(model)  # its one full forward, on four tokens, before counting
    seen: list[tuple[int, ...]] = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    try:
        causal_outputs(model, _examples(), START, K, batch_size=6)
    finally:
        handle.remove()
    assert all(len(s) == 2 and s[0] <= small_chunks for s in seen), seen
    assert sum(s[0] for s in seen) == sum(LENGTHS)  # padding positions get no head


def test_bits_per_byte_runs_the_head_in_chunks(gpt2_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmalgebra.distill.causal.bits_per_byte import score_texts

    model = AutoModelForCausalLM.from_pretrained(gpt2_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(gpt2_dir)
    causal_head.check_head(model)
    shapes: list[tuple[int, ...]] = []
    head = model.get_output_embeddings()
    handle = head.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    monkey = pytest.MonkeyPatch()
    monkey.setattr(causal_head, "CHUNK_BYTES", 4 * 4 * model.config.vocab_size)
    try:
        score = score_texts(model, tokenizer, ["the old river", "a new city by the lake"], 16)
    finally:
        handle.remove()
        monkey.undo()
    assert all(len(s) == 2 and s[0] <= 4 for s in shapes), shapes
    assert sum(s[0] for s in shapes) == score.tokens


class _DoubledLogits(torch.nn.Module):
    """A causal LM whose forward doubles its head's logits (an architecture the chunked head
    does not know)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.config = inner.config
        self.base_model_prefix = "inner"

    @property
    def base_model(self) -> torch.nn.Module:
        return self.inner.base_model

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.inner.get_output_embeddings()

    def forward(self, **kwargs):  # type: ignore[no-untyped-def]
        out = self.inner(**kwargs)
        out.logits = out.logits * 2
        return out


def test_a_model_whose_logits_are_made_otherwise_is_refused() -> None:
    torch.manual_seed(0)
    odd = _DoubledLogits(_llama().eval())
    with pytest.raises(UserInputError, match="_DoubledLogits computes its logits"):
        causal_outputs(odd, _examples(), START, K)


def test_bfloat16_follows_the_models_autocast_forward(
    model, small_chunks: int, slow_bf16_allowed: None
) -> None:
    got = causal_outputs(model, _examples(), START, K, batch_size=4, dtype=torch.bfloat16)
    for tokens, out in zip(_examples(), got, strict=True):
        full = _full_logprobs(model, tokens, autocast=True)
        want = full.gather(1, torch.from_numpy(tokens).unsqueeze(1)).squeeze(1).numpy()
        # the same bfloat16 products on both sides, summed in another order: rounding of
        # bfloat16 logits (8 bits of mantissa) is the most they may differ by
        np.testing.assert_allclose(out.next_logprob, want, rtol=0, atol=0.05)


def test_a_table_padded_past_the_tokenizer_gives_top_k_and_draws_of_its_tokens() -> None:
    """A teacher whose token table has rows past its tokenizer (padded to a round size, as
    many are) had stored top-k and drawn ids that name no token, and training ended in an
    ``IndexError`` on the teacher's map: both are taken among the tokenizer's ids, their
    log-probabilities of the whole table (the padded rows count in the rest of the mass)."""
    torch.manual_seed(0)
    model, tokens = _llama().eval(), 60  # the last 37 rows of 97 name no token
    examples, seeds = _examples(), _seeds()
    examples = [np.minimum(e, tokens - 1) for e in examples]
    got = causal_outputs(model, examples, START, K, DRAWS, seeds, batch_size=4, tokens=tokens)
    for example, out in zip(examples, got, strict=True):
        full = _full_logprobs(model, example)
        assert out.topk_ids.max() < tokens and out.sample_ids is not None
        assert out.sample_ids.max() < tokens
        want = full[:, :tokens].topk(K, dim=-1).values.numpy()
        np.testing.assert_allclose(out.topk_logprobs, want, rtol=0, atol=1e-5)
        drawn = full.gather(1, torch.from_numpy(out.sample_ids)).numpy()
        np.testing.assert_allclose(out.sample_logprobs, drawn, rtol=0, atol=1e-5)
