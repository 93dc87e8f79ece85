"""The contenders of ``bench_teacher_inference.py``: random BERT masked LMs, masked example
copies of ``wiki-en``, the full-logits baseline, ``masked_topk`` in float32 or bfloat16, the
per-part timing of one batch (encoder, heads), a trained teacher's agreement, and the comparison
of two sets of top-k outputs. Each contender runs in a fresh interpreter (``harness``)."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.precision import compute_context
from lmalgebra.distill.examples import example_id
from lmalgebra.distill.masked.masking import MaskedCopy, TeacherMasker, pad_batch
from lmalgebra.distill.masked.topk import TeacherOutput, masked_topk
from lmalgebra.distill.recipe import MaskingSpec
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.packaged import asset_path
from utilisation import DTYPES, bert_forward_flops, counted_flops

FP16_HALF_ULP = 2.0**-11  # relative rounding error of float16
SHAPES = {
    "BERT-base": {"layers": 12, "hidden": 768, "heads": 12, "intermediate": 3072},
    "small BERT": {"layers": 4, "hidden": 256, "heads": 4, "intermediate": 1024},
}


def build_model(shape: dict[str, int], vocab_size: int, seed: int = 0) -> Any:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape["hidden"],
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["heads"],
        intermediate_size=shape["intermediate"],
        max_position_embeddings=512,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return BertForMaskedLM(config).eval()


def length_batches(copies: Sequence[MaskedCopy], batch_size: int) -> list[list[int]]:
    """Indices of each batch, longest copies first: the order ``masked_topk`` uses."""
    order = sorted(range(len(copies)), key=lambda i: -len(copies[i].input_ids))
    return [order[s : s + batch_size] for s in range(0, len(order), batch_size)]


@torch.inference_mode()
def full_logits_topk(
    model: Any, copies: Sequence[MaskedCopy], k: int, pad_id: int, batch_size: int
) -> list[TeacherOutput]:
    """Baseline: full ``(batch, seq, vocab)`` logits, log_softmax and top-k everywhere, then the
    masked positions gathered. Same batches as ``masked_topk``; outputs in input order."""
    out: list[TeacherOutput | None] = [None] * len(copies)
    for chosen in length_batches(copies, batch_size):
        batch = [copies[i] for i in chosen]
        padded = pad_batch(batch, pad_id)
        logits = model(
            input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]
        ).logits.float()
        logprobs = torch.log_softmax(logits, dim=-1)
        values, indices = logprobs.topk(k, dim=-1)
        rows, cols = padded["rows"], padded["cols"]
        top_lp, top_ids = values[rows, cols].numpy(), indices[rows, cols].numpy()
        labels = torch.from_numpy(np.concatenate([c.labels for c in batch]))
        gold = logprobs[rows, cols].gather(1, labels.unsqueeze(1)).squeeze(1).numpy()
        start = 0
        for i, c in zip(chosen, batch, strict=True):
            stop = start + len(c.positions)
            loss = float(-gold[start:stop].mean()) if stop > start else float("nan")
            out[i] = TeacherOutput(top_ids[start:stop], top_lp[start:stop], loss)
            start = stop
    return [o for o in out if o is not None]


def compare(ours: list[TeacherOutput], base: list[TeacherOutput]) -> dict[str, float]:
    """Top-k id agreement and log-prob differences, rank by rank."""
    ids_o = np.concatenate([o.topk_ids for o in ours])
    ids_b = np.concatenate([o.topk_ids for o in base])
    lp_o = np.concatenate([o.topk_logprobs for o in ours]).astype(np.float64)
    lp_b = np.concatenate([o.topk_logprobs for o in base]).astype(np.float64)
    diff = np.abs(lp_o - lp_b)
    allowed = FP16_HALF_ULP * np.maximum(np.abs(lp_o), 2.0**-14)
    loss_o = np.array([o.loss for o in ours])
    loss_b = np.array([o.loss for o in base])
    return {
        "tokens": float(len(ids_o)),
        "ids_same_share": float(np.mean(np.all(ids_o == ids_b, axis=1))),
        "ids_same_set_share": float(
            np.mean(np.all(np.sort(ids_o, axis=1) == np.sort(ids_b, axis=1), axis=1))
        ),
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float((diff / np.maximum(np.abs(lp_o), 2.0**-14)).max()),
        "within_fp16": float(np.all(diff <= allowed)),
        "loss_max_abs_diff": float(np.nanmax(np.abs(loss_o - loss_b))),
    }


def model_flops(model: Any, lengths: Sequence[int], attention: bool = True) -> float:
    """:func:`utilisation.bert_forward_flops` of a BERT encoder (its config's shape), no head."""
    config = model.config
    return bert_forward_flops(
        lengths,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        intermediate=config.intermediate_size,
        attention=attention,
    )


@torch.inference_mode()
def head_only(
    model: Any,
    copies: Sequence[MaskedCopy],
    k: int,
    pad_id: int,
    batch_size: int,
    count: int,
    dtype: str = "float32",
) -> dict[str, float]:
    """Seconds per batch of the encoder, and of each contender's head given the hidden states
    (projection, then normalisation + top-k + gather), on ``count`` batches spread over the
    length-sorted order; the encoder's matrix-product FLOPs per batch. In bfloat16 the encoder
    runs under autocast and ours' head in float32; the baseline's head, a float32 contender, is
    not timed."""
    batches = length_batches(copies, batch_size)
    picks = sorted({round(i * (len(batches) - 1) / max(count - 1, 1)) for i in range(count)})
    keys = ("encoder", "ours_proj", "ours_post", "base_proj", "base_post", "encoder_flops")
    times = dict.fromkeys((*keys, "tokens", "masked"), 0.0)
    context = compute_context(torch.device("cpu"), DTYPES[dtype])
    for index in picks:
        batch = [copies[i] for i in batches[index]]
        padded = pad_batch(batch, pad_id)
        rows, cols = padded["rows"], padded["cols"]
        labels = torch.from_numpy(np.concatenate([c.labels for c in batch]))
        times["encoder_flops"] += model_flops(model, [padded["input_ids"].shape[1]] * len(batch))
        clock = time.perf_counter()
        with context:
            hidden = model.base_model(
                input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]
            ).last_hidden_state
        times["encoder"] += time.perf_counter() - clock
        times["tokens"] += float(padded["input_ids"].numel())
        times["masked"] += float(rows.numel())
        # ours: the head on the gathered rows, in float32 whatever the encoder's dtype (as
        # masked_topk runs it), exact log-probs from logsumexp
        clock = time.perf_counter()
        logits = model.cls(hidden[rows, cols].float().unsqueeze(0))[0]
        mid = time.perf_counter()
        lse = torch.logsumexp(logits, dim=-1, keepdim=True)
        values, _ = logits.topk(k, dim=-1)
        _ = values - lse, logits.gather(1, labels.unsqueeze(1)) - lse
        times["ours_post"] += time.perf_counter() - mid
        times["ours_proj"] += mid - clock
        del logits
        if dtype != "float32":
            continue
        # baseline: the head at every position, log_softmax and top-k everywhere, then gather
        clock = time.perf_counter()
        logits = model.cls(hidden).float()
        mid = time.perf_counter()
        logprobs = torch.log_softmax(logits, dim=-1)
        values, indices = logprobs.topk(k, dim=-1)
        _ = values[rows, cols], indices[rows, cols]
        _ = logprobs[rows, cols].gather(1, labels.unsqueeze(1))
        times["base_post"] += time.perf_counter() - mid
        times["base_proj"] += mid - clock
        del logits, logprobs
    n = len(picks)
    return {key: value / n for key, value in times.items()} | {"batches": float(n)}


