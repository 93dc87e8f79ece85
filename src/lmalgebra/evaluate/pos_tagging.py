"""UPOS tagging as a downstream test of an encoder: a linear probe on frozen states, or fine-tuning.

Words are split into subwords by the model's fast tokenizer and each word is represented by the
hidden state of its first subword. ``probe`` computes the chosen layer's states once (batched,
length-sorted), keeps them in memory and trains a linear softmax classifier on them; ``finetune``
trains the whole encoder with a linear head. Both keep the epoch with the best dev accuracy and
score it on test: accuracy and macro-F1 over the tags present in gold test.

Words past the model's maximum length, and words the tokenizer turns into no subword at all, are
neither trained on nor scored; the result counts them.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmalgebra.core.errors import TrainingDivergedError, UserInputError
from lmalgebra.core.fingerprint import sha256_file
from lmalgebra.core.progress import progress_bar
from lmalgebra.evaluate.conllu import Sentence, TreebankSplits, find_splits, read_conllu
from lmalgebra.evaluate.pos_options import MODE_DEFAULTS, Mode, PosOptions, refuse_repeated_names
from lmalgebra.evaluate.pos_results import (
    PosResult,
    claim_evaluation,
    finished_results,
    result_summary,
    write_results,
)
from lmalgebra.sources.embed import max_tokens, padding_id, refuse_foreign_ids
from lmalgebra.sources.model_source import check_layer
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.lockfile import run_directory_lock
from lmalgebra.storage.output_paths import check_directory, tidy_on_failure

log = logging.getLogger(__name__)
# Universal Dependencies' part-of-speech tags (universaldependencies.org/u/pos)
UD_UPOS = frozenset(
    "ADJ ADP ADV AUX CCONJ DET INTJ NOUN NUM PART PRON PROPN PUNCT SCONJ SYM VERB X".split()  # noqa: SIM905
)


@dataclass
class _Split:
    """One split, tokenised: subword ids with specials, and the kept words' positions and tags."""

    ids: list[list[int]]
    first: list[list[int]]  # position of each kept word's first subword
    labels: list[list[int]]  # tag index of each kept word
    cut: int = 0
    untokenized: int = 0


@dataclass
class _Batch:
    input_ids: torch.Tensor  # (batch, seq) int64
    attention: torch.Tensor  # (batch, seq) int64
    rows: torch.Tensor  # (words,) int64: sentence of each word within the batch
    cols: torch.Tensor  # (words,) int64: position of its first subword
    labels: torch.Tensor  # (words,) int64


def macro_f1(gold: Sequence[Any], pred: Sequence[Any]) -> float:
    """Mean F1 over the labels present in ``gold`` (a label never predicted scores 0)."""
    g, p = np.asarray(gold), np.asarray(pred)
    if g.shape != p.shape or g.size == 0:
        raise ValueError(f"macro_f1: {g.size} gold and {p.size} predicted labels")
    scores = []
    for label in np.unique(g):
        tp = np.sum((g == label) & (p == label))
        fp = np.sum((g != label) & (p == label))
        fn = np.sum((g == label) & (p != label))
        scores.append(2 * tp / (2 * tp + fp + fn))
    return float(np.mean(scores))


def _encode(sentences: list[Sentence], tokenizer: Any, limit: int, tags: dict[str, int]) -> _Split:
    """Tokenise whole sentences; cut at ``limit`` subwords, keeping the closing special tokens."""
    words = [[form for form, _ in s] for s in sentences]
    enc = tokenizer(words, is_split_into_words=True, add_special_tokens=True, verbose=False)
    split = _Split([], [], [])
    for i, sentence in enumerate(sentences):
        ids, word_ids = list(enc["input_ids"][i]), enc.word_ids(i)
        keep = len(ids)
        if len(ids) > limit:
            tail = 0
            while tail < len(ids) - 1 and word_ids[len(ids) - 1 - tail] is None:
                tail += 1
            tail = min(tail, limit - 1)
            keep = limit - tail
            ids = ids[:keep] + ids[len(ids) - tail :]
        first: dict[int, int] = {}
        for position, word in enumerate(word_ids):
            if word is not None and word not in first:
                first[word] = position
        split.untokenized += len(sentence) - len(first)
        kept = [w for w in sorted(first) if first[w] < keep]
        split.cut += len(first) - len(kept)
        if kept:  # a sentence with no word to score is dropped
            split.ids.append(ids)
            split.first.append([first[w] for w in kept])
            split.labels.append([tags[sentence[w][1]] for w in kept])
    return split


