"""The MergeDistill recipe: languages, teachers, the teacher store's settings, student, training.

A recipe has one of two objectives, and each has a recipe type of its own: ``MaskedRecipe``
(masked-LM teachers, masking, examples cut by tokens, a union-vocabulary student) and
``CausalRecipe`` (causal LM teachers with any tokenizers, examples cut by text, a student with a
tokenizer of its own). ``MergeRecipe`` is their common base: ``MergeRecipe.model_validate(data)``
(and ``load_recipe``) reads ``objective`` (default ``masked``) and returns the recipe type it
names, so a setting of the other objective is an unknown key, never silently ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.recipe_files import read_yaml
from lmalgebra.core.settings import (
    PathText,
    Settings,
    SettingsError,
    describe,
    home_expanded,
    path_texts,
    refuse_found_elsewhere,
    refuse_ignored,
    section_key,
    switched_on,
)
from lmalgebra.distill.layout import (
    MADE_IN,
    RunLayout,
    check_language_name,
    check_plain_name,
    made_in,
)
from lmalgebra.distill.student import CausalStudentSpec, MaskedStudentSpec, ModelSpec
from lmalgebra.distill.vocab.tokenizer_choice import parse_student_tokenizer
from lmalgebra.sources.corpus import CorpusSpec, refuse_other_languages, split_language
from lmalgebra.sources.models import ModelRef
from lmalgebra.train.config import (
    MIN_TEMPERATURE,
    CausalTrainingSpec,
    TrainingSpec,
    kd_free,
    training_key,
)

# [CLS], [SEP] and a few words: the shortest example that leaves tokens to mask
MIN_EXAMPLE_LENGTH = 8
OBJECTIVE_HELP = (
    "masked: masked-LM teachers, union vocabulary (MergeDistill); causal: causal LM teachers "
    "with any tokenizers, examples cut by text."
)


class TeacherSpec(Settings):
    """A pre-trained LM with a trained head (masked or causal, as the recipe's objective says):
    hub id, local directory or package:NAME."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    path: PathText = Field(
        description="Hub id or local directory of an AutoModelForMaskedLM "
        "(objective masked) or AutoModelForCausalLM (objective causal)."
    )
    revision: str | None = Field(default=None, description="Hub revision.")
    trust_remote_code: bool = Field(default=False, description="Allow the model's own code to run.")

    def ref(self, name: str) -> ModelRef:
        return ModelRef(
            name=name,
            path=self.path,
            revision=self.revision,
            trust_remote_code=self.trust_remote_code,
        )

    def check_kind(self, name: str) -> None:
        """Refuse a model no teacher can be (an ONNX graph, a file of vectors: no head to read
        outputs from), before any stage or its dry run reads it."""
        source = self.ref(name).source
        if not source.transformers_model:
            raise UserInputError(
                f"teacher {name!r}: {self.path} is {source.what}; a teacher is a transformers "
                "language model with its head (a directory, hub id, package:NAME or gguf:FILE)"
            )


class LanguageSpec(Settings):
    """One language: its text and the teachers that cover it."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    corpus: CorpusSpec = Field(description="The language's text.")
    teachers: list[str] = Field(
        description="Names of teachers (keys of `teachers`) for this language."
    )
    max_examples: int | None = Field(
        default=None, ge=1, description="Use at most this many examples."
    )


class MaskingSpec(Settings):
    """BERT-style masking, drawn per (example, teacher) from the seed."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    probability: float = Field(default=0.15, gt=0, lt=1, description="Share of tokens to predict.")
    replace: tuple[float, float, float] = Field(
        default=(0.8, 0.1, 0.1), description="Of those: [MASK], random token, unchanged."
    )
    whole_word: bool = Field(
        default=False, description="Mask all pieces of a chosen word together."
    )
    seed: int = Field(default=0, description="Masking seed.")

    @model_validator(mode="after")
    def _check(self) -> MaskingSpec:
        if any(r < 0 for r in self.replace) or abs(sum(self.replace) - 1) > 1e-9:
            raise UserInputError(
                f"{section_key(MaskingSpec, 'masking.')}replace must be >= 0 and sum to 1, "
                f"got {list(self.replace)}"
            )
        return self


