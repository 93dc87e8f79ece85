"""One interface, two objectives: what every MergeDistill objective does, stage by stage.

``Objective`` is written once for both: the stage sequence (``prepare`` -> ``teach`` -> [``vocab``]
-> ``train`` -> ``evaluate``) and what each stage shares (the run directory's lock, the recipe's
copy, the examples, the resumable loops that write each teacher's copies and outputs shard by
shard, the store's checks). What differs is an objective's own: ``distill.masked.objective``
(masked-LM teachers, top-k store, union vocabulary) and ``distill.causal.objective`` (causal
teachers with any tokenizers, log-probability store, a student with a tokenizer of its own): the
store's sets, what makes one shard of each, the training and the evaluation.
``distill.pipeline.objective_of`` chooses one from the recipe, once.
"""

from __future__ import annotations

import contextlib
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
import torch

from lmalgebra.core.errors import UserInputError, either, merge_stage
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.precision import dtype_name
from lmalgebra.core.progress import progress_bar
from lmalgebra.distill.examples import (
    examples_set,
    heldout_digests,
    refuse_edited_corpus,
    require,
    write_examples,
)
from lmalgebra.distill.layout import (
    CARD,
    EVALUATION,
    RUN_SCRATCH,
    RunLayout,
    is_complete,
    model_damage,
    read_marker,
    trusted_model,
)
from lmalgebra.distill.recipe import MergeRecipe, load_recipe, made_in, run_copy_text
from lmalgebra.distill.run.evaluation_record import (
    RECORD,
    Basis,
    RowKind,
    earlier_rows,
    merged,
    read_record,
    student_identity,
    student_order,
    write_record,
)
from lmalgebra.distill.run.inspection import RunInspection
from lmalgebra.distill.run.store_check import (
    HASHES_FIELD,
    SOURCE_FIELD,
    changed_teacher,
    check_set,
    missing_set,
    refuse_miscounted,
    source_digest,
    stale_key,
    stale_source,
)
from lmalgebra.distill.student import student_inputs
from lmalgebra.distill.teachers import (
    Head,
    Inference,
    Teacher,
    accepted_dtypes,
    infer_shards,
    inference_setup,
    load_lm,
    warn_unknown,
)
from lmalgebra.distributed import is_main, main_rank_only, on_main_rank
from lmalgebra.storage.atomic import refuse_special, refuse_unwritable, write_text_atomic
from lmalgebra.storage.csv_tables import Table as CsvTable
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.storage.output_paths import check_directory, holds_kind
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.config import TrainingSpec
from lmalgebra.train.run_fingerprint import differences

# the evaluation's pooling, as a refusal reached from ``merge evaluate`` and from Python names it
POOLING = either("--pooling", "pooling=")
Stage = Literal["prepare", "teach", "vocab", "train", "evaluate"]
STAGES: tuple[Stage, ...] = ("prepare", "teach", "vocab", "train", "evaluate")

log = logging.getLogger(__name__)
SHOWN_STUDENTS = 5  # the stale students verify names by name


def run_dir(self: Objective, **_: Any) -> Path:
    """The directory a stage's lock is held in (``holding_lock``): the recipe's run."""
    return self.recipe.output_dir


@dataclass
class Table:
    """Rows of one kind (instances of ``kind.row``) and the table they are rows of, whose
    columns and their types a DataFrame of them has (an empty one too)."""

    rows: list[Any]
    kind: CsvTable[Any]


@dataclass
class Evaluation:
    """What ``evaluate`` found for a run's students.

    Attributes:
        scores: one row per (language, tokenisation or model, model).
        rdt: student -> language -> RDT in percent (then ``average``), positive when the student
            is better than its teachers.
        markdown: the evaluation as written to ``evaluation/evaluation.md``.
        extra: the objective's further tables by name (causal runs: ``coverage``, the LMD
            coverage of each teacher by each student).
    """

    scores: Table
    rdt: dict[str, dict[str, float]]
    markdown: str
    extra: dict[str, Table] = field(default_factory=dict)


