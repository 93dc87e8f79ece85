"""Verification of a MergeDistill run: every shard set against its manifest, the student
vocabulary (id maps and tokenizer against the checksums in ``vocab_union.json``) and every
student's checkpoints (each file against the sha256 in its ``state.json``, the state against
its own), and every saved student's files against the sha256 its ``lmalgebra.json`` records;
and the example counts the stages after ``prepare`` read, across the examples' manifest and
shards, each teacher's copies and its outputs (``store_check.count_problems``).

What is missing counts as much as what is damaged: once the run holds anything a stage's
outputs were made from (a later stage's files), every set that stage makes for the recipe's
languages and teachers must be there."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.core.errors import RESTART, UserInputError, merge_stage
from lmalgebra.core.text_files import not_a_directory, not_a_file
from lmalgebra.distill.layout import CHECKPOINTS, SHARD_SETS, RunLayout, model_damage
from lmalgebra.distill.recipe import MergeRecipe, run_recipe
from lmalgebra.distill.run.store_check import run_count_problems
from lmalgebra.distill.vocab.union import META_FILE, UnionVocab, read_report
from lmalgebra.storage.completion import STAMP, CompletionStamp
from lmalgebra.storage.shard_set import MANIFEST, SHARD_PREFIX, ShardSet
from lmalgebra.train.checkpoint import checkpoint_dirs, damage, latest_state
from lmalgebra.train.loop import TRAIN_LOG
from lmalgebra.train.run_fingerprint import differences
from lmalgebra.train.validation import best_damage, resume_refusal


def verify_run(run_dir: Path, store_parts: tuple[str, str], vocab: bool) -> list[str]:
    """Every missing, corrupt or incomplete shard set of the run, a damaged vocabulary and
    damaged checkpoints, naming the file. ``store_parts``: the folders of the teachers' copies
    and of their outputs; ``vocab``: whether the objective builds a vocabulary (the run's
    objective says both: ``distill.pipeline.verify``)."""
    layout = RunLayout(run_dir)
    recipe = run_recipe(run_dir)
    problems = missing_parts(layout, recipe, store_parts, vocab)
    for part in SHARD_SETS:
        again = f"run {merge_stage('teach' if part in store_parts[1:] else 'prepare')}"
        for directory in shard_set_directories(layout.root / part):
            problems += ShardSet.existing(directory).problems(f"{again} again")
    languages = {lang: spec.teachers for lang, spec in recipe.languages.items()}
    problems += run_count_problems(layout, languages, *store_parts)
    problems += vocabulary_problems(layout)
    states = {checkpoint: damage(checkpoint) for checkpoint in layout.checkpoints()}
    for path, reason, state in states.values():
        if state is None:
            problems.append(f"checkpoint file {path} is damaged ({reason})")
    whole = {c: found[2] for c, found in states.items() if found[2] is not None}
    problems += [d for run in layout.training_runs() if (d := _mixed(run, whole)) is not None]
    problems += [d for d in map(_best_problem, layout.training_runs()) if d is not None]
    # a student's log is checked where no checkpoint is left (``keep_checkpoints`` 0) too
    logged = {p.parent for p in layout.root.glob(f"*/{TRAIN_LOG}")}
    runs = sorted({*layout.training_runs(), *logged})
    problems += [d for d in map(_log_damage, runs) if d is not None]
    damaged = (model_damage(model) for model in layout.saved_students().values())
    return problems + [f"student model: {damage}" for damage in damaged if damage]


def _mixed(run: Path, states: dict[Path, dict[str, Any]]) -> str | None:
    """A whole checkpoint of ``run`` recorded with other inputs than its newest (copied in from
    another student, say): no training writes both (``--restart`` drops every checkpoint), and
    resuming refuses the newest where it is the stranger. ``states``: each whole checkpoint's."""
    mine = [c for c in checkpoint_dirs(run / CHECKPOINTS) if "fingerprint" in states.get(c, {})]
    for directory in mine[:-1]:
        newest = states[mine[-1]]["fingerprint"]
        if changed := differences(states[directory]["fingerprint"], newest):
            return (
                f"checkpoints {directory} and {mine[-1].name} were written by training runs "
                f"with other inputs ({'; '.join(changed[:2])}): one is not this student's "
                f"(copied from another?); remove it, or train with {RESTART}"
            )
    return None


