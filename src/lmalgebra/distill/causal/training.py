"""``lmalgebra merge train`` on a causal recipe: a GPT-2-style student with a tokenizer of its own,
trained from the causal teacher store with the one loop and a mix of cross-tokenizer losses.

Loss of a micro-batch (each example against the teacher its slot was drawn for)::

    loss = (1 - lambda) * CE + lambda * sum_l w_l * L_l,   l in {mined_kl, uld, alm, sampled}

with ``lambda`` from the recipe's schedule (``training.lambda_schedule``) and ``w_l`` from
``training.objective_mix``; ``{ce: w}`` alone trains on CE only (the baseline). Temperatures of
MinED-KL and ALM: ``training.temperature``. Positions: ALM on chunks, ULD at chunk starts, MinED-KL
and sampled at MinED-aligned positions (``distill.causal_student_data``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.distill.causal.student_data import (
    CausalBatch,
    CausalStoreBatches,
    alignments_for,
)
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.example_store import stored_texts
from lmalgebra.distill.pretrain.causal import build_causal_lm
from lmalgebra.distill.recipe import MergeRecipe
from lmalgebra.distill.store_check import check_store
from lmalgebra.distill.student_inputs import student_inputs
from lmalgebra.distill.teachers import Teacher
from lmalgebra.distill.vocab.token_forms import detect_convention
from lmalgebra.distill.vocab.tokenizer_choice import TokenizerChoice, parse_student_tokenizer
from lmalgebra.distill.vocab.tokenizer_trainers import byte_tokenizer, train_causal_tokenizer
from lmalgebra.distributed import is_main, same_on_every_rank
from lmalgebra.sources.models import ModelRef, load_tokenizer, resolve_directory
from lmalgebra.storage.atomic import write_json_atomic
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.cross_tokenizer_losses import (
    Mean,
    alm_loss,
    batch_mean,
    ce_loss,
    mined_kl,
    sampled_ce,
    uld_loss,
)
from lmalgebra.train.data_parallel import global_mean
from lmalgebra.train.loop import StepLoss, train
from lmalgebra.train.losses import LossParts

log = logging.getLogger(__name__)
DEFAULT_MIX = {"alm": 1.0}


def distillation_term(
    name: str, logits: torch.Tensor, batch: CausalBatch, temperature: float, mean: Mean = batch_mean
) -> torch.Tensor:
    """Loss ``name`` of student ``logits (B, S, V)`` against the batch's teacher rows, averaged
    by ``mean`` (over this batch, or ``global_mean`` over the global batch of several ranks)."""
    identity = torch.arange(logits.shape[-1], device=logits.device)  # ids are student ids
    if name == "mined_kl":
        return mined_kl(
            logits,
            batch.mined,
            batch.topk_ids,
            batch.topk_logprobs,
            identity,
            batch.mask,
            temperature,
            mean=mean,
        )
    if name == "uld":
        return uld_loss(logits, batch.chunk_start, batch.topk_logprobs, batch.mask, mean=mean)
    if name == "alm":
        return alm_loss(
            logits,
            batch.targets,
            batch.mask,
            batch.student_chunk,
            batch.next_logprob,
            batch.teacher_chunk,
            temperature,
            mean=mean,
        )
    if name == "sampled" and batch.sample_ids is not None:
        return sampled_ce(logits, batch.mined, batch.sample_ids, identity, batch.mask, mean=mean)
    raise ValueError(f"no distillation loss {name!r} for this batch")


def causal_step_loss(mix: dict[str, float]) -> StepLoss:
    """The loop's micro-batch loss for ``mix`` (``training.objective_mix``). Each term is a mean
    over the global batch (``global_mean``): on several ranks, each its own count of positions."""
    distilled = {k: w for k, w in mix.items() if k != "ce" and w > 0}

    def step(model: Any, batch: CausalBatch, spec: TrainingSpec, weight: float) -> LossParts:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        ce = ce_loss(logits, batch.targets, batch.mask, mean=global_mean)
        if spec.gold_only or not distilled:
            return LossParts(ce, ce, torch.zeros((), device=ce.device), False)
        kd = sum(
            (
                w * distillation_term(k, logits, batch, spec.temperature, global_mean)
                for k, w in distilled.items()
            ),
            torch.zeros((), device=ce.device),
        )
        return LossParts((1 - weight) * ce + weight * kd, ce, kd, True)

    return step


def _made_tokenizer(choice: TokenizerChoice, recipe: MergeRecipe) -> Any:
    """The tokenizer ``choice`` names: a teacher's or a model's (loaded), a trained one (on the
    run's training examples of every language, in language order) or the byte tokenizer."""
    positions = recipe.student.max_position_embeddings
    if choice.source == "bytes":
        return byte_tokenizer(positions)
    if choice.source == "train":
        texts = stored_texts(recipe.output_dir, sorted(recipe.languages), heldout=False)
        every = [text for lang in sorted(texts) for text in texts[lang]]
        log.info("training the student's %s tokenizer on %d examples", choice, len(every))
        return train_causal_tokenizer(every, choice.kind, choice.vocab_size, positions)
    teacher = recipe.teachers.get(choice.name) if choice.source == "teacher" else None
    ref = teacher.ref(choice.name) if teacher else ModelRef(name="student", path=choice.name)
    return load_tokenizer(ref, resolve_directory(ref))


def student_tokenizer(recipe: MergeRecipe) -> tuple[Any, dict[str, Any]]:
    """The student's tokenizer (``student.tokenizer``, ``distill.tokenizer_choice``) and what
    identifies it; refused without offsets, readable tokens or a start token."""
    given = recipe.student.tokenizer
    if given is None:
        raise UserInputError(
            "a causal recipe's student needs a tokenizer: set student.tokenizer to teacher:NAME, "
            "train:KIND:SIZE, bytes or a model reference"
        )
    choice = parse_student_tokenizer(given, recipe.teachers)
    tokenizer = _made_tokenizer(choice, recipe)
    detect_convention(tokenizer, f"student tokenizer {given!r}")
    if start_token_id(tokenizer) is None:
        raise UserInputError(
            f"student tokenizer {given!r} has neither a beginning-of-sequence nor an "
            "end-of-text token to predict the first token after"
        )
    vocabulary = sha256_json(sorted(tokenizer.get_vocab().items()))
    if not same_on_every_rank(vocabulary):  # each rank builds it: a trained one must agree
        raise RuntimeError(f"student tokenizer {given!r} differs between processes")
    return tokenizer, {"tokenizer": str(choice), "vocabulary": vocabulary}


def _check(recipe: MergeRecipe, mix: dict[str, float]) -> None:
    if recipe.student.init_embeddings != "random":
        raise UserInputError("student.init_embeddings: teachers applies to masked students only")
    if "sampled" in mix and recipe.causal.samples == 0:
        raise UserInputError(
            "training.objective_mix: sampled needs drawn tokens in the store; set causal.samples "
            "> 0 and run `lmalgebra merge teach RECIPE` again"
        )


@dataclass(frozen=True)
class CausalStudentData:
    """What a causal student trains on: its batches, its tokenizer and what identifies it, and
    the teachers the store was written by."""

    source: CausalStoreBatches
    tokenizer: Any
    identity: dict[str, Any]
    teachers: dict[str, Teacher]


def causal_student_data(
    recipe: MergeRecipe, spec: TrainingSpec, mix: dict[str, float]
) -> CausalStudentData:
    """The batches of ``recipe``'s store for the loss ``mix`` (drawn tokens only when ``mix``
    has ``sampled``), after the checks of a causal student's recipe; a store built from another
    recipe or other teachers is refused first (``store_check``)."""
    _check(recipe, mix)
    teachers = check_store(recipe)
    tokenizer, identity = student_tokenizer(recipe)
    start = start_token_id(tokenizer)
    assert start is not None  # student_tokenizer refuses a tokenizer without one
    source = CausalStoreBatches(
        recipe.output_dir,
        {k: v.teachers for k, v in recipe.languages.items()},
        {n: t.tokenizer for n, t in teachers.items()},
        tokenizer,
        start,
        recipe.student.max_position_embeddings,
        spec.batch_size,
        spec.sampling_exponent,
        spec.multi_teacher,
        spec.seed,
        samples="sampled" in mix,
        alignments=alignments_for([] if spec.gold_only else [k for k, w in mix.items() if w > 0]),
    )
    return CausalStudentData(source, tokenizer, identity, teachers)


def train_causal_student(
    recipe: MergeRecipe, name: str, spec: TrainingSpec, progress: bool, restart: bool
) -> Path:
    """Train (or resume) the causal student ``run_dir/<name>``; the model goes to
    ``<name>/model`` (``AutoModelForCausalLM`` with its tokenizer)."""
    mix = spec.objective_mix or DEFAULT_MIX
    data = causal_student_data(recipe, spec, mix)
    source, tokenizer = data.source, data.tokenizer
    log.info("language sampling probabilities: %s", source.probabilities)
    out = recipe.output_dir / name
    model = build_causal_lm(recipe.student, tokenizer, seed=spec.seed)
    inputs = {**student_inputs(recipe), "student_tokenizer": data.identity}
    final = train(model, source, spec, out, progress, inputs, restart, causal_step_loss(mix))
    target = out / "model"
    if not is_main():
        return target
    (target / "lmalgebra.json").unlink(missing_ok=True)  # written last: marks the student complete
    with naming_file(target):
        model.save_pretrained(target)
        tokenizer.save_pretrained(target)
    write_json_atomic(
        target / "lmalgebra.json",
        {
            "kind": "causal-student",
            "recipe": recipe.model_dump(mode="json"),
            "training": spec.model_dump(),
            "objective_mix": mix,
            "teacher_hashes": {n: t.hashes for n, t in data.teachers.items()},
            "student_tokenizer": data.identity,
            "language_probabilities": source.probabilities,
            "final": final,
        },
    )
    return target
