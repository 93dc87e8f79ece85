"""Before a student trains: the teacher store must have been built from this recipe and these
teachers. Each shard set's key, recomputed from the recipe and the teachers' current hashes, must
equal the key the set was written under; a difference is refused with one line naming what
changed and the stage to run again. Each objective names its sets (``Objective.check_store``).

And the store must count the same examples everywhere (``count_problems``): what training reads
row by row beside another (a teacher's copies beside the examples, its outputs beside its copies)
holds as many rows, shard for shard; ``merge verify`` names the same problems."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from lmalgebra.core.errors import UserInputError, counted, merge_stage
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.distill.layout import RunLayout
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.run_fingerprint import differences


def missing_set(shards: ShardSet, command: str) -> str:
    """How a stage refuses an earlier stage's shard set that is missing, incomplete or whose
    manifest is damaged (``command``: the ``merge`` command that writes it)."""
    if shards.manifest_damaged:
        return (
            f"{shards.manifest_path} is damaged (not as it was written): run "
            f"{merge_stage(command)} again to rebuild the set"
        )
    return f"{shards.directory} is missing or incomplete: run {merge_stage(command)} first"


def check_set(accepted: Sequence[ShardSet], stage: str) -> None:
    """Refuse a missing or incomplete shard set, or one written under none of the ``accepted``
    keys (one per dtype the recipe accepts: ``stale_key``); ``stage``: the ``merge`` command
    that writes it. So is a shard missing or failing its checksum, naming that stage: met as
    training read it, it had been refused asking to run again the command that read it."""
    expected = accepted[0]
    found = ShardSet.existing(expected.directory)
    if not found.complete or not found.records:  # a complete set of nothing feeds no student
        raise UserInputError(missing_set(found, stage))
    problem = stale_key(accepted, stage)
    if problem:
        raise UserInputError(problem)
    damaged = found.damaged()
    if damaged:
        raise UserInputError(
            f"store shard {found.path(damaged[0])} is missing or fails its checksum: run "
            f"{merge_stage(stage)} again to recompute it"
        )


def stale_key(accepted: Sequence[ShardSet], stage: str) -> str | None:
    """A complete set written under none of the ``accepted`` keys, named with what differs from
    the first: a setting of the recipe, the dtype, or a teacher's weights or tokenizer hash
    (None: the set is not there, or is one of them). ``merge verify`` names what training
    refuses here."""
    expected = accepted[0]
    found = ShardSet.existing(expected.directory)
    if not found.complete or found.key in [a.key for a in accepted]:
        return None
    changed = differences(found.key, expected.key)
    shown = "; ".join(changed[:3]) + ("; ..." if len(changed) > 3 else "")
    return (
        f"the store in {expected.directory} was built with a different recipe or teacher "
        f"({shown}): run {merge_stage(stage)} for this recipe"
    )


def shard_rows(shards: ShardSet) -> list[int]:
    """The rows each recorded shard of ``shards`` holds, in shard order (-1: not recorded)."""
    return [_count(shards.records[i].get("rows"), -1) for i in sorted(shards.records)]


def _count(value: object, otherwise: int) -> int:
    """``value`` when it is a count (an int, not a bool, not negative), else ``otherwise``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return otherwise


def bad_record(shards: ShardSet) -> str | None:
    """The first shard record of ``shards`` whose ``rows`` is no count (negative, text, absent),
    named by its field and value: the counts summed over it would name numbers nobody wrote."""
    for index, record in sorted(shards.records.items()):
        if _count(record.get("rows"), -1) < 0:
            value = repr(record["rows"]) if "rows" in record else "nothing"
            name = shards.path(index).name
            return f"{shards.manifest_path}: the record of {name} holds rows {value}, not a count"
    return None


def examples_problems(examples: ShardSet) -> list[str]:
    """A complete examples set (``examples/<lang>``) whose manifest's counts disagree with its
    shards: ``examples`` must be the rows its shards hold, ``heldout`` at most that. What is
    incomplete, unrecorded or damaged is named by the set's own ``problems``."""
    if not (examples.complete and examples.records):
        return []
    again = f"run {merge_stage('prepare')} again"
    bad = bad_record(examples)
    if bad:
        return [f"{bad} ({again})"]
    held = sum(shard_rows(examples))
    counted = _count(examples.summary.get("examples"), -1)
    heldout = _count(examples.summary.get("heldout"), -1)
    if counted != held:
        recorded = examples.summary.get("examples")
        return [
            f"{examples.manifest_path}: records {recorded!r} examples, but its shards hold "
            f"{held} ({again})"
        ]
    if not 0 <= heldout <= counted:
        recorded = examples.summary.get("heldout")
        return [
            f"{examples.manifest_path}: records {recorded!r} held-out examples of {counted} "
            f"({again})"
        ]
    return []


