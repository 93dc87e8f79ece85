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
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from lmalgebra.core import plugins
from lmalgebra.core.errors import UserInputError, merge_stage
from lmalgebra.distill.causal.bits_per_byte import score_texts
from lmalgebra.distill.causal.student_data import CausalBatch, CausalStoreBatches
from lmalgebra.distill.causal.student_init import InitModel, open_init
from lmalgebra.distill.causal.student_model import causal_student
from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.examples import stored_texts
from lmalgebra.distill.layout import (
    ANOTHER_STUDENT,
    CHECKPOINTS,
    LOGPROBS,
    RunLayout,
    saved_steps,
    saved_training,
    write_model_directory,
)
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.run.model_card import causal_student_card
from lmalgebra.distill.student import student_inputs
from lmalgebra.distill.teachers import Teacher
from lmalgebra.train.checkpoint import refuse_uncleared
from lmalgebra.train.config import CausalTrainingSpec, TrainingSpec
from lmalgebra.train.cross_tokenizer import LOSSES, Mean, batch_mean, ce_loss, needs_of
from lmalgebra.train.data_parallel import global_mean
from lmalgebra.train.loop import (
    StepLoss,
    clear_training_run,
    refuse_fewer_steps,
    refuse_other_training,
    refuse_training_parts,
    release_checkpoints,
    train,
)
from lmalgebra.train.losses import LossParts
from lmalgebra.train.validation import Validation

log = logging.getLogger(__name__)
DEFAULT_MIX = {"alm": 1.0}


def distillation_term(
    name: str, logits: torch.Tensor, batch: CausalBatch, temperature: float, mean: Mean = batch_mean
) -> torch.Tensor:
    """Loss ``name`` (``train.cross_tokenizer.LOSSES``) of student ``logits (B, S, V)`` against
    the batch's teacher rows, averaged by ``mean`` (over this batch, or ``global_mean`` over the
    global batch of several ranks)."""
    return LOSSES[name].term(logits, batch, temperature, mean)


def causal_step_loss(
    mix: dict[str, float], smoothing: float = 0.0, balance: str = "lambda"
) -> StepLoss:
    """The loop's micro-batch loss for ``mix`` (``training.objective_mix``), with ``smoothing``
    the CE term's label smoothing and ``balance`` ``training.kd_balance``. Each term is a mean over
    the global batch (``global_mean``): on several ranks, each its own count of positions."""
    distilled = {k: w for k, w in mix.items() if k != "ce" and w > 0}

    def step(model: Any, batch: CausalBatch, spec: TrainingSpec, weight: float) -> LossParts:
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        ce = ce_loss(logits, batch.targets, batch.mask, global_mean, smoothing)
        if spec.gold_only or not distilled:
            return LossParts(ce, ce, torch.zeros((), device=ce.device), False)
        kd = sum(
            (
                w * distillation_term(k, logits, batch, spec.temperature, global_mean)
                for k, w in distilled.items()
            ),
            torch.zeros((), device=ce.device),
        )
        if balance == "gradient":
            kd = kd * gradient_ratio(ce, kd, logits)
        return LossParts((1 - weight) * ce + weight * kd, ce, kd, True)

    return step


def gradient_ratio(ce: torch.Tensor, kd: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """``||dCE/dlogits|| / ||dKD/dlogits||``, detached (1 when KD has no gradient): the factor
    that gives the distillation term CE's gradient magnitude on the logits (tokenkit's balancing
    of its losses). On several ranks each rank takes its own factor from its micro-batch."""
    if not kd.requires_grad:
        return torch.ones((), device=kd.device)
    (g_ce,) = torch.autograd.grad(ce, logits, retain_graph=True)
    (g_kd,) = torch.autograd.grad(kd, logits, retain_graph=True)
    norm_kd = g_kd.float().norm()
    if not torch.isfinite(norm_kd) or norm_kd == 0:
        return torch.ones((), device=kd.device)
    return (g_ce.float().norm() / norm_kd).detach()


def check_mix(recipe: CausalRecipe, mix: dict[str, float]) -> None:
    """Refuse a loss ``mix`` the recipe's store cannot feed, before the store is read."""
    drawn = [name for name in mix if "samples" in LOSSES[name].needs]
    if drawn and recipe.causal.samples == 0:
        raise UserInputError(
            f"training.objective_mix: {', '.join(drawn)} needs drawn tokens in the store; set "
            f"causal.samples > 0 and run {merge_stage('teach')} again"
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
    tokens, alignments and maps only as ``mix`` reads them), after the checks of a causal
    student's recipe."""
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
        needs=needs_of([] if spec.gold_only else [k for k, w in mix.items() if w > 0]),
        validation_fraction=spec.validation_fraction,
    )
    if init is not None:  # the init model's own tokenizer, or one of another model
        ids = [int(max(t.ids)) for found in source.encoded for t in found if len(t.ids)]
        init.refuse_foreign_ids(max(ids, default=-1))
    return CausalStudentData(source, tokenizer, identity, teachers, init)


