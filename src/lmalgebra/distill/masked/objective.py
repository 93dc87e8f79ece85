"""The masked objective (MergeDistill): masked-LM teachers, each example masked per teacher, the
teachers' top-k at the masked positions, the union vocabulary, a BERT student trained on it, and
held-out masked-token scores against the teachers."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lmalgebra.core import plugins
from lmalgebra.core.errors import UserInputError, merge_stage
from lmalgebra.core.text_files import not_a_directory
from lmalgebra.distill.layout import (
    EVALUATION_MD,
    MASKED,
    RDT_FILE,
    RUN_SCRATCH,
    TOPK,
    is_complete,
)
from lmalgebra.distill.masked.inspection import masked_report
from lmalgebra.distill.masked.plan import plan_vocab, zero_topk
from lmalgebra.distill.masked.scores import ACCURACY_PLOT, SCORES, Score
from lmalgebra.distill.masked.store import masking, topk_inference
from lmalgebra.distill.masked.teachers import open_teachers, teacher_tokenizer
from lmalgebra.distill.masked.vocabulary import build_vocabulary, vocab_stamp
from lmalgebra.distill.objective import POOLING, Evaluation, Objective, Stage, Table, run_dir
from lmalgebra.distill.plan import plan_rows
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.run.evaluation_record import RowKind
from lmalgebra.distill.run.inspection import RunInspection
from lmalgebra.distill.teachers import Inference, Teacher, dtype_key
from lmalgebra.distributed import main_rank_only
from lmalgebra.storage.completion import CompletionStamp
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.train.config import TrainingSpec

if TYPE_CHECKING:
    import pyarrow as pa
    import torch


def _other_teachers(stamp: CompletionStamp) -> str:
    return (
        f"the vocabulary in {stamp.directory} was built from other teachers: "
        f"run {merge_stage('vocab')} again"
    )


def _vocab_problem(stamp: CompletionStamp) -> str | None:
    """How training refuses a vocabulary that is damaged or missing (None: it is there)."""
    directory = stamp.directory
    if (directory.exists() or directory.is_symlink()) and not directory.is_dir():
        what = not_a_directory(directory)
        return f"{directory} {what}: remove it, then run {merge_stage('vocab')}"
    if stamp.damaged():
        return f"{stamp.path} is damaged: run {merge_stage('vocab')} again"
    if stamp.recorded() is None:
        return f"{stamp.directory} is missing: run {merge_stage('vocab')} first"
    from lmalgebra.distill.vocab.union import UnionVocab

    try:  # its files edited or cut short since: read as training reads them (the dry run too)
        UnionVocab.load(stamp.directory)
    except UserInputError as err:
        return str(err)
    return None


class MaskedObjective(Objective):
    """The stages of a masked recipe."""

    kind = "masked"
    stages: ClassVar[tuple[Stage, ...]] = ("prepare", "teach", "vocab", "train", "evaluate")
    store_parts = (MASKED, TOPK)
    head = "masked"
    columns = ("input_ids", "positions")
    copying = ("mask", "masked_tokens")
    trained_from = ((MASKED, "prepare"), (TOPK, "teach"))
    digested = ("teach",)  # each output's key holds its copies': as students have recorded it
    recipe: MaskedRecipe

    def open_teachers(self) -> dict[str, Teacher]:
        return open_teachers(self.recipe)

    def recorded_inputs(self) -> dict[str, Any]:
        """The base's, and the vocabulary, embedding initialisation and model configuration a
        masked student's checkpoints record (a dry run had planned resuming one of others)."""
        from lmalgebra.distill.masked.training import masked_inputs, planned_model

        return {**masked_inputs(self.recipe), **planned_model(self.recipe)}

    def copies_key(self) -> dict[str, Any]:
        masking = self.recipe.masking.model_dump(mode="json")
        return {"masking": masking, "example_length": self.recipe.example_length}

    def outputs_key(self, dtype: str) -> dict[str, Any]:
        return dtype_key(dtype)

    def copy_shard(
        self, lang: str, teacher: Teacher
    ) -> tuple[Callable[[pa.Table], pa.Table], dict[str, Any]]:
        return masking(self.recipe, teacher), {}

    def infer_shard(
        self, teacher: Teacher, compute: torch.dtype
    ) -> tuple[Inference, dict[str, Any]]:
        return topk_inference(self.recipe, teacher, compute), {}

    @holding_lock("merge vocab", run_dir, RUN_SCRATCH)
    @main_rank_only
    def vocab(self) -> None:
        """The union student vocabulary, teacher->student id maps, student tokenizer and report."""
        build_vocabulary(self.recipe, self.open_teachers())

    def stale_vocabulary(self, teachers: dict[str, Teacher]) -> list[str]:
        stamp = vocab_stamp(self.recipe, teachers)
        if stamp.damaged() or stamp.recorded() is None or stamp.done():
            return []  # a damaged or missing vocabulary: named as such (``verify``, training)
        return [_other_teachers(stamp)]

    def stale_student(self, name: str, teachers: dict[str, Teacher], store: str) -> str | None:
        """Also a saved student trained on the union vocabulary as it was before it was built
        again (its copy of ``vocab_union.json`` is not the run's: teachers in another order give
        other ids), whose ids the run's maps no longer give."""
        from lmalgebra.distill.vocab.union import META_FILE

        problem = super().stale_student(name, teachers, store)
        model = self.layout.model(name)
        own, current = model / META_FILE, self.layout.vocab / META_FILE
        if problem is not None or not (is_complete(model) and own.is_file() and current.is_file()):
            return problem
        if own.read_bytes() == current.read_bytes():
            return None
        return (
            f"student {name!r} was trained on the union vocabulary as it was before it was "
            f"built again ({self.layout.vocab}), whose ids are not its own: train it again with "
            f"{merge_stage('train', name, restart=True)}"
        )

    def missing_input(self, stage: Stage) -> str | None:
        found = super().missing_input(stage)
        if found is not None or stage != "train":
            return found
        stamp = CompletionStamp(self.layout.vocab, "")  # whatever its key: read, not compared
        return _vocab_problem(stamp)

    def check_store(self) -> dict[str, Teacher]:
        """The store's checks, then the vocabulary's: refused when damaged, missing or built
        from other teachers."""
        teachers = super().check_store()
        stamp = vocab_stamp(self.recipe, teachers)
        problem = _vocab_problem(stamp)
        if problem is not None:
            raise UserInputError(problem)
        if not stamp.done():
            raise UserInputError(_other_teachers(stamp))
        return teachers

    @holding_lock("merge train", run_dir, RUN_SCRATCH)
    def train(self, name: str, training: TrainingSpec, progress: bool, restart: bool) -> Path:
        from lmalgebra.distill.masked.training import train_masked_student

        self.layout.student(name)  # a name that is no plain directory name: refused first
        self.recipe.check_training(training)  # settings before the store, as a dry run
        teachers = self.check_store()
        return train_masked_student(
            self.recipe,
            name,
            training,
            teachers,
            progress,
            restart,
            store=self.store_digest(teachers),
        )

    def evaluation_files(self) -> tuple[str, ...]:
        return (SCORES.file, RDT_FILE, EVALUATION_MD, ACCURACY_PLOT)

    def row_kinds(self) -> tuple[RowKind, ...]:
        return (RowKind("scores", Score),)

    def evaluation_settings(self, pooling: str | None) -> dict[str, Any]:
        if pooling is not None:
            raise UserInputError(
                f"{POOLING} {pooling!r} would be ignored: it applies to causal runs only (LMD "
                "coverage of their teachers)"
            )
        return {}

    def score(
        self, students: list[str], languages: list[str] | None, settings: dict[str, Any]
    ) -> dict[str, list[Any]]:
        from lmalgebra.distill.masked.evaluation import evaluate_run

        return {"scores": evaluate_run(self.recipe, students, languages)}

    def row_order(self, students: list[str]) -> dict[str, Any]:
        languages = list(self.recipe.languages)

        def key(row: dict[str, Any]) -> tuple[int, int, int]:
            teachers = self.recipe.languages[row["language"]].teachers
            model = 0 if row["model"] == row["teacher"] else 1 + students.index(row["model"])
            return languages.index(row["language"]), teachers.index(row["teacher"]), model

        return {"scores": key}

    def evaluation_texts(
        self, tables: dict[str, list[dict[str, Any]]], students: list[str], settings: dict[str, Any]
    ) -> dict[str, str]:
        from lmalgebra.distill.masked.scores import evaluation_texts, score_rdt

        scores = [Score(**row) for row in tables["scores"]]
        return evaluation_texts(scores, {name: score_rdt(scores, name) for name in students})

    def publish(
        self,
        tables: dict[str, list[dict[str, Any]]],
        students: list[str],
        scored: list[str],
        settings: dict[str, Any],
        write: bool = True,
    ) -> Evaluation:
        from lmalgebra.distill.masked.scores import markdown, score_rdt, write_evaluation
        from lmalgebra.distill.run.model_card import add_evaluation

        scores = [Score(**row) for row in tables["scores"]]
        deviations = {name: score_rdt(scores, name) for name in students}
        if write:
            write_evaluation(self.layout.evaluation, scores, deviations)
            for name in scored:
                mine = [s for s in scores if s.model in (name, s.teacher)]
                add_evaluation(self.layout.model(name), markdown(mine, {name: deviations[name]}))
        table = Table(scores, SCORES)
        return Evaluation(table, deviations, markdown(scores, deviations))

    def plan(self, training: TrainingSpec) -> list[dict[str, Any]]:
        """A ``training.teachers``, a setting or an ``init_embeddings`` entry point that
        training refuses is refused first."""
        self.recipe.check_training(training)
        self.recipe.student.embedding_init()
        tokenizer = partial(teacher_tokenizer, example_length=self.recipe.example_length)
        rows = plan_rows(self, training, tokenizer, zero_topk, partial(plan_vocab, self.recipe))
        plugins.announce(plugins.EMBEDDING_INITS, [self.recipe.student.init_embeddings])
        return rows

    def inspect(self) -> RunInspection:
        return masked_report(self.layout.root)
