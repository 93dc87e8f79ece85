"""Text a teacher writes (``teacher_text``, sequence-level distillation): it joins a language's
training examples and nothing else, its continuations are the teacher's (a naive greedy decoder
agrees at a temperature near zero), a stopped run writes the same text again, and what prepare
would refuse the dry run refuses."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill import pipeline as stages
from lmalgebra.distill.causal.student_data import validation_rows
from lmalgebra.distill.causal.teacher_text import generate, prompt_of
from lmalgebra.distill.examples import example_id, is_written, language_examples
from lmalgebra.distill.layout import RunLayout
from lmalgebra.distill.recipe import TeacherTextSpec, load_recipe
from lmalgebra.distill.run.verify import verify_run
from lmalgebra.distill.teachers import load_lm
from lmalgebra.sources.models import ModelRef
from lmalgebra.storage.shard_set import ShardSet
from tiny import documents

TEXT = {"teacher": "bl", "documents": 10, "new_tokens": 6, "batch_size": 4, "prompt_chars": 30}


def _recipe(root: Path, teachers: dict[str, Path], **text: Any) -> Path:
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join(documents(14, seed=77)) + "\n", encoding="utf-8")
    spec = {**TEXT, "prompts": {"paths": [str(prompts)]}, **text}
    return write_causal_recipe(root, teachers, student=CAUSAL_STUDENT, teacher_text={"xx": spec})


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    root = tmp_path_factory.mktemp("teacher-text")
    path = _recipe(root, causal_teacher_dirs)
    stages.prepare(load_recipe(path), progress=False)
    return path


def _stored(recipe_path: Path, part: str) -> pa.Table:
    recipe = load_recipe(recipe_path)
    layout = RunLayout(recipe.output_dir)
    directory = layout.examples("xx") if part == "examples" else layout.teacher_text("xx")
    return pa.concat_tables(ShardSet.existing(directory).tables())


def test_written_text_joins_the_training_examples_alone(prepared: Path, tmp_path: Path) -> None:
    recipe = load_recipe(prepared)
    written = _stored(prepared, "teacher_text")
    assert written.num_rows == 10
    prompts, texts = (written.column(c).to_pylist() for c in ("prompt", "text"))
    for prompt, text in zip(prompts, texts, strict=True):
        assert text.startswith(prompt) and len(text) > len(prompt)
    table = _stored(prepared, "examples")
    ids = table.column("id").to_pylist()
    mine = [is_written(i, "xx") for i in ids]
    assert sum(mine) == len(set(written.column("text").to_pylist()))
    heldout = table.column("heldout").to_numpy(zero_copy_only=False)
    assert not heldout[mine].any()  # never the test text
    # the corpus's own examples, held-out split included, are those of a run without it
    plain = recipe.model_copy(update={"teacher_text": {}})
    corpus = [(e.id, e.text, e.heldout) for e in language_examples(plain, "xx")]
    rows = zip(ids, table.column("text").to_pylist(), heldout.tolist(), strict=True)
    assert [r for r, m in zip(rows, mine, strict=True) if not m] == corpus
    # validation draws the same corpus examples as without it, and none the teacher wrote
    kept = validation_rows(np.array(ids), heldout, 0.2, "xx")
    alone = validation_rows(
        np.array([i for i, _, _ in corpus]), heldout[~np.array(mine)], 0.2, "xx"
    )
    assert not kept[mine].any()
    assert kept[~np.array(mine)].tolist() == alone.tolist()
    # the teachers' store holds the written examples as any other
    stages.teach(recipe, progress=False)
    assert verify_run(recipe.output_dir, ("tokens", "logprobs"), False) == []


def test_a_stopped_run_writes_the_same_text_again(prepared: Path) -> None:
    recipe = load_recipe(prepared)
    before = _stored(prepared, "teacher_text").column("text").to_pylist()
    shards = ShardSet.existing(RunLayout(recipe.output_dir).teacher_text("xx"))
    shards.path(1).unlink()  # stopped before its second shard was (re)written
    assert any(
        "teacher_text" in p for p in verify_run(recipe.output_dir, ("tokens", "logprobs"), False)
    )
    stages.prepare(recipe, progress=False)  # the examples it drew are those of the text again
    assert _stored(prepared, "teacher_text").column("text").to_pylist() == before


def test_continuations_are_the_teachers_own(causal_teacher_dirs) -> None:
    """At a temperature near zero, sampling is the teacher's argmax: a naive decoder feeding
    each prompt alone, one token at a time, writes the same text (left padding changes
    nothing). Compared where every choice clears its runner-up by a margin that no kernel's
    rounding, and no draw at that temperature, can cross."""
    directory = causal_teacher_dirs["bl"]
    model = load_lm(ModelRef(name="bl", path=str(directory)), directory, "causal")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    prompts = ["the cat sat", "a much longer prompt than the first one is", "x"]
    spec = TeacherTextSpec.model_validate(
        {
            "teacher": "bl",
            "prompts": {"paths": ["-"]},
            "documents": 3,
            "new_tokens": 5,
            "temperature": 1e-4,
        }
    )
    got = generate(model, tokenizer, prompts, spec, seed=1, compute=torch.float32)
    compared = 0
    for prompt, text in zip(prompts, got, strict=True):
        start = tokenizer(prompt, return_tensors="pt")["input_ids"]
        ids, clear = _greedy(model, start, 5, tokenizer.eos_token_id)
        if clear:  # a near-tie may go either way on another CPU's kernels
            assert text == tokenizer.decode(ids[0], skip_special_tokens=True).strip()
            compared += 1
    assert compared >= 2
    # at temperature 1 the seed changes what is drawn
    hot = spec.model_copy(update={"temperature": 1.0, "new_tokens": 12})
    draws = {
        tuple(generate(model, tokenizer, prompts, hot, seed=s, compute=torch.float32))
        for s in range(4)
    }
    assert len(draws) > 1


def _greedy(model: Any, ids: torch.Tensor, steps: int, eos: int) -> tuple[torch.Tensor, bool]:
    """``ids`` continued by ``steps`` argmax tokens (or up to ``eos``), and whether
    every argmax led its runner-up by more than 0.01 (at temperature 1e-4 a draw of the runner-up
    has odds below e^-100)."""
    clear = True
    for _ in range(steps):
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, -1]
        first, second = logits.topk(2).values.tolist()
        clear = clear and first - second > 0.01
        nxt = logits.argmax()
        if nxt.item() == eos:
            break
        ids = torch.cat([ids, nxt.view(1, 1)], dim=1)
    return ids, clear


@pytest.mark.parametrize(("setting", "value"), [("top_p", 0.5), ("seed", 3)])
def test_the_minimum_temperature_writes_the_argmax_and_refuses_sampling_settings(
    tmp_path: Path, causal_teacher_dirs, setting: str, value: float
) -> None:
    """``temperature`` at its minimum is documented as the teacher's argmax, yet generation
    still sampled there, so ``top_p`` and ``seed`` could change a token at a near-tie: it
    decodes greedily (nothing drawn), and either setting beside it is refused, naming both."""
    change = {"temperature": 1e-4, setting: value}
    culprit = f"teacher_text.xx.{setting} {value!r} would be ignored"
    with pytest.raises(UserInputError, match=culprit):
        load_recipe(_recipe(tmp_path, causal_teacher_dirs, **change))
    spec = TeacherTextSpec.model_validate(
        {"teacher": "bl", "prompts": {"paths": ["-"]}, "documents": 1, "temperature": 1e-4}
    )
    seen: list[Any] = []

    class Model(torch.nn.Linear):
        def generate(self, input_ids: torch.Tensor, **kwargs: Any) -> torch.Tensor:
            seen.append(kwargs["generation_config"])
            return input_ids

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(causal_teacher_dirs["bl"])
    generate(Model(1, 1), tokenizer, ["the cat"], spec, seed=1, compute=torch.float32)
    assert seen[0].do_sample is False


def test_text_sampled_at_the_minimum_temperature_before_is_written_again_greedily(
    tmp_path: Path, causal_teacher_dirs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text written at the minimum temperature before it decoded greedily (keys without
    ``decoding``): the dry run and ``merge prepare`` had disagreed on it (refused, naming a
    key field, by the stage alone). It is text of other settings, and like any, written
    again with the examples drawn from it, by the stage after a dry run that plans it."""
    from lmalgebra.distill.recipe import TeacherTextSpec

    path = _recipe(tmp_path, causal_teacher_dirs, temperature=1e-4)
    with monkeypatch.context() as before:
        before.setattr(TeacherTextSpec, "decoding", property(lambda self: {}))
        stages.prepare(load_recipe(path), progress=False)
    recipe = load_recipe(path)
    stages.objective_of(recipe).refuse_edited_inputs()  # the dry run's check: plans it
    stages.prepare(recipe, progress=False)
    for part in ("teacher_text", "examples"):
        key = ShardSet.existing(tmp_path / "run" / part / "xx").key
        assert "greedy" in str(key), part


