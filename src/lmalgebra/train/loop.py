"""The one training loop: masked-LM pre-training, gold-only and distilled students alike.

What differs between runs is passed in: the model, a batch source (a pure function of the batch
index) and whether the KD term is used. Accelerate handles device placement and mixed precision;
bfloat16 is refused where the hardware lacks it (``core.precision.check_bf16``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch

from lmalgebra.core import interrupt
from lmalgebra.core.allocator import release_free_memory, reuse_freed_memory
from lmalgebra.core.errors import RESTART, TrainingDivergedError, UserInputError, counted, either
from lmalgebra.core.fingerprint import plain
from lmalgebra.core.precision import check_bf16
from lmalgebra.core.progress import progress_bar
from lmalgebra.core.text_files import absent, not_a_directory, not_a_file
from lmalgebra.distributed import barrier, is_main, world
from lmalgebra.storage.atomic import remove_file, write_text_atomic
from lmalgebra.storage.disk_space import naming_file
from lmalgebra.storage.output_paths import directory_kind
from lmalgebra.train.batches import Batch, BatchSource
from lmalgebra.train.checkpoint import (
    checkpointed_step,
    clear_checkpoints,
    load_latest,
    save_checkpoint,
)
from lmalgebra.train.config import OptimisationSpec, TrainingSpec
from lmalgebra.train.data_parallel import check_batch_size, global_values, local_loss, local_part
from lmalgebra.train.dropout import lane_dropout
from lmalgebra.train.losses import LossParts, combined_loss
from lmalgebra.train.masked_head import masked_logits
from lmalgebra.train.run_fingerprint import (
    as_json,
    differences,
    model_part,
    training_fields,
    training_part,
)
from lmalgebra.train.schedules import kd_weight, learning_rate
from lmalgebra.train.validation import BEST, CHECKPOINTS, Validation, ValidationTracker, clear_best

log = logging.getLogger(__name__)
TRAIN_LOG = "train_log.jsonl"  # one line per logged step, which a resumed run cuts back
# another model to train beside a trained one, in the command line's and the Python API's terms

# (model, batch, settings, KD weight) -> the loss parts of one micro-batch
StepLoss = Callable[[Any, Any, TrainingSpec, float], LossParts]


def _optimizer(model: torch.nn.Module, spec: TrainingSpec, device: str) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only; the fused kernel (one pass over each parameter
    instead of a loop of elementwise ops) where torch has one for the device."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in model.named_parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 or "norm" in name.lower() else decay).append(param)
    groups = [
        {"params": decay, "weight_decay": spec.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=spec.lr, fused=device in ("cpu", "cuda") or None)


def _step_loss(model: Any, batch: Batch, spec: TrainingSpec, weight: float) -> LossParts:
    logits = masked_logits(model, batch.head_inputs())
    use_kd = not spec.gold_only and batch.topk_ids is not None
    return combined_loss(
        logits,
        batch.labels,
        weight,
        batch.topk_ids if use_kd else None,
        batch.topk_logprobs if use_kd else None,
        spec.temperature,
    )


def _logged_step(line: str) -> float:
    """The step of a log line; infinity for a line torn by a killed run, so that it is dropped."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return math.inf


def _log_lines(path: Path) -> list[str]:
    """The lines of a training log; bytes that are not UTF-8 (a damaged line, which the
    caller drops as it drops a torn one) read as replacement characters."""
    return path.read_bytes().decode("utf-8", errors="replace").splitlines()


def _has_logged_steps(out: Path) -> bool:
    """Whether ``out``'s training log records a step (a run trained there before)."""
    path = out / TRAIN_LOG
    try:
        lines = _log_lines(path) if path.is_file() else []
    except OSError:
        return False
    return any(0 < _logged_step(ln) < math.inf for ln in lines)


class _Log:
    """Per-step JSONL log (truncated to the resume point) and TensorBoard when installed.

    ``last``: the record of step ``start`` when the log holds it (else empty), what a run that
    resumes with no step left to train returns, as the run that trained that step did."""

    def __init__(self, out: Path, start: int):
        self.path = out / TRAIN_LOG
        lines = _log_lines(self.path) if self.path.is_file() else []
        kept = [ln for ln in lines if _logged_step(ln) <= start]
        if kept:
            write_text_atomic(self.path, "".join(f"{ln}\n" for ln in kept))
        else:  # made by the first step it records: a run stopped before one leaves no log
            remove_file(self.path)
        self.last: dict[str, Any] = {}
        if start and kept and _logged_step(kept[-1]) == start:
            self.last = dict(json.loads(kept[-1]))
        self.board: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.board = SummaryWriter(str(out / "tensorboard"))
        except ImportError:
            pass

    def write(self, record: dict[str, Any]) -> None:
        with naming_file(self.path), self.path.open("a") as handle:
            handle.write(json.dumps(plain(record), allow_nan=False) + "\n")  # NaN as null
        if self.board is not None:
            for key, value in record.items():
                if isinstance(value, float):
                    self.board.add_scalar(key, value, record["step"])


