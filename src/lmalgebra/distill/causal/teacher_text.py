"""Text a teacher writes (sequence-level distillation, Kim & Rush 2016), for the languages of a
causal recipe's ``teacher_text``: the teacher continues the beginning of each prompt document,
sampled, and what it writes (the prompt and its continuation) joins the language's training
examples. Every teacher of the language is then taught on it as on the real text.

What it writes is never a held-out example (the test text is the corpus's alone) nor a
validation one (``student_data.validation_rows`` draws from the corpus's examples): its examples'
ids are ``<language>-written-<hash>``. A prompt document that is one of the language's held-out
examples is refused, so no student reads the beginning of its own test text.

Stored per language as a shard set (``teacher_text/<lang>/``: ``prompt``, ``text``), keyed by the
settings, the prompts and the teacher's weights and tokenizer; shard ``i`` holds the texts of
prompts ``i * batch_size ...`` and is drawn from a seed of its own, so a run stopped part-way
writes the same text (on the same machine) when run again.
"""

from __future__ import annotations

import hashlib
from typing import Any

import pyarrow as pa
import torch

from lmalgebra.core.errors import UserInputError, counted, merge_stage
from lmalgebra.core.fingerprint import sha256_texts
from lmalgebra.core.precision import compute_context, dtype_name
from lmalgebra.core.progress import progress_bar
from lmalgebra.distill.causal.teachers import start_token_id
from lmalgebra.distill.examples import example_id, examples_set, heldout_examples
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import CausalRecipe, TeacherTextSpec
from lmalgebra.distill.teachers import Teacher, accepted_dtypes, dtype_key, load_lm, max_positions
from lmalgebra.sources.corpus import read_documents
from lmalgebra.storage.shard_set import ShardSet


def prompt_of(document: str, chars: int) -> str:
    """The document's first ``chars`` characters, cut back to the last space within them
    (where there is one), without surrounding space."""
    head = document.strip()[:chars]
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.strip()


def prompts_of(recipe: CausalRecipe, lang: str, heldout: dict[str, str]) -> list[str]:
    """The prompts of ``lang``'s teacher text: the first ``documents`` prompt documents,
    cut (``prompt_of``). Refused, naming the file, when there are fewer, and when one of them is
    a held-out example of the language (``heldout``: their texts by id) or of another language
    of the recipe (prompts from another language's corpus), or its prompt is the beginning of
    one, cut alike (a document that begins as a held-out example does): the students, which
    train on every language, would train on the beginning of their test text."""
    spec = recipe.teacher_text[lang]
    documents = prompt_documents(recipe, lang)
    prompts = [prompt_of(d, spec.prompt_chars) for d in documents]
    where = f"teacher_text.{lang}.prompts ({', '.join(spec.prompts.paths)})"
    others = {o: heldout_examples(recipe, o) for o in recipe.languages if o != lang}
    for held_lang, held in {lang: heldout, **others}.items():
        starts = {prompt_of(text, spec.prompt_chars): i for i, text in held.items()}
        short = {text: i for i, text in held.items() if len(text) < spec.prompt_chars}
        for number, (document, prompt) in enumerate(zip(documents, prompts, strict=True), 1):
            within = [i for text, i in short.items() if prompt.startswith(text)]
            if example_id(held_lang, document) in held:
                found = "is a held-out example"
            elif prompt in starts or within:
                found = f"begins as held-out example {starts.get(prompt) or within[0]} does"
            else:
                continue
            raise UserInputError(
                f"{where}: document {number} {found} of language {held_lang!r}, and the "
                "students would train on the beginning of their test text: prompt from text "
                "the run does not hold out"
            )
    return prompts


def prompt_documents(recipe: CausalRecipe, lang: str) -> list[str]:
    """The first ``documents`` non-empty prompt documents of ``lang``'s teacher text, refused,
    naming the file, when there are fewer."""
    spec = recipe.teacher_text[lang]
    try:
        documents = [d.strip() for d in read_documents(spec.prompts)]
    except UserInputError as err:  # named as prompts: "corpus" alone reads as the language's
        raise UserInputError(f"teacher_text.{lang}.prompts: {err}") from None
    documents = [d for d in documents if d]
    if len(documents) < spec.documents:
        raise UserInputError(
            f"teacher_text.{lang}.prompts ({', '.join(spec.prompts.paths)}) has "
            f"{counted(len(documents), 'document')}, fewer than teacher_text.{lang}.documents "
            f"{spec.documents}: give more prompt text or ask for fewer documents"
        )
    return documents[: spec.documents]


def teacher_text_set(
    recipe: CausalRecipe, lang: str, teacher: Teacher, prompts: list[str], dtype: str
) -> ShardSet:
    """The shard set of ``lang``'s teacher text, keyed by everything that changes it."""
    spec = recipe.teacher_text[lang]
    key = {
        "stage": "teacher_text",
        "rules": "prompt+continuation/seed-per-shard",  # bump when these rules change
        **spec.decoding,
        "language": lang,
        "settings": _settings(spec),
        "prompts": sha256_texts(prompts),
        "weights": teacher.hashes["weights"],
        "tokenizer": teacher.hashes["tokenizer"],
        **dtype_key(dtype),
    }
    return ShardSet(RunLayout(recipe.output_dir).teacher_text(lang), key)