def test_prompts_are_cut_at_a_word() -> None:
    assert prompt_of("  la maison est grande et belle", 14) == "la maison est"
    assert prompt_of("Donaudampfschifffahrt", 6) == "Donaud"


@pytest.mark.parametrize(
    "change, culprit",
    [
        ({"documents": 20}, "has 14 documents, fewer than teacher_text.xx.documents 20"),
        ({"teacher": "wp"}, "teacher_text.xx.teacher 'wp' is not a teacher of language 'xx'"),
        ({"teacher": "nobody"}, "teacher_text.xx.teacher 'nobody' is not defined under `teachers`"),
        (
            {"prompts": {"paths": ["/nowhere/prompts.txt"]}},
            "teacher_text.xx.prompts: corpus /nowhere/prompts.txt does not exist",
        ),
    ],
)
def test_bad_teacher_text_is_refused_by_name(
    tmp_path: Path, causal_teacher_dirs, change: dict[str, Any], culprit: str
) -> None:
    with pytest.raises(UserInputError, match=culprit.replace("(", r"\(")):
        recipe = load_recipe(_recipe(tmp_path, causal_teacher_dirs, **change))
        stages.objective_of(recipe).plan(recipe.training)  # the dry run refuses it first
    assert not (tmp_path / "run").exists()