def refuse_fewer_steps(reached: int, steps: int, where: Path, beside: str) -> None:
    """Refuse to train a run that has ``reached`` a later step than ``steps`` (its checkpoints,
    or its saved model): the model saved at the end would replace a trained one with one
    labelled with fewer steps, or with the untrained model (``steps: 0``). ``beside``: how the
    command that trains it trains another model instead (a merge's other student, a pretrain's
    other ``out``), which the refusal offers."""
    if reached > steps:
        raise UserInputError(
            f"{where} holds a run trained {counted(reached, 'step')}: training.steps {steps} would "
            f"replace it; give steps >= {reached}, {RESTART} to train it again from step 0, or "
            f"train another beside it ({beside})"
        )


def refuse_training_parts(out: Path, itself: bool = False) -> None:
    """Refuse a training directory ``out``, or its ``checkpoints/`` or ``best/``, that is there
    but is no directory (a file, a FIFO, a link to nothing): training would stop on it with a
    traceback once it writes there; and a symbolic link in place of a part training writes
    itself (``checkpoints/``, ``best/``, the training log) or (``itself``) of ``out``: training
    writes their files, and ``--restart`` removes checkpoints, through the link, over what it
    names (a directory of the user's elsewhere); and a training log that is there but is no
    file (a directory, a FIFO), which training met only once the model was built; and ``out``
    holding another lmalgebra output (a teacher selection written there), which training had
    filled with its checkpoints."""
    for path in (out, out / CHECKPOINTS, out / BEST):
        if path.is_symlink() and not path.exists():
            raise UserInputError(f"training directory {path} {absent(path)}")
        if path.exists() and not path.is_dir():
            raise UserInputError(f"training directory {path} {not_a_directory(path)}")
    for path in ([out] if itself else []) + [out / CHECKPOINTS, out / BEST, out / TRAIN_LOG]:
        if path.is_symlink():
            raise UserInputError(
                f"training directory {path} is a symbolic link to {path.readlink()}: training "
                f"writes its files there itself and would replace (with {RESTART}, remove) "
                "what the link names; remove the link"
            )
    refuse_held_output(out)
    log = out / TRAIN_LOG
    if log.exists() and not log.is_file():  # a directory, a FIFO: met once the model is built
        raise UserInputError(
            f"training log {log} {not_a_file(log)}: training reads it to resume and writes it; "
            "remove it, then run again"
        )


def refuse_held_output(directory: Path) -> None:
    """Refuse a directory training writes in (a student's, a run of one of its
    ``lambda_candidates``, a teacher's ``training/``) that holds another lmalgebra output (a
    teacher selection written there: ``output_paths.directory_kind``): training had written
    its checkpoints, log and model among that output's files."""
    kind = directory_kind(directory) if directory.is_dir() else None
    if kind is not None:
        raise UserInputError(
            f"training directory {directory} holds {kind[0]} ({kind[1]}): training would write "
            "its checkpoints, log and model among that output's files; move it away, or train "
            "in another directory"
        )


def changed_training(recorded: Any, spec: OptimisationSpec) -> list[str]:
    """The settings that shape every step in which ``spec`` differs from ``recorded`` (a saved
    model's record of its training; None where it has none): ``"key OLD -> NEW"`` each. A
    setting one of them lacks (a record of an older release) is not compared."""
    if not isinstance(recorded, dict):
        return []
    current, saved = training_part(spec), training_fields(recorded)
    return differences(
        {k: v for k, v in saved.items() if k in current},
        {k: v for k, v in current.items() if k in saved},
    )