def write_teacher_text(
    recipe: CausalRecipe,
    lang: str,
    teacher: Teacher,
    heldout: dict[str, str],
    setup: tuple[torch.device, torch.dtype],
    progress: bool,
) -> list[str]:
    """``lang``'s teacher text, written shard by shard (those a stopped run wrote are kept) on
    ``setup``'s device and in its dtype, then read back in prompt order."""
    spec = recipe.teacher_text[lang]
    prompts = prompts_of(recipe, lang, heldout)
    device, compute = setup
    shards = written_set(recipe, lang, teacher, prompts, dtype_name(compute))
    refuse_too_long(recipe, lang, teacher, prompts)
    refuse_other_text(recipe, lang, shards)
    starts = range(0, len(prompts), spec.batch_size)
    todo = set(shards.plan(len(starts), shared=False))
    if not shards.complete:
        model: Any = None
        label = f"write {lang}/{teacher.name}"
        with progress_bar(label, len(starts), progress) as advance:
            for index, start in enumerate(starts):
                if index in todo:
                    if model is None:
                        ref = recipe.teachers[teacher.name].ref(teacher.name)
                        model = load_lm(ref, teacher.directory, "causal").to(device)
                    batch = prompts[start : start + spec.batch_size]
                    seed = shard_seed(spec, lang, index)
                    texts = generate(model, teacher.tokenizer, batch, spec, seed, compute)
                    shards.write(index, pa.table({"prompt": batch, "text": texts}))
                advance(1)
        shards.finish(documents=len(prompts), teacher=teacher.name)
    return [t for table in shards.tables() for t in table.column("text").to_pylist()]


def written_set(
    recipe: CausalRecipe, lang: str, teacher: Teacher, prompts: list[str], dtype: str
) -> ShardSet:
    """The set ``lang``'s teacher text is written to in ``dtype``, unless a complete one written
    in another dtype the recipe's ``dtype`` accepts (``auto``: either) is there, which is kept
    (as a teacher store is read)."""
    for other in accepted_dtypes(recipe):
        found = teacher_text_set(recipe, lang, teacher, prompts, other)
        if other != dtype and found.complete:
            return found
    return teacher_text_set(recipe, lang, teacher, prompts, dtype)


def refuse_other_text(recipe: CausalRecipe, lang: str, shards: ShardSet) -> None:
    """Refuse to write ``lang``'s teacher text anew over text written from other prompts, by
    another teacher or in another dtype while the run's examples, drawn from that text, are
    there: the run is left as it was, as for an edited corpus (``examples.write_examples``)."""
    before = ShardSet.existing(shards.directory)
    if shards.complete or before.key is None or before.manifest_damaged:
        return
    if before.key == shards.key or not examples_set(recipe, lang).intact():
        return  # the same text, or examples that are drawn again anyway
    fields = sorted(
        f for f in set(before.key) | set(shards.key) if before.key.get(f) != shards.key.get(f)
    )
    raise UserInputError(_changed(recipe, lang, fields))


def refuse_edited_prompts(recipe: CausalRecipe, lang: str) -> None:
    """What ``refuse_other_text`` refuses of prompts or settings changed since the teacher
    wrote, for a dry run, which writes nothing (the teacher's weights, tokenizer and dtype,
    which a dry run does not read, are the run's to check)."""
    before = ShardSet.existing(RunLayout(recipe.output_dir).teacher_text(lang))
    if not isinstance(before.key, dict) or before.manifest_damaged:
        return
    if not examples_set(recipe, lang).intact():
        return  # the examples are drawn again anyway
    spec = recipe.teacher_text[lang]
    prompts = [prompt_of(d, spec.prompt_chars) for d in prompt_documents(recipe, lang)]
    now = {"settings": _settings(spec), "prompts": sha256_texts(prompts), **spec.decoding}
    fields = sorted(f for f in {*now, "decoding"} if before.key.get(f) != now.get(f))
    if fields:
        raise UserInputError(_changed(recipe, lang, fields))


def _settings(spec: TeacherTextSpec) -> dict[str, Any]:
    """The settings of the teacher text's key: all but where its prompts are read from."""
    return spec.model_dump(mode="json", exclude={"prompts"})


def _changed(recipe: CausalRecipe, lang: str, fields: list[str]) -> str:
    """The refusal of teacher text whose key ``fields`` changed while the examples hold it."""
    return (
        f"teacher_text.{lang}: {_inputs(recipe.teacher_text[lang], fields)} changed since the "
        f"run's teacher wrote its text, and the run's examples in "
        f"{examples_set(recipe, lang).directory} hold that text (the store and students come "
        "from those): restore them, or give the recipe another output_dir"
    )


