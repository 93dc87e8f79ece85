"""``lmalgebra merge train`` on a causal recipe: a GPT-2-style student with a tokenizer of its own
(or the pre-trained model ``student.init`` names, with its tokenizer), trained from the causal
teacher store with the one loop and a mix of cross-tokenizer losses.

Loss of a micro-batch (each example against the teacher its slot was drawn for)::

    loss = (1 - lambda) * CE + lambda * sum_l w_l * L_l,   l in {mined_kl, uld, alm, sampled}

with ``lambda`` from the recipe's schedule (``training.lambda_schedule``) and ``w_l`` from
``training.objective_mix``; ``{ce: w}`` alone trains on CE only (the baseline). Temperatures of
MinED-KL and ALM: ``training.temperature``. Positions: ALM on chunks, ULD at chunk starts, MinED-KL
and sampled at MinED-aligned positions (``distill.causal.student_data``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.causal.student_data import (
    CausalBatch,
    CausalStoreBatches,
    alignments_for,
)
from lmalgebra.distill.causal.student_init import InitModel, open_init
from lmalgebra.distill.causal.student_model import causal_student
from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.examples import stored_texts
from lmalgebra.distill.layout import LOGPROBS, RunLayout, saved_steps, write_model_directory
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.student import student_inputs
from lmalgebra.distill.teachers import Teacher
from lmalgebra.distributed import is_main
from lmalgebra.train.config import CausalTrainingSpec, TrainingSpec
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
from lmalgebra.train.loop import StepLoss, refuse_fewer_steps, release_checkpoints, train
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


def check_mix(recipe: CausalRecipe, mix: dict[str, float]) -> None:
    """Refuse a loss ``mix`` the recipe's store cannot feed, before the store is read."""
    if "sampled" in mix and recipe.causal.samples == 0:
        raise UserInputError(
            "training.objective_mix: sampled needs drawn tokens in the store; set causal.samples "
            "> 0 and run `lmalgebra merge teach RECIPE` again"
        )


@dataclass(frozen=True)
class CausalStudentData:
    """What a causal student trains on: its batches, its tokenizer and what identifies it, the
    teachers the store was written by, and the model it starts from (None: built fresh)."""

    source: CausalStoreBatches
    tokenizer: Any
    identity: dict[str, Any]
    teachers: dict[str, Teacher]
    init: InitModel | None = None


def causal_student_data(
    recipe: CausalRecipe,
    spec: CausalTrainingSpec,
    mix: dict[str, float],
    teachers: dict[str, Teacher],
) -> CausalStudentData:
    """The batches of ``recipe``'s store (checked: ``teachers``) for the loss ``mix`` (drawn
    tokens only when ``mix`` has ``sampled``), after the checks of a causal student's recipe."""
    check_mix(recipe, mix)

    def training() -> dict[str, list[str]]:
        return stored_texts(recipe.output_dir, sorted(recipe.languages), heldout=False)

    init = open_init(recipe.student, RunLayout(recipe.output_dir).hashes)
    tokenizer, identity = student_tokenizer(recipe, training)
    start = start_token_id(tokenizer)
    assert start is not None  # student_tokenizer refuses a tokenizer without one
    source = CausalStoreBatches(
        recipe.output_dir,
        recipe.teachers_of(spec.teachers),
        {n: t.tokenizer for n, t in teachers.items()},
        tokenizer,
        start,
        recipe.student.max_position_embeddings if init is None else init.positions,
        spec.batch_size,
        spec.sampling_exponent,
        spec.multi_teacher,
        spec.seed,
        samples="sampled" in mix,
        alignments=alignments_for([] if spec.gold_only else [k for k, w in mix.items() if w > 0]),
    )
    return CausalStudentData(source, tokenizer, identity, teachers, init)


def train_causal_student(
    recipe: CausalRecipe,
    name: str,
    spec: CausalTrainingSpec,
    teachers: dict[str, Teacher],
    progress: bool,
    restart: bool,
) -> Path:
    """Train (or resume) the causal student ``name`` of the run on its store (checked:
    ``teachers``); the model goes to ``<name>/model`` (``AutoModelForCausalLM`` with its
    tokenizer)."""
    mix = spec.objective_mix or DEFAULT_MIX
    saved = RunLayout(recipe.output_dir).model(name)
    if not restart:  # a saved student of more steps is not replaced (steps: 0, say)
        refuse_fewer_steps(saved_steps(saved), spec.steps, saved)
    data = causal_student_data(recipe, spec, mix, teachers)
    source, tokenizer = data.source, data.tokenizer
    log.info("language sampling probabilities: %s", source.probabilities)
    layout = RunLayout(recipe.output_dir)
    model = causal_student(recipe.student, tokenizer, spec.seed, data.init)
    # a student started from a model records it (weights hashed): resumed only from that model
    started = {} if data.init is None else {"student_init": data.init.record()}
    inputs = {**student_inputs(recipe, LOGPROBS), "student_tokenizer": data.identity, **started}
    step = causal_step_loss(mix)
    final = train(model, source, spec, layout.student(name), progress, inputs, restart, step)
    target = layout.model(name)
    if not is_main():
        return target
    metadata = {
        "kind": "causal-student",
        "recipe": recipe.model_dump(mode="json"),
        "training": spec.model_dump(),
        "objective_mix": mix,
        "teacher_hashes": {n: t.hashes for n, t in teachers.items()},
        "student_tokenizer": data.identity,
        **started,
        "language_probabilities": source.probabilities,
        "final": final,
    }
    saved = write_model_directory(target, model, tokenizer, metadata)
    release_checkpoints(layout.student(name), spec)
    return saved