def refuse_other_training(
    recorded: Any, spec: OptimisationSpec, runs: Iterable[Path], where: Path, beside: str
) -> None:
    """Refuse to train ``spec`` over the model saved at ``where`` with other settings that shape
    every step than it was trained with (``recorded``: its record of them, None where it has
    none) once no checkpoint is left to resume from in any of the directories it trains in
    (``runs``: a student's, each of its ``lambda_candidates``'; ``keep_checkpoints`` 0):
    training would start again from step 0 and replace it, where a checkpoint of other settings
    is refused. Other ``lambda_candidates`` train in other directories, so the checkpoints there
    (an earlier run's, kept by a ``--restart`` of the other layout) are not the saved model's:
    refused whatever they hold (they had been resumed and replaced it). A setting one of them
    lacks (a record of an older release) is not compared. ``beside``: as
    :func:`refuse_fewer_steps` offers it."""
    runs = list(runs)
    changed = changed_training(recorded, spec)
    moved = any(c.startswith("lambda_candidates ") for c in changed)
    kept = any(checkpointed_step(r / CHECKPOINTS) for r in runs)
    if not changed or (kept and not moved):
        return
    shown = "; ".join(f"training.{c}" for c in changed[:3])
    why = f"the checkpoints in {runs[0]} are not its own" if kept else no_checkpoint(recorded, runs)
    untrained = isinstance(recorded, dict) and recorded.get("steps") == 0
    made = "was saved untrained (steps 0)" if untrained else "was trained"
    raise UserInputError(
        f"{where} {made} with other settings ({shown}) and {why}: training would replace "
        f"it; {RESTART} trains it again, or train another beside it ({beside})"
    )


def no_checkpoint(recorded: Any, runs: list[Path]) -> str:
    """Why no checkpoint of ``runs`` is left to resume from, as a refusal says it: the saved
    model's record (``recorded``) kept none, or the directories this training reads hold none
    (checkpoints removed, or those of a run with or without ``lambda_candidates``)."""
    kept = recorded.get("keep_checkpoints") if isinstance(recorded, dict) else None
    if kept == 0 or not runs:
        return "kept no checkpoint (training.keep_checkpoints 0)"
    more = f" and {len(runs) - 1} more hold" if len(runs) > 1 else " holds"
    return f"no checkpoint is left to resume from ({runs[0] / 'checkpoints'}{more} none)"


def refuse_other_inputs_saved(
    recorded: Any, current: dict[str, Any], runs: Iterable[Path], where: Path, training: Any
) -> None:
    """Refuse to train over the model saved at ``where`` when it was made from other inputs
    than ``current`` (``recorded``: its record of them, None where it has none) once no
    checkpoint is left to resume from (``refuse_other_training``'s case): training would start
    again from step 0 and replace it, with its text edited or its sizes changed, unsaid.
    ``training``: its record of its training settings (what ``no_checkpoint`` reads)."""
    runs = list(runs)
    if not isinstance(recorded, dict) or any(checkpointed_step(r / CHECKPOINTS) for r in runs):
        return
    changed = differences(recorded, current)
    if changed:
        raise UserInputError(
            f"{where} was made from other inputs ({'; '.join(changed[:3])}) and "
            f"{no_checkpoint(training, runs)}: training would replace it from step 0; "
            f"{RESTART} trains it again, or give another {either('--out', 'out')}"
        )