def _batch(split: _Split, members: Sequence[int], pad_id: int) -> _Batch:
    width = max(len(split.ids[i]) for i in members)
    input_ids = torch.full((len(members), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(members), width), dtype=torch.long)
    rows, cols, labels = [], [], []
    for row, i in enumerate(members):
        input_ids[row, : len(split.ids[i])] = torch.tensor(split.ids[i])
        attention[row, : len(split.ids[i])] = 1
        rows += [row] * len(split.first[i])
        cols += split.first[i]
        labels += split.labels[i]
    as_long = torch.tensor
    return _Batch(input_ids, attention, as_long(rows), as_long(cols), as_long(labels))


def _transformers_model(model: Any, batch: _Batch, layer: int) -> torch.Tensor:
    """States of each word's first subword at ``layer``: ``(words, hidden) float32``."""
    outputs = model(
        input_ids=batch.input_ids, attention_mask=batch.attention, output_hidden_states=True
    )
    return outputs.hidden_states[layer][batch.rows, batch.cols].float()


@torch.inference_mode()
def _features(
    model: Any, split: _Split, pad_id: int, options: PosOptions, label: str | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every kept word's state ``(words, hidden) float32`` and tag ``(words,) int64``.

    Sentences run longest first, so a batch pads only to its own longest member; words come out
    in that order, with their tags. A progress bar shows when ``label`` is given.
    """
    was_training = model.training
    model.eval()
    order = sorted(range(len(split.ids)), key=lambda i: -len(split.ids[i]))
    states, labels = [], []
    size = options.batch_size
    with progress_bar(label or "", len(order), options.progress and bool(label)) as advance:
        for start in range(0, len(order), size):
            batch = _batch(split, order[start : start + size], pad_id)
            states.append(_transformers_model(model, batch, options.layer))
            labels.append(batch.labels)
            advance(len(batch.input_ids))
    model.train(was_training)
    return torch.cat(states), torch.cat(labels)


def _accuracy(head: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.inference_mode():
        return float((head(x).argmax(-1) == y).double().mean())


def _snapshot(*modules: torch.nn.Module) -> list[dict[str, torch.Tensor]]:
    return [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in modules]


def _train_probe(
    train: tuple[torch.Tensor, torch.Tensor],
    dev: tuple[torch.Tensor, torch.Tensor],
    n_tags: int,
    options: PosOptions,
) -> tuple[torch.nn.Linear, float, int]:
    """Linear softmax classifier on features ``(words, hidden) float32``; the best dev epoch's.

    Training sees features standardised with train statistics; the returned layer has that
    standardisation folded in, so it takes raw features.
    """
    mean, std = train[0].mean(0), train[0].std(0, correction=0).clamp(min=1e-6)
    x, y = (train[0] - mean) / std, train[1]
    dev = ((dev[0] - mean) / std, dev[1])
    torch.manual_seed(options.seed)
    head = torch.nn.Linear(x.shape[1], n_tags)
    epochs, lr = _schedule("probe", options)
    optimiser = torch.optim.AdamW(head.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(options.seed)
    best, best_epoch, state = -1.0, 0, []
    for epoch in range(1, epochs + 1):
        for chunk in torch.randperm(len(y), generator=generator).split(options.probe_batch_words):
            loss = torch.nn.functional.cross_entropy(head(x[chunk]), y[chunk])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        accuracy = _accuracy(head, *dev)
        log.debug("probe epoch %d: dev accuracy %.4f", epoch, accuracy)
        if accuracy > best:
            best, best_epoch, state = accuracy, epoch, _snapshot(head)
        elif epoch - best_epoch >= options.patience:
            break
    head.load_state_dict(state[0])
    with torch.no_grad():  # W (x - mean) / std + b  ==  (W / std) x + (b - (W / std) mean)
        head.weight.div_(std)
        head.bias.sub_(head.weight @ mean)
    return head, best, best_epoch


def _schedule(mode: str, options: PosOptions) -> tuple[int, float]:
    epochs, lr = MODE_DEFAULTS[mode]
    return options.epochs or epochs, options.lr or lr


def _finetune(
    model: Any, train: _Split, dev: _Split, n_tags: int, pad_id: int, options: PosOptions
) -> tuple[torch.nn.Module, float, int]:
    """Train encoder + linear head (cross-entropy on first subwords); keep the best dev epoch."""
    torch.manual_seed(options.seed)
    head = torch.nn.Sequential(
        torch.nn.Dropout(0.1), torch.nn.Linear(model.config.hidden_size, n_tags)
    )
    epochs, lr = _schedule("finetune", options)
    params = list(model.parameters()) + list(head.parameters())
    optimiser = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    steps = epochs * -(-len(train.ids) // options.batch_size)
    warmup = max(1, steps // 10)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / (steps - warmup + 1)))
    )
    generator = torch.Generator().manual_seed(options.seed)
    best, best_epoch, state = -1.0, 0, []  # epoch 1 always sets the first copy
    for epoch in range(1, epochs + 1):
        order = torch.randperm(len(train.ids), generator=generator).tolist()
        with progress_bar(f"fine-tune epoch {epoch}", len(order), options.progress) as advance:
            for start in range(0, len(order), options.batch_size):
                batch = _batch(train, order[start : start + options.batch_size], pad_id)
                model.train()
                head.train()
                logits = head(_transformers_model(model, batch, options.layer))
                loss = torch.nn.functional.cross_entropy(logits, batch.labels)
                optimiser.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimiser.step()
                scheduler.step()
                advance(len(batch.input_ids))
        head.eval()
        accuracy = _accuracy(head, *_features(model, dev, pad_id, options, None))
        log.info("fine-tune epoch %d: loss %.4f, dev accuracy %.4f", epoch, loss.item(), accuracy)
        if accuracy > best:
            best, best_epoch, state = accuracy, epoch, _snapshot(model, head)
        elif epoch - best_epoch >= options.patience:
            break
    model.load_state_dict(state[0])
    head.load_state_dict(state[1])
    return head.eval(), best, best_epoch


def _load_splits(
    train: Path, dev: Path, test: Path, options: PosOptions
) -> dict[str, list[Sentence]]:
    data = {"train": read_conllu(train), "dev": read_conllu(dev), "test": read_conllu(test)}
    cap = options.max_train_sentences
    if cap is not None and cap < len(data["train"]):
        chosen = sorted(random.Random(options.seed).sample(range(len(data["train"])), cap))
        data["train"] = [data["train"][i] for i in chosen]
    if options.max_eval_sentences is not None:
        for split in ("dev", "test"):
            data[split] = data[split][: options.max_eval_sentences]
    _warn_odd_tags(data)
    return data


def _warn_odd_tags(data: dict[str, list[Sentence]]) -> None:
    """Say which tags are outside UD's 17 (each a class of its own: a typo passes as one) and
    which test tags train never shows (the tagger cannot predict them: F1 0 in macro-F1)."""
    counts = {name: Counter(t for s in split for _, t in s) for name, split in data.items()}
    odd = sorted(set().union(*counts.values()) - UD_UPOS)
    if odd:
        seen = ", ".join(_count(t, sum(c[t] for c in counts.values())) for t in odd[:5])
        log.warning(
            "tags outside UD's 17 UPOS tags, each read as a class of its own: %s%s; check "
            "for a typo (a tag set of your own is scored as given)",
            seen,
            f" and {len(odd) - 5} more" if len(odd) > 5 else "",
        )
    unseen = sorted(set(counts["test"]) - set(counts["train"]))
    if unseen:
        log.warning(
            "test tags that train never shows, which the tagger cannot predict (F1 0 in "
            "macro-F1): %s",
            ", ".join(_count(t, counts["test"][t]) for t in unseen),
        )


def _count(tag: str, words: int) -> str:
    return f"{tag} ({words} word{'s' if words != 1 else ''})"


def _fit_and_predict(
    name: str,
    model: Any,
    encoded: dict[str, _Split],
    n_tags: int,
    pad_id: int,
    mode: Mode,
    options: PosOptions,
) -> tuple[torch.Tensor, torch.Tensor, float, int]:
    """Train the tagger; gold and predicted test tags ``(words,) int64``, dev accuracy, epoch."""

    def extract(split: str) -> tuple[torch.Tensor, torch.Tensor]:
        return _features(model, encoded[split], pad_id, options, f"{name}: {split} states")

    head: torch.nn.Module
    if mode == "probe":
        train = extract("train")
        head, dev_accuracy, best_epoch = _train_probe(train, extract("dev"), n_tags, options)
    else:
        head, dev_accuracy, best_epoch = _finetune(
            model, encoded["train"], encoded["dev"], n_tags, pad_id, options
        )
    x_test, gold = extract("test")
    with torch.inference_mode():
        logits = head(x_test)
    if not bool(logits.isfinite().all()):  # NaN logits argmax to tag 0: a score of nothing
        raise TrainingDivergedError(
            f"model {name!r}: the {mode} tagger diverged at lr {_schedule(mode, options)[1]:g} "
            "(its outputs are not finite) and is not scored; try a lower --lr (lr)"
        )
    return gold, logits.argmax(-1), dev_accuracy, best_epoch


def evaluate_pos(
    ref: ModelRef, train: Path, dev: Path, test: Path, mode: Mode, options: PosOptions | None = None
) -> PosResult:
    """Tag ``test`` with a tagger trained on ``train`` over ``ref``, its epoch picked on ``dev``.

    The tag set is every UPOS tag in the three files. Deterministic given ``options.seed`` (and,
    for a ``random:`` model, the model's own seed).
    """
    options = options or PosOptions()
    _check_mode(mode)
    started = time.perf_counter()
    return _evaluate(ref, _load_splits(train, dev, test, options), mode, options, started)


def _check_mode(mode: str) -> None:
    if mode not in MODE_DEFAULTS:
        raise UserInputError(f"POS evaluation: mode must be probe or finetune, got {mode!r}")


def _evaluate(
    ref: ModelRef, data: dict[str, list[Sentence]], mode: Mode, options: PosOptions, started: float
) -> PosResult:
    """:func:`evaluate_pos` on splits already read (``_load_splits``)."""
    tags = {t: i for i, t in enumerate(sorted({t for s in data.values() for x in s for _, t in x}))}
    refuse_untaggable([ref])
    source = ref.source
    tokenizer, model = source.load_tokenizer(), source.load()
    check_layer(ref.name, model, options.layer)
    limit = max_tokens(model, tokenizer, options.max_length, f"model {ref.name!r}")
    encoded = {name: _encode(s, tokenizer, limit, tags) for name, s in data.items()}
    for split in encoded.values():
        refuse_foreign_ids(f"model {ref.name!r}", model, split.ids)
    empty = next((name for name, split in encoded.items() if not split.ids), None)
    if empty is not None:
        why = (  # a max_length that leaves no room beside the special tokens cuts every word
            f"every word past the {limit} subwords a sentence is cut to (--max_length, its "
            "special tokens included)"
            if encoded[empty].cut
            else "no word its tokenizer can represent"
        )
        raise UserInputError(f"model {ref.name!r}: the {empty} split has {why}")
    pad_id = padding_id(tokenizer.pad_token_id, model)
    gold, predicted, dev_accuracy, best_epoch = _fit_and_predict(
        ref.name, model, encoded, len(tags), pad_id, mode, options
    )
    majority = Counter(t for labels in encoded["train"].labels for t in labels).most_common(1)[0]
    return PosResult(
        model=ref.name,
        mode=mode,
        layer=options.layer,
        accuracy=float((predicted == gold).double().mean()),
        macro_f1=macro_f1(gold.tolist(), predicted.tolist()),
        majority_accuracy=float((gold == majority[0]).double().mean()),
        dev_accuracy=dev_accuracy,
        best_epoch=best_epoch,
        train_sentences=len(encoded["train"].ids),
        test_words=len(gold),
        words_cut=sum(s.cut for s in encoded.values()),
        words_untokenized=sum(s.untokenized for s in encoded.values()),
        seconds=time.perf_counter() - started,
    )


def evaluate_many(
    refs: Sequence[ModelRef],
    train: Path,
    dev: Path,
    test: Path,
    mode: Mode,
    options: PosOptions | None = None,
    out: Path | None = None,
    identity: dict[str, Any] | None = None,
) -> list[PosResult]:
    """:func:`evaluate_pos` per model, the treebank files read once for all of them (each
    result's ``seconds`` is its model's own: loading, training, tagging); with ``out``, results
    are rewritten after each model (a failure leaves those of the models done, and no empty
    directory), under ``out``'s lock (one writer at a time; not into another kind of output),
    with ``identity`` (:func:`evaluation_identity`) in ``pos_config.json``. An interrupted
    evaluation of the same ``identity`` in ``out`` resumes: the models it finished keep their
    recorded results (``pos_results.finished_results``) and are not evaluated again."""
    options = options or PosOptions()
    _check_mode(mode)
    refuse_repeated_names([ref.name for ref in refs])
    results: list[PosResult] = []
    settings = {"train": train, "dev": dev, "test": test, "mode": mode, **options.model_dump()}
    locked = nullcontext() if out is None else run_directory_lock(out, "evaluate-pos")
    with locked, tidy_on_failure(*([out] if out is not None else [])):
        kept = {} if out is None else finished_results(out, identity)
        if any(ref.name in kept for ref in refs):
            names = ", ".join(ref.name for ref in refs if ref.name in kept)
            log.info("resuming the evaluation in %s: kept the results of %s", out, names)
        pending = [ref for ref in refs if ref.name not in kept]
        data = _load_splits(train, dev, test, options) if pending else {}
        for ref in refs:
            if ref.name in kept:
                result = kept[ref.name]
            else:
                result = _evaluate(ref, data, mode, options, time.perf_counter())
                log.info("%s: %s", ref.name, result_summary(result))
            results.append(result)
            if out is not None:
                done = {"identity": identity, "finished": len(results) == len(refs)}
                write_results(results, out, {**settings, **done})
    return results


def refuse_untaggable(refs: Sequence[ModelRef]) -> None:
    """Refuse a model whose hidden states a tagger cannot read word by word: an ONNX graph, a
    file of vectors (a tagger runs a transformers model, frozen or fine-tuned)."""
    for source in (ref.source for ref in refs):
        if not source.transformers_model:
            raise UserInputError(
                f"model {source.name!r} is {source.what}: a tagger reads each word's hidden state "
                "from a transformers model (give a directory, package:NAME or hub id of one)"
            )


def evaluation_identity(
    refs: Sequence[ModelRef], splits: TreebankSplits, mode: Mode, options: PosOptions
) -> dict[str, Any]:
    """What makes an evaluation this one: the sha256 of each treebank file, each model's
    fingerprint (weights, tokenizer, config), the mode and the options (less progress). The
    weights are hashed on each run (no cache: reading them is small beside training a tagger).
    A model of an architecture transformers cannot take is refused here, before any tagger."""
    refuse_repeated_names([ref.name for ref in refs])  # the record keys its models by name
    refuse_untaggable(refs)
    sources = [ref.source.locate() for ref in refs]  # every model found before any is checked
    for source in sources:
        source.check_architecture()
    return {
        "treebank": {
            split: sha256_file(getattr(splits, split)) for split in ("train", "dev", "test")
        },
        "models": {source.name: source.fingerprint() for source in sources},
        "mode": mode,
        "options": options.model_dump(mode="json", exclude={"progress"}),
    }


def evaluate_treebank(
    refs: Sequence[ModelRef],
    treebank: Path,
    mode: Mode,
    options: PosOptions,
    out: Path,
    overwrite: bool = False,
) -> list[PosResult]:
    """``lmalgebra evaluate-pos``: :func:`evaluate_many` on the splits of a treebank directory
    (``conllu.find_splits``), results written to ``out`` (checked before any model is loaded:
    an evaluation of other treebank files, models, mode or options there is refused unless
    ``overwrite``, ``pos_results.claim_evaluation``)."""
    check_directory(out, "output directory")
    splits = find_splits(treebank)
    with run_directory_lock(out, "evaluate-pos"):
        identity = evaluation_identity(refs, splits, mode, options)
        claim_evaluation(out, identity, overwrite)
        return evaluate_many(
            refs, splits.train, splits.dev, splits.test, mode, options, out, identity
        )