def flops_check(model: Any, copies: Sequence[MaskedCopy], pad_id: int, batch_size: int) -> float:
    """torch's count of one batch's encoder matrix products over the formula's (without the
    attention products, which torch's counter does not see in fused kernels on the CPU)."""
    batch = [copies[i] for i in length_batches(copies, batch_size)[0]]
    padded = pad_batch(batch, pad_id)
    width = padded["input_ids"].shape[1]
    with torch.inference_mode():
        counted = counted_flops(
            lambda: model.base_model(
                input_ids=padded["input_ids"], attention_mask=padded["attention_mask"]
            )
        )
    return counted / model_flops(model, [width] * len(batch), attention=False)


def examples(
    count: int, batch_size: int, length: int, seed: int
) -> tuple[Any, list[MaskedCopy], list[MaskedCopy]]:
    """The tokenizer, ``batch_size`` masked copies for warm-up and ``count`` to time."""
    tok_dir = asset_path("minilm")
    tokenizer = source_of(ModelRef(name="minilm", path=str(tok_dir)), tok_dir).load_tokenizer()
    wiki = asset_path("wiki-en")
    docs = [d.strip() for d in read_documents(CorpusSpec(paths=[str(wiki)], text_column="extract"))]
    order = random.Random(seed).sample(range(len(docs)), count + batch_size)
    masker = TeacherMasker("bert", tokenizer, MaskingSpec(seed=seed), length)
    copies = [masker(example_id("en", docs[i]), docs[i]) for i in order]
    return tokenizer, copies[:batch_size], copies[batch_size:]