def train(
    model: Any,
    source: BatchSource,
    spec: TrainingSpec,
    out: Path,
    progress: bool = True,
    inputs: dict[str, Any] | None = None,
    restart: bool = False,
    step_loss: StepLoss | None = None,
    validation: Validation | None = None,
    *,
    beside: str = "another output directory",
) -> dict[str, Any]:
    """Train ``model`` for ``spec.steps`` optimizer steps, resuming from ``out/checkpoints``.

    ``inputs``: what the data depends on (recipe, store, vocabulary...), recorded with the model
    configuration and training settings in every checkpoint; a checkpoint recorded with others
    is refused, naming what changed. ``restart``: drop existing checkpoints and start at step 0.
    ``step_loss``: the loss of a micro-batch (default: masked-LM gold and KD terms over the
    masked positions of a :class:`Batch`). ``validation``: score the model every few steps on
    examples kept out of training; the best-scoring weights are the run's result, and the run
    stops early once they stop improving (``train.validation``). ``beside``: how the command
    trains another model instead, which a refusal of ``out``'s checkpoints offers.
    """

    refuse_training_parts(out)
    if not restart:
        refuse_fewer_steps(checkpointed_step(out / CHECKPOINTS), spec.steps, out, beside)
    if spec.steps == 0:  # the model as it starts: nothing read, trained or written
        if restart and is_main():  # an earlier training's files are not this model's
            clear_training(out)
        log.info("steps 0: the model is kept as it starts, untrained")
        model.eval()
        return {}
    out.mkdir(parents=True, exist_ok=True)
    world()  # sets up the process group when launched as several processes, before Accelerate
    check_batch_size(spec.batch_size)
    parts = {"model": model_part(model), "training": training_part(spec), **(inputs or {})}
    fingerprint = as_json(parts)
    check_precision(spec)  # before any checkpoint is dropped
    if restart:
        if is_main():
            clear_checkpoints(out / CHECKPOINTS)
        barrier()
    accelerator = _accelerator(spec.mixed_precision)
    torch.manual_seed(spec.seed)
    optimizer = _optimizer(model, spec, accelerator.device.type)
    model, optimizer = accelerator.prepare(model, optimizer)
    state = load_latest(
        out / CHECKPOINTS, accelerator.unwrap_model(model), optimizer.optimizer, fingerprint
    )
    start = int(state["step"]) if state else 0
    if start:
        log.info("resuming from step %d", start)
    elif spec.keep_checkpoints == 0 and not restart and _has_logged_steps(out):
        log.warning(
            "%s: trained before, and training.keep_checkpoints 0 kept no checkpoint to continue "
            "from: training again from step 0, replacing what it saved",
            out,
        )
    if 0 < spec.steps < spec.warmup_steps:  # the default: one given is refused (``config``)
        log.warning(
            "training.warmup_steps %d exceeds training.steps %d: the learning rate rises to "
            "%.3g of training.lr and never reaches it; set training.warmup_steps",
            spec.warmup_steps,
            spec.steps,
            spec.steps / spec.warmup_steps,
        )
    main = is_main()  # only the main rank writes logs and checkpoints
    logger = _Log(out, start) if main else None
    saved = (state or {}).get("extra", {}).get("validation")
    tracker = None if validation is None else ValidationTracker(validation, out, saved, start)
    reuse_freed_memory()  # a step's large temporaries faulted in once, not every step
    model.train()
    last = {} if logger is None else _resumed_record(state, logger)  # no step left: as saved
    masks = (
        lane_dropout(accelerator.unwrap_model(model))
        if spec.dropout_masks == "lanes"
        else contextlib.nullcontext(0)
    )
    with masks, progress_bar(f"train {out.name}", spec.steps, progress) as advance:
        advance(start)
        for step in range(start, spec.steps):
            interrupt.check()  # a Ctrl-C swallowed by a finaliser during the last step
            if tracker is not None and tracker.stopped:
                break
            last = _one_step(
                model, optimizer, accelerator, source, spec, step, step_loss or _step_loss
            )
            checked = tracker is not None and tracker.due(step + 1, spec.steps)
            if tracker is not None and checked:
                last["validation"] = tracker.check(accelerator.unwrap_model(model), step + 1, main)
            ends = step + 1 == spec.steps or (tracker is not None and tracker.stopped)
            if logger is not None and ((step + 1) % spec.log_every == 0 or ends or checked):
                logger.write(last)
            if main and ((step + 1) % spec.checkpoint_every == 0 or ends):
                save_checkpoint(
                    out / CHECKPOINTS,
                    step + 1,
                    accelerator.unwrap_model(model),
                    optimizer.optimizer,
                    {
                        "languages": source.languages,
                        "record": plain(last),
                        **({} if tracker is None else {"validation": tracker.state()}),
                    },
                    keep=max(1, spec.keep_checkpoints),
                    fingerprint=fingerprint,
                )
            advance(1, _status(last))
    if tracker is not None:
        barrier()  # the main rank has written the best weights every rank loads
        tracker.restore(accelerator.unwrap_model(model))
        last = {**last, "best_step": tracker.best_step, "best_validation": tracker.best}
    model.eval()
    release_free_memory()
    return last


def _resumed_record(state: dict[str, Any] | None, logger: _Log) -> dict[str, Any]:
    """The record of the step a run resumes from, what it returns when no step is left to
    train: the one its checkpoint holds (checksummed with it), else (a checkpoint of an older
    release) the training log's. The log's alone had been read: a log damaged or removed since
    gave an empty record, and a finished student trained again was saved with none of its last
    step's figures."""
    record = (state or {}).get("extra", {}).get("record")
    return dict(record) if isinstance(record, dict) else logger.last


def release_checkpoints(out: Path, spec: OptimisationSpec) -> None:
    """Once the trained model is saved: remove ``out``'s checkpoints, and the best validation
    weights it was saved from, where the run keeps none (``keep_checkpoints`` 0)."""
    if spec.keep_checkpoints == 0 and is_main():
        clear_checkpoints(out / CHECKPOINTS)
        clear_best(out)