def test_a_writer_that_teaches_no_language_is_named_by_the_writers_rule(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """A teacher defined only to write a language's text (no language lists it) was refused as
    ``defined but no language uses it``, though ``teacher_text`` uses it: the line names the
    writer's own rule, a teacher of the language it writes for."""
    path = _recipe(tmp_path, causal_teacher_dirs)
    data = yaml.safe_load(path.read_text())
    data["teachers"]["g2"] = {"path": str(causal_teacher_dirs["uni"])}
    data["teacher_text"]["xx"]["teacher"] = "g2"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(UserInputError, match=r"teacher_text\.xx\.teacher 'g2' is not a teacher of"):
        load_recipe(path)


def _held_out_prompt_refused(tmp_path: Path, teacher_dirs, language: str) -> tuple[Path, str]:
    """xx's 13th prompt is a held-out document of ``language``: the plan and ``prepare`` refuse
    it, naming the language, and write no teacher text. The recipe and that document."""
    path = _recipe(tmp_path, teacher_dirs)
    recipe = load_recipe(path)
    held_ids = {e.id for e in language_examples(recipe, language) if e.heldout}
    corpus = (tmp_path / f"{language}.txt").read_text(encoding="utf-8").splitlines()
    held = [d for d in corpus if example_id(language, d.strip()) in held_ids]
    assert held
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(documents(14, seed=77)[:12] + held[:1]) + "\n", encoding="utf-8")
    data = yaml.safe_load(path.read_text())
    data["teacher_text"]["xx"]["documents"] = 13
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    said = f"document 13 is a held-out example of language '{language}'"
    for stage in (
        lambda: stages.objective_of(recipe).plan(recipe.training),
        lambda: stages.prepare(recipe, progress=False),
    ):
        with pytest.raises(UserInputError, match=said):
            stage()
    assert not RunLayout(recipe.output_dir).teacher_text("xx").exists()
    return path, held[0]


def test_a_prompt_from_the_test_text_is_refused(tmp_path: Path, causal_teacher_dirs) -> None:
    path, held = _held_out_prompt_refused(tmp_path, causal_teacher_dirs, "xx")
    # the held-out document with words after it is another document, with the same beginning
    (tmp_path / "prompts.txt").write_text(
        "\n".join([*documents(14, seed=77)[:12], held.strip() + " and more words"]) + "\n",
        encoding="utf-8",
    )
    recipe = load_recipe(path)
    with pytest.raises(UserInputError, match=r"document 13 begins as held-out example xx-\w+ does"):
        stages.objective_of(recipe).plan(recipe.training)
    assert not RunLayout(recipe.output_dir).teacher_text("xx").exists()