class Objective(ABC):
    """The stages of a recipe of one objective; each resumes what an earlier run finished."""

    kind: ClassVar[str]  # the recipe's ``objective``
    stages: ClassVar[tuple[Stage, ...]]  # the stages this objective has, in order
    # the store's folders: each teacher's copies of the examples (prepare), its outputs (teach)
    store_parts: ClassVar[tuple[str, str]]
    head: ClassVar[Head]  # the teachers' language-model head
    # a copy's columns: its tokens, and those its teacher predicts (which prepare counts)
    columns: ClassVar[tuple[str, str]]
    copying: ClassVar[tuple[str, str]]  # prepare's progress verb; the name of its count
    # the folders of each (language, teacher) training checks, in order, and the stage of each
    trained_from: ClassVar[tuple[tuple[str, str], ...]]
    # the stages whose sets' keys make the store's identity a student records (``store_digest``)
    digested: ClassVar[tuple[str, ...]] = ("prepare", "teach")

    def __init__(self, recipe: MergeRecipe) -> None:
        self.recipe = recipe
        self.layout = RunLayout(recipe.output_dir)

    def runnable(self, asked: Sequence[Stage]) -> list[Stage]:
        """The stages of ``asked`` this objective has, in pipeline order: a stage it lacks (a
        causal recipe's ``vocab``) is skipped in a sequence, and refused in one line, by the
        objective, when asked for alone."""
        if list(asked) == ["vocab"] and "vocab" not in self.stages:
            self.vocab()
        return [s for s in self.stages if s in asked]

    def pairs(self) -> list[tuple[str, str]]:
        """Every (language, teacher) of the recipe, in recipe order."""
        return [(lang, t) for lang, spec in self.recipe.languages.items() for t in spec.teachers]

    @abstractmethod
    def open_teachers(self) -> dict[str, Teacher]:
        """Every teacher of the recipe, checked for this objective before anything is done."""

    @abstractmethod
    def copies_key(self) -> dict[str, Any]:
        """What a teacher's copies depend on besides the examples and its tokenizer."""

    @abstractmethod
    def outputs_key(self, dtype: str) -> dict[str, Any]:
        """What a teacher's outputs computed in ``dtype`` depend on besides its copies, its
        weights and ``top_k`` (``teachers.dtype_key``: the dtype, where not float32)."""

    def copies_set(self, lang: str, teacher: Teacher) -> ShardSet:
        """``teacher``'s copies of language ``lang``'s examples (``prepare``)."""
        part = self.store_parts[0]
        key = {
            "stage": part,
            "examples": examples_set(self.recipe, lang).key,
            "teacher": teacher.name,
            "tokenizer": teacher.hashes["tokenizer"],
            **self.copies_key(),
        }
        return ShardSet(self.layout.store(part, lang, teacher.name), key)

    def outputs_set(self, lang: str, teacher: Teacher, dtype: str) -> ShardSet:
        """``teacher``'s outputs on its copies of ``lang``, computed in ``dtype`` (``teach``)."""
        copies, part = self.store_parts
        key = {
            "stage": part,
            copies: self.copies_set(lang, teacher).key,
            "weights": teacher.hashes["weights"],
            "top_k": self.recipe.top_k,
            **self.outputs_key(dtype),
        }
        return ShardSet(self.layout.store(part, lang, teacher.name), key)

    @abstractmethod
    def copy_shard(
        self, lang: str, teacher: Teacher
    ) -> tuple[Callable[[pa.Table], pa.Table], dict[str, Any]]:
        """What makes a shard of ``teacher``'s copies of a shard of ``lang``'s examples, and what
        the complete set's manifest records of the teacher besides its vocabulary's size."""

    @abstractmethod
    def infer_shard(
        self, teacher: Teacher, compute: torch.dtype
    ) -> tuple[Inference, dict[str, Any]]:
        """What makes a shard of ``teacher``'s outputs (computed in ``compute``) with its model
        from a shard of its copies, and what the complete set's manifest records besides top_k."""

    def write_copy(self, lang: str, teacher: Teacher, examples: pa.Table, progress: bool) -> None:
        """``teacher``'s copies of language ``lang``'s ``examples`` (``prepare``: the main rank
        alone), shard by shard; the shards an interrupted run recorded are kept."""
        shards, rows = self.copies_set(lang, teacher), self.recipe.shard_rows
        source = ShardSet.existing(self.layout.examples(lang))
        restart_stale(shards, source)
        starts = range(0, examples.num_rows, rows)
        todo = set(shards.plan(len(starts), shared=False))
        if shards.complete:
            return
        make, facts = self.copy_shard(lang, teacher)
        (verb, counted), column = self.copying, self.columns[1]
        unknown = [0, 0]  # the teacher's unknown tokens, and all its tokens, in what is written
        with progress_bar(f"{verb} {lang}/{teacher.name}", len(starts), progress) as advance:
            for index, start in enumerate(starts):
                if index in todo:
                    table = make(examples.slice(start, rows))
                    shards.write(index, table, **{counted: len(pc.list_flatten(table[column]))})
                    _count_unknown(unknown, pc.list_flatten(table[self.columns[0]]), teacher)
                advance(1)
        _warn_unknown(unknown, lang, teacher)
        total = sum(int(s[counted]) for s in shards.manifest["shards"])
        vocab = len(teacher.tokenizer)
        made_from = {SOURCE_FIELD: source_digest(source)}
        shards.finish(
            **{counted: total},
            vocab_size=vocab,
            **facts,
            **{HASHES_FIELD: teacher.hashes},
            **made_from,
        )

    def write_outputs(
        self, lang: str, teacher: Teacher, setup: tuple[torch.device, torch.dtype], progress: bool
    ) -> None:
        """``teacher``'s outputs on its copies of ``lang`` (``teach``: every rank its shards), on
        ``setup``'s device and in its dtype (``teachers.inference_setup``)."""
        device, compute = setup
        copies = self.copies_set(lang, teacher)
        require(copies, "prepare")
        ref = self.recipe.teachers[teacher.name].ref(teacher.name)
        infer, facts = self.infer_shard(teacher, compute)

        def load() -> Any:
            return load_lm(ref, teacher.directory, self.head).to(device)

        dtype = dtype_name(compute)
        target, label = self.outputs_set(lang, teacher, dtype), f"teach {lang}/{teacher.name}"
        restart_stale(target, copies)
        changed = changed_teacher(target, teacher.hashes)
        if changed:  # computed by the teacher as it was before (its configuration, say)
            log.warning(
                "%s was computed by teacher %r before its files changed (%s): recomputing it",
                target.directory,
                teacher.name,
                ", ".join(changed),
            )
            target.restart()
        finish = {"top_k": self.recipe.top_k, **facts, "dtype": dtype}
        finish[SOURCE_FIELD] = source_digest(copies)
        finish[HASHES_FIELD] = teacher.hashes
        infer_shards(
            copies, target, label, load, infer, progress, f"teacher {teacher.name!r}", **finish
        )

    @holding_lock("merge prepare", run_dir, RUN_SCRATCH)
    @main_rank_only  # light work: one process writes it, the others wait
    def prepare(self, progress: bool = True) -> None:
        """Examples per language, then each teacher's copy of each example."""
        teachers = self.open_teachers()  # refuses unusable teachers before anything is written
        self.layout.root.mkdir(parents=True, exist_ok=True)
        self.record_recipe()
        for lang in self.recipe.languages:
            examples = write_examples(self.recipe, lang, self.written(lang, teachers, progress))
            for name in self.recipe.languages[lang].teachers:
                self.write_copy(lang, teachers[name], examples, progress)

    def written(self, lang: str, teachers: dict[str, Teacher], progress: bool) -> list[str]:
        """Text a teacher writes for ``lang``, which joins its training examples (none: the
        causal objective's ``teacher_text``)."""
        return []

    @holding_lock("merge teach", run_dir, RUN_SCRATCH)
    def teach(
        self, progress: bool = True, setup: tuple[torch.device, torch.dtype] | None = None
    ) -> None:
        """Offline teacher inference over every copy of every (language, teacher).

        ``setup``: device and dtype already resolved (``teachers.inference_setup``)."""
        setup = setup or inference_setup(self.recipe)  # an unusable device or dtype: refused first
        refuse_unwritable(self.layout.recipe)  # written last: refused before the teachers run
        self.recipe_kept()  # so is a user's file in its place
        teachers = self.open_teachers()
        for lang, name in self.pairs():
            self.write_outputs(lang, teachers[name], setup, progress)
        # the store is now this recipe's (its top_k, say): the run's copy says so, or every
        # command reading the run (evaluate, verify) would call the store another recipe's
        if is_main():  # every rank taught its shards; one writes the record
            self.record_recipe()

    def record_recipe(self) -> None:
        """Write the run's copy of the recipe (``recipe.yaml``), which the commands given the
        run directory read; one there that reads as this recipe is kept as it is (the user's
        own, comments and all, where the run is the recipe's directory: ``output_dir: .``)."""
        if self.recipe_kept():
            return
        write_text_atomic(self.layout.recipe, run_copy_text(self.recipe))

    def recipe_kept(self) -> bool:
        """Whether the run's ``recipe.yaml`` reads as this recipe, kept as it is; refused where
        it is a file of the user's, no run's copy (no ``examples/`` beside it,
        ``output_paths.holds_kind``, nor the line a copy is headed with), which the run's copy
        had replaced unsaid. A damaged copy of a run is written again."""
        if not self.layout.recipe.is_file():
            return False
        with contextlib.suppress(UserInputError):
            if load_recipe(self.layout.recipe).model_dump(mode="json") == self.recipe.model_dump(
                mode="json"
            ):
                return True
        if not holds_kind(self.layout.root, "a merge run") and made_in(self.layout.recipe) is None:
            raise UserInputError(
                f"{self.layout.recipe} is no merge run's copy of its recipe (a file of yours?), "
                "and the run writes its copy there: move the file, or give another output_dir"
            )
        return False

    @abstractmethod
    def vocab(self) -> None:
        """The student vocabulary built from the teachers' (``vocab``); refused, in one line, by
        an objective whose students have none."""

    def check_store(self) -> dict[str, Teacher]:
        """Refuse a store built from another recipe or other teachers (``store_sets``), or one
        whose example counts disagree (the examples' manifest and shards, each teacher's copies
        of them, its outputs on those: ``store_check.count_problems``, as ``merge verify`` names
        them); the teachers, opened."""
        teachers = self.open_teachers()
        written = self.stale_written(teachers)
        if written:
            raise UserInputError(written[0])
        for accepted, stage in self.store_sets(teachers):
            check_set(accepted, stage)
        for problem in self.changed_teachers(teachers).values():  # each set's key holds
            raise UserInputError(problem)
        languages = {lang: spec.teachers for lang, spec in self.recipe.languages.items()}
        refuse_miscounted(self.layout, languages, *self.store_parts)
        return teachers

    def store_sets(self, teachers: dict[str, Teacher]) -> list[tuple[list[ShardSet], str]]:
        """Each shard set training reads, as the sets it accepts (one per dtype the recipe
        accepts, the first in the dtype it asks for), with the ``merge`` stage that writes it:
        what ``check_store`` checks, each teacher's copies before its outputs (a copy made
        with another tokenizer is named for ``prepare``, which makes it again)."""
        dtypes = accepted_dtypes(self.recipe)
        sets: list[tuple[list[ShardSet], str]] = []
        for lang, name in self.pairs():
            teacher = teachers[name]
            sets.append(([self.copies_set(lang, teacher)], "prepare"))
            sets.append(([self.outputs_set(lang, teacher, d) for d in dtypes], "teach"))
        return sets

    def stale_vocabulary(self, teachers: dict[str, Teacher]) -> list[str]:
        """A vocabulary built from other teachers than ``teachers`` (objectives that build one)."""
        return []

    def recorded_inputs(self) -> dict[str, Any]:
        """The parts of a student's checkpoint fingerprint that need no weights read (the
        recipe's data settings, the store's keys): what a dry run compares."""
        return student_inputs(self.recipe, self.store_parts[-1])

    def training_runs(self, name: str, training: TrainingSpec) -> dict[Path, TrainingSpec]:
        """Each directory student ``name`` trains in, with the settings its run there trains
        with (its checkpoints' fingerprints hold them): its own directory and ``training``."""
        return {self.layout.student(name): training}

    def refuse_edited_inputs(self) -> None:
        """What ``prepare`` refuses of inputs edited since it wrote from them, for a dry run,
        which writes nothing: a corpus that no longer gives the stored examples."""
        for lang in self.recipe.languages:
            refuse_edited_corpus(self.recipe, lang)

    def stale_written(self, teachers: dict[str, Teacher]) -> list[str]:
        """Text a teacher wrote for the examples before its weights or tokenizer changed
        (objectives whose recipes have it: the causal ``teacher_text``)."""
        return []

    def stale_store(self) -> list[str]:
        """What ``check_store`` refuses of the store that is there (``merge verify``): each set
        (and vocabulary) built from another recipe or other teachers, or the teachers that cannot
        be opened to tell; a set not yet made is not named here."""
        try:
            teachers = self.open_teachers()
        except UserInputError as err:
            return [f"the store cannot be checked against its teachers: {err}"]
        stale = {a[0].directory: stale_key(a, stage) for a, stage in self.store_sets(teachers)}
        changed = self.changed_teachers(teachers)  # of a set whose key holds
        return (
            self.stale_written(teachers)
            + [p for p in stale.values() if p]
            + [p for d, p in changed.items() if not stale.get(d)]
            + self.stale_vocabulary(teachers)
        )

    def changed_teachers(self, teachers: dict[str, Teacher]) -> dict[Path, str]:
        """Each set of the teachers' outputs computed by its teacher before its files changed
        in a way the set's key does not hold (its configuration: ``store_check.changed_teacher``),
        by directory, as ``check_store`` refuses it; ``teach`` computes it again."""
        problems = {}
        for lang, name in self.pairs():
            found = ShardSet.existing(self.layout.store(self.store_parts[1], lang, name))
            changed = changed_teacher(found, teachers[name].hashes)
            if changed:
                problems[found.directory] = (
                    f"the store in {found.directory} was computed by teacher {name!r} before its "
                    f"files ({teachers[name].directory}) changed ({', '.join(changed)}): run "
                    f"{merge_stage('teach')} again"
                )
        return problems

    def missing_input(self, stage: Stage) -> str | None:
        """How ``stage`` alone refuses the first output of an earlier stage it reads that is
        missing or incomplete (its own message), found without opening a teacher (a dry run
        reads no weights); None when each is there. ``store_parts`` and ``trained_from`` say
        what each stage reads, in the order the stage checks them."""
        copies = self.store_parts[0]
        reads: list[tuple[Path, str]] = []
        if stage == "teach":
            reads = [(self.layout.store(copies, lang, t), "prepare") for lang, t in self.pairs()]
        elif stage == "vocab":
            reads = [(self.layout.examples(lang), "prepare") for lang in self.recipe.languages]
        elif stage in ("train", "evaluate"):  # what training reads, evaluation checks
            reads = [
                (self.layout.store(part, lang, t), writer)
                for lang, t in self.pairs()
                for part, writer in self.trained_from
            ]
        for directory, writer in reads:
            found = ShardSet.existing(directory)
            if not found.complete or not found.records:
                return missing_set(found, writer)
        return None

    def refuse_untrained(self, students: Sequence[str]) -> None:
        """Refuse a student with no saved model to score (a damaged record named as such, not
        read for its teachers), as ``evaluate`` does first, and its dry run."""
        for name in students:
            refuse_special(self.layout.model(name) / CARD, "student model card")
            trusted_model(
                self.layout.model(name),
                f"student {name!r} has no model in {self.layout.model(name)}: run "
                f"{merge_stage('train', name)} first",
            )

    def check_students(self, students: Sequence[str]) -> dict[str, Teacher]:
        """Refuse to score students against teachers or a store other than those they were
        trained from: the store must be the current teachers' (``check_store``), and each saved
        student's record of its teachers' hashes theirs (``stale_student``); the teachers."""
        teachers = self.check_store()
        store = self.store_digest(teachers)
        for name in students:
            problem = self.stale_student(name, teachers, store)
            if problem is not None:
                raise UserInputError(problem)
        return teachers

    def stale_student(self, name: str, teachers: dict[str, Teacher], store: str) -> str | None:
        """How ``check_students`` refuses saved student ``name``: trained from a teacher of
        ``teachers`` as it was before its files changed, or from the store as it was before it
        was built again (``store``: ``store_digest`` of it now); None for a student of these, or
        one not saved (named by the objective's evaluation)."""
        model = self.layout.model(name)
        if not is_complete(model):
            return None
        record = read_marker(model)
        again = f"train it again with {merge_stage('train', name, restart=True)}"
        recorded = record.get("teacher_hashes", {})
        changed = [t for t, h in recorded.items() if t in teachers and teachers[t].hashes != h]
        if changed:
            teacher = teachers[changed[0]]
            return (
                f"student {name!r} was trained from teacher {changed[0]!r} as it was before "
                f"its files ({teacher.directory}) changed: {again}"
            )
        if record.get("store_sha256", store) != store:  # a student of an older release: as is
            recorded_recipe = _store_settings(record.get("recipe"))
            current = _store_settings(self.recipe.model_dump(mode="json"))
            shown = "; ".join(differences(recorded_recipe, current)[:3])
            return (
                f"student {name!r} was trained from the teacher store as it was before it "
                f"was built again ({shown or 'the store was built again'}): {again}, or train "
                f"one of another {either('--name', 'students key')}"
            )
        return None

    def stale_students(self) -> list[str]:
        """What ``check_students`` refuses of the run's saved students whose records read
        (``merge verify``, once the store passes its checks: ``stale_store``)."""
        teachers = self.open_teachers()
        store = self.store_digest(teachers)
        names = [n for n, model in self.layout.saved_students().items() if not model_damage(model)]
        problems = {n: p for n in names if (p := self.stale_student(n, teachers, store))}
        if len(problems) < 2:
            return list(problems.values())
        # one line however many: the first student's, the others named (each said the same)
        shown = ", ".join(map(repr, list(problems)[:SHOWN_STUDENTS]))
        more = (
            f" and {len(problems) - SHOWN_STUDENTS} more" if len(problems) > SHOWN_STUDENTS else ""
        )
        return [
            f"{len(problems)} students were trained from teachers or a store as they were before "
            f"they changed ({shown}{more}): {next(iter(problems.values()))}; train each of the "
            "others again the same way"
        ]

    def store_digest(self, teachers: dict[str, Teacher]) -> str:
        """The identity of the store that training reads (the keys of its sets as written):
        recorded with each student, so that one trained from a store since built again under
        other settings is told from one of this store."""
        sets = [
            ShardSet.existing(accepted[0].directory)
            for accepted, stage in self.store_sets(teachers)
            if stage in self.digested
        ]
        return sha256_json([s.key for s in sets])

    @abstractmethod
    def train(self, name: str, training: TrainingSpec, progress: bool, restart: bool) -> Path:
        """Train (or resume) student ``name`` of the run; its model directory."""

    # the record alone, in an evaluation/ this command created, is no evaluation: a command that
    # fails before its tables takes it back
    @holding_lock("merge evaluate", run_dir, (f"{EVALUATION}/{RECORD}",))
    def evaluate(
        self,
        students: Sequence[str],
        languages: Sequence[str] | None,
        pooling: str | None,
        overwrite: bool = False,
    ) -> Evaluation:
        """Score ``students`` and the teachers on the held-out examples of ``languages`` (None:
        every language); write ``evaluation/``, the rows of other students and languages already
        there kept (``run.evaluation_record``; ``overwrite``: this evaluation's rows alone). Its
        settings are checked first, then the store and the students (``check_students``).

        ``pooling``: how LMD coverage pools a span's states (objectives that measure it).

        Launched as several processes (the Python API under ``torchrun``), the main rank scores
        and writes; the others wait for it and return the same evaluation, read from its record
        (every rank had scored and written the same files)."""

        def read_back() -> Evaluation:
            record = read_record(self.layout.evaluation / RECORD, self.kind, self.row_kinds())
            settings = self.evaluation_settings(pooling)
            everyone, scored = list(record["students"]), list(students)
            return self.publish(record["tables"], everyone, scored, settings, write=False)

        return on_main_rank(
            lambda: self._evaluate(students, languages, pooling, overwrite),
            read_back,
            "merge evaluate",
        )

    def _evaluate(
        self,
        students: Sequence[str],
        languages: Sequence[str] | None,
        pooling: str | None,
        overwrite: bool,
    ) -> Evaluation:
        """``evaluate`` in one process."""
        settings = self.evaluation_settings(pooling)
        check_directory(self.layout.evaluation, "evaluation directory")  # before any scoring
        for problem in self.blocked_outputs([]):  # had been met after the scoring
            raise UserInputError(problem)
        names = list(dict.fromkeys(students))
        self.refuse_untrained(names)
        teachers = self.check_students(names)
        run_languages = list(self.recipe.languages)
        for lang in languages or []:
            if lang not in run_languages:
                raise UserInputError(
                    f"language {lang!r} is not in the run {self.layout.root} "
                    f"(languages: {', '.join(run_languages)})"
                )
        chosen = [lang for lang in run_languages if lang in (languages or run_languages)]
        basis = Basis(
            self.kind,
            settings,
            heldout_digests(self.recipe),
            {name: teacher.hashes for name, teacher in teachers.items()},
        )
        earlier = earlier_rows(self.layout, basis, self.row_kinds(), chosen, names, overwrite)
        fresh = self.score(names, chosen if languages else None, settings)
        everyone = student_order(earlier, names)
        tables = merged(earlier, fresh, self.row_order(everyone))
        identities = {**earlier.students, **{s: student_identity(self.layout, s) for s in names}}
        write_record(self.layout, basis, tables, {s: str(identities[s]) for s in everyone})
        return self.publish(tables, everyone, names, settings)

    def blocked_outputs(self, students: Sequence[str], others: bool = False) -> list[str]:
        """What stands where ``merge evaluate`` writes a file (a directory, a link or a special
        file in place of an evaluation file, or of a saved student's model card, which training
        and evaluation write), each named as the writer refuses it: ``evaluate`` refuses the
        first before any scoring, ``merge verify`` names them all (it had passed a run that the
        next evaluation or training then refused); ``others``: where the run's other commands
        write into ``evaluation/`` too (``scored_files``: ``merge verify``'s)."""
        files = (RECORD, *self.evaluation_files(), *(self.scored_files() if others else ()))
        paths = [self.layout.evaluation / file for file in files]
        paths += [self.layout.model(name) / CARD for name in students]
        problems = []
        for path in paths:
            try:
                refuse_unwritable(path)
            except UserInputError as err:
                problems.append(str(err))
        return problems

    @abstractmethod
    def evaluation_files(self) -> tuple[str, ...]:
        """The files of ``evaluation/`` that ``publish`` writes (its record aside)."""

    def scored_files(self) -> tuple[str, ...]:
        """The files of ``evaluation/`` that commands other than ``merge evaluate`` write (and
        read back, to keep their earlier rows): none but a causal run's."""
        return ()

    @abstractmethod
    def row_kinds(self) -> tuple[RowKind, ...]:
        """The tables of the evaluation's record (``run.evaluation_record``)."""

    @abstractmethod
    def evaluation_settings(self, pooling: str | None) -> dict[str, Any]:
        """The evaluation's settings that change its rows, checked (``pooling``: objectives that
        measure LMD coverage; a refusal names it as ``POOLING`` does)."""

    @abstractmethod
    def score(
        self, students: list[str], languages: list[str] | None, settings: dict[str, Any]
    ) -> dict[str, list[Any]]:
        """The rows of each table of ``row_kinds`` that ``students`` and the teachers score on
        ``languages`` (None: every language)."""

    @abstractmethod
    def row_order(self, students: list[str]) -> dict[str, Any]:
        """Per table, the key that sorts its rows (mappings) as one evaluation of ``students``
        orders them."""

    @abstractmethod
    def evaluation_texts(
        self, tables: dict[str, list[dict[str, Any]]], students: list[str], settings: dict[str, Any]
    ) -> dict[str, str]:
        """The text files ``publish`` writes (the scores, ``rdt.csv``, ``evaluation.md``) by name,
        as every row of ``tables`` makes them: what ``merge verify`` compares the files with."""

    @abstractmethod
    def publish(
        self,
        tables: dict[str, list[dict[str, Any]]],
        students: list[str],
        scored: list[str],
        settings: dict[str, Any],
        write: bool = True,
    ) -> Evaluation:
        """The evaluation of ``students`` made from every row of ``tables`` (scored under
        ``settings``), written to ``evaluation/`` (the scores, ``rdt.csv``, ``evaluation.md``),
        and the model card of each student this command ``scored``; ``write=False``: made, not
        written (the main rank wrote it)."""

    @abstractmethod
    def plan(self, training: TrainingSpec) -> list[dict[str, Any]]:
        """The run planned before anything runs: one row per (language, teacher) with counts,
        the store's bytes and seconds per stage (``distill.run.dry_run``)."""

    @abstractmethod
    def inspect(self) -> RunInspection:
        """What the run directory holds (``distill.run.inspection``'s report)."""