def clear_training(out: Path) -> None:
    """Remove what training wrote in ``out``: its checkpoints, best validation weights and
    training log (``--restart`` of a run that trains nothing, ``steps: 0``, whose model had
    been saved beside the checkpoints and log of the training it replaced, and resumed from
    them by the next run). A checkpoint holding a file of the user's is refused before anything
    is removed (``clear_checkpoints``): a dry run checks it with ``refuse_uncleared``."""
    clear_checkpoints(out / CHECKPOINTS)
    clear_best(out)
    remove_file(out / TRAIN_LOG)
    with contextlib.suppress(OSError):
        (out / CHECKPOINTS).rmdir()


def clear_training_run(out: Path) -> None:
    """Remove what training wrote in ``out``, a directory a student trains in no more (a
    ``lambda_candidates`` run that ``--restart`` with other candidates, or none, leaves out):
    ``clear_training``, then ``out`` itself where that leaves it empty (a file of the user's
    there is kept, and the directory with it)."""
    if not is_main():
        return
    clear_training(out)
    with contextlib.suppress(OSError):
        out.rmdir()


def _accelerator(mixed_precision: str) -> Any:
    """An ``Accelerator`` in ``mixed_precision``. Accelerate keeps one precision per process and
    refuses another with a traceback: a process that trained one student in float32 and now
    trains one in bfloat16 (a notebook, a sweep) starts from a fresh precision setting; the
    process group (``PartialState``) is kept."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    state = AcceleratorState._shared_state
    if state.get("_mixed_precision", mixed_precision) != mixed_precision:
        AcceleratorState._reset_state(reset_partial_state=False)
    return Accelerator(mixed_precision=mixed_precision)


def check_precision(spec: TrainingSpec) -> None:
    """Refuse bf16 where the device Accelerate trains on (a GPU when there is one) lacks it, and
    fp16 off a GPU (Accelerate would train in float32 while the run recorded fp16): by training,
    and by a dry run of it."""
    if spec.mixed_precision == "no":
        return
    from accelerate import PartialState

    device = PartialState().device
    if spec.mixed_precision == "bf16":
        check_bf16(device, "training.mixed_precision", "use no (float32)")
    elif device.type not in ("cuda", "xpu", "mlu", "npu", "musa", "hpu"):
        raise UserInputError(
            f"training.mixed_precision: fp16 needs a GPU, and training runs on {device} (where "
            "it would train in float32); use no (float32), or bf16 where the hardware has it"
        )


def _status(record: dict[str, Any]) -> str:
    """``loss 2.345, 12,345 tokens/s`` for the progress bar."""
    speed = sum(v for k, v in record.items() if k.startswith("tokens_per_s/"))
    return f"loss {record['loss']:.3f}, {speed:,.0f} tokens/s"


def _one_step(
    model: Any,
    optimizer: Any,
    accelerator: Any,
    source: BatchSource,
    spec: TrainingSpec,
    step: int,
    step_loss: StepLoss,
) -> dict[str, Any]:
    clock = time.perf_counter()
    rate = learning_rate(step, spec.steps, spec.lr, spec.warmup_steps)
    for group in optimizer.param_groups:
        group["lr"] = rate
    weight = (
        0.0
        if spec.gold_only
        else kd_weight(step, spec.steps, spec.lambda_schedule, spec.lambda_value)
    )
    totals = {"loss": 0.0, "mlm": 0.0, "kd": 0.0}
    tokens = torch.zeros(len(source.languages), dtype=torch.long)
    for micro in range(spec.grad_accum):
        # each rank takes its slice of the global batch (all of it in one process)
        batch, share = local_part(source.batch(step * spec.grad_accum + micro))
        batch = batch.to(accelerator.device)
        with accelerator.autocast():
            parts = step_loss(model, batch, spec, weight)
        values = [float(parts.total.detach()), float(parts.mlm.detach()), float(parts.kd.detach())]
        value, mlm, kd = global_values(values, share)
        if not math.isfinite(value):
            raise TrainingDivergedError(
                f"loss is {value} at step {step + 1}; "
                "the last good checkpoint is kept (try a lower learning rate)"
            )
        accelerator.backward(local_loss(parts.total, share, model) / spec.grad_accum)
        totals["loss"] += value / spec.grad_accum
        totals["mlm"] += mlm / spec.grad_accum
        totals["kd"] += kd / spec.grad_accum
        tokens += batch.tokens.cpu()
    accelerator.clip_grad_norm_(model.parameters(), spec.max_grad_norm)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - clock
    record: dict[str, Any] = {"step": step + 1, **totals, "lambda": weight, "lr": rate}
    for lang, count in zip(source.languages, tokens.tolist(), strict=True):
        record[f"tokens_per_s/{lang}"] = count / seconds
    return record
