"""Model cards: the ``README.md`` a Hugging Face model directory carries, for students and teachers.

A card says what the model is, how it was made (from the recipe and training settings) and how to
load it; ``merge evaluate`` fills in its evaluation table. The metadata block at the top follows
the Hub's model-card convention (``library_name``, ``pipeline_tag``, ``tags``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lmalgebra.core.text_files import read_text
from lmalgebra.storage.atomic import write_text_atomic

CARD = "README.md"
EVALUATION = "## Evaluation"


def _facts(rows: Iterable[tuple[str, Any]]) -> str:
    return "\n".join(f"- **{key}**: {value}" for key, value in rows)


_USE = {
    "fill-mask": 'fill = pipeline("fill-mask", model="PATH/TO/THIS/DIRECTORY")',
    "text-generation": 'generate = pipeline("text-generation", model="PATH/TO/THIS/DIRECTORY")',
}


def card_text(
    title: str,
    summary: str,
    facts: Iterable[tuple[str, Any]],
    evaluation: str,
    task: str = "fill-mask",
) -> str:
    """A whole card: metadata, title, what it is, how it was made, how to use, evaluation.

    ``task``: the Hub pipeline tag, ``fill-mask`` or ``text-generation``."""
    return (
        f"---\nlibrary_name: transformers\npipeline_tag: {task}\ntags: [lmalgebra, {task}]\n"
        f"---\n\n# {title}\n\n{summary}\n\n## How it was made\n\n{_facts(facts)}\n\n"
        "## How to use\n\n```python\nfrom transformers import pipeline\n\n"
        f"{_USE[task]}\n"
        "```\n\n"
        f"{EVALUATION}\n\n{evaluation}\n"
    )


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
    kind = "gold-only (MLM on gold labels)" if training["gold_only"] else "distilled (KD + MLM)"
    facts = [
        ("languages and teachers", teachers),
        ("objective", f"{kind}, lambda {training['lambda_schedule']}"),
        ("language sampling", ", ".join(f"{k} {v:.3f}" for k, v in probabilities.items())),
        ("vocabulary", f"{vocab_size} tokens, the union of the teachers' (lmalgebra merge vocab)"),
        ("student", ", ".join(f"{k} {v}" for k, v in recipe["student"].items() if v is not None)),
        (
            "training",
            f"{training['steps']} steps, batch {training['batch_size']}, "
            f"lr {training['lr']}, seed {training['seed']}",
        ),
    ]
    summary = (
        f"`{name}`: a multilingual BERT masked LM distilled by lmalgebra (MergeDistill) from "
        "several teacher masked LMs, each with its own tokenizer and languages. "
        "`lmalgebra.json` beside this card holds the full recipe and teacher hashes."
    )
    waiting = f"Not evaluated yet: `lmalgebra merge evaluate RUN_DIR --student {name}`."
    return card_text(f"{name} (MergeDistill student)", summary, facts, waiting)


def teacher_card(
    language: str,
    examples: int,
    vocab_size: int,
    model: Mapping[str, Any],
    training: Mapping[str, Any],
) -> str:
    """The card of a teacher pre-trained from scratch by ``lmalgebra pretrain``."""
    facts = [
        ("language", language),
        ("data", f"{examples} training examples (held-out examples excluded by id)"),
        ("tokenizer", f"WordPiece, {vocab_size} pieces, trained on the same text"),
        ("model", ", ".join(f"{k} {v}" for k, v in model.items() if v is not None)),
        (
            "training",
            f"{training['steps']} steps, batch {training['batch_size']}, "
            f"lr {training['lr']}, seed {training['seed']}",
        ),
    ]
    summary = (
        f"A small monolingual ({language}) BERT masked LM trained from scratch by "
        "`lmalgebra pretrain`, usable as a MergeDistill teacher."
    )
    return card_text(f"{language} teacher (lmalgebra pretrain)", summary, facts, "Not evaluated.")


def causal_teacher_card(
    language: str,
    examples: int,
    kind: str,
    vocab_size: int,
    model: Mapping[str, Any],
    training: Mapping[str, Any],
) -> str:
    """The card of a causal teacher pre-trained from scratch by ``lmalgebra pretrain --causal``."""
    facts = [
        ("language", language),
        ("data", f"{examples} training examples (held-out examples excluded by id)"),
        ("tokenizer", f"{kind}, {vocab_size} tokens, trained on the same text"),
        ("model", ", ".join(f"{k} {v}" for k, v in model.items() if v is not None)),
        (
            "training",
            f"{training['steps']} steps, batch {training['batch_size']}, "
            f"lr {training['lr']}, seed {training['seed']}",
        ),
    ]
    summary = (
        f"A small monolingual ({language}) GPT-2-style causal LM trained from scratch by "
        "`lmalgebra pretrain --causal`, usable as a causal teacher."
    )
    title = f"{language} causal teacher (lmalgebra pretrain)"
    return card_text(title, summary, facts, "Not evaluated.", "text-generation")


def head_teacher_card(
    language: str,
    examples: int,
    encoder: Mapping[str, str],
    head: str,
    training: Mapping[str, Any],
) -> str:
    """The card of a teacher made by ``lmalgebra pretrain --head-only``: a frozen encoder
    (``encoder``: its ``reference`` and ``weights`` hash) with a masked-LM head fitted here."""
    facts = [
        ("language", language),
        ("data", f"{examples} training examples (held-out examples excluded by id)"),
        ("encoder", f"{encoder['reference']} (frozen; weights sha256 {encoder['weights'][:12]})"),
        ("tokenizer", "the encoder's own"),
        ("head", head),
        (
            "training",
            f"{training['steps']} steps, batch {training['batch_size']}, "
            f"lr {training['lr']}, seed {training['seed']}",
        ),
    ]
    summary = (
        f"A pre-trained encoder, unchanged, with a masked-LM head fitted on {language} text by "
        "`lmalgebra pretrain --head-only`, usable as a MergeDistill teacher."
    )
    title = f"{language} head-only teacher (lmalgebra pretrain --head-only)"
    return card_text(title, summary, facts, "Not evaluated.")


def write_card(directory: Path, text: str) -> Path:
    """Write ``text`` as the card of the model in ``directory``; its path."""
    write_text_atomic(directory / CARD, text)
    return directory / CARD


def add_evaluation(directory: Path, table: str) -> None:
    """Replace the evaluation section of the card in ``directory`` (if it has one) by ``table``."""
    path = directory / CARD
    if not path.is_file():
        return
    head = read_text(path, "model card").split(EVALUATION, 1)[0]
    write_text_atomic(path, f"{head}{EVALUATION}\n\n{table}\n")