def test_a_prompt_from_another_languages_test_text_is_refused(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """Prompts for xx drawn from yy's corpus, held-out documents and all: the check had looked
    at xx's held-out examples alone, and the students, which train on every language, trained
    on the beginning of yy's test text."""
    _held_out_prompt_refused(tmp_path, causal_teacher_dirs, "yy")


def test_a_masked_recipe_has_no_teacher_text(tmp_path: Path) -> None:
    from lmalgebra.distill.recipe import parse_recipe

    data = {
        "languages": {"xx": {"corpus": {"paths": ["x.txt"]}, "teachers": ["t"]}},
        "teachers": {"t": {"path": "t"}},
        "teacher_text": {},
    }
    with pytest.raises(UserInputError, match="teacher_text"):
        parse_recipe(data, "recipe.yaml")


def test_a_prompt_past_the_teachers_positions_is_refused(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """Refused by prepare, and by the dry run in the same line (it had planned the run: it
    checked the prompts against the held-out text, not against the teacher's positions)."""
    recipe = load_recipe(_recipe(tmp_path, causal_teacher_dirs, new_tokens=250, prompt_chars=400))
    for stage in (
        lambda: stages.plan(recipe, stages=["prepare"]),
        lambda: stages.prepare(recipe, progress=False),
    ):
        with pytest.raises(
            UserInputError, match=r"teacher_text.xx: prompt 1 is \d+ tokens of teacher 'bl'"
        ):
            stage()
    assert not list((tmp_path / "run" / "teacher_text").glob("*/shard-*"))


@pytest.mark.parametrize("section", ["teacher_text", "training"])
def test_a_temperature_whose_softmax_overflows_is_refused(
    tmp_path: Path, causal_teacher_dirs, section: str
) -> None:
    """Logits divided by 1e-40 overflow float32: sampling had stopped on a NaN probability
    (a traceback), training on a NaN loss blamed on the learning rate."""
    if section == "teacher_text":
        path = _recipe(tmp_path, causal_teacher_dirs, temperature=1e-40)
    else:
        path = write_causal_recipe(
            tmp_path, causal_teacher_dirs, student=CAUSAL_STUDENT, training={"temperature": 1e-40}
        )
    key = "teacher_text.xx.temperature" if section == "teacher_text" else "training.temperature"
    with pytest.raises(UserInputError, match=rf"key '{key}': .*greater than or equal to 0.0001"):
        load_recipe(path)


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_text_the_examples_hold_is_not_written_anew_from_other_inputs(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """Prompts or a teacher changed after prepare: prepare had written the text anew, then
    refused the examples, leaving a run whose text and examples disagree (and a changed teacher
    trained students on its old text). Refused by name, the run left as it was."""
    from safetensors.torch import load_file, save_file

    path = _recipe(tmp_path, causal_teacher_dirs)
    stages.prepare(load_recipe(path), progress=False)
    directory = RunLayout(load_recipe(path).output_dir).teacher_text("xx")
    before = _files(directory)
    prompts = tmp_path / "prompts.txt"
    kept = prompts.read_text(encoding="utf-8")
    prompts.write_text("Changed " + kept, encoding="utf-8")
    edited = r"teacher_text.xx: the prompts \(.*\) changed since"
    with pytest.raises(UserInputError, match=edited):
        stages.prepare(load_recipe(path), progress=False)
    with pytest.raises(UserInputError, match=edited):  # the dry run refuses it alike
        stages.plan(load_recipe(path), stages=["prepare"])
    assert _files(directory) == before
    prompts.write_text(kept, encoding="utf-8")
    teacher = tmp_path / "bl-edited"
    shutil.copytree(causal_teacher_dirs["bl"], teacher)
    weights = load_file(teacher / "model.safetensors")
    name = next(k for k in weights if k.endswith("c_fc.weight"))
    weights[name] = weights[name] * 1.5
    save_file(weights, teacher / "model.safetensors", metadata={"format": "pt"})
    data = yaml.safe_load(path.read_text())
    data["teachers"]["bl"]["path"] = str(teacher)
    path.write_text(yaml.safe_dump(data))
    recipe = load_recipe(path)
    with pytest.raises(UserInputError, match="the weights of teacher 'bl' changed since"):
        stages.prepare(recipe, progress=False)
    assert _files(directory) == before
    with pytest.raises(UserInputError, match="written by teacher 'bl' before its weights changed"):
        stages.objective_of(recipe).check_store()  # training and evaluation refuse it too


def test_a_part_that_is_no_directory_is_named_before_training(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """A FIFO or file where a set belongs had passed `merge verify` (only a missing one was
    named), and examples gone had passed `merge train --dry-run` (training refused them)."""
    recipe = load_recipe(_recipe(tmp_path, causal_teacher_dirs))
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    layout = RunLayout(recipe.output_dir)
    shutil.rmtree(layout.teacher_text("xx"))
    os.mkfifo(layout.teacher_text("xx"))
    shutil.rmtree(layout.examples("yy"))
    layout.examples("yy").write_text("not a set\n")
    problems = " ".join(verify_run(recipe.output_dir, ("tokens", "logprobs"), False))
    assert f"{layout.teacher_text('xx')} is a FIFO, socket or device, not a directory" in problems
    assert f"{layout.examples('yy')} is a file, not a directory" in problems
    missing = stages.objective_of(recipe).missing_input("train")
    assert missing == (
        f"{layout.examples('yy')} is missing or incomplete: run `lmalgebra merge prepare RECIPE` "
        "first"
    )


def test_examples_drawn_again_from_other_text_are_taught_again(
    tmp_path: Path, causal_teacher_dirs
) -> None:
    """Prompts edited and the examples deleted, as the refusal of the edit allows: prepare drew
    the examples again, but kept the teachers' copies and outputs (keyed by the same settings)
    made from the old ones; verify passed, and training refused the copies in a line that sent
    the user back to prepare, which kept them again. Each set now records what it was computed
    from: prepare and teach compute again what was made from other contents."""
    path = _recipe(tmp_path, causal_teacher_dirs)
    recipe = load_recipe(path)
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    layout = RunLayout(recipe.output_dir)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Changed " + prompts.read_text(encoding="utf-8"), encoding="utf-8")
    shutil.rmtree(layout.examples("xx"))
    stages.prepare(recipe, progress=False)
    problems = verify_run(recipe.output_dir, ("tokens", "logprobs"), False)
    stale = layout.store("logprobs", "xx", "bl")
    assert any(p.startswith(f"{stale} was computed from other rows than") for p in problems)
    assert not any("tokens" in p.split(" ", 1)[0] for p in problems)  # computed again
    with pytest.raises(UserInputError, match=f"{stale} was computed from other rows"):
        stages.objective_of(recipe).check_store()
    stages.teach(recipe, progress=False)
    assert verify_run(recipe.output_dir, ("tokens", "logprobs"), False) == []
    stages.objective_of(recipe).check_store()


def test_inspect_counts_the_written_examples(prepared: Path) -> None:
    from lmalgebra.distill.causal.inspection import causal_report

    recipe = load_recipe(prepared)
    written = len(set(_stored(prepared, "teacher_text").column("text").to_pylist()))
    rows = {(r["language"], r["teacher"]): r for r in causal_report(recipe.output_dir).pairs}
    assert rows[("xx", "bl")]["written"] == rows[("xx", "uni")]["written"] == written
    assert rows[("yy", "wp")]["written"] == 0


@pytest.mark.parametrize("damage", ["manifest edited", "set removed"])
def test_text_whose_record_is_damaged_is_refused_until_written_again(
    tmp_path: Path, causal_teacher_dirs, damage: str
) -> None:
    """The text's manifest damaged, or its set gone, while the examples hold the text: training
    and evaluation had skipped the check of the teacher that wrote it (and trained); refused by
    name, by the dry run of training too, until prepare writes it again."""
    recipe = load_recipe(_recipe(tmp_path, causal_teacher_dirs))
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    directory = RunLayout(recipe.output_dir).teacher_text("xx")
    if damage == "set removed":
        shutil.rmtree(directory)
    else:
        manifest = directory / "manifest.json"
        text = manifest.read_text(encoding="utf-8")
        manifest.write_text(text.replace('"documents": 10', '"documents": 11'), encoding="utf-8")
    refusal = f"{directory}: missing, damaged or incomplete"
    objective = stages.objective_of(recipe)
    with pytest.raises(UserInputError, match=refusal):
        objective.check_store()
    assert (objective.missing_input("train") or "").startswith(refusal)
    assert any(p.startswith(refusal) for p in stages.verify(recipe.output_dir))
    stages.prepare(recipe, progress=False)
    objective.check_store()
    assert objective.missing_input("train") is None
