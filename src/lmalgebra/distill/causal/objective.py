"""The causal objective: causal LM teachers with any tokenizers, examples cut by text, each
teacher's next-token log-probabilities at every position, a GPT-2-style student with a tokenizer
of its own trained with cross-tokenizer losses, and held-out bits per byte against the teachers."""

from __future__ import annotations

import typing
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from lmalgebra.core import plugins
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import validate
from lmalgebra.distill.causal.inspection import causal_report
from lmalgebra.distill.causal.plan import plan_student, zero_logprobs
from lmalgebra.distill.causal.store import OFFSETS_RULES, logprobs_inference, tokens_table
from lmalgebra.distill.causal.teachers import open_teachers, start_token_id, teacher_tokenizer
from lmalgebra.distill.layout import EVALUATION_MD, LOGPROBS, RDT_FILE, RUN_SCRATCH, TOKENS
from lmalgebra.distill.objective import POOLING, Evaluation, Objective, Stage, Table, run_dir
from lmalgebra.distill.plan import plan_rows
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.run.evaluation_record import RowKind
from lmalgebra.distill.run.inspection import RunInspection
from lmalgebra.distill.run.store_check import missing_set
from lmalgebra.distill.teachers import Inference, Teacher, dtype_key
from lmalgebra.storage.lockfile import holding_lock
from lmalgebra.storage.output_paths import cache_directory, refuse_unusable_cache_parts
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.config import CausalTrainingSpec, TrainingSpec

if TYPE_CHECKING:
    import pyarrow as pa
    import torch


