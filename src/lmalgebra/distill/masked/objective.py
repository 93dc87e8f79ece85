"""The masked objective (MergeDistill): masked-LM teachers, each example masked per teacher, the
teachers' top-k at the masked positions, the union vocabulary, a BERT student trained on it, and
held-out masked-token scores against the teachers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.layout import MASKED, RUN_SCRATCH, TOPK
from lmalgebra.distill.masked.inspection import masked_report
from lmalgebra.distill.masked.plan import plan_vocab, zero_topk
from lmalgebra.distill.masked.scores import SCORES
from lmalgebra.distill.masked.store import masking, topk_inference
from lmalgebra.distill.masked.teachers import open_teachers, teacher_tokenizer
from lmalgebra.distill.masked.vocabulary import build_vocabulary, vocab_stamp
from lmalgebra.distill.objective import Evaluation, Objective, Stage, Table, run_dir
from lmalgebra.distill.plan import plan_rows
from lmalgebra.distill.recipe import MaskedRecipe
from lmalgebra.distill.run.inspection import RunInspection
from lmalgebra.distill.teachers import Inference, Teacher, accepted_dtypes, dtype_key
from lmalgebra.distributed import main_rank_only
from lmalgebra.storage.completion import CompletionStamp
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.config import TrainingSpec

if TYPE_CHECKING:
    import pyarrow as pa
    import torch


def _other_teachers(stamp: CompletionStamp) -> str:
    return (
        f"the vocabulary in {stamp.directory} was built from other teachers: "
        "run `lmalgebra merge vocab RECIPE` again"
    )


class MaskedObjective(Objective):
    """The stages of a masked recipe."""

    stages: ClassVar[tuple[Stage, ...]] = ("prepare", "teach", "vocab", "train", "evaluate")
    store_parts = (MASKED, TOPK)
    head = "masked"
    columns = ("input_ids", "positions")
    copying = ("mask", "masked_tokens")
    recipe: MaskedRecipe

    def open_teachers(self) -> dict[str, Teacher]:
        return open_teachers(self.recipe)

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

    def store_sets(self, teachers: dict[str, Teacher]) -> list[tuple[list[ShardSet], str]]:
        dtypes = accepted_dtypes(self.recipe)
        return [
            ([self.outputs_set(lang, teachers[name], d) for d in dtypes], "teach")
            for lang, name in self.pairs()
        ]

    def stale_vocabulary(self, teachers: dict[str, Teacher]) -> list[str]:
        stamp = vocab_stamp(self.recipe, teachers)
        if stamp.damaged() or stamp.recorded() is None or stamp.done():
            return []  # a damaged or missing vocabulary: named as such (``verify``, training)
        return [_other_teachers(stamp)]

    def check_store(self) -> dict[str, Teacher]:
        """The store's checks, then the vocabulary's: refused when damaged, missing or built
        from other teachers."""
        teachers = super().check_store()
        stamp = vocab_stamp(self.recipe, teachers)
        if stamp.damaged():
            raise UserInputError(
                f"{stamp.path} is damaged: run `lmalgebra merge vocab RECIPE` again"
            )
        if stamp.recorded() is None:
            raise UserInputError(
                f"{stamp.directory} is missing: run `lmalgebra merge vocab RECIPE` first"
            )
        if not stamp.done():
            raise UserInputError(_other_teachers(stamp))
        return teachers

    @holding_lock("merge train", run_dir, RUN_SCRATCH)
    def train(self, name: str, training: TrainingSpec, progress: bool, restart: bool) -> Path:
        from lmalgebra.distill.masked.training import train_masked_student

        self.layout.student(name)  # a name that is no plain directory name: refused first
        self.recipe.check_training(training)  # settings before the store, as a dry run
        teachers = self.check_store()
        return train_masked_student(self.recipe, name, training, teachers, progress, restart)

    def evaluate(
        self, students: Sequence[str], languages: Sequence[str] | None, pooling: str | None
    ) -> Evaluation:
        from lmalgebra.distill.masked.evaluation import evaluate_students
        from lmalgebra.distill.masked.scores import markdown

        if pooling is not None:
            raise UserInputError(
                "pooling applies to causal runs only (LMD coverage of their teachers)"
            )
        chosen = list(languages) if languages else None
        self.check_students(students)
        scores, deviations = evaluate_students(self.recipe, list(students), chosen)
        table = Table(scores, list(SCORES.columns))
        return Evaluation(table, deviations, markdown(scores, deviations))

    def plan(self, training: TrainingSpec) -> list[dict[str, Any]]:
        """A ``training.teachers`` or a setting that training refuses is refused first."""
        self.recipe.check_training(training)
        tokenizer = partial(teacher_tokenizer, example_length=self.recipe.example_length)
        return plan_rows(self, training, tokenizer, zero_topk, partial(plan_vocab, self.recipe))

    def inspect(self) -> RunInspection:
        return masked_report(self.layout.root)