class CausalSpec(Settings):
    """How a causal recipe cuts its examples and what its store keeps besides the top-k.

    Examples are cut by text, not by tokens: every teacher (and later the student) sees exactly
    the same bytes of an example, which cross-tokenizer alignment needs.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    example_bytes: int = Field(
        default=2048,
        ge=16,
        description="Each document is cut to its first example_bytes UTF-8 bytes "
        "(at a character boundary); every teacher reads the same text.",
    )
    samples: int = Field(
        default=0,
        ge=0,
        le=1024,
        description="Tokens drawn (with replacement) from each teacher's next-token distribution "
        "at every position, stored with their log-probabilities (Sparse Logit Sampling); 0: none.",
    )
    sample_seed: int = Field(default=0, description="Seed of the drawn tokens.")

    @model_validator(mode="after")
    def _check(self) -> CausalSpec:
        if not self.samples:  # nothing is drawn: a seed of the draws would do nothing
            causal = section_key(CausalSpec, "causal.")
            refuse_ignored(self, causal, {"sample_seed": f"{causal}samples above 0"})
        return self


class TeacherTextSpec(Settings):
    """Text a teacher writes for a language (sequence-level distillation, Kim & Rush 2016): the
    teacher continues the beginning of each prompt document, sampled; what it writes joins the
    language's training examples, never its held-out or validation ones
    (``distill.causal.teacher_text``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    teacher: str = Field(description="The teacher that writes (a key of `teachers`).")
    prompts: CorpusSpec = Field(
        description="Documents whose beginnings prompt the teacher, one text per prompt: text "
        "the run holds out none of (a document that is a held-out example of any language of "
        "the recipe is refused)."
    )
    documents: int = Field(ge=1, le=1_000_000, description="How many texts the teacher writes.")
    prompt_chars: int = Field(
        default=40,
        ge=1,
        description="A prompt is its document's first prompt_chars characters, cut back to the "
        "last space within them (where there is one).",
    )
    new_tokens: int = Field(default=64, ge=1, le=8192, description="Tokens written per prompt.")
    temperature: float = Field(
        default=1.0,
        ge=MIN_TEMPERATURE,
        le=10,
        description="Sampling temperature; its minimum, 1e-4, writes the teacher's argmax "
        "(greedy decoding: top_p and seed, which then change nothing, are refused beside it).",
    )
    top_p: float = Field(
        default=1.0, gt=0, le=1, description="Nucleus sampling's mass (1: the whole distribution)."
    )
    seed: int = Field(default=0, ge=0, description="Seed of the sampling.")
    batch_size: int = Field(
        default=16,
        ge=1,
        le=4096,
        description="Prompts per generation batch and per stored shard (each shard is drawn "
        "from a seed of its own, so a stopped run writes the same text when run again).",
    )

    @property
    def greedy(self) -> bool:
        """Whether the teacher writes its argmax (the minimum temperature), drawing nothing."""
        return self.temperature <= MIN_TEMPERATURE

    @property
    def decoding(self) -> dict[str, str]:
        """What the keys of text written under these settings (and of examples drawn with it)
        add to them: the argmax, written greedily (text sampled at that temperature before is
        not it); nothing for sampled text."""
        return {"decoding": "greedy"} if self.greedy else {}


def cut_text(text: str, max_bytes: int) -> str:
    """``text``'s longest prefix of at most ``max_bytes`` UTF-8 bytes ending between characters."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    return data[:max_bytes].decode("utf-8", errors="ignore")  # drops a character cut in two


class MergeRecipe(Settings):
    """What every recipe has: data, teachers, the teacher store's settings, the run directory.

    The base of ``MaskedRecipe`` and ``CausalRecipe``; ``MergeRecipe.model_validate`` returns
    the one the data's ``objective`` names."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    if TYPE_CHECKING:  # every recipe has these sections, each of its objective's own type
        student: ModelSpec
        training: TrainingSpec

    languages: dict[str, LanguageSpec] = Field(description="Language code -> corpus and teachers.")
    teachers: dict[str, TeacherSpec] = Field(description="Teacher name -> model reference.")
    heldout_fraction: float = Field(
        default=0.05, ge=0, lt=1, description="Examples kept for evaluation."
    )
    top_k: int = Field(
        default=8,
        ge=1,
        le=1024,
        description="Teacher log-probabilities kept per predicted token (masked: per masked "
        "token; causal: per token).",
    )
    batch_size: int = Field(default=32, ge=1, description="Examples per teacher forward pass.")
    dtype: Literal["float32", "bfloat16", "auto"] = Field(
        default="float32",
        description="Compute precision of teacher inference: float32; bfloat16 (autocast: "
        "weights stay float32, log-probabilities are taken in float32 from the bfloat16 logits; "
        "refused where the hardware lacks it unless LMALGEBRA_ALLOW_SLOW_BF16=1); auto: "
        "bfloat16 where native, else float32. The store records the dtype it resolves to.",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="cpu",
        description="Where teacher inference runs: cpu, cuda, or auto (cuda when present).",
    )
    shard_rows: int = Field(default=1024, ge=1, description="Examples per store shard.")
    output_dir: Path = Field(default=Path("runs/merge"), description="Run directory.")

    @model_validator(mode="before")
    @classmethod
    def _not_the_base(cls, data: Any) -> Any:
        """Refuse ``MergeRecipe(...)`` first: a key of the objective's own had been named unknown
        (``example_length``, ``objective``), and the rest a bare TypeError."""
        if cls is MergeRecipe:  # a ValueError: pydantic's error, named with the class
            raise ValueError(
                "MergeRecipe is the base of the objectives' recipes: build one with "
                "MergeRecipe.model_validate(mapping), which makes the one its objective names "
                "(MaskedRecipe or CausalRecipe, of lmalgebra.distill.recipe)"
            )
        return data

    @model_validator(mode="after")
    def _check_teachers(self) -> MergeRecipe:
        if not self.languages:
            raise UserInputError("the recipe names no language")
        for name, teacher in self.teachers.items():  # each has its directories in the store
            check_plain_name(name, "teacher name")
            teacher.check_kind(name)
        for code, lang in self.languages.items():
            check_language_name(code)
            refuse_other_languages(lang.corpus, code, f"language {code!r}")
            if not lang.teachers:
                raise UserInputError(f"language {code!r} has no teacher")
            repeated = sorted({t for t in lang.teachers if lang.teachers.count(t) > 1})
            if repeated:
                raise UserInputError(
                    f"language {code!r} lists teacher {repeated[0]!r} more than once"
                )
            for name in lang.teachers:
                if name not in self.teachers:
                    raise UserInputError(
                        f"language {code!r} names teacher {name!r}, "
                        "which is not defined under `teachers`"
                    )
        used = {t for lang in self.languages.values() for t in lang.teachers}
        # a causal recipe's writer of text is refused by its own rule (a teacher of its language)
        writers = {s.teacher for s in getattr(self, "teacher_text", {}).values()}
        unused = sorted(set(self.teachers) - used - writers)
        if unused:
            raise UserInputError(f"teacher {unused[0]!r} is defined but no language uses it")
        return self

    def teachers_of(
        self, only: list[str] | dict[str, list[str]] | None = None
    ) -> dict[str, list[str]]:
        """Language -> its teachers, restricted to ``only`` (``training.teachers``: one list for
        every language, or per language; None: all); refused when ``only`` names a teacher or a
        language the recipe lacks, or leaves a language with none."""
        if only is None:
            return {code: list(lang.teachers) for code, lang in self.languages.items()}
        per_lang = only if isinstance(only, dict) else dict.fromkeys(self.languages, only)
        for code, names in per_lang.items():
            if code not in self.languages:
                raise UserInputError(
                    f"training.teachers names language {code!r}, which is not under `languages` "
                    f"(languages: {', '.join(self.languages)})"
                )
            for name in names:
                if name not in self.teachers:
                    raise UserInputError(
                        f"training.teachers names {name!r}, which is not defined under "
                        f"`teachers` (teachers: {', '.join(self.teachers)})"
                    )
        kept = {
            code: [t for t in lang.teachers if t in per_lang.get(code, lang.teachers)]
            for code, lang in self.languages.items()
        }
        for code, names in kept.items():
            if not names:
                raise UserInputError(
                    f"training.teachers leaves language {code!r} without a teacher "
                    f"(its teachers: {', '.join(self.languages[code].teachers)})"
                )
        return kept

    def check_training(self, spec: TrainingSpec) -> dict[str, list[str]]:
        """What training refuses of ``spec`` beside this recipe, before any work (the dry run
        too): a ``training.teachers`` the recipe refuses (``teachers_of``, whose result is
        returned), and a setting the recipe makes training ignore: ``sampling_exponent`` with
        one language to sample, ``multi_teacher`` where no language keeps several teachers,
        ``dropout_masks`` for a student without dropout."""
        kept = self.teachers_of(spec.teachers)
        unused = {}
        if len(kept) == 1:
            unused["sampling_exponent"] = "recipes of several languages"
        if all(len(names) == 1 for names in kept.values()):
            unused["multi_teacher"] = "languages of several teachers"
        if getattr(self.student, "init", None) is None and not self.student.dropout:
            unused["dropout_masks"] = "students with dropout (student.dropout above 0)"
        refuse_ignored(spec, training_key(TrainingSpec), unused)
        return kept

    def example_text(self, text: str) -> str:
        """The text an example keeps of a (stripped) document: all of it."""
        return text

    def example_cut(self) -> dict[str, Any]:
        """What the examples' store key records of how examples are cut (nothing: whole)."""
        return {}

    def written_text(self, lang: str) -> TeacherTextSpec | None:
        """The text a teacher writes for language ``lang`` (``teacher_text``), or None."""
        return None

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> MergeRecipe:
        """On ``MergeRecipe``: the ``MaskedRecipe`` or ``CausalRecipe`` ``obj``'s ``objective``
        names (default masked); on either of those, that type's own validation."""
        if cls is MergeRecipe:
            try:
                return _RECIPES.validate_python(obj, *args, **kwargs)
            except ValidationError as err:
                raise SettingsError(_message(err, obj, "MergeRecipe"), err) from None
        return super().model_validate(obj, *args, **kwargs)


class MaskedRecipe(MergeRecipe):
    """Masked-LM teachers, masked copies of examples cut by tokens, a union-vocabulary student."""

    objective: Literal["masked"] = Field(default="masked", description=OBJECTIVE_HELP)
    masking: MaskingSpec = Field(default_factory=MaskingSpec, description="Masking.")
    example_length: int = Field(
        default=128, ge=MIN_EXAMPLE_LENGTH, description="Tokens per example per teacher (cut)."
    )
    student: MaskedStudentSpec = Field(
        default_factory=MaskedStudentSpec, description="Student architecture."
    )
    training: TrainingSpec = Field(default_factory=TrainingSpec, description="Student training.")


class CausalRecipe(MergeRecipe):
    """Causal LM teachers with any tokenizers, examples cut by text, a student with a tokenizer
    of its own."""

    objective: Literal["causal"] = Field(default="causal", description=OBJECTIVE_HELP)
    causal: CausalSpec = Field(default_factory=CausalSpec, description="Text cut and samples.")
    student: CausalStudentSpec = Field(
        default_factory=CausalStudentSpec, description="Student architecture and tokenizer."
    )
    training: CausalTrainingSpec = Field(
        default_factory=CausalTrainingSpec, description="Student training."
    )
    teacher_text: dict[str, TeacherTextSpec] = Field(
        default_factory=dict,
        description="Language -> text a teacher writes for it, added to its training examples "
        "(sequence-level distillation); none by default.",
    )

    @model_validator(mode="after")
    def _check_tokenizer(self) -> CausalRecipe:
        if self.student.tokenizer is not None:
            parse_student_tokenizer(self.student.tokenizer, self.teachers)
        for lang, spec in self.teacher_text.items():
            if lang not in self.languages:
                raise UserInputError(
                    f"teacher_text names language {lang!r}, which is not under `languages` "
                    f"(languages: {', '.join(self.languages)})"
                )
            if spec.teacher not in self.teachers:
                raise UserInputError(
                    f"teacher_text.{lang}.teacher {spec.teacher!r} is not defined under "
                    f"`teachers` (teachers: {', '.join(self.teachers)})"
                )
            if spec.teacher not in self.languages[lang].teachers:
                raise UserInputError(
                    f"teacher_text.{lang}.teacher {spec.teacher!r} is not a teacher of language "
                    f"{lang!r} (its teachers: {', '.join(self.languages[lang].teachers)})"
                )
            if spec.greedy:  # the teacher's argmax: nothing is drawn for these to change
                sampling = f"teacher_text.{lang}.temperature above {MIN_TEMPERATURE:g} (sampling)"
                refuse_ignored(spec, f"teacher_text.{lang}.", {"top_p": sampling, "seed": sampling})
        return self

    def written_text(self, lang: str) -> TeacherTextSpec | None:
        return self.teacher_text.get(lang)

    def check_training(self, spec: TrainingSpec) -> dict[str, list[str]]:
        """Also refuse, where the run distils nothing (gold_only, CE alone, a KD weight of 0), a
        choice among a language's teachers: a causal student reads an example's text, which
        every teacher's copy holds alike."""
        kept = super().check_training(spec)
        idle = distils_nothing(spec)
        fields = type(spec).model_fields
        given = [n for n in TEACHER_CHOICE if getattr(spec, n) != fields[n].get_default()]
        if idle is not None and given:
            raise UserInputError(
                f"{training_key(TrainingSpec)}{given[0]} {getattr(spec, given[0])!r} would be "
                f"ignored under {idle}: "
                "a causal student that distils nothing reads an example's text alone, the same "
                "in every teacher's copy; leave it out"
            )
        return kept

    def example_text(self, text: str) -> str:
        """The document's first ``causal.example_bytes`` UTF-8 bytes (at a character boundary):
        every teacher tokenises exactly those bytes."""
        return cut_text(text, self.causal.example_bytes)

    def example_cut(self) -> dict[str, Any]:
        return {"cut": {"utf8_bytes": self.causal.example_bytes, "at": "character boundary"}}


# a causal student's settings that choose among a language's teachers: read only to distil
TEACHER_CHOICE = ("teachers", "multi_teacher")


def distils_nothing(spec: TrainingSpec) -> str | None:
    """What makes a student of ``spec`` learn nothing from its teachers (gold labels alone, CE
    alone, every KD weight 0), as a message names it; None where it distils."""
    if spec.gold_only:
        return switched_on(TrainingSpec, "training.", "gold_only")
    if kd_free(spec.model_dump()):
        return f"{training_key(TrainingSpec)}objective_mix {{ce}} (the CE-only baseline)"
    weights = spec.kd_weights()
    if weights is not None and not any(weights):
        return f"{spec.kd_weights_given()}, which weighs the distillation term by nothing"
    return None


def _objective(data: Any) -> Any:
    if isinstance(data, dict):
        return data.get("objective", "masked")
    return getattr(data, "objective", None)


# The objectives: name -> recipe. The recipe union, the keys each objective accepts and the
# messages read this table; ``distill.pipeline.OBJECTIVES`` names the Objective that runs each
# recipe (it imports torch, which parsing a recipe does not).
RECIPES: dict[str, type[MergeRecipe]] = {"masked": MaskedRecipe, "causal": CausalRecipe}
OBJECTIVES = tuple(RECIPES)
_RECIPES: TypeAdapter[MergeRecipe] = TypeAdapter(
    Annotated[  # type: ignore[arg-type]  # a union built from the table
        Union[tuple(Annotated[recipe, Tag(name)] for name, recipe in RECIPES.items())],  # noqa: UP007
        Discriminator(_objective),
    ]
)


def _keys(recipe: type[MergeRecipe]) -> set[str]:
    """Every key of ``recipe``'s top level and of its student and training sections."""
    keys = set(recipe.model_fields)
    for section in ("student", "training"):
        spec = recipe.model_fields[section].annotation
        assert isinstance(spec, type) and issubclass(spec, BaseModel)
        keys |= {f"{section}.{name}" for name in spec.model_fields}
    return keys


_KEYS = {name: _keys(recipe) for name, recipe in RECIPES.items()}


def key_owner(key: str, objective: str) -> str | None:
    """The other objective whose recipes have ``key`` (dotted: ``training.objective_mix``), which
    recipes of ``objective`` have not; None if none has it."""
    return next((o for o in OBJECTIVES if key in _KEYS[o] - _KEYS[objective]), None)


def parse_recipe(data: Any, source: str) -> MergeRecipe:
    """The recipe ``data`` describes (a mapping of its keys); one line naming ``source`` and the
    key (or the keys a check across them found at odds) when it is not one."""
    try:
        return MergeRecipe.model_validate(data)
    except SettingsError as err:
        raise UserInputError(_message(err.validation, data, source)) from None
    except UserInputError as err:  # a check across keys: named in the recipe too
        message = str(err)
        raise UserInputError(
            message if message.startswith(f"{source}: ") else f"{source}: {message}"
        ) from None


def _message(err: ValidationError, data: Any, source: str) -> str:
    """``describe``'s line, with the objective's tag left out of the key, and for a key of the
    other objective, which objective it belongs to."""
    if not isinstance(data, dict | BaseModel):
        return f"{source}: a recipe is a mapping of its keys, got {type(data).__name__}"
    first = err.errors()[0]
    objective = _objective(data)
    if first["type"] == "union_tag_invalid" or objective not in OBJECTIVES:
        names = " or ".join(OBJECTIVES)
        return f"{source}: key 'objective': must be {names}, got {objective!r}"
    message = describe(err, source, tagged=True)
    unknown = next((e for e in err.errors() if e["type"] == "extra_forbidden"), None)
    if unknown is not None:
        key = ".".join(str(p) for p in unknown["loc"][1:])  # the tag left out
        other = key_owner(key, objective)
        if other is not None:
            message += f": a setting of {other} recipes, and this recipe's objective is {objective}"
    return message


def masked_only(recipe: MergeRecipe, refusal: str) -> MaskedRecipe:
    """``recipe`` as the masked recipe it must be; ``refusal`` (one line) otherwise."""
    if not isinstance(recipe, MaskedRecipe):
        raise UserInputError(refusal)
    return recipe


def causal_only(recipe: MergeRecipe, refusal: str) -> CausalRecipe:
    """``recipe`` as the causal recipe it must be; ``refusal`` (one line) otherwise."""
    if not isinstance(recipe, CausalRecipe):
        raise UserInputError(refusal)
    return recipe


def load_recipe(path: Path) -> MergeRecipe:
    """The recipe in the YAML file ``path``."""
    return parse_recipe(read_yaml(path), str(path))


def user_recipe(path: Path) -> MergeRecipe:
    """The recipe in the user's file ``path``, whose relative paths are read from the current
    directory (as ``from_pretrained`` reads them): one that names nothing from here but
    something from the recipe's own directory is refused, naming both (a teacher had been
    taken for a hub id out of reach, a corpus named missing); of a file that says where it was
    made (a run's copy, a selection's ``recommended.yaml``), something from there."""
    recipe = load_recipe(path)
    base = made_in(path)
    if base is not None:
        _refuse_moved(recipe, path, base, "where it was made", output=True)
    else:
        base = home_expanded(path).absolute().parent
        _refuse_moved(recipe, path, base, "the recipe's directory", output=True)
    return recipe


def run_copy_text(recipe: MergeRecipe) -> str:
    """The run's copy of ``recipe`` (``recipe.yaml``), headed by the current directory."""
    settings = recipe.model_dump(mode="json")
    return MADE_IN + json.dumps(str(Path.cwd())) + "\n" + yaml.safe_dump(settings, sort_keys=False)


def run_recipe(run_dir: Path) -> MergeRecipe:
    """The recipe of the run in ``run_dir``, read from its copy, whose ``output_dir`` is
    ``run_dir``. A relative path in the copy that names nothing from the current directory but
    something from the directory the run was made in (the copy's first line) is refused,
    naming its key and both directories: read from here it would be another file or none."""
    layout = RunLayout(run_dir)
    copy = layout.require_recipe()
    recipe = load_recipe(copy)
    base = made_in(copy)
    if base is not None:
        _refuse_moved(recipe, copy, base, "where the run was made", output=False)
    return recipe.model_copy(update={"output_dir": layout.root})


def _refuse_moved(recipe: MergeRecipe, copy: Path, base: Path, where: str, *, output: bool) -> None:
    """Refuse the first relative path of ``recipe`` (read from the file ``copy``) that names
    something from ``base`` (``where``: what it is) and nothing from the current directory;
    with ``output``, the ``output_dir`` the file names too (a run's copy's is the run's own
    directory, given to the command instead)."""
    texts = (
        (k, split_language(t)[1])
        for k, t in path_texts(recipe)
        if _read_as_path(recipe, k, t, output=output)
    )
    refuse_found_elsewhere(texts, copy, base, where)


def _read_as_path(recipe: MergeRecipe, key: str, text: str, *, output: bool) -> bool:
    """Whether the path-like setting ``key`` (``text``) of ``recipe`` is read as a path: not a
    student tokenizer naming a teacher (``bl``, ``teacher:bl``), nor the run's output unless
    ``output`` and the file sets it: an ``output_dir`` naming a run beside the recipe alone had
    been read from here unchecked, and a new run made here (the default names nothing of the
    file's)."""
    if key == "student.tokenizer":
        return parse_student_tokenizer(text, list(recipe.teachers)).source == "model"
    if key == "output_dir":
        return output and "output_dir" in recipe.model_fields_set
    return True