class CausalObjective(Objective):
    """The stages of a causal recipe (no vocab stage: the student keeps a tokenizer of its own)."""

    kind = "causal"
    stages: ClassVar[tuple[Stage, ...]] = ("prepare", "teach", "train", "evaluate")
    store_parts = (TOKENS, LOGPROBS)
    head = "causal"
    columns = ("token_ids", "token_ids")
    copying = ("tokenize", "tokens")
    trained_from = ((TOKENS, "prepare"), (LOGPROBS, "teach"))
    recipe: CausalRecipe

    def open_teachers(self) -> dict[str, Teacher]:
        return open_teachers(self.recipe)

    def copies_key(self) -> dict[str, Any]:
        return {"offsets": OFFSETS_RULES}

    def outputs_key(self, dtype: str) -> dict[str, Any]:
        causal = self.recipe.causal
        seed = {"sample_seed": causal.sample_seed} if causal.samples else {}
        return {"samples": causal.samples, **dtype_key(dtype), **seed}

    def copy_shard(
        self, lang: str, teacher: Teacher
    ) -> tuple[Callable[[pa.Table], pa.Table], dict[str, Any]]:
        make = partial(tokens_table, self.recipe, lang, teacher)
        return make, {"start_token_id": start_token_id(teacher.tokenizer)}

    def infer_shard(
        self, teacher: Teacher, compute: torch.dtype
    ) -> tuple[Inference, dict[str, Any]]:
        infer = logprobs_inference(self.recipe, teacher, compute)
        return infer, {"samples": self.recipe.causal.samples}

    def written(self, lang: str, teachers: dict[str, Teacher], progress: bool) -> list[str]:
        from lmalgebra.distill.causal.teacher_text import write_teacher_text
        from lmalgebra.distill.examples import heldout_examples
        from lmalgebra.distill.teachers import inference_setup

        spec = self.recipe.written_text(lang)
        if spec is None:
            return []
        heldout, setup = heldout_examples(self.recipe, lang), inference_setup(self.recipe)
        return write_teacher_text(
            self.recipe, lang, teachers[spec.teacher], heldout, setup, progress
        )

    def vocab(self) -> None:
        raise UserInputError(
            "a causal recipe has no union vocabulary (its student keeps a tokenizer of its own): "
            "`merge vocab` applies to recipes with objective masked"
        )

    def missing_input(self, stage: Stage) -> str | None:
        found = super().missing_input(stage)
        if found is not None or stage != "train":
            return found
        for lang in self.recipe.languages:  # training reads the examples' text after the store
            examples = ShardSet.existing(self.layout.examples(lang))
            if not examples.complete or not examples.records:
                return missing_set(examples, "prepare")
        from lmalgebra.distill.causal.teacher_text import unrecorded_text

        texts = [unrecorded_text(self.recipe, lang) for lang in self.recipe.teacher_text]
        return next((p for p in texts if p), None)  # the text's teacher, checked by training

    def recorded_inputs(self) -> dict[str, Any]:
        """The base's, and what a causal student's checkpoints record that the recipe gives
        alone: its tokenizer's name (its vocabulary, which needs it made, is compared by the
        run) and, built of the recipe's sizes, the model configuration's sizes."""
        from lmalgebra.distill.causal.student_model import causal_sizes
        from lmalgebra.distill.causal.student_tokenizer import tokenizer_name

        name = tokenizer_name(self.recipe)
        named = {} if name is None else {"student_tokenizer.tokenizer": name}
        student = self.recipe.student
        sizes = {} if student.init else causal_sizes(student)
        return {**super().recorded_inputs(), **named, **{f"model.{k}": v for k, v in sizes.items()}}

    def training_runs(self, name: str, training: TrainingSpec) -> dict[Path, TrainingSpec]:
        """One run per KD weight of ``training.lambda_candidates``, each in its own directory."""
        from lmalgebra.distill.causal.training import candidate_specs

        spec = CausalTrainingSpec.model_validate(training.model_dump())
        if not spec.lambda_candidates:
            return super().training_runs(name, training)
        runs = candidate_specs(spec)
        return {self.layout.candidate(name, v): run for v, run in runs.items() if v is not None}

    def refuse_edited_inputs(self) -> None:
        from lmalgebra.distill.causal.teacher_text import refuse_edited_prompts

        super().refuse_edited_inputs()
        for lang in self.recipe.teacher_text:  # and prompts the teacher wrote from
            refuse_edited_prompts(self.recipe, lang)

    def stale_written(self, teachers: dict[str, Teacher]) -> list[str]:
        from lmalgebra.distill.causal.teacher_text import written_by_other

        return written_by_other(self.recipe, teachers)

    @holding_lock("merge train", run_dir, RUN_SCRATCH)
    def train(self, name: str, training: TrainingSpec, progress: bool, restart: bool) -> Path:
        from lmalgebra.distill.causal.training import DEFAULT_MIX, check_mix, train_causal_student

        self.layout.student(name)  # a name that is no plain directory name: refused first
        spec = CausalTrainingSpec.model_validate(training.model_dump())
        check_mix(self.recipe, spec.objective_mix or DEFAULT_MIX)  # settings before the store
        self.recipe.check_training(spec)
        teachers = self.check_store()
        return train_causal_student(
            self.recipe, name, spec, teachers, progress, restart, store=self.store_digest(teachers)
        )

    def evaluation_files(self) -> tuple[str, ...]:
        from lmalgebra.distill.causal.bits_per_byte import BITS
        from lmalgebra.evaluate.lmd_coverage import COVERAGE

        return (BITS.file, RDT_FILE, COVERAGE.file, EVALUATION_MD)

    def scored_files(self) -> tuple[str, ...]:
        from lmalgebra.distill.causal.bits_per_byte import SCORED

        return (SCORED.file,)  # merge bits-per-byte's table

    def row_kinds(self) -> tuple[RowKind, ...]:
        from lmalgebra.distill.causal.bits_per_byte import BitsRow
        from lmalgebra.distill.causal.evaluation import Continuation, Skipped
        from lmalgebra.evaluate.lmd_coverage import CoverageRow

        return (
            RowKind("bits", BitsRow),
            RowKind("coverage", CoverageRow, model="student"),
            RowKind("continuations", Continuation, model="student"),
            RowKind("skipped", Skipped, model=None),
        )

    def evaluation_settings(self, pooling: str | None) -> dict[str, Any]:
        from lmalgebra.evaluate.lmd_coverage import CoveragePooling, CoverageSpec

        known = typing.get_args(CoveragePooling)
        if pooling is not None and pooling not in known:  # named as given: flag or keyword
            raise UserInputError(
                f"{POOLING} {pooling!r} is no pooling of LMD coverage: "
                f"{' or '.join(map(repr, known))}"
            )
        spec = validate(CoverageSpec, {"pooling": pooling or "mean"}, "evaluate")
        # what changes the coverage's rows (not where embeddings are kept, nor their batches)
        return spec.model_dump(mode="json", include={"pooling", "spans", "alpha"})

    def score(
        self, students: list[str], languages: list[str] | None, settings: dict[str, Any]
    ) -> dict[str, list[Any]]:
        from lmalgebra.distill.causal.evaluation import score_causal_run
        from lmalgebra.evaluate.lmd_coverage import CoverageSpec

        spec = validate(CoverageSpec, settings, "evaluate")
        return score_causal_run(self.recipe, students, languages, spec)

    def row_order(self, students: list[str]) -> dict[str, Any]:
        teachers = list(self.recipe.teachers)
        models = [*teachers, *students]
        languages = sorted(self.recipe.languages)

        def of(lang: str) -> tuple[int, list[str]]:
            return languages.index(lang), self.recipe.languages[lang].teachers

        return {
            "bits": lambda r: (models.index(r["model"]), languages.index(r["language"])),
            "coverage": lambda r: (
                of(r["language"])[0],
                of(r["language"])[1].index(r["teacher"]),
                students.index(r["student"]),
            ),
            "continuations": lambda r: (students.index(r["student"]), of(r["language"])[0]),
            "skipped": lambda r: of(r["language"])[0],
        }

    def evaluation_texts(
        self, tables: dict[str, list[dict[str, Any]]], students: list[str], settings: dict[str, Any]
    ) -> dict[str, str]:
        from lmalgebra.distill.causal.evaluation import causal_evaluation, causal_texts

        return causal_texts(causal_evaluation(self.recipe, tables, students, settings["pooling"]))

    def publish(
        self,
        tables: dict[str, list[dict[str, Any]]],
        students: list[str],
        scored: list[str],
        settings: dict[str, Any],
        write: bool = True,
    ) -> Evaluation:
        from lmalgebra.distill.causal.bits_per_byte import BITS
        from lmalgebra.distill.causal.evaluation import (
            causal_evaluation,
            causal_markdown,
            write_causal_evaluation,
        )
        from lmalgebra.evaluate.lmd_coverage import COVERAGE

        found = causal_evaluation(self.recipe, tables, students, settings["pooling"])
        if write:
            write_causal_evaluation(self.layout, found, scored)
        coverage = Table(found.coverage, COVERAGE)
        return Evaluation(
            Table(found.bits, BITS),
            found.rdt,
            causal_markdown(found),
            {"coverage": coverage},
        )

    def plan(self, training: TrainingSpec) -> list[dict[str, Any]]:
        """What training refuses of ``training`` (a teacher the recipe lacks, a setting the
        recipe makes it ignore, a loss the store cannot feed) is refused first."""
        from lmalgebra.distill.causal.teacher_text import prompts_of, refuse_too_long
        from lmalgebra.distill.causal.training import DEFAULT_MIX, check_mix
        from lmalgebra.distill.examples import heldout_examples
        from lmalgebra.distill.vocab.mined_map import CACHE_SUBDIR as MINED_MAPS

        spec = CausalTrainingSpec.model_validate(training.model_dump())
        mix = spec.objective_mix or DEFAULT_MIX
        check_mix(self.recipe, mix)  # in train's order
        self.recipe.check_training(spec)
        # every training builds each teacher's MinED map (gold_only and CE too), writing there
        refuse_unusable_cache_parts(cache_directory(), [MINED_MAPS])
        for lang, text in self.recipe.teacher_text.items():  # prepare's refusals of its prompts
            prompts = prompts_of(self.recipe, lang, heldout_examples(self.recipe, lang))
            refuse_too_long(self.recipe, lang, self._writer(text.teacher), prompts)
        tokenizer = partial(teacher_tokenizer, top_k=self.recipe.top_k)
        zeros = partial(zero_logprobs, self.recipe)
        student = partial(plan_student, self.recipe, validation=spec.validation_fraction)
        rows = plan_rows(self, spec, tokenizer, zeros, student)
        plugins.announce(plugins.CAUSAL_LOSSES, spec.objective_mix or DEFAULT_MIX)
        return rows

    def _writer(self, name: str) -> Teacher:
        """Teacher ``name`` as a dry run knows it: its directory and its tokenizer, checked as
        the run checks them, no weights read."""
        ref = self.recipe.teachers[name].ref(name)
        directory = ref.source.resolve(weights=False)
        return Teacher(name, directory, {}, teacher_tokenizer(ref, directory, self.recipe.top_k))

    def inspect(self) -> RunInspection:
        return causal_report(self.layout.root)
