"""Model cards: the ``README.md`` a Hugging Face model directory carries, for students and teachers.

One builder (``model_card``) writes every card: what the model is, how it was made (facts from
the recipe and training settings) and how to load it; ``merge evaluate`` fills in its evaluation
table. The metadata block at the top follows the Hub's model-card convention (``library_name``,
``pipeline_tag``, ``tags``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from lmalgebra.core.text_files import read_text
from lmalgebra.distill.layout import CARD
from lmalgebra.storage.atomic import write_text_atomic

EVALUATION = "## Evaluation"
NOT_EVALUATED = "Not evaluated."
Task = Literal["fill-mask", "text-generation"]
_USE = {
    "fill-mask": 'fill = pipeline("fill-mask", model="PATH/TO/THIS/DIRECTORY")',
    "text-generation": 'generate = pipeline("text-generation", model="PATH/TO/THIS/DIRECTORY")',
}


def model_card(
    title: str,
    summary: str,
    facts: Iterable[tuple[str, Any]],
    evaluation: str = NOT_EVALUATED,
    task: Task = "fill-mask",
) -> str:
    """A whole card: metadata, title, what it is, how it was made, how to use, evaluation.

    ``task``: the Hub pipeline tag, ``fill-mask`` or ``text-generation``."""
    made = "\n".join(f"- **{key}**: {value}" for key, value in facts)
    return (
        f"---\nlibrary_name: transformers\npipeline_tag: {task}\ntags: [lmalgebra, {task}]\n"
        f"---\n\n# {title}\n\n{summary}\n\n## How it was made\n\n{made}\n\n"
        "## How to use\n\n```python\nfrom transformers import pipeline\n\n"
        f"{_USE[task]}\n"
        "```\n\n"
        f"{EVALUATION}\n\n{evaluation}\n"
    )


def sizes(spec: Mapping[str, Any]) -> str:
    """``hidden_size 64, num_layers 2, ...``: a model's sizes, unset ones left out."""
    return ", ".join(f"{k} {v}" for k, v in spec.items() if v is not None)


def training_fact(training: Mapping[str, Any]) -> tuple[str, str]:
    """The card's line on a training run: steps, batch, learning rate, seed."""
    return (
        "training",
        f"{training['steps']} steps, batch {training['batch_size']}, "
        f"lr {training['lr']}, seed {training['seed']}",
    )


def teacher_card(
    title: str,
    summary: str,
    language: str,
    examples: int,
    facts: Iterable[tuple[str, Any]],
    training: Mapping[str, Any],
    task: Task = "fill-mask",
) -> str:
    """The card of a teacher made by ``lmalgebra pretrain``: its language and training text,
    ``facts`` (tokenizer, model or encoder and head), its training."""
    data = f"{examples} training examples (held-out examples excluded by id)"
    rows = [("language", language), ("data", data), *facts, training_fact(training)]
    return model_card(title, summary, rows, NOT_EVALUATED, task)


def student_card(
    name: str,
    recipe: Mapping[str, Any],
    training: Mapping[str, Any],
    probabilities: Mapping[str, float],
    vocab_size: int,
) -> str:
    """The card of MergeDistill student ``name`` (``recipe``: the resolved recipe as JSON)."""
    languages = recipe["languages"]
    teachers = "; ".join(
        f"{lang}: {', '.join(spec['teachers'])}" for lang, spec in languages.items()
    )
    gold_only = training["gold_only"]
    kind = "gold-only (MLM on gold labels)" if gold_only else "distilled (KD + MLM), lambda "
    facts = [
        ("languages and teachers", teachers),
        ("objective", kind + ("" if gold_only else training["lambda_schedule"])),
        ("language sampling", ", ".join(f"{k} {v:.3f}" for k, v in probabilities.items())),
        ("vocabulary", f"{vocab_size} tokens, the union of the teachers' (lmalgebra merge vocab)"),
        ("student", sizes(recipe["student"])),
        training_fact(training),
    ]
    names = sorted({t for spec in languages.values() for t in spec["teachers"]})
    how = (
        "trained by lmalgebra on gold labels alone (MergeDistill's gold-only baseline: no "
        "teacher's predictions), in its teachers' tokenisations"
        if gold_only
        else f"distilled by lmalgebra (MergeDistill) from the teacher masked LMs {', '.join(names)}"
    )
    many = "multilingual " if len(languages) > 1 else ""
    summary = (
        f"`{name}`: a {many}BERT masked LM {how}. "
        "`lmalgebra.json` beside this card holds the full recipe and teacher hashes."
    )
    waiting = f"Not evaluated yet: `lmalgebra merge evaluate RUN_DIR --students {name}`."
    return model_card(f"{name} (MergeDistill student)", summary, facts, waiting)


def causal_student_card(
    name: str,
    teachers_of: Mapping[str, list[str]],
    student: Mapping[str, Any],
    training: Mapping[str, Any],
    mix: Mapping[str, float],
    probabilities: Mapping[str, float],
    tokenizer: str,
) -> str:
    """The card of causal student ``name``: its teachers per language, losses, tokenizer, start
    (``student``: the recipe's section as JSON) and training (as JSON)."""
    start = f"from {student['init']}" if student.get("init") else f"random ({sizes(student)})"
    if student.get("layers"):
        start += f", decoder layers {student['layers']}"
    losses = ", ".join(f"{k} {v:g}" for k, v in mix.items())
    distilled = not training["gold_only"] and any(k != "ce" and w > 0 for k, w in mix.items())
    facts = [
        (
            "languages and teachers",
            "; ".join(f"{k}: {', '.join(v)}" for k, v in teachers_of.items()),
        ),
        ("losses", losses + (f"; lambda {training['lambda_schedule']}" if distilled else "")),
        ("tokenizer", tokenizer),
        ("student", start),
        ("language sampling", ", ".join(f"{k} {v:.3f}" for k, v in probabilities.items())),
        training_fact(training),
    ]
    how = (
        "distilled by lmalgebra from teacher causal LMs whose tokenizers may differ from its own"
        if distilled
        else "trained by lmalgebra on its text alone (cross-entropy: no teacher's predictions)"
    )
    summary = (
        f"`{name}`: a causal LM {how}. `lmalgebra.json` beside this card holds the full recipe, "
        "the training settings and the teachers' hashes."
    )
    waiting = f"Not evaluated yet: `lmalgebra merge evaluate RUN_DIR --students {name}`."
    return model_card(f"{name} (causal student)", summary, facts, waiting, "text-generation")


def add_evaluation(directory: Path, table: str) -> None:
    """Replace the evaluation section of the card in ``directory`` (if it has one) by ``table``."""
    path = directory / CARD
    if not path.is_file():
        return
    head = read_text(path, "model card").split(EVALUATION, 1)[0]
    write_text_atomic(path, f"{head}{EVALUATION}\n\n{table}\n")
