"""The baseline of ``bench_training.py``: a ``transformers.Trainer`` masked LM on the same
examples in the same order as our loop, with the same optimizer settings, every step's start
time recorded."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.student import MaskedStudentSpec
from lmalgebra.train.batches import Batch
from lmalgebra.train.config import TrainingSpec


class MaskedExamples(torch.utils.data.Dataset):
    """Hugging Face MLM examples: input ids and labels (-100 where not masked), unpadded."""

    def __init__(self, batches: list[Batch]):
        self.items: list[tuple[torch.Tensor, torch.Tensor]] = []
        for b in batches:
            labels = torch.full_like(b.input_ids, -100)
            labels[b.rows, b.cols] = b.labels
            for row in range(b.input_ids.shape[0]):
                length = int(b.attention_mask[row].sum())
                self.items.append((b.input_ids[row, :length], labels[row, :length]))

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        ids, labels = self.items[index]
        return {"input_ids": ids, "labels": labels}


def pad_collate(items: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad to the batch's longest example (pad id 0, label -100)."""
    width = max(len(i["input_ids"]) for i in items)
    ids = torch.zeros((len(items), width), dtype=torch.long)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    attention = torch.zeros((len(items), width), dtype=torch.long)
    for row, item in enumerate(items):
        n = len(item["input_ids"])
        ids[row, :n], labels[row, :n], attention[row, :n] = item["input_ids"], item["labels"], 1
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def run_hf(
    batches: list[Batch], student: MaskedStudentSpec, vocab_size: int, spec: TrainingSpec, out: Path
) -> tuple[dict[int, float], dict[str, Any]]:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    starts: dict[int, float] = {}
    seen: dict[str, Any] = {}

    class StepClock(TrainerCallback):  # type: ignore[misc]
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            starts.setdefault(state.global_step, time.perf_counter())
            seen.setdefault("threads", torch.get_num_threads())

    model = build_masked_lm(student, vocab_size, pad_id=0, seed=spec.seed)
    arguments = TrainingArguments(
        output_dir=str(out),
        per_device_train_batch_size=spec.batch_size,
        max_steps=spec.steps,
        learning_rate=spec.lr,
        lr_scheduler_type="linear",
        warmup_steps=spec.warmup_steps,
        optim="adamw_torch_fused",  # the Trainer's default; our loop's AdamW is fused too
        weight_decay=spec.weight_decay,
        max_grad_norm=spec.max_grad_norm,
        train_sampling_strategy="sequential",
        eval_strategy="no",
        save_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
        use_cpu=True,
        seed=spec.seed,
    )
    trainer = Trainer(
        model=model,
        args=arguments,
        train_dataset=MaskedExamples(batches),
        data_collator=pad_collate,
        callbacks=[StepClock()],
    )
    trainer.train()
    seen["optimizer"] = type(trainer.optimizer.optimizer).__name__
    return starts, seen
