"""A refusal names what its reader gave, as they gave it: a Python caller the keys and keywords
of the call (not the command line's flags), a section built alone its own keys, a command's
remedy that command's own, and a count in the number it is."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

import lmalgebra
from hostile_helpers import assert_one_line
from lmalgebra.core.errors import UserInputError, counted
from merge_fixtures import TINY_STUDENT, write_recipe


def _decompose_recipe(root: Path, bert: Path, bert2: Path, corpus: Path, **keys: Any) -> Path:
    recipe = {
        "models": [{"name": "a", "path": str(bert)}, {"name": "b", "path": str(bert2)}],
        "corpus": {"paths": [str(corpus)]},
        "out": str(root / "run"),
        **keys,
    }
    path = root / "r.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def test_a_section_built_alone_names_its_own_keys() -> None:
    """``StudySpec(level=0.9)`` had been refused as ``study.level 0.9 ... study.bootstrap``, keys
    of a recipe it was not part of, as a plain ``UserInputError``; a section built alone names
    its own keys, inside a recipe the recipe's, as a ``ValueError``, as a bad value's refusal
    is."""
    from lmalgebra.distill.recipe import CausalSpec, MaskingSpec
    from lmalgebra.lmd.settings.scale import ScaleSpec
    from lmalgebra.lmd.settings.study import StudySpec

    built = {
        "level 0.9 would be ignored: it applies to bootstrap intervals only": (
            lambda: StudySpec(level=0.9)
        ),
        "probes 5 would be ignored: it applies to method reduced or sketch only": (
            lambda: ScaleSpec(probes=5)
        ),
        "sample_seed 3 would be ignored: it applies to samples above 0 only": (
            lambda: CausalSpec(sample_seed=3)
        ),
        "replace must be >= 0 and sum to 1, got [0.5, 0.5, 0.5]": (
            lambda: MaskingSpec(replace=[0.5, 0.5, 0.5])
        ),
    }
    for message, build in built.items():
        with pytest.raises(ValueError) as caught:
            build()
        assert isinstance(caught.value, UserInputError)
        assert str(caught.value) == message
    models = [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}]
    with pytest.raises(ValueError, match=r"^study\.level 0\.9 .*study\.bootstrap"):
        lmalgebra.DecomposeConfig(models=models, corpus={"paths": ["c.txt"]}, study={"level": 0.9})


def test_a_recipe_file_run_from_python_names_its_keys_and_the_file(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """``decompose_recipe("r.yaml")`` had been told ``--study.level 0.9 ... --study.bootstrap``,
    flags of a command it never ran, naming no file; the command line's refusal of the same
    file names the flags, as before."""
    recipe = _decompose_recipe(tmp_path, bert_dir, bert2_dir, corpus_txt, study={"level": 0.9})
    with pytest.raises(UserInputError) as caught:
        lmalgebra.decompose_recipe(recipe)
    assert str(caught.value) == (
        f"decompose_recipe() recipe {recipe}: study.level 0.9 would be ignored: it applies to "
        "study.bootstrap intervals only"
    )
    code, stderr = cli(["decompose", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["--study.level 0.9", "--study.bootstrap"])
    assert not (tmp_path / "run").exists()


def test_a_path_found_beside_the_recipe_names_the_recipes_directory_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """A recipe reached as ``../p1/r.yaml`` whose relative model path names something beside
    it had been refused naming ``/x/else/../p1`` as its directory, and as the one to run from."""
    (tmp_path / "p1" / "m").mkdir(parents=True)
    (tmp_path / "else").mkdir()
    recipe = _decompose_recipe(tmp_path / "p1", Path("m"), bert2_dir, corpus_txt)
    monkeypatch.chdir(tmp_path / "else")
    code, stderr = cli(["decompose", str(Path("..", "p1", recipe.name)), "--dry-run"])
    line = assert_one_line(code, stderr, ["'models.0.path'", f"run the command from {tmp_path}/p1"])
    assert "/../" not in line


def test_a_shipped_recipe_name_is_refused_where_no_decomposition_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """``recipe:NAME`` names the decomposition recipes shipped with lmalgebra: given to a merge
    it had been read as a merge recipe ("unknown key 'models'"), or refused listing the
    decomposition recipes; given to pretrain, called a spec that "does not exist". A merge
    recipe's own file of that name is read."""
    monkeypatch.chdir(tmp_path)
    shipped = "shipped with lmalgebra (for lmalgebra decompose), not a"
    refused = f"^recipe recipe:decompose-minilm-wiki: .*{re.escape(shipped)}"
    with pytest.raises(UserInputError, match=refused):
        lmalgebra.merge_plan("recipe:decompose-minilm-wiki")
    code, stderr = cli(["merge", "prepare", "recipe:nothing"])
    line = assert_one_line(code, stderr, ["recipe recipe:nothing", shipped, "MergeDistill recipe"])
    assert "decompose-minilm-wiki" not in line
    code, stderr = cli(["pretrain", "masked", "recipe:nothing", "--out", "t"])
    line = assert_one_line(code, stderr, ["pretrain spec recipe:nothing", f"{shipped} pretrain"])
    assert "does not exist" not in line
    Path("recipe:mine").write_text("languages: {}\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"^recipe:mine: ") as caught:
        lmalgebra.merge_plan("recipe:mine")
    assert shipped not in str(caught.value)


def test_pooling_is_named_as_flag_and_keyword(tmp_path: Path, teacher_dirs, cli) -> None:
    """``MergeRun.evaluate(pooling="last")`` of a masked run had been told that "pooling
    applies to causal runs only", and of a causal run ``evaluate: key 'pooling'``, a key of
    no file; both name the flag and the keyword, and the value given."""
    masked = write_recipe(tmp_path, teacher_dirs).parent
    (masked / "examples").mkdir()  # a run's, as its copy of the recipe is
    with pytest.raises(UserInputError) as caught:
        lmalgebra.MergeRun.load(masked).evaluate(pooling="last")
    assert str(caught.value).startswith("--pooling (pooling=) 'last' would be ignored: it ")
    code, stderr = cli(["merge", "evaluate", str(masked), "--pooling", "max"])
    assert_one_line(code, stderr, ["--pooling (pooling=) 'max' would be ignored", "causal runs"])
    assert not (masked / "evaluation").exists()


def test_a_refused_retraining_offers_the_commands_own_remedy(tmp_path: Path) -> None:
    """A teacher trained further than a pretrain asks, refused, had been offered ``merge train
    --name`` and ``students`` beside ``--out``, the remedies of two commands, and "1 steps"."""
    from lmalgebra.api.pretrain import CausalPretrainSpec, pretrain

    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n\nmore text here\n", encoding="utf-8")
    spec = {"language": "xx", "corpus": {"paths": [str(corpus)]}, "out": str(tmp_path / "t")}
    pretrain(CausalPretrainSpec(**spec, tokenizer={"vocab_size": 300}, training={"steps": 1}))
    fewer = CausalPretrainSpec(**spec, tokenizer={"vocab_size": 300}, training={"steps": 0})
    with pytest.raises(UserInputError) as caught:
        pretrain(fewer)
    message = str(caught.value)
    assert "holds a run trained 1 step: training.steps 0" in message
    assert message.endswith("train another beside it (another --out (another out in the spec))")
    assert "merge" not in message and "students" not in message


def test_a_model_saved_untrained_is_not_called_trained(tmp_path: Path) -> None:
    """A teacher saved with ``steps: 0``, then asked for training of other settings, was
    refused as "trained with other settings", which it never was."""
    from lmalgebra.api.pretrain import CausalPretrainSpec, pretrain

    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n\nmore text here\n", encoding="utf-8")
    spec = {"language": "xx", "corpus": {"paths": [str(corpus)]}, "out": str(tmp_path / "t")}
    pretrain(CausalPretrainSpec(**spec, tokenizer={"vocab_size": 300}, training={"steps": 0}))
    other = {"steps": 1, "batch_size": 4}
    with pytest.raises(UserInputError) as caught:
        pretrain(CausalPretrainSpec(**spec, tokenizer={"vocab_size": 300}, training=other))
    message = str(caught.value)
    assert "was saved untrained (steps 0) with other settings (training.batch_size" in message
    assert "was trained" not in message


def test_a_refused_student_offers_the_merges_own_remedy(tmp_path: Path, teacher_dirs) -> None:
    """The same refusal of a merge's student names another student of the merge, not
    ``pretrain --out``."""
    training = {"steps": 1, "batch_size": 8, "warmup_steps": 0, "log_every": 1}
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    lmalgebra.merge(recipe, ["prepare", "teach", "vocab", "train"], progress=False)
    with pytest.raises(UserInputError) as caught:
        lmalgebra.merge(recipe, ["train"], students={"student": {"steps": 0}}, progress=False)
    message = str(caught.value)
    assert "holds a run trained 1 step: training.steps 0 would replace it" in message
    assert "(`lmalgebra merge train RECIPE --name OTHER` (merge(recipe, 'train'," in message
    assert "pretrain" not in message and "--out" not in message


def test_a_users_config_json_is_not_called_a_model(tmp_path: Path, cli) -> None:
    """A ``config.json`` of the user's own (no model's configuration) in ``pretrain --out`` had
    been refused as "a model lmalgebra did not write"; a model's configuration still is."""
    out = tmp_path / "mine"
    out.mkdir()
    (out / "config.json").write_text(json.dumps({"learning_rate": 1}), encoding="utf-8")
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n", encoding="utf-8")
    args = ["pretrain", "causal", "--language", "xx", "--corpus.paths", str(corpus)]
    args += ["--tokenizer.vocab_size", "300", "--out", str(out)]
    code, stderr = cli(args)
    line = assert_one_line(code, stderr, [f"{out} holds a file of the user's (config.json)"])
    assert "did not write" not in line
    (out / "config.json").write_text(json.dumps({"model_type": "gpt2"}), encoding="utf-8")
    code, stderr = cli(args)
    assert_one_line(code, stderr, [f"{out} holds a model lmalgebra did not write (config.json)"])
    assert sorted(p.name for p in out.iterdir()) == ["config.json"]


@pytest.mark.parametrize(
    "given, reason",
    [
        ({"gold_only": True}, "gold_only=True"),
        ({"objective_mix": {"ce": 1.0}}, "objective_mix {ce} (the CE-only baseline)"),
    ],
)
def test_a_kd_weight_in_a_run_that_distils_nothing_names_why(
    given: dict[str, Any], reason: str
) -> None:
    """``lambda_value`` beside gold labels alone or CE alone had been refused as annealed by
    the linear schedule, with the remedy ``lambda_schedule: constant``, which would not use it
    either: the refusal names what makes the run distil nothing."""
    from lmalgebra.train.config import CausalTrainingSpec

    with pytest.raises(UserInputError) as caught:
        CausalTrainingSpec(**given, lambda_value=0.3)
    assert str(caught.value).startswith(f"lambda_value 0.3 would be ignored under {reason}:")
    assert "lambda_schedule" not in str(caught.value)


def test_a_training_section_built_alone_names_its_own_keys() -> None:
    """``TrainingSpec(gold_only=True, temperature=2)`` (and the causal and teacher training
    sections, built alone) had been refused naming ``training.temperature`` and
    ``training.gold_only: true``, keys of a recipe the caller never wrote; within a recipe
    the recipe's keys are named, as before."""
    from lmalgebra.distill.pretrain.specs import TeacherTrainingSpec
    from lmalgebra.train.config import CausalTrainingSpec, TrainingSpec

    built = {
        "temperature 2.0 would be ignored under gold_only=True: it shapes the distillation "
        "term, and this run distils nothing; leave it out": (
            lambda: TrainingSpec(gold_only=True, temperature=2)
        ),
        "teachers is empty: name at least one teacher, or omit it": (
            lambda: TrainingSpec(teachers=[])
        ),
        "lambda_value 0.3 would be ignored: the linear lambda_schedule anneals the KD weight "
        "from 1 to 0; set lambda_schedule constant to use it": (
            lambda: TrainingSpec(lambda_value=0.3)
        ),
        "patience 2 would be ignored: it counts validations; set validation_every and "
        "validation_fraction": (lambda: CausalTrainingSpec(patience=2)),
        "kd_balance gradient would be ignored: gold_only=True trains on CE alone, with no "
        "distillation term to balance": (
            lambda: CausalTrainingSpec(gold_only=True, kd_balance="gradient")
        ),
        "objective_mix would be ignored: gold_only=True trains on gold labels alone; give one "
        "of them": (lambda: CausalTrainingSpec(gold_only=True, objective_mix={"alm": 1.0})),
        "warmup_steps 10 exceeds steps 5: the learning rate would never reach lr; use "
        "warmup_steps <= 5": (lambda: TeacherTrainingSpec(steps=5, warmup_steps=10)),
    }
    for message, build in built.items():
        with pytest.raises(ValueError) as caught:
            build()
        assert isinstance(caught.value, UserInputError)
        assert str(caught.value) == message
    training = {"gold_only": True, "temperature": 2}
    with pytest.raises(UserInputError, match=r"^training\.temperature 2\.0 .* under training\."):
        lmalgebra.MergeRecipe.model_validate({"teachers": {}, "training": training})


def test_a_students_training_given_to_merge_plan_names_the_keys_given(
    tmp_path: Path, teacher_dirs
) -> None:
    """``merge_plan(recipe, training={"gold_only": True, "temperature": 2})`` had been told of
    ``training.temperature`` under ``training.gold_only: true``, a recipe's keys in YAML's
    spelling: the keys of the mapping it gave are named, after the call."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    for training in ({"gold_only": True, "temperature": 2}, lmalgebra.TrainingSpec(steps=2)):
        if isinstance(training, lmalgebra.TrainingSpec):  # unchecked, as a model_copy is
            training = training.model_copy(update={"gold_only": True, "temperature": 2.0})
        with pytest.raises(UserInputError) as caught:
            lmalgebra.merge_plan(recipe, training=training)
        assert str(caught.value).startswith(
            "merge_plan() training: temperature 2.0 would be ignored under gold_only=True: "
        ), caught.value
    assert not (tmp_path / "run").exists()


def test_a_model_name_refused_from_python_names_the_calls_key(
    bert_dir: Path, bert2_dir: Path
) -> None:
    """A model name holding ``+`` given to ``decompose()`` had been told to rename it with
    ``--models NAME=REFERENCE`` or a recipe's ``name:``, neither of which the call has."""
    with pytest.raises(UserInputError, match=r"the key of decompose\(\)'s models\)"):
        lmalgebra.decompose_plan({"a+b": str(bert_dir), "c": str(bert2_dir)}, ["some text"])


def test_counted_says_one_thing_in_the_singular() -> None:
    assert [counted(n, "weight") for n in (0, 1, 2)] == ["0 weights", "1 weight", "2 weights"]
    assert counted(1, "layer") == "1 layer" and counted(3, "body", "bodies") == "3 bodies"


def test_a_link_to_a_link_to_nothing_names_where_the_chain_ends(
    tmp_path: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """A model path that is a link to a link to nothing had been called "a symbolic link to
    LINK, which does not exist", where LINK is there (a link): the path that is missing is
    named."""
    (tmp_path / "first").symlink_to(tmp_path / "gone")
    (tmp_path / "second").symlink_to(tmp_path / "first")
    args = ["decompose", "--models", f"a={tmp_path / 'second'}", "--models", f"b={bert2_dir}"]
    code, stderr = cli([*args, "--corpus.paths", str(corpus_txt), "--dry-run"])
    assert_one_line(
        code,
        stderr,
        [
            f"is a symbolic link to {tmp_path / 'first'}, itself a link leading to "
            f"{tmp_path / 'gone'}, which does not exist"
        ],
    )


def test_a_flags_bad_value_over_a_recipe_is_named_as_the_flag(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """``decompose r.yaml --study.level 2`` had been refused as ``r.yaml: key 'study.level'``,
    blaming the file for the flag's value; a bad value of the file itself is still the file's."""
    recipe = _decompose_recipe(tmp_path, bert_dir, bert2_dir, corpus_txt, spans={"length": 8})
    code, stderr = cli(["decompose", str(recipe), "--study.level", "2", "--dry-run"])
    line = assert_one_line(code, stderr, ["command line: --study.level: ", "got 2.0"])
    assert str(recipe) not in line
    recipe = _decompose_recipe(tmp_path, bert_dir, bert2_dir, corpus_txt, spans={"length": 0})
    code, stderr = cli(["decompose", str(recipe), "--study.lengths", "8,16", "--dry-run"])
    assert_one_line(code, stderr, [f"{recipe}: key 'spans.length'"])
    assert not (tmp_path / "run").exists()


def test_a_stage_refused_names_the_call_and_its_argument(tmp_path: Path, teacher_dirs) -> None:
    """``merge(recipe, "verify")`` had been told ``unknown stage 'verify'``, naming neither the
    call nor its argument."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    for call, wanted in (
        (lambda: lmalgebra.merge(recipe, ["prepare", "bake"]), r"^merge\(\): stages: unknown "),
        (lambda: lmalgebra.merge_plan(recipe, stages=[]), r"^merge_plan\(\): stages: no stage "),
    ):
        with pytest.raises(UserInputError, match=wanted):
            call()
    assert not (tmp_path / "run").exists()


def test_spans_too_long_for_the_text_are_named_as_the_remedy(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path
) -> None:
    """Spans longer than any document had been refused with "give more text, or a larger
    fraction", not the span length that left no span."""
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    with pytest.raises(UserInputError) as caught:
        lmalgebra.decompose_plan(models, str(corpus_txt), spans={"length": 10**6})
    assert str(caught.value).endswith(
        """or shorter spans (--spans.length (spans={"length": N}))"""
    ), caught.value


def test_a_save_refused_names_the_method_of_its_class(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path
) -> None:
    """``Decomposition.save(FILE)`` had been refused as ``save() directory FILE``, a function
    lmalgebra does not have; it names the method, as the class's other refusals do."""
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    spans = {"length": 8, "counts": (20, 5, 5)}
    found = lmalgebra.decompose(models, str(corpus_txt), spans=spans, cache_dir=tmp_path / "c")
    (tmp_path / "file").write_text("mine\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"^Decomposition\.save\(\) directory .*file is a"):
        found.save(tmp_path / "file")
    assert (tmp_path / "file").read_text(encoding="utf-8") == "mine\n"


def test_report_of_a_run_directory_that_is_none_names_the_run_directory(
    tmp_path: Path, cli
) -> None:
    """``lmalgebra report FILE`` (or a link to nothing) had been refused as ``cannot create
    report file FILE/report.html``, naming the page it would write, not the run it was given."""
    (tmp_path / "file").write_text("mine\n", encoding="utf-8")
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    for given, said in (("file", "is a file, not a directory"), ("gone", "which does not exist")):
        code, stderr = cli(["report", str(tmp_path / given)])
        line = assert_one_line(code, stderr, [f"run directory {tmp_path / given} ", said])
        assert "report file" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "gone"]


def test_a_recipes_rule_on_a_students_training_names_the_keys_given(
    tmp_path: Path, teacher_dirs, causal_teacher_dirs
) -> None:
    """The rules a recipe applies to a student's training (a choice of teachers where a causal
    student distils nothing, ``sampling_exponent`` with one language) had named
    ``training.multi_teacher ... under training.gold_only: true`` to a Python caller that gave
    ``training={"gold_only": True, "multi_teacher": "best"}``, and no call: the keys of the
    call's mapping are named, after the call."""
    from causal_fixtures import write_causal_recipe

    (tmp_path / "c").mkdir()
    (tmp_path / "m").mkdir()
    causal = write_causal_recipe(tmp_path / "c", causal_teacher_dirs)
    with pytest.raises(UserInputError) as caught:
        lmalgebra.merge_plan(causal, training={"gold_only": True, "multi_teacher": "best"})
    assert str(caught.value).startswith(
        "merge_plan() training: multi_teacher 'best' would be ignored under gold_only=True: a "
        "causal student that distils nothing"
    ), caught.value
    one = {"xx": {"corpus": {"paths": [str(tmp_path / "m" / "xx.txt")]}, "teachers": ["wp"]}}
    masked = write_recipe(tmp_path / "m", {"wp": teacher_dirs["wp"]}, languages=one)
    with pytest.raises(UserInputError) as caught:
        lmalgebra.merge(masked, ["train"], students={"s": {"sampling_exponent": 0.3}})
    assert str(caught.value) == (
        "merge() students: sampling_exponent 0.3 would be ignored: it applies to recipes of "
        "several languages only"
    )
    assert not (tmp_path / "c" / "run").exists() and not (tmp_path / "m" / "run").exists()


def test_a_bad_argument_to_quiet_or_a_run_inspections_frame_names_the_call() -> None:
    """``lmalgebra.quiet(True)`` and ``RunInspection.frame("x")`` had raised Python's own
    ``TypeError`` (``quiet() takes 0 positional arguments but 1 was given``): one
    ``UserInputError`` names the call and the argument, as the API's entry points name theirs."""
    inspection = lmalgebra.RunInspection(Path("run"), [], [], "", "", None)
    calls = {
        "quiet(): takes no argument, got True": lambda: lmalgebra.quiet(True),
        "quiet(): got an unexpected keyword argument 'on'": lambda: lmalgebra.quiet(on=True),
        "RunInspection.frame(): takes no argument, got 'x'": lambda: inspection.frame("x"),
        "RunInspection.as_dict(): takes no argument, got 2": lambda: inspection.as_dict(2),
    }
    for message, call in calls.items():
        with pytest.raises(TypeError) as caught:
            call()
        assert isinstance(caught.value, UserInputError)
        assert str(caught.value) == message
    with lmalgebra.quiet():  # called as it takes it: as before
        assert inspection.as_dict()["pairs"] == []


def test_a_key_of_another_pretrain_spec_names_the_module_it_is_imported_from() -> None:
    """A key of another teacher spec had been named by the module that defines it
    (``lmalgebra.distill.pretrain.specs.MaskedPretrainSpec``), not where the documentation
    imports it from: ``lmalgebra.api.pretrain``; ``TrainingSpec`` by ``lmalgebra``'s own."""
    import lmalgebra.api.pretrain as pretrain
    from lmalgebra.distill.pretrain.specs import TeacherTrainingSpec

    with pytest.raises(ValueError, match=r"a key of lmalgebra\.api\.pretrain\.MaskedPretrainSpec "):
        pretrain.HeadOnlySpec(tokenizer={"vocab_size": 300})
    with pytest.raises(ValueError, match=r"a key of lmalgebra\.api\.pretrain\.HeadOnlySpec "):
        pretrain.CausalPretrainSpec(encoder="x")
    with pytest.raises(ValueError, match=r"a key of lmalgebra\.TrainingSpec "):
        TeacherTrainingSpec(temperature=2)
    assert {"MaskedPretrainSpec", "HeadOnlySpec"} <= set(pretrain.__all__)