def written_by_other(recipe: CausalRecipe, teachers: dict[str, Teacher]) -> list[str]:
    """Each language's complete teacher text written by its teacher as it was before its
    weights or tokenizer changed (``teachers``: as they are now), which the run's examples
    hold: what training, evaluation and ``merge verify`` refuse, as ``merge prepare`` does. So is
    text whose record is missing, damaged or incomplete while the examples hold it: which teacher
    wrote it cannot be told."""
    problems = []
    for lang, spec in recipe.teacher_text.items():
        found = ShardSet.existing(RunLayout(recipe.output_dir).teacher_text(lang))
        hashes = teachers[spec.teacher].hashes
        if not found.complete or not isinstance(found.key, dict):
            problems += [p for p in [unrecorded_text(recipe, lang)] if p]
            continue
        fields = [f for f in ("weights", "tokenizer") if found.key.get(f) != hashes[f]]
        if fields:
            problems.append(
                f"{found.directory}: written by teacher {spec.teacher!r} before its "
                f"{' and '.join(fields)} changed, and the run's examples hold that text: "
                "restore the teacher, or give the recipe another output_dir"
            )
    return problems


def unrecorded_text(recipe: CausalRecipe, lang: str) -> str | None:
    """The refusal of ``lang``'s teacher text missing, damaged or incomplete while the run's
    examples hold it (which teacher wrote it cannot be told); None when it is there, or when
    the examples are drawn again anyway. Read without opening a teacher (a dry run names it)."""
    found = ShardSet.existing(RunLayout(recipe.output_dir).teacher_text(lang))
    if (found.complete and isinstance(found.key, dict)) or not examples_set(recipe, lang).intact():
        return None
    return (
        f"{found.directory}: missing, damaged or incomplete, and the run's examples hold the "
        f"text teacher {recipe.teacher_text[lang].teacher!r} wrote there (which teacher wrote it "
        f"cannot be told): run {merge_stage('prepare')} to write it again"
    )


def _inputs(spec: TeacherTextSpec, fields: list[str]) -> str:
    """What the teacher text's key ``fields`` stand for, as a user knows them."""
    named = {
        "prompts": f"the prompts ({', '.join(spec.prompts.paths)})",
        "weights": f"the weights of teacher {spec.teacher!r}",
        "tokenizer": f"the tokenizer of teacher {spec.teacher!r}",
        "dtype": "the dtype",
        "settings": "its settings",
        "decoding": "its decoding (greedy at the minimum temperature, sampled there before)",
    }
    return " and ".join(named.get(f, f) for f in fields)


def refuse_too_long(recipe: CausalRecipe, lang: str, teacher: Teacher, prompts: list[str]) -> None:
    """Refuse a prompt whose tokens and the ``new_tokens`` after it pass the positions the
    teacher reads, naming the prompt's document."""
    limit = max_positions(teacher.directory)
    if limit is None:
        return
    spec = recipe.teacher_text[lang]
    for number, prompt in enumerate(prompts, 1):
        length = len(teacher.tokenizer(prompt)["input_ids"])
        if length + spec.new_tokens > limit:
            raise UserInputError(
                f"teacher_text.{lang}: prompt {number} is {length} tokens of teacher "
                f"{teacher.name!r}, and with new_tokens {spec.new_tokens} passes the "
                f"{limit} positions it reads: lower prompt_chars or new_tokens"
            )


def shard_seed(spec: TeacherTextSpec, lang: str, index: int) -> int:
    """The sampling seed of shard ``index`` of ``lang``'s teacher text."""
    digest = hashlib.sha256(f"{spec.seed}/{lang}/{index}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


@torch.no_grad()
def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    spec: TeacherTextSpec,
    seed: int,
    compute: torch.dtype,
) -> list[str]:
    """Each prompt with the continuation ``model`` samples after it (``spec.new_tokens`` tokens
    at most, at ``spec.temperature`` and ``spec.top_p``, no top-k; its argmax at the minimum
    temperature), decoded without special tokens, stripped. Every sampling setting is given
    here: nothing of the model's own ``generation_config.json`` changes what is drawn."""
    from transformers import GenerationConfig

    encoded = [tokenizer(p)["input_ids"] for p in prompts]
    start = start_token_id(tokenizer)  # a causal teacher has one (``teacher_tokenizer``)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else start
    width = max(len(ids) for ids in encoded)
    # padded on the left, masked: every continuation starts where its prompt ends
    ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], dtype=torch.long)
    mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded])
    sampling = {"temperature": spec.temperature, "top_k": 0, "top_p": spec.top_p}
    config = GenerationConfig(
        do_sample=not spec.greedy,
        **({} if spec.greedy else sampling),
        max_new_tokens=spec.new_tokens,
        pad_token_id=pad,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    device = next(model.parameters()).device
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)  # the caller's random state is left as it was
        with compute_context(device, compute):
            out = model.generate(
                input_ids=ids.to(device), attention_mask=mask.to(device), generation_config=config
            )
    return [t.strip() for t in tokenizer.batch_decode(out, skip_special_tokens=True)]
