"""A causal student's tokenizer, made as ``student.tokenizer`` says
(``distill.vocab.tokenizer_choice``): a teacher's or a model's, one trained on the run's training
text, or the byte tokenizer; or the tokenizer of the model the student starts from
(``student.init``); refused without offsets, readable tokens or a start token."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.distill.causal.student_init import init_reference
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.recipe import CausalRecipe
from lmalgebra.distill.vocab.token_forms import detect_convention
from lmalgebra.distill.vocab.tokenizer_choice import TokenizerChoice, parse_student_tokenizer
from lmalgebra.distill.vocab.tokenizer_trainers import byte_tokenizer, train_causal_tokenizer
from lmalgebra.distributed import same_on_every_rank
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.model_source import named_as
from lmalgebra.sources.models import ModelRef

log = logging.getLogger(__name__)


Texts = Callable[[], Mapping[str, Sequence[str]]]  # each language's training texts, when asked


def made_tokenizer(
    choice: TokenizerChoice, recipe: CausalRecipe, training: Texts, weights: bool = True
) -> Any:
    """The tokenizer ``choice`` names: a teacher's or a model's (loaded; ``weights=False``, a
    plan: as a plan reads it, a GGUF file's not dequantised into the cache), one trained on the
    ``training()`` texts of every language (in language order) or the byte tokenizer."""
    positions = recipe.student.max_position_embeddings
    if choice.source == "bytes":
        return byte_tokenizer(positions)
    if choice.source == "train":
        texts = training()
        every = [text for lang in sorted(texts) for text in texts[lang]]
        log.info("training the student's %s tokenizer on %d examples", choice, len(every))
        return train_causal_tokenizer(every, choice.kind, choice.vocab_size, positions)
    teacher = recipe.teachers.get(choice.name) if choice.source == "teacher" else None
    # a model named by reference: messages name the setting ("model 'student.tokenizer'")
    ref = (
        teacher.ref(choice.name)
        if teacher
        else ModelRef(name="student.tokenizer", path=choice.name)
    )
    return source_of(ref, weights=weights).load_tokenizer()


def tokenizer_name(recipe: CausalRecipe) -> str | None:
    """The name a student's checkpoints record of its tokenizer, from the recipe alone (its
    vocabulary needs it made); None for a recipe without one."""
    if recipe.student.init is not None:
        return f"init:{recipe.student.init}"
    given = recipe.student.tokenizer
    return None if given is None else str(parse_student_tokenizer(given, recipe.teachers))


def refuse_tokenless(recipe: CausalRecipe) -> None:
    """Refuse a student with neither a tokenizer nor a model to start from, as training does
    (its dry run too; the stages before training need neither)."""
    if recipe.student.tokenizer is None and recipe.student.init is None:
        raise UserInputError(
            "a causal recipe's student needs a tokenizer: set student.tokenizer to teacher:NAME, "
            "train:KIND:SIZE, bytes or a model reference (or student.init to start from a model)"
        )


def student_tokenizer(
    recipe: CausalRecipe, training: Texts, weights: bool = True
) -> tuple[Any, dict[str, Any]]:
    """The student's tokenizer and what identifies it; ``training``: each language's training
    texts (called only for a trained tokenizer). A student with ``init`` has that model's.
    ``weights=False`` (a dry run): a model's tokenizer is read as a plan reads it (a GGUF file's
    configuration and tokenizer alone, nothing written to the cache; the same tokenizer files)."""
    init, named = recipe.student.init, tokenizer_name(recipe)
    if init is not None:
        ref = init_reference(init)
        given = f"init:{init}"
        with named_as(ref.name, f"student.init {init!r}"):
            tokenizer = source_of(ref, weights=False).load_tokenizer()
    elif recipe.student.tokenizer is None:
        refuse_tokenless(recipe)
    else:
        given = recipe.student.tokenizer
        choice = parse_student_tokenizer(given, recipe.teachers)
        tokenizer = made_tokenizer(choice, recipe, training, weights)
    detect_convention(tokenizer, f"student tokenizer {given!r}")
    if start_token_id(tokenizer) is None:
        raise UserInputError(
            f"student tokenizer {given!r} has neither a beginning-of-sequence nor an "
            "end-of-text token to predict the first token after"
        )
    vocabulary = sha256_json(sorted(tokenizer.get_vocab().items()))
    if not same_on_every_rank(vocabulary):  # each rank builds it: a trained one must agree
        raise RuntimeError(f"student tokenizer {given!r} differs between processes")
    return tokenizer, {"tokenizer": named, "vocabulary": vocabulary}