def validation_of(
    spec: CausalTrainingSpec, data: CausalStudentData, context: int
) -> Validation | None:
    """The run's validation (None without one): the mean over languages of the student's bits
    per byte on each language's validation examples (carved out of the training examples, never
    the held-out ones), every ``spec.validation_every`` steps."""
    if not spec.validation_every:
        return None
    texts = data.source.validation

    def score(model: Any) -> float:
        scores = [score_texts(model, data.tokenizer, t, context) for t in texts.values()]
        return sum(s.bits_per_byte for s in scores) / len(scores)

    return Validation(score, spec.validation_every, spec.patience)


def train_causal_student(
    recipe: CausalRecipe,
    name: str,
    spec: CausalTrainingSpec,
    teachers: dict[str, Teacher],
    progress: bool,
    restart: bool,
    *,
    store: str,
) -> Path:
    """Train (or resume) the causal student ``name`` of the run on its store (checked:
    ``teachers``; its identity ``store``, recorded with the student); the model goes to
    ``<name>/model`` (``AutoModelForCausalLM`` with its tokenizer). With ``lambda_candidates``,
    one run per KD weight in ``<name>/lambda-<value>`` and the best on validation is the
    student."""
    mix = spec.objective_mix or DEFAULT_MIX
    layout = RunLayout(recipe.output_dir)
    saved = layout.model(name)
    runs = {None: spec} if spec.lambda_candidates is None else candidate_specs(spec)
    # where each run trains: the student's own directory, or each candidate's alone
    outs = {v: layout.student(name) if v is None else layout.candidate(name, v) for v in runs}
    for value, out in outs.items():  # a candidate's directory is training's own, like a link
        refuse_training_parts(out, itself=value is not None)
    # what the student trained in before and trains in no more (a dropped candidate's run)
    left = [r for r in layout.student_runs(name) if r not in outs.values()] if restart else []
    for out in sorted({*outs.values(), *left}) if restart else []:  # as the dry run, first
        refuse_uncleared(out / CHECKPOINTS)  # a checkpoint holding a user's file
    if not restart:  # a saved student of more steps, or other settings, is not replaced
        refuse_fewer_steps(saved_steps(saved), spec.steps, saved, ANOTHER_STUDENT)
        refuse_other_training(saved_training(saved), spec, outs.values(), saved, ANOTHER_STUDENT)
    data = causal_student_data(recipe, spec, mix, teachers)
    source, tokenizer = data.source, data.tokenizer
    log.info("language sampling probabilities: %s", source.probabilities)
    # a student started from a model records it (weights hashed): resumed only from that model
    started = {} if data.init is None else {"student_init": data.init.record()}
    inputs = {**student_inputs(recipe, LOGPROBS), "student_tokenizer": data.identity, **started}
    step = causal_step_loss(mix, spec.label_smoothing, spec.kd_balance)
    context = recipe.student.max_position_embeddings if data.init is None else data.init.positions
    validation = validation_of(spec, data, context)
    plugins.announce(plugins.CAUSAL_LOSSES, mix)  # its checks passed: training starts
    for out in left:  # its checkpoints and best weights had stayed, and verify checked them
        clear_training_run(out)
    chosen: tuple[float, Any, dict[str, Any]] | None = None
    choice: dict[str, float] = {}
    for value, run_spec in runs.items():
        out = outs[value]
        model = causal_student(recipe.student, tokenizer, spec.seed, data.init)
        final = train(
            model,
            source,
            run_spec,
            out,
            progress,
            inputs,
            restart,
            step,
            validation,
            beside=ANOTHER_STUDENT,
        )
        score = float(final.get("best_validation", math.inf))
        if value is not None:
            choice[f"{value:g}"] = score
        if chosen is None or score < chosen[0]:
            chosen = (score, model, final)
    assert chosen is not None
    _, model, final = chosen
    target = layout.model(name)
    metadata = {
        "kind": "causal-student",
        "recipe": recipe.model_dump(mode="json"),
        "training": spec.model_dump(),
        "objective_mix": mix,
        "teacher_hashes": {n: t.hashes for n, t in teachers.items()},
        "store_sha256": store,
        "student_tokenizer": data.identity,
        **started,
        "language_probabilities": source.probabilities,
        "final": final,
        **({"lambda_choice": choice} if choice else {}),
    }
    what = f"{data.identity['tokenizer']}, {len(tokenizer)} tokens"
    card = causal_student_card(
        name,
        recipe.teachers_of(spec.teachers),
        recipe.student.model_dump(mode="json"),
        spec.model_dump(),
        mix,
        source.probabilities,
        what,
    )
    saved = write_model_directory(target, model, tokenizer, metadata, card)
    for out in outs.values():
        release_checkpoints(out, spec)
    return saved


def candidate_specs(spec: CausalTrainingSpec) -> dict[float | None, CausalTrainingSpec]:
    """One run's settings per KD weight of ``spec.lambda_candidates``, in the order listed."""
    return {
        c: spec.model_copy(update={"lambda_value": c, "lambda_candidates": None})
        for c in spec.lambda_candidates or []
    }