def _log_damage(run: Path) -> str | None:
    """A training run's log that is there but no file (a directory, a FIFO, a link to
    nothing): training, which reads it to resume, would stop on it."""
    log = run / TRAIN_LOG
    if log.is_file() or not (log.exists() or log.is_symlink()):
        return None
    return f"{log} {not_a_file(log)}: training reads it when it resumes; remove it, then run again"


def missing_parts(
    layout: RunLayout, recipe: MergeRecipe, store_parts: tuple[str, str], vocab: bool
) -> list[str]:
    """Every shard set (and a masked run's vocabulary) that the run's recipe says a stage makes,
    missing although the run holds something made after that stage, in stage order."""
    copy, outputs = store_parts
    pairs = [(lang, t) for lang, spec in recipe.languages.items() for t in spec.teachers]
    written = [lang for lang in recipe.languages if recipe.written_text(lang) is not None]
    stages = [
        ("prepare", [layout.teacher_text(lang) for lang in written]),
        ("prepare", [layout.examples(lang) for lang in recipe.languages]),
        ("prepare", [layout.store(copy, lang, t) for lang, t in pairs]),
        ("teach", [layout.store(outputs, lang, t) for lang, t in pairs]),
    ]
    if vocab:
        stages.append(("vocab", [layout.vocab]))
    trained = list(layout.root.glob("*/model")) + layout.checkpoints()
    problems = not_directories(stages)
    for i, (stage, parts) in enumerate(stages):
        later = [p for _, ps in stages[i + 1 :] for p in ps] + trained
        # a vocabulary without its completion mark (deleted, or cleared by a `merge vocab`
        # stopped before it finished) is no vocabulary to the stages that read it
        missing = [p for p in parts if not p.exists() or (p == layout.vocab and _unmarked(p))]
        if missing and any(p.exists() for p in later):
            what = "missing" if not any(p.exists() for p in missing) else "missing or incomplete"
            problems.append(
                f"{', '.join(map(str, missing))}: {what}, though the run holds what was made from "
                f"{'them' if len(missing) > 1 else 'it'} (run {merge_stage(stage)} "
                "again to rebuild)"
            )
    return problems


def not_directories(stages: list[tuple[str, list[Path]]]) -> list[str]:
    """Each part of ``stages`` whose place holds something that is no directory (a file, a FIFO):
    no stage can read or write the part there."""
    return [
        f"{part} {not_a_directory(part)}: remove it, then run {merge_stage(stage)} again"
        for stage, parts in stages
        for part in parts
        if part.exists() and not part.is_dir()
    ]


def _unmarked(directory: Path) -> bool:
    """Whether ``directory`` lacks its completion mark (one that is there but damaged is named
    by :func:`vocabulary_problems`)."""
    return not ((directory / STAMP).exists() or (directory / STAMP).is_symlink())


def shard_set_directories(root: Path) -> list[Path]:
    """Every directory under ``root`` holding a manifest or a shard: a set whose manifest was
    deleted is found by its shards, and reported, instead of passing unseen."""
    held = (p for p in root.rglob("*") if p.name == MANIFEST or p.name.startswith(SHARD_PREFIX))
    return sorted({p.parent for p in held if p.is_file()})


def vocabulary_problems(layout: RunLayout) -> list[str]:
    """The vocabulary's problem, if a vocabulary was written (``merge vocab``) and is damaged."""
    directory = layout.vocab
    if not (directory / STAMP).is_file() and not (directory / META_FILE).is_file():
        return []
    try:
        UnionVocab.load(directory)
        read_report(directory)
    except UserInputError as err:
        return [str(err)]
    except (OSError, ValueError, KeyError, TypeError) as err:  # a damaged tokenizer.json
        return [f"{directory}: cannot be read ({type(err).__name__}: {err})"]
    if CompletionStamp(directory, "").damaged():  # training would take it for no vocabulary
        return [f"{directory / STAMP} is damaged (run {merge_stage('vocab')} again)"]
    return []


def _best_problem(run: Path) -> str | None:
    """Why the best validation weights of training run ``run`` cannot be restored: damaged
    (``best_damage``), or not those its newest intact checkpoint records as its best, which
    resuming refuses (``resume_refusal``: ``best/`` deleted, or another step's, had passed)."""
    found = latest_state(run / CHECKPOINTS)
    return best_damage(run) or resume_refusal(run, None if found is None else found[1])