SOURCE_FIELD = "source_sha256"  # in a copy's or output's manifest: what it was computed from


def source_digest(source: ShardSet) -> str:
    """The identity of what ``source`` holds (its shard records, each with its sha256), which a
    set computed from it records (``SOURCE_FIELD``): a set keyed by the same settings but drawn
    again from other text has another."""
    return sha256_json(source.manifest["shards"])


def stale_source(made: ShardSet, source: ShardSet) -> bool:
    """Whether complete ``made`` records being computed from other contents than ``source``
    holds now (a set of an older release, which records none, is read as it is)."""
    recorded = made.summary.get(SOURCE_FIELD)
    return made.complete and recorded is not None and recorded != source_digest(source)


HASHES_FIELD = "teacher_hashes"  # in a copy's or output's manifest: its teacher's files' hashes


def changed_teacher(made: ShardSet, hashes: Mapping[str, str]) -> list[str]:
    """What of its teacher's files complete ``made`` records hashes of other than ``hashes``
    (the teacher's now: ``weights``, ``tokenizer``, ``config``, the ``code`` it ships...): a
    set's key holds the weights' and the tokenizer's hashes alone, so a configuration edited
    since (``hidden_act``, say), which changes the outputs, is told by the record. A set of an
    older release that records none, or a kind of hash it records none of, is read as it is."""
    recorded = made.summary.get(HASHES_FIELD)
    if not made.complete or not isinstance(recorded, dict):
        return []
    return [kind for kind, value in hashes.items() if recorded.get(kind, value) != value]


def aligned_problems(made: ShardSet, source: ShardSet, what: str, stage: str) -> list[str]:
    """``made`` (complete) does not hold, for each shard of ``source`` (complete), a shard of as
    many rows: the stages after read the two side by side, row by row. ``what``: what
    ``source`` holds ("examples", "rows"); ``stage``: the command that rebuilds ``made``."""
    if not (source.complete and made.complete) or bad_record(source):
        return []  # named as incomplete, or its record, already
    bad = bad_record(made)
    if bad:
        return [f"{bad} (run {merge_stage(stage)} again)"]
    rows, expected = shard_rows(made), shard_rows(source)
    if rows == expected and stale_source(made, source):
        return [
            f"{made.directory} was computed from other {what} than {source.directory} holds "
            f"now (run {merge_stage(stage)} again)"
        ]
    if rows == expected:
        return []
    return [
        f"{made.directory}: {counted(len(rows), 'shard')} of {counted(sum(rows), 'row')}, but "
        f"{source.directory} it "
        f"was computed from holds {len(expected)} of {sum(expected)} {what} (run "
        f"{merge_stage(stage)} again)"
    ]


def count_problems(
    examples: ShardSet, copies: Sequence[ShardSet], outputs: Sequence[ShardSet]
) -> list[str]:
    """Where one language's example counts disagree across what the stages after ``prepare``
    read: the examples' manifest against its shards, each teacher's copy of the examples
    (``masked/`` or ``tokens/``) against the examples, and each teacher's outputs (``topk/`` or
    ``logprobs/``, in the order of ``copies``) against its copy; one message per file."""
    problems = examples_problems(examples)
    for copy, output in zip(copies, outputs, strict=True):
        problems += aligned_problems(copy, examples, "examples", "prepare")
        problems += aligned_problems(output, copy, "rows", "teach")
    return problems


def run_count_problems(
    layout: RunLayout, languages: Mapping[str, Sequence[str]], copy: str, outputs: str
) -> list[str]:
    """``count_problems`` of every language of a run (``languages``: language -> its teachers),
    whose teachers' copies are the sets of part ``copy`` and their outputs of part ``outputs``
    (``masked`` and ``topk``, or ``tokens`` and ``logprobs``)."""
    problems = []
    for lang, teachers in languages.items():
        copies, made = (
            [ShardSet.existing(layout.store(part, lang, t)) for t in teachers]
            for part in (copy, outputs)
        )
        problems += count_problems(ShardSet.existing(layout.examples(lang)), copies, made)
    return problems


def refuse_miscounted(
    layout: RunLayout, languages: Mapping[str, Sequence[str]], copy: str, outputs: str
) -> None:
    """Refuse, naming the first file, a run whose example counts disagree
    (``run_count_problems``): before a stage reads them row by row."""
    problems = run_count_problems(layout, languages, copy, outputs)
    if problems:
        raise UserInputError(problems[0])