def _store_settings(recipe: Any) -> Any:
    """A recipe (as a mapping) less what no store is built from (where the run is, the student,
    its training), so that a message about a store built again names what changed it."""
    if not isinstance(recipe, dict):
        return recipe
    return {k: v for k, v in recipe.items() if k not in ("output_dir", "student", "training")}


def restart_stale(made: ShardSet, source: ShardSet) -> None:
    """Compute ``made`` again, whole, when it records being computed from other contents than
    ``source`` holds (examples drawn again from edited text under the same settings)."""
    if stale_source(made, source):
        log.warning(
            "%s was computed from what %s held before: recomputing it",
            made.directory,
            source.directory,
        )
        made.restart()


def _count_unknown(counts: list[int], ids: Any, teacher: Teacher) -> None:
    """Add to ``counts`` (unknown, all) the teacher's unknown tokens among ``ids``."""
    unk = teacher.tokenizer.unk_token_id
    if unk is not None:
        counts[0] += int(pc.sum(pc.equal(ids, unk)).as_py() or 0)
    counts[1] += len(ids)


def _warn_unknown(counts: list[int], lang: str, teacher: Teacher) -> None:
    unknown, total = counts  # a teacher that reads much of a language as unknown: it is said
    warn_unknown(f"teacher {teacher.name!r}", unknown, total, lang, teacher.tokenizer.unk_token)
