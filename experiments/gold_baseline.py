"""The same student trained by TRL's GOLD trainer (``trl.experimental.gold``), an online teacher.

``real_teachers.py`` runs it beside lmalgebra's stored-teacher students at the same steps, batch
size, learning-rate schedule, weight decay, clipping and training texts. GOLD is off-policy here
(``lmbda=0``: the texts, no student generations) with the forward KL (``beta=0``), and the
student reads ``[start] + tokens`` exactly as lmalgebra's does (pre-tokenised rows with a
completion mask: no chat template).

``attempt_cross_tokenizer`` records what GOLD does with a teacher whose tokenizer is not
byte-level BPE (Gemma's SentencePiece): its cross-tokenizer ULD path refuses it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def _student(init_ref: str, layers: list[int]) -> tuple[Any, Any]:
    from lmalgebra.distill.causal.student_init import init_student, open_init
    from lmalgebra.distill.student import CausalStudentSpec
    from lmalgebra.sources.kinds import source_of

    init = open_init(CausalStudentSpec(init=init_ref, layers=layers), None)
    assert init is not None  # the spec names a model
    tokenizer = source_of(init.ref, init.directory).load_tokenizer()
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return init_student(init), tokenizer


def _teacher(ref_text: str) -> tuple[Any, Path]:
    from lmalgebra.distill.teachers import load_lm
    from lmalgebra.sources.models import ModelRef

    ref = ModelRef.parse(ref_text)
    directory = ref.source.resolve()
    return load_lm(ref, directory, "causal", role="teacher"), directory


def _config(out: Path, training: dict[str, Any], seed: int, cross_tokenizer: bool, teacher: Path):
    from trl.experimental.gold import GOLDConfig

    return GOLDConfig(
        output_dir=str(out),
        per_device_train_batch_size=training["batch_size"],
        max_steps=training["steps"],
        learning_rate=training["lr"],
        warmup_steps=training["warmup_steps"],
        lr_scheduler_type="linear",
        weight_decay=0.01,
        max_grad_norm=1.0,
        seed=seed,
        lmbda=0.0,
        beta=0.0,
        temperature=1.0,
        use_uld_loss=cross_tokenizer,
        teacher_tokenizer_name_or_path=str(teacher),
        max_length=1024,
        report_to=[],
        logging_steps=max(1, training["steps"] // 4),
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        dataloader_num_workers=0,
    )


def _rows(tokenizer: Any, texts: list[str]) -> list[dict[str, Any]]:
    """``[start] + tokens`` per text, the start token alone the prompt (as lmalgebra's student)."""
    from lmalgebra.distill.causal.teachers import start_token_id

    start = start_token_id(tokenizer)
    prompt = tokenizer.decode([start])
    rows = []
    for text in texts:
        ids = [start, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        mask = [0] + [1] * (len(ids) - 1)
        rows.append({"input_ids": ids, "completion_mask": mask, "prompt": prompt})
    return rows


def train_gold(
    out: Path,
    teacher_ref: str,
    init_ref: str,
    layers: list[int],
    texts: list[str],
    training: dict[str, Any],
    seed: int,
) -> dict[str, Any]:
    """Train the student with GOLD against ``teacher_ref`` (same tokenizer as the student); the
    saved model directory and seconds (loading the models, the trainer and training; per step)."""
    from datasets import Dataset
    from trl.experimental.gold import GOLDTrainer

    model_dir = out / "model"
    if (model_dir / "config.json").is_file() and (out / "gold.json").is_file():
        import json

        return dict(json.loads((out / "gold.json").read_text()))
    clock = time.perf_counter()  # loading counted, as in lmalgebra's run
    student, tokenizer = _student(init_ref, layers)
    teacher, directory = _teacher(teacher_ref)
    config = _config(out, training, seed, False, directory)
    trainer = GOLDTrainer(
        model=student,
        teacher_model=teacher,
        args=config,
        train_dataset=Dataset.from_list(_rows(tokenizer, texts)),
        processing_class=tokenizer,
    )
    trainer.train()
    seconds = time.perf_counter() - clock
    trainer.save_model(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    found = {
        "model": str(model_dir),
        "seconds": seconds,
        "seconds_per_step": seconds / training["steps"],
        "trl": __import__("trl").__version__,
    }
    import json

    from lmalgebra.core.fingerprint import plain  # NaN as null: strict JSON readers refuse NaN

    (out / "gold.json").write_text(json.dumps(plain(found), indent=2, allow_nan=False))
    return found


def attempt_cross_tokenizer(
    out: Path, teacher_ref: str, init_ref: str, layers: list[int], text: str
) -> str:
    """One GOLD step with a teacher of another tokenizer (ULD): what TRL says (or ``ran``)."""
    from datasets import Dataset
    from trl.experimental.gold import GOLDTrainer

    student, tokenizer = _student(init_ref, layers)
    teacher, directory = _teacher(teacher_ref)
    training = {"batch_size": 1, "steps": 1, "lr": 1e-5, "warmup_steps": 0}
    config = _config(out, training, 0, True, directory)
    turns = [{"role": "user", "content": "Go on."}, {"role": "assistant", "content": text}]
    rows = [{"messages": turns}]
    try:
        trainer = GOLDTrainer(
            model=student,
            teacher_model=teacher,
            args=config,
            train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer,
        )
        trainer.train()
    except (NotImplementedError, ValueError) as err:
        return f"{type(err).__name__}: {err}"
    return "ran"