def contender(
    which: str,
    shape: str,
    count: int,
    batch_size: int,
    length: int,
    k: int,
    threads: int,
    seed: int,
    out: str,
    dtype: str = "float32",
    trim: bool = True,
) -> Callable[[], dict[str, Any]]:
    """Untimed: the model, the examples, a warm-up batch. The work: ``baseline`` (float32) or
    ``ours`` (in ``dtype``; ``trim``: the last layer on the masked rows only) on the examples
    (outputs saved to ``out``), or ``head``: seconds per batch of each part in ``dtype``."""
    torch.set_num_threads(threads)
    tokenizer, warmup, copies = examples(count, batch_size, length, seed)
    pad_id = tokenizer.pad_token_id or 0
    model = build_model(SHAPES[shape], len(tokenizer), seed)
    if which == "head":
        check = flops_check(model, copies, pad_id, batch_size) if dtype == "float32" else None
        return lambda: (
            head_only(model, copies, k, pad_id, batch_size, 4, dtype) | {"flops_check": check}
        )
    if which == "baseline":
        topk: Callable[..., list[TeacherOutput]] = full_logits_topk
    else:
        topk = lambda *a: masked_topk(*a, dtype=DTYPES[dtype], trim_last_layer=trim)  # noqa: E731
    topk(model, warmup, k, pad_id, batch_size)

    def work() -> dict[str, Any]:
        save_outputs(out, topk(model, copies, k, pad_id, batch_size))
        return {
            "params": sum(p.numel() for p in model.parameters()),
            "tokens": sum(len(c.input_ids) for c in copies),
            "masked": sum(len(c.positions) for c in copies),
            "lengths": [len(c.input_ids) for c in copies],
            "vocab": len(tokenizer),
        }

    return work


def trained_agreement(
    directory: str,
    dtypes: list[str],
    count: int,
    batch_size: int,
    length: int,
    k: int,
    threads: int,
    seed: int,
) -> Callable[[], dict[str, Any]]:
    """The work: a trained masked LM's ``masked_topk`` in each of ``dtypes`` against its own
    float32 full logits on ``count`` examples (agreement only; the time is not a figure)."""
    from transformers import AutoModelForMaskedLM

    torch.set_num_threads(threads)
    tokenizer, _, copies = examples(count, batch_size, length, seed)
    pad_id = tokenizer.pad_token_id or 0
    model = AutoModelForMaskedLM.from_pretrained(directory).eval()

    def work() -> dict[str, Any]:
        base = full_logits_topk(model, copies, k, pad_id, batch_size)
        return {
            dtype: compare(masked_topk(model, copies, k, pad_id, batch_size, DTYPES[dtype]), base)
            for dtype in dtypes
        }

    return work


def trained_teacher_problem(path: Path, vocab: int) -> str:
    """What makes ``path`` unusable as the trained teacher (a masked LM directory with a
    ``vocab``-token vocabulary), or nothing."""
    config_file = path / "config.json"
    if not config_file.is_file():
        return f"{path}: no config.json there (a model directory)"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        return f"{config_file}: unreadable ({error})"
    architectures = config.get("architectures") or []
    if not any(a.endswith("ForMaskedLM") for a in architectures):
        return f"{path}: not a masked LM (architectures {architectures})"
    if config.get("vocab_size") != vocab:
        return (
            f"{path}: vocabulary of {config.get('vocab_size')} tokens; the examples are cut with "
            f"the packaged MiniLM tokenizer ({vocab:,} tokens)"
        )
    return ""


def save_outputs(path: str, outputs: list[TeacherOutput]) -> None:
    np.savez(
        path,
        ids=np.concatenate([o.topk_ids for o in outputs]).astype(np.int64),
        logprobs=np.concatenate([o.topk_logprobs for o in outputs]).astype(np.float32),
        loss=np.array([o.loss for o in outputs]),
        counts=np.array([len(o.topk_ids) for o in outputs]),
    )


def load_outputs(path: str | Path) -> list[TeacherOutput]:
    with np.load(path) as data:
        cuts = np.cumsum(data["counts"])[:-1]
        ids, lps = np.split(data["ids"], cuts), np.split(data["logprobs"], cuts)
        return [
            TeacherOutput(i, lp, float(x)) for i, lp, x in zip(ids, lps, data["loss"], strict=True)
        ]
