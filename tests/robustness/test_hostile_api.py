"""Bad arguments to the Python API: every one is a single ``UserInputError`` naming the argument
(also the ``TypeError`` or ``ValueError`` a caller expects), never a raw exception from deep
inside, and nothing is left written."""

from __future__ import annotations

import ast
import copy
import inspect
import re
import shutil
import typing
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import lmalgebra
from hostile_helpers import assert_one_line
from lmalgebra import Decomposition, MergeRun, UserInputError
from lmalgebra.api.runtime import ENTRY_POINT
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe
from tiny import documents

STRINGS = np.array([["a", "b"], ["c", "d"], ["e", "f"]])


@pytest.mark.parametrize("argument", ["X", "y"])
def test_a_string_array_to_fit_names_the_array(argument: str) -> None:
    numbers = np.zeros((3, 2))
    X, y = (STRINGS, numbers) if argument == "X" else (numbers, STRINGS)  # noqa: N806 (sklearn)
    with pytest.raises(UserInputError) as caught:
        lmalgebra.LinearDecomposition().fit(X, y)
    assert isinstance(caught.value, ValueError)  # what scikit-learn's conventions expect
    assert str(caught.value).startswith(f"{argument}: ") and "strings" in str(caught.value)


# (arguments after the recipe, keywords, the argument's name in the message, what it was given)
MERGE: dict[str, tuple[tuple[Any, ...], dict[str, Any], str]] = {
    "stages_none": ((None,), {}, "stages must be Sequence[str] | str, got None"),
    "stages_number": ((3,), {}, "stages must be Sequence[str] | str, got 3"),
    "students_list": ((["prepare"],), {"students": ["s"]}, "students must be Mapping"),
    "students_training_number": ((["prepare"],), {"students": {"s": 3}}, "students must be"),
    "students_training_pairs": (
        (["prepare"],),
        {"students": {"s": [("steps", 2)]}},
        "TrainingSpec | Mapping[str, Any] | None] | None, got {'s': [('steps', 2)]}",
    ),
    "languages_one_string": ((["prepare"],), {"languages": "xx"}, "languages must be"),
    "unknown_keyword": ((["prepare"],), {"student": {}}, "unexpected keyword argument 'student'"),
}


@pytest.mark.parametrize("case", list(MERGE))
def test_a_bad_argument_to_merge_names_it(
    case: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    args, kwargs, needle = MERGE[case]
    recipe = write_recipe(tmp_path, teacher_dirs)
    with pytest.raises(UserInputError) as caught:
        lmalgebra.merge(recipe, *args, **kwargs)
    assert isinstance(caught.value, TypeError)  # what Python raises for a bad call
    assert str(caught.value).startswith("merge(): ") and needle in str(caught.value)
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "run").exists()


def test_a_bad_training_to_merge_plan_names_it(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    with pytest.raises(UserInputError, match=r"^merge_plan\(\): training must be .*, got 3$"):
        lmalgebra.merge_plan(write_recipe(tmp_path, teacher_dirs), training=3)
    # pairs are no mapping; the message spells the accepted types, not an alias
    wanted = "training must be TrainingSpec | Mapping[str, Any] | None, got [('steps', 2)]"
    with pytest.raises(UserInputError, match=re.escape(wanted) + "$"):
        lmalgebra.merge_plan(write_recipe(tmp_path, teacher_dirs), training=[("steps", 2)])


@pytest.mark.parametrize(
    "call",
    [
        lambda: Decomposition.load(None),
        lambda: MergeRun.load(3),
        lambda: lmalgebra.read_texts(3),
        lambda: lmalgebra.decompose({"a": "package:minilm"}, ["text"], out=3),
        lambda: lmalgebra.decompose_recipe(3),
    ],
    ids=["Decomposition.load", "MergeRun.load", "read_texts", "decompose", "decompose_recipe"],
)
def test_a_value_of_the_wrong_type_to_an_entry_point_names_it(call: Any) -> None:
    with pytest.raises(UserInputError, match=r"^\S+\(\): \w+ must be .*, got (None|3)$"):
        call()


def test_every_public_function_checks_its_arguments() -> None:
    for name in ("decompose", "decompose_plan", "decompose_recipe", "spans", "read_texts"):
        assert getattr(getattr(lmalgebra, name), ENTRY_POINT, False), name
    for name in ("merge", "merge_plan"):
        assert getattr(getattr(lmalgebra, name), ENTRY_POINT, False), name
    for cls in (Decomposition, MergeRun):  # every public method that takes an argument
        for name, method in vars(cls).items():
            function = getattr(method, "__func__", method)
            if name.startswith("_") or not inspect.isfunction(function):
                continue
            if len(inspect.signature(function).parameters) > 1:
                assert getattr(function, ENTRY_POINT, False), f"{cls.__name__}.{name}"


@pytest.mark.parametrize("spec", [None, "teacher.yaml", "mapping"])
def test_pretrain_names_a_spec_that_is_not_one(spec: Any, tmp_path: Path) -> None:
    """``pretrain`` checked nothing: None, a path or a mapping of a valid spec's keys (which a
    lax check would make into the spec the function never receives) ended in AttributeError."""
    from lmalgebra.api.pretrain import pretrain

    if spec == "mapping":
        corpus = tmp_path / "c.txt"
        corpus.write_text("some text\n", encoding="utf-8")
        spec = {"language": "xx", "corpus": {"paths": [str(corpus)]}, "out": str(tmp_path / "t")}
        spec |= {"tokenizer": {"vocab_size": 300}, "training": {"steps": 1}}
    with pytest.raises(UserInputError, match=r"^pretrain\(\): spec must be TeacherSpec, got "):
        pretrain(spec)
    assert not (tmp_path / "t").exists()


def _causal_spec(tmp_path: Path) -> Any:
    from lmalgebra.api.pretrain import CausalPretrainSpec

    corpus = tmp_path / "c.txt"
    corpus.write_text("some text\n", encoding="utf-8")
    spec = {"language": "xx", "corpus": {"paths": [str(corpus)]}, "out": str(tmp_path / "t")}
    return CausalPretrainSpec(**spec, tokenizer={"vocab_size": 300}, training={"steps": 1})


# a copy with one value replaced (pydantic checks none), the key the message names
UNCHECKED_COPIES: dict[str, tuple[Any, str]] = {
    "model_none": (lambda s: s.model_copy(update={"model": None}), "'model'"),
    "out_none": (lambda s: s.model_copy(update={"out": None}), "'out'"),
    "language_none": (lambda s: s.model_copy(update={"language": None}), "'language'"),
    "steps_bool": (
        lambda s: s.model_copy(update={"training": s.training.model_copy(update={"steps": True})}),
        "'training.steps': a boolean is no integer",
    ),
    # a None read as 0 by the refusal of settings untrained runs ignore, which had been raised
    # as `example_length 32 would be ignored`, naming a value that was fine
    "steps_none_beside_a_length": (
        lambda s: s.model_copy(
            update={"example_length": 32, "training": s.training.model_copy(update={"steps": None})}
        ),
        "'training.steps': Input should be a valid integer, got None",
    ),
}


@pytest.mark.parametrize("case", sorted(UNCHECKED_COPIES))
def test_pretrain_checks_a_spec_copied_with_a_bad_value(case: str, tmp_path: Path) -> None:
    """A spec copied with ``model_copy(update=...)`` is not validated by pydantic: a None had
    reached an attribute deep inside (AttributeError, TypeError), or trained a teacher of
    language None."""
    from lmalgebra.api.pretrain import pretrain

    copy_with, key = UNCHECKED_COPIES[case]
    with pytest.raises(UserInputError, match=r"^pretrain\(\): spec CausalPretrainSpec: "):
        pretrain(copy_with(_causal_spec(tmp_path)))
    with pytest.raises(UserInputError, match=re.escape(key)):
        pretrain(copy_with(_causal_spec(tmp_path)))
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("code", ["", "../x", ".hidden", "a/b"])
def test_a_teacher_is_pretrained_for_a_language_code_a_recipe_can_name(
    code: str, tmp_path: Path
) -> None:
    """A language no merge recipe can name (a recipe's codes are directory names of its run)
    had been trained and recorded: a teacher whose held-out examples match no recipe's."""
    from lmalgebra.api.pretrain import pretrain

    said = f"^language {re.escape(repr(code))} must be one plain directory name like a merge"
    spec = _causal_spec(tmp_path)
    with pytest.raises(UserInputError, match=said):
        type(spec).model_validate({**spec.model_dump(mode="json"), "language": code})
    with pytest.raises(UserInputError, match=said):  # a copy pydantic did not check
        pretrain(spec.model_copy(update={"language": code}))
    assert not (tmp_path / "t").exists()


@pytest.mark.parametrize("update", [{"top_k": None}, {"teachers": None}, {"training": None}])
def test_a_merge_recipe_copied_with_a_bad_value_is_named(
    update: dict[str, Any], tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    from lmalgebra.distill.recipe import load_recipe

    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs))
    key = next(iter(update))
    with pytest.raises(UserInputError, match=rf"^merge_plan\(\) recipe MaskedRecipe: key '{key}'"):
        lmalgebra.merge_plan(recipe.model_copy(update=update))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("given", "name", "annotation"),
    [
        ({"overwrite": "no"}, "overwrite", "bool"),  # a true string: would have overwritten
        ({"overwrite": 1}, None, None),
        ({"overwrite": np.bool_(False)}, None, None),
        ({"diagonal": "1"}, "diagonal", "float"),
        ({"diagonal": True}, "diagonal", "float"),
        ({"diagonal": np.float32(1)}, None, None),
        ({"diagonal": 1}, None, None),
    ],
)
def test_strings_and_booleans_are_taken_as_given(
    given: dict[str, Any], name: str | None, annotation: str | None
) -> None:
    """The function receives the value as given, so it is judged as given: no string passes for
    a bool or a number, no bool for a number; numpy scalars and ints pass where they work."""
    from lmalgebra.api.runtime import check_arguments

    def target(overwrite: bool = False, diagonal: float = 1.0) -> None: ...

    target.__annotations__ = {"overwrite": "bool", "diagonal": "float", "return": "None"}
    if name is None:
        check_arguments(target, **given)
        return
    wanted = f"target(): {name} must be {annotation}, got {given[name]!r}"
    with pytest.raises(UserInputError, match=re.escape(wanted) + "$"):
        check_arguments(target, **given)


@pytest.fixture(scope="module")
def decomposition(bert_dir: Path, bert2_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    cache = tmp_path_factory.mktemp("hostile-api-cache")
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    spans = {"length": 8, "counts": (40, 10, 10)}
    return lmalgebra.decompose(models, documents(60), spans=spans, cache_dir=cache, progress=False)


@pytest.mark.parametrize("saved", [False, True], ids=["computed", "loaded"])
@pytest.mark.parametrize("where", ["file", "under_a_file"])
def test_save_into_a_file_names_the_file(
    saved: bool, where: str, decomposition: Decomposition, tmp_path: Path
) -> None:
    result = decomposition
    if saved:  # a run read back is copied, not written anew: the other path of save
        result = Decomposition.load(decomposition.save(tmp_path / "first"))
    blocker = tmp_path / "taken.txt"
    blocker.write_text("mine\n", encoding="utf-8")
    target = blocker if where == "file" else blocker / "run"
    with pytest.raises(UserInputError) as caught:
        result.save(target)
    message = str(caught.value)
    assert str(blocker) in message and "is a file, not a directory" in message
    assert blocker.read_text(encoding="utf-8") == "mine\n"


def test_load_of_a_file_says_it_is_a_file(tmp_path: Path) -> None:
    path = tmp_path / "fits.csv"
    path.write_text("kind,target\n", encoding="utf-8")
    with pytest.raises(UserInputError, match="is a file, not a directory"):
        Decomposition.load(path)
    with pytest.raises(UserInputError, match="is a file, not a directory"):
        MergeRun.load(path)


def test_a_bad_value_to_a_decomposition_method_is_named_with_the_method(
    decomposition: Decomposition,
) -> None:
    """The message of a value of the right type but no meaning starts with the method, as a
    value of the wrong type's does, and says what would do."""
    with pytest.raises(UserInputError, match=r"^Decomposition\.pairwise\(\): split must be one "):
        decomposition.pairwise("nope")
    with pytest.raises(UserInputError, match=r"^Decomposition\.reduction: .* \(it has .*fits"):
        decomposition.reduction  # noqa: B018  (an exact run has no reduction table)
    unsaved = copy.copy(decomposition)  # another test of this module may have saved it
    unsaved.run_dir = None
    with pytest.raises(UserInputError, match=r"^Decomposition\.report\(\): .*give report\(path\)"):
        unsaved.report()


def _settings_classes() -> list[type]:
    """Every settings class of the package (the modules that define them imported first)."""
    import importlib
    import pkgutil

    from lmalgebra.core.settings import Settings

    for module in pkgutil.walk_packages(lmalgebra.__path__, "lmalgebra."):
        if module.name != "lmalgebra.__main__":  # which would run the command line
            importlib.import_module(module.name)
    found, todo = [], list(Settings.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted(set(found), key=lambda c: c.__qualname__)


def test_every_settings_class_built_from_python_names_a_bad_value_in_one_line() -> None:
    """``TrainingSpec(steps=-1)``, ``DecomposeConfig(models=3)``, ``MergeRecipe.model_validate``
    of a bad mapping: one UserInputError line naming the class, the key and the value (also a
    ValueError, as pydantic's error is), never pydantic's report of many lines."""
    from lmalgebra.core.settings import SettingsError

    classes = _settings_classes()
    names = {c.__name__ for c in classes}
    assert {"TrainingSpec", "DecomposeConfig", "MergeRecipe", "MaskedRecipe"} <= names, names
    for cls in classes:
        for build in (lambda c=cls: c.model_validate(3), lambda c=cls: c(no_such_key=1)):
            with pytest.raises(SettingsError) as caught:
                build()
            message = str(caught.value)
            assert "\n" not in message and message.startswith(f"{cls.__name__}: "), message
            assert isinstance(caught.value, ValueError)
    cases = [
        (lambda: lmalgebra.TrainingSpec(steps=-1), "TrainingSpec: key 'steps': .*got -1"),
        (lambda: lmalgebra.TrainingSpec(stepz=3), "TrainingSpec: unknown key 'stepz'"),
        (
            lambda: lmalgebra.MergeRecipe.model_validate({"languages": 3, "teachers": {}}),
            "MergeRecipe: key 'languages': .*got 3",
        ),
        (lambda: lmalgebra.DecomposeConfig(models=3), "DecomposeConfig: key 'models': .*got 3"),
        (
            lambda: lmalgebra.MergeRecipe.model_validate(3),  # not "key 'objective'": no keys
            "MergeRecipe: a recipe is a mapping of its keys, got int",
        ),
    ]
    for build, wanted in cases:
        with pytest.raises(UserInputError, match=f"^{wanted}$"):
            build()


def test_an_array_of_embeddings_is_real_and_fits_in_float32(bert_dir: Path, tmp_path: Path) -> None:
    """Embeddings are kept in float32: a complex array or tensor, or a value past float32's range,
    is one line naming the model, not a silent loss of the imaginary part or an infinity; a
    bfloat16 tensor that requires grad is taken as it is."""
    import torch

    texts = documents(60)
    spans = {"length": 8, "counts": (40, 10, 10)}
    rows = len(lmalgebra.spans({"a": str(bert_dir)}, texts, spans=spans))
    options = {"spans": spans, "cache_dir": tmp_path, "progress": False}
    rng = np.random.default_rng(0)
    real = rng.normal(size=(rows, 4))
    huge = real.copy()
    huge[7, 2] = 1e300
    for given, wanted in (
        (real + 1j * real, r"model 'b': the array is complex \(complex128\); embeddings are real"),
        (torch.from_numpy(real + 1j * real).to(torch.complex64), r"\(complex64\)"),
        (huge, "model 'b': a value in row 7 is beyond float32's range"),
    ):
        with pytest.raises(UserInputError, match=wanted):
            lmalgebra.decompose({"a": str(bert_dir), "b": given}, texts, **options)
    tensor = torch.from_numpy(real).to(torch.bfloat16).requires_grad_()
    result = lmalgebra.decompose({"a": str(bert_dir), "b": tensor}, texts, **options)
    assert np.isfinite(result.pairwise().loc["b", "a"])  # b (the tensor) from a


@pytest.mark.filterwarnings("ignore:.*(Sparse CSR|nested tensors):UserWarning")  # torch's betas
def test_a_tensor_numpy_cannot_take_or_a_duration_array_is_named(bert_dir: Path) -> None:
    """A sparse or nested tensor had ended in torch's TypeError or RuntimeError traceback, and
    an array of durations (``timedelta64``, a number to numpy) been fitted as embeddings."""
    import torch

    dense = torch.ones(3, 2)
    for given, wanted in (
        (dense.to_sparse(), "the tensor is sparse_coo; give its dense form"),
        (dense.to_sparse_csr(), "the tensor is sparse_csr"),
        (torch.nested.nested_tensor([dense[0], dense[1]]), "the tensor is nested"),
        (np.ones((3, 2), dtype="timedelta64[s]"), r"the array is not numeric \(timedelta64"),
    ):
        with pytest.raises(UserInputError, match=f"^model 'b': {wanted}"):
            lmalgebra.decompose({"a": str(bert_dir), "b": given}, documents(60))


@pytest.mark.parametrize(
    "X", [None, np.full((4, 2), np.nan), np.zeros(4)], ids=["none", "nan", "1d"]
)
def test_scikit_learns_complaint_about_an_array_is_one_line(X: Any) -> None:  # noqa: N803
    """scikit-learn's checks word their complaints on several lines; ours is one (the advice the
    estimator contract asks for kept in it)."""
    with pytest.raises(UserInputError) as caught:
        lmalgebra.LinearDecomposition().fit(X, np.zeros((4, 2)))
    message = str(caught.value)
    assert "\n" not in message and message.startswith(("X: ", "Input X")), message


def test_merge_with_no_student_is_one_line(tmp_path: Path, teacher_dirs: dict[str, Path]) -> None:
    """An empty ``students`` trains nothing: one line naming it (a ValueError too), not the
    pipeline's own ValueError, and nothing written."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    with pytest.raises(UserInputError, match=r"^merge\(\): students is empty") as caught:
        lmalgebra.merge(recipe, "train", students={})
    assert isinstance(caught.value, ValueError)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("call", "words"),
    [
        (lambda r: lmalgebra.merge(r / "recipe.yaml", languages=[]), "merge(): languages is"),
        (lambda r: MergeRun.load(r / "run").evaluate(languages=[]), "(): languages is"),
        (lambda r: MergeRun.load(r / "run").evaluate(students=[]), "(): students is"),
        (lambda r: MergeRun.load(r / "run").bits_per_byte(models=[]), "(): models is"),
        (lambda r: MergeRun.load(r / "run").bits_per_byte(languages=()), "(): languages is"),
    ],
    ids=["merge", "evaluate-languages", "evaluate-students", "bits-models", "bits-languages"],
)
def test_an_empty_choice_is_not_taken_for_all(
    call: Any, words: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``languages=[]`` (or ``students=[]``, ``models=[]``) had evaluated every language (every
    student, every teacher), as ``None`` does, where ``merge(students={})`` is refused."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    lmalgebra.merge(recipe, "prepare")
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    with pytest.raises(UserInputError, match=re.escape(words) + " empty: name at least one") as e:
        call(tmp_path)
    assert isinstance(e.value, ValueError)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


@pytest.mark.parametrize("name", ["", " wp"], ids=["empty", "spaced"])
def test_a_bad_model_name_of_bits_per_byte_is_named_as_given(
    name: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A blank name in ``bits_per_byte``'s mapping (name -> path) had been refused as
    ``ModelRef: key 'name'``, the internal class, not the model the caller gave."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    lmalgebra.merge(recipe, "prepare")
    with pytest.raises(UserInputError) as caught:
        MergeRun.load(tmp_path / "run").bits_per_byte({name: teacher_dirs["wp"]})
    message = str(caught.value)
    assert message.startswith(f"model {name!r} ({teacher_dirs['wp']}): a model name is"), message
    assert "ModelRef" not in message and "key 'name'" not in message


def test_a_mapping_of_bits_per_byte_reads_references_as_the_command_line_does(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``{"x": "random:DIR"}`` had been taken for a directory named ``random:DIR``, where the
    same reference on the command line (``x=random:DIR``) is random weights, refused by name."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    lmalgebra.merge(recipe, "prepare")
    with pytest.raises(UserInputError, match=r"^model 'x' \(random:.*\) must name a causal LM"):
        MergeRun.load(tmp_path / "run").bits_per_byte({"x": f"random:{teacher_dirs['wp']}"})


@pytest.mark.parametrize(
    ("stages", "kwargs", "words"),
    [
        ("evaluate", {"students": {"student": {"lr": 0.5}}}, "students['student']'s training"),
        (["vocab"], {"restart": True}, "restart"),
        ("evaluate", {"keep_saved": True}, "keep_saved"),
        ("train", {"languages": ["xx"]}, "languages"),
        ("prepare", {"pooling": "mean"}, "pooling"),
    ],
    ids=["training", "restart", "keep_saved", "languages", "pooling"],
)
def test_a_setting_no_chosen_stage_reads_is_refused(
    stages: Any, kwargs: dict[str, Any], words: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``merge(recipe, "evaluate", students={"student": {"lr": 0.5}})`` scored the student and
    never read the training it was given; ``restart``, ``keep_saved`` without ``train`` and
    ``languages``, ``pooling`` without ``evaluate`` were as idle."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    with pytest.raises(UserInputError, match=re.escape(f"merge(): {words} would be ignored")):
        lmalgebra.merge(recipe, stages, **kwargs)
    assert not (tmp_path / "run").exists()


def test_training_settings_of_the_other_objective_are_named(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A ``CausalTrainingSpec`` for a masked recipe had been refused for a key of its defaults
    the caller never set (``unknown key 'objective_mix'``)."""
    from lmalgebra.train.config import CausalTrainingSpec

    recipe = write_recipe(tmp_path, teacher_dirs)
    wanted = "a CausalTrainingSpec holds the training of causal recipes, and this recipe's "
    for call in (
        lambda: lmalgebra.merge_plan(recipe, training=CausalTrainingSpec(steps=2)),
        lambda: lmalgebra.merge(recipe, "train", students={"s": CausalTrainingSpec()}),
    ):
        with pytest.raises(UserInputError, match=re.escape(wanted) + "objective is masked"):
            call()
    assert not (tmp_path / "run").exists()


def test_a_training_key_of_the_other_objective_is_named_as_its(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``--training.objective_mix`` (a flag the help lists, for causal recipes) over a masked
    recipe, or ``training={"objective_mix": ...}``, said "unknown key" alone, where the recipe
    file's reader names the objective the key belongs to: so do they now; the flag is named as
    typed (it had been ``command line: unknown key 'objective_mix'``)."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    wanted = "unknown key 'objective_mix': a setting of causal recipes' training, and this "
    with pytest.raises(UserInputError, match=r"^merge_plan\(\) training: " + wanted):
        lmalgebra.merge_plan(recipe, training={"objective_mix": {"ce": 1.0}})
    args = ["merge", "train", str(recipe), "--training.objective_mix", '{"ce": 1}', "--dry-run"]
    said = "--training.objective_mix: a setting of causal recipes' training, and this recipe's"
    line = assert_one_line(*cli(args), [f"error: {said} objective is masked"])
    assert "unknown key" not in line and "command line" not in line, line  # the flag, named
    args = ["merge", "train", str(recipe), "--training.label_smoothing", "0.1", "--dry-run"]
    assert_one_line(*cli(args), ["error: --training.label_smoothing: a setting of causal"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["evaluation", "examples", "recipe.yaml", "vocab", "logprobs"])
def test_a_student_named_as_a_part_of_the_run_is_refused(
    name: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A student named as what a stage writes at the top of the run (``evaluation``, the store's
    ``examples``, the ``recipe.yaml`` file) had been trained into that directory (a file there: a
    traceback): refused in one line naming it, before any stage runs."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    wanted = f"^student name '{re.escape(name)}' is the name of the run's own"
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge(recipe, students={name: None})
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge_plan(recipe, student=name)
    with pytest.raises(UserInputError, match=wanted):  # the plan with restart had passed it
        lmalgebra.merge_plan(recipe, student=name, restart=True)


@pytest.mark.parametrize("part", ["", "model", "checkpoints"])
def test_a_student_directory_that_is_a_fifo_or_file_is_refused_by_plan_and_run(
    part: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A FIFO where the student's directory goes (or its ``model/``, ``checkpoints/``) ended
    training, at its first checkpoint or after its last step, in ``FileExistsError`` or
    ``NotADirectoryError`` tracebacks, and the plan had passed it: refused in one line naming
    it, before any stage runs, by the plan too (with ``restart`` as well)."""
    import os

    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)
    folder = tmp_path / "run" / "student" / part if part else tmp_path / "run" / "student"
    folder.parent.mkdir(parents=True)
    os.mkfifo(folder)
    wanted = rf"^student directory {re.escape(str(folder))} is a FIFO, socket or device, not a"
    for restart in (False, True):
        with pytest.raises(UserInputError, match=wanted):
            lmalgebra.merge_plan(recipe, stages=["train"], restart=restart)
        with pytest.raises(UserInputError, match=wanted):
            lmalgebra.merge(recipe, "train", restart=restart)
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["student"]


def test_a_link_in_place_of_a_students_model_directory_is_refused(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``student/model`` a symbolic link to a teacher's directory: training wrote the student
    through it, replacing the teacher's weights with the student's. Refused in one line naming
    the link and its target, by the plan too; the teacher is left as it was."""
    import shutil

    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)
    teacher = Path(shutil.copytree(teacher_dirs["wp"], tmp_path / "teacher"))
    before = (teacher / "model.safetensors").read_bytes()
    link = tmp_path / "run" / "student" / "model"
    link.parent.mkdir(parents=True)
    link.symlink_to(teacher)
    wanted = rf"^student directory {re.escape(str(link))} is a symbolic link to "
    wanted += re.escape(str(teacher))
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge_plan(recipe, stages=["train"], restart=True)
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge(recipe, "train", restart=True)
    assert (teacher / "model.safetensors").read_bytes() == before


def test_a_link_from_a_part_of_the_run_into_another_output_is_refused(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``evaluation`` a symbolic link into a decomposition run: ``merge evaluate`` wrote its
    tables among the decomposition's. Refused naming the link and what its target holds, by the
    plan too; a link to a directory of no output (a larger disk) is followed."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    other = tmp_path / "decomposition"
    other.mkdir()
    for name in ("summary.json", "config.yaml"):
        (other / name).write_text("{}\n", encoding="utf-8")
    (tmp_path / "run").mkdir()
    link = tmp_path / "run" / "evaluation"
    link.symlink_to(other)
    wanted = rf"^{re.escape(str(link))} is a symbolic link to .*decomposition, which holds a dec"
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge_plan(recipe)
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge(recipe, "prepare")
    assert sorted(p.name for p in other.iterdir()) == ["config.yaml", "summary.json"]
    link.unlink()
    (tmp_path / "disk").mkdir()
    link.symlink_to(tmp_path / "disk")
    lmalgebra.merge_plan(recipe)


@pytest.mark.parametrize("part", ["teacher_text", "examples"])
def test_a_part_of_the_run_that_holds_another_output_is_refused(
    tmp_path: Path, teacher_dirs: dict[str, Path], part: str
) -> None:
    """A decomposition run kept under the name of one of the run's shard sets: ``merge
    prepare`` wrote the language's set among its files. Refused naming it, by the plan too."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    other = tmp_path / "run" / part
    other.mkdir(parents=True)
    for name in ("summary.json", "config.yaml"):
        (other / name).write_text("{}\n", encoding="utf-8")
    wanted = rf"^{re.escape(str(other))} holds a decomposition run \(summary.json\): the run "
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge_plan(recipe)
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge(recipe, "prepare")
    assert sorted(p.name for p in other.iterdir()) == ["config.yaml", "summary.json"]


@pytest.mark.parametrize(
    "given",
    [b"some text", bytearray(b"some text"), memoryview(b"some text")],
    ids=["bytes", "array", "view"],
)
def test_texts_given_as_bytes_are_named_as_given(given: Any) -> None:
    """Bytes iterate as numbers: ``texts`` of bytes had been refused as "texts[0] is a int", a
    value the caller never gave; the message names what was given."""
    for call in (lmalgebra.decompose, lmalgebra.spans):
        with pytest.raises(UserInputError, match=r"^texts must be .*, got (bytes|bytearray|memo)"):
            call({"a": "x"}, given)


@pytest.mark.parametrize("kind", [set, frozenset])
def test_a_set_where_order_counts_is_refused_naming_it(kind: type) -> None:
    """A set iterates in an order that changes from process to process: texts given as one had
    hashed as other documents in each (a run resumed, or read back, refused as on other
    inputs), a ``layer_map`` had been read either way round and corpus paths in another order.
    Each is refused, naming the texts or the key."""
    texts = kind(documents(10))
    for call in (lmalgebra.decompose, lmalgebra.decompose_plan, lmalgebra.spans):
        with pytest.raises(UserInputError, match=rf"^texts is a {kind.__name__}, whose order"):
            call({"a": "x", "b": "y"}, texts)
    wanted = rf"key 'study.layer_map': a {kind.__name__} has no order of its own"
    with pytest.raises(UserInputError, match=rf"^decompose_plan\(\): {wanted}"):
        lmalgebra.decompose_plan({"a": "x", "b": "y"}, study={"layer_map": kind({"a", "b"})})
    with pytest.raises(UserInputError, match=r"key 'corpus\.paths': a .*set has no order of its"):
        lmalgebra.DecomposeConfig(models=[], corpus={"paths": kind({"a.txt", "b.txt"})})


@pytest.mark.parametrize("call", ["decompose_plan", "spans"])
def test_an_unknown_option_names_the_call_it_was_given_to(call: str) -> None:
    """``decompose_plan(..., spanz={})`` and ``spans(...)`` had been refused as
    ``decompose(): unknown option 'spanz'``, a call the user did not make."""
    with pytest.raises(UserInputError, match=rf"^{call}\(\): unknown option 'spanz'"):
        getattr(lmalgebra, call)({"a": "x"}, ["some text"], spanz={})
    with pytest.raises(UserInputError, match=rf"^{call}\(\): corpus must be a mapping"):
        getattr(lmalgebra, call)({"a": "x"}, ["some text"], corpus=["x"])


def test_a_student_named_as_a_teacher_is_refused(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A student named as a teacher of the recipe (``merge train --name wp``) trained, and its
    evaluation's rows were written under the teacher's name beside the teacher's own: refused
    before any stage runs, by the plan too."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    wanted = r"^student name 'wp' is the name of a teacher of the recipe"
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge(recipe, students={"wp": None})
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.merge_plan(recipe, student="wp")


def test_a_message_reached_from_python_names_the_keyword_beside_the_flag(tmp_path: Path) -> None:
    """Messages raised through the Python API told the caller to pass ``--overwrite``,
    ``--restart``, ``--students`` or ``--models``, flags of a command line it never used; each
    names the keyword argument beside the flag."""
    from lmalgebra.distill.causal.bits_per_byte import refuse_names
    from lmalgebra.distill.run.rdt import refuse_dropping
    from lmalgebra.sources.models import ModelRef
    from lmalgebra.storage.output_paths import claim_run_directory
    from lmalgebra.train.run_fingerprint import check_fingerprint

    run = tmp_path / "run"
    run.mkdir()
    (run / "fits.csv").write_text("x\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"pass --overwrite \(overwrite=True\) to remove"):
        claim_run_directory(run, {"a": 2}, {"a": 1}, finished=True, overwrite=False, what="run")
    with pytest.raises(UserInputError, match=r"name a model \(--models \(models=\)\)"):
        lmalgebra.spans({}, ["some text to cut"])
    twice = [ModelRef(name="a", path="x"), ModelRef(name="a", path="y")]
    with pytest.raises(UserInputError, match=r"--models NAME=REFERENCE \(models=\{NAME: REF"):
        refuse_names(run, twice)
    table = tmp_path / "evaluation" / "rdt.csv"
    table.parent.mkdir()
    table.write_text("student,xx,average\ns1,1,1\ns2,1,1\n", encoding="utf-8")
    match = r"--students s1 --students s2 \(students=\['s1', 's2'\]\).*\(overwrite=True\)"
    with pytest.raises(UserInputError, match=match):
        refuse_dropping(table, ["s1"], None)
    with pytest.raises(UserInputError, match=r"--restart \(restart=True\) starts afresh"):
        check_fingerprint({"lr": 1}, {"lr": 2}, "step-1", str(tmp_path))


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (
            {"study": {"level": 0.9}},
            "study.level 0.9 would be ignored: it applies to study.bootstrap",
        ),
        ({"alpha": 0, "alpha_mode": "absolute"}, "alpha_mode 'absolute' would be ignored: it ap"),
        ({"scale": {"probes": 3}}, "scale.probes 3 would be ignored: it applies to scale.method"),
        ({"alpha": 0.5, "study": {"alpha_select": "gcv"}}, "alpha 0.5 would be ignored: study.al"),
        ({"study": {"lengths": [64]}}, "study.lengths [64] would be ignored: its one length is"),
    ],
    ids=["study", "top-level", "scale", "alpha", "lengths"],
)
def test_a_rule_across_settings_names_them_as_the_call_gave_them(
    options: dict[str, Any], said: str
) -> None:
    """A rule across settings told a Python caller of ``--study.bootstrap`` or ``--alpha``,
    flags of a command line it never used: from Python it names the keys the call was given
    (``study.level`` for ``study={"level": ...}``); the command line still names its flags."""
    models = {"a": np.eye(30, 4), "b": np.eye(30, 4, 1)}
    with pytest.raises(UserInputError) as caught:
        lmalgebra.decompose_plan(models, documents(40), **options)
    assert str(caught.value).startswith(f"decompose_plan(): {said}"), str(caught.value)
    assert "--" not in str(caught.value)


def test_a_study_refused_once_its_models_are_known_names_the_keyword_beside_the_flag(
    bert_dir: Path, bert2_dir: Path
) -> None:
    """A study the models leave nothing to do (``nulls`` of random-weights models, ``layers``
    of arrays) was refused from Python naming ``--study.nulls`` alone, a flag of a command
    line it never used: the keyword is named beside it."""
    randoms = {"a": f"random:{bert_dir}", "b": f"random:{bert2_dir}"}
    said = '--study.nulls (study={"nulls": True}) would add nothing'
    with pytest.raises(UserInputError, match=re.escape(said)):
        lmalgebra.decompose_plan(randoms, documents(40), timed=False, study={"nulls": True})
    arrays = {"a": np.eye(30, 4), "b": np.eye(30, 4, 1)}
    said = '--study.layers (study={"layers": True}) sweeps'
    with pytest.raises(UserInputError, match=re.escape(said)):
        lmalgebra.decompose_plan(
            arrays, documents(40), reference_tokenizer=str(bert_dir), study={"layers": True}
        )


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"study": {"lengths": [0, 8]}}, "study.lengths"),
        ({"study": {"lengths": []}}, "study.lengths"),
        ({"study": {"train_sizes": [1, 8]}}, "study.train_sizes"),
        ({"study": {"layer_map": ["a"]}}, "study.layer_map"),
        ({"study": {"bootstrap": 10, "level": 1.5}}, "study.level"),
        ({"study": {"alpha_select": "gcv", "alpha_grid": [0.0]}}, "study.alpha_grid"),
        ({"spans": {"length": 0}}, "spans.length"),
        ({"spans": {"per_doc": 0}}, "spans.per_doc"),
        ({"spans": {"fractions": (1.0, 0.0, 0.0)}}, "spans.fractions"),
    ],
)
def test_a_value_a_section_refuses_names_its_key(options: dict[str, Any], key: str) -> None:
    """A value of the study or spans section refused by its own rule (a span length of 0, an
    empty list of lengths, a level of 1.5) had been named by no key ("span length T must be
    >= 1, got 0"): the key is named, as pydantic's own checks name theirs."""
    models = {"a": np.eye(30, 4), "b": np.eye(30, 4, 1)}
    with pytest.raises(UserInputError, match=rf"^decompose_plan\(\): key {key!r}: "):
        lmalgebra.decompose_plan(models, documents(40), **options)


@pytest.mark.parametrize(
    "setting", [{"layer": 1}, {"pooling": "first"}, {"exclude_special": True}, {"max_length": 4}]
)
def test_a_setting_no_sentence_transformer_reads_is_refused(
    setting: dict[str, Any], bert_dir: Path, tmp_path: Path
) -> None:
    """A SentenceTransformer embeds through its own pipeline (its tokeniser's length, its
    pooling): where every model is one (or an array), ``layer``, ``pooling``,
    ``exclude_special`` and ``max_length`` had been taken and changed nothing."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    word = models.Transformer(str(bert_dir), max_seq_length=64)
    width = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    encoder = SentenceTransformer(modules=[word, models.Pooling(width())], device="cpu")
    texts = documents(60)
    options = {"spans": {"length": 8, "counts": (40, 10, 10)}, "cache_dir": tmp_path}
    name = next(iter(setting))
    with pytest.raises(UserInputError, match=rf"^{name} .* would be ignored.*SentenceTransformer"):
        lmalgebra.decompose({"a": encoder, "b": encoder}, texts, **options, **setting)
    mixed = {"a": encoder, "b": str(bert_dir)}  # b embeds by the run's settings
    result = lmalgebra.decompose(mixed, texts, **options, progress=False, **setting)
    assert np.isfinite(result.pairwise().loc["b", "a"])


def test_a_setting_of_loading_is_refused_where_every_model_is_loaded_already(
    bert_dir: Path, bert2_dir: Path, tmp_path: Path
) -> None:
    """``weights_dtype`` says how weights are loaded: a ``(model, tokenizer)`` pair is loaded
    already, and runs had taken ``weights_dtype="bfloat16"`` for pairs alone and embedded them
    in float32, recording bfloat16."""
    from transformers import AutoModel, AutoTokenizer

    pairs = {
        name: (AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path))
        for name, path in (("a", bert_dir), ("b", bert2_dir))
    }
    texts = documents(60)
    options = {"spans": {"length": 8, "counts": (40, 10, 10)}, "cache_dir": tmp_path}
    with pytest.raises(UserInputError, match=r"^weights_dtype 'bfloat16' would be ignored.*pair"):
        lmalgebra.decompose(pairs, texts, **options, weights_dtype="bfloat16")
    with pytest.raises(UserInputError, match=r"^weights_dtype 'bfloat16' would be ignored"):
        lmalgebra.decompose_plan(pairs, texts, timed=False, **options, weights_dtype="bfloat16")


def test_calls_from_two_threads_run_one_after_the_other() -> None:
    """Two calls from two threads had run at once: both wrote the same cache file under the one
    temporary name their pid gives (``FileNotFoundError`` from the rename), the second took the
    first's directory lock as its own, and the libraries' log levels were left silenced. A
    second call now waits for the first."""
    import logging
    import threading
    import time

    from lmalgebra.api.runtime import library_entry

    events: list[str] = []
    release = threading.Event()
    logger = logging.getLogger("sentence_transformers")  # one the calls silence
    before = logger.level

    @library_entry
    def call(tag: str) -> None:
        events.append(tag)
        if tag == "first":
            release.wait(10)
        events.append(f"/{tag}")

    first = threading.Thread(target=call, args=("first",))
    first.start()
    while not events:
        time.sleep(0.01)
    second = threading.Thread(target=call, args=("second",))
    second.start()
    time.sleep(0.2)
    assert events == ["first"]  # the second waits for the first to end
    release.set()
    first.join(10)
    second.join(10)
    assert events == ["first", "/first", "second", "/second"]
    assert logger.level == before


def test_a_decomposition_keeps_its_directory_after_chdir(
    decomposition: Decomposition, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run saved or loaded by a relative path was looked for in the new current directory
    after ``os.chdir``: its heatmap drawn into a directory made there, ``save`` ending in
    ``FileNotFoundError`` after copying that heatmap alone."""
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    monkeypatch.chdir(tmp_path / "one")
    saved = copy.copy(decomposition)
    saved.save("run")
    loaded = Decomposition.load("run")
    monkeypatch.chdir(tmp_path / "two")
    assert saved.heatmap == tmp_path / "one" / "run" / "pairwise_r2_test.png"
    assert loaded.report() == tmp_path / "one" / "run" / "report.html"
    loaded.save("copy")
    assert Decomposition.load("copy").summary == loaded.summary
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == ["copy"]


@pytest.mark.parametrize("since", ["written_again", "removed"])
def test_a_decomposition_read_from_a_run_changed_since_is_refused(
    since: str, decomposition: Decomposition, bert_dir: Path, bert2_dir: Path, tmp_path: Path
) -> None:
    """A run read back, then written again with another configuration (or removed): the old
    object had drawn its heatmap into the new run (or made the removed directory anew for it),
    reported the new run and copied it as its own with ``save`` (``FileNotFoundError`` once
    removed). Each is refused, naming the call and the directory; nothing is written."""
    import shutil

    run = tmp_path / "run"
    loaded = Decomposition.load(copy.copy(decomposition).save(run))
    if since == "removed":
        shutil.rmtree(run)
    else:
        models = {"a": str(bert_dir), "b": str(bert2_dir)}
        spans = {"length": 8, "counts": (40, 10, 10)}
        lmalgebra.decompose(models, documents(60), spans=spans, layer=1, progress=False).save(
            run, overwrite=True
        )
    before = sorted(p.name for p in run.iterdir()) if run.exists() else None
    for call, name in (
        (lambda: loaded.heatmap, "heatmap"),
        (lambda: loaded.report(tmp_path / "r.html"), "report()"),
        (lambda: loaded.save(tmp_path / "copy"), "save()"),
    ):
        with pytest.raises(UserInputError, match=rf"^Decomposition\.{re.escape(name)}: {run} "):
            call()
    assert (sorted(p.name for p in run.iterdir()) if run.exists() else None) == before
    assert not (tmp_path / "r.html").exists() and not (tmp_path / "copy").exists()


def test_a_model_on_the_meta_device_is_named(bert_dir: Path, tmp_path: Path) -> None:
    """A model built on PyTorch's meta device (shapes, no values), or such a tensor of
    embeddings, ended in ``NotImplementedError: Cannot copy out of meta tensor``."""
    import torch
    from transformers import AutoConfig, AutoModel, AutoTokenizer

    config = AutoConfig.from_pretrained(bert_dir)
    with torch.device("meta"):
        model = AutoModel.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(bert_dir)
    options = {"spans": {"length": 8, "counts": (40, 10, 10)}, "cache_dir": tmp_path}
    for given, wanted in (
        ((model, tokenizer), "model 'b': its weights are on the meta device"),
        (torch.empty(60, 4, device="meta"), "model 'b': the tensor is on the meta device"),
    ):
        with pytest.raises(UserInputError, match=f"^{re.escape(wanted)}"):
            lmalgebra.decompose({"a": str(bert_dir), "b": given}, documents(60), **options)


def test_a_model_with_a_head_is_embedded_as_its_directory(
    bert_dir: Path, bert2_dir: Path, gpt2_dir: Path, tmp_path: Path
) -> None:
    """A ``(model, tokenizer)`` pair of a model with a head (``AutoModelForMaskedLM``,
    ``AutoModelForCausalLM``) had its logits pooled as its embedding: a ``ValueError`` (shape
    mismatch) from deep inside. Its hidden states are embedded, as the directory's are."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, BertForMaskedLM

    texts = documents(60)
    options = {"spans": {"length": 8, "counts": (40, 10, 10)}, "cache_dir": tmp_path}
    for directory, head in ((bert_dir, BertForMaskedLM), (gpt2_dir, AutoModelForCausalLM)):
        pair = (head.from_pretrained(directory), AutoTokenizer.from_pretrained(directory))
        by_path = lmalgebra.decompose({"m": str(directory), "b": str(bert2_dir)}, texts, **options)
        given = lmalgebra.decompose({"m": pair, "b": str(bert2_dir)}, texts, **options)
        assert given.pairwise().equals(by_path.pairwise())


@pytest.mark.parametrize("name", [" a", "a ", "a\t"])
def test_a_model_name_the_tables_cannot_give_back_is_refused(name: str, bert_dir: Path) -> None:
    """A model named ``" a"`` was fitted and written, but its tables' cells are read back
    stripped: its pairwise and group rows matched no model, NaN where R^2 had been computed.
    Refused before any work, from Python and from a recipe alike."""
    wanted = re.escape("a model name is a non-blank string without spaces around it")
    with pytest.raises(UserInputError, match=rf"^decompose\(\): key 'models.0.name': {wanted}"):
        lmalgebra.decompose({name: str(bert_dir), "b": str(bert_dir)}, ["some text"])
    models = [{"name": name, "path": str(bert_dir)}, {"name": "b", "path": str(bert_dir)}]
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.DecomposeConfig(models=models)


@pytest.mark.parametrize("name", ["x+y", "x,y"])
def test_a_model_name_that_reads_as_a_basis_of_several_is_refused(
    name: str, bert_dir: Path, tmp_path: Path, cli
) -> None:
    """A model named ``x+y`` was written in fits.csv as the group basis of ``x`` and ``y`` is
    (two different bases printed the same), and one named ``x,y`` could not be named in a
    flag's list (``--basis x,y``). Refused before any work, naming the key, from Python, a
    recipe and a directory whose name would be the model's."""
    joiner = name[1]
    wanted = f"a model name holds no {joiner!r}, which joins the names of a basis"
    match = r"^decompose_plan\(\): key 'models\.0\.name': " + re.escape(wanted)
    with pytest.raises(UserInputError, match=match):
        lmalgebra.decompose_plan({name: str(bert_dir), "b": str(bert_dir)}, documents(40))
    folder = tmp_path / name
    folder.symlink_to(bert_dir)
    code, stderr = cli(
        ["decompose", "--models", str(folder), "--models", str(bert_dir), "--dry-run"]
    )
    assert_one_line(code, stderr, [wanted, "--models NAME=REFERENCE"])


def test_a_model_named_as_the_group_tables_mean_row_is_refused(
    bert_dir: Path, tmp_path: Path, cli
) -> None:
    """A model named ``mean`` was fitted and written: group_r2.csv then held two rows
    ``mean``, the model's and the mean over the models, one read as the other. Refused before
    any work, naming the key, from Python and a directory whose name would be the model's."""
    wanted = "a model name is not 'mean', the target of group_r2.csv's row of the mean"
    match = r"^decompose_plan\(\): key 'models\.1\.name': " + re.escape(wanted)
    with pytest.raises(UserInputError, match=match):
        lmalgebra.decompose_plan({"a": str(bert_dir), "mean": str(bert_dir)}, documents(40))
    folder = tmp_path / "mean"
    folder.symlink_to(bert_dir)
    code, stderr = cli(
        ["decompose", "--models", str(bert_dir), "--models", str(folder), "--dry-run"]
    )
    assert_one_line(code, stderr, [wanted, "--models NAME=REFERENCE"])


def test_a_numpy_boolean_is_no_number() -> None:
    """``np.bool_`` is no ``bool``: ``TrainingSpec(steps=np.bool_(True))`` trained one step,
    ``pairwise(diagonal=np.True_)`` and ``LinearDecomposition(blocks=[True, 5])`` took it for
    1, where a Python ``True`` is refused as no number."""
    from lmalgebra.api.runtime import check_arguments

    with pytest.raises(UserInputError, match=r"^TrainingSpec: key 'steps': a boolean is no int"):
        lmalgebra.TrainingSpec(steps=np.bool_(True))
    assert lmalgebra.TrainingSpec(steps=np.int64(3)).steps == 3

    def target(flag: bool = False, diagonal: float = 1.0) -> None: ...

    target.__annotations__ = {"flag": "bool", "diagonal": "float", "return": "None"}
    with pytest.raises(UserInputError, match=r"diagonal must be float, got np.True_$"):
        check_arguments(target, diagonal=np.bool_(True))
    check_arguments(target, flag=np.bool_(True))
    rows = np.random.default_rng(0).normal(size=(9, 6))
    for blocks in ([True, 5], [np.bool_(True), 5]):
        with pytest.raises(UserInputError, match=r"^blocks must be a list of feature counts"):
            lmalgebra.LinearDecomposition(blocks=blocks).fit(rows, rows[:, 0])


def test_a_merge_run_keeps_its_directory_after_chdir(
    tmp_path: Path, teacher_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run loaded (or made) by a relative path was looked for in the current directory of the
    moment: after ``os.chdir`` its ``inspect()`` found "0 pairs", ``verify()`` no run, and
    ``evaluate()`` no student."""
    recipe = write_recipe(tmp_path, teacher_dirs, output_dir="run")
    monkeypatch.chdir(tmp_path)
    made = lmalgebra.merge(recipe, "prepare")
    loaded = MergeRun.load("run")
    monkeypatch.chdir(tmp_path / "run")  # which holds no "run" of its own
    for run in (made, loaded):
        assert run.run_dir == tmp_path / "run"
        assert run.inspect().summary.startswith("3 (language, teacher) pairs")
        assert run.verify() == []


def test_a_merge_run_is_made_from_any_form_of_recipe(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``MergeRun("recipe.yaml")`` (or ``MergeRun(None)``) ended in ``AttributeError: 'str'
    object has no attribute 'output_dir'``; it takes a recipe as ``merge()`` does."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    for given in (recipe, str(recipe)):
        assert MergeRun(given).run_dir == tmp_path / "run"
    with pytest.raises(UserInputError, match=r"^MergeRun\(\): recipe must be a YAML path, "):
        MergeRun(None)


def test_a_bad_recipe_is_named_with_the_call_it_was_given_to() -> None:
    """A mapping missing a key given to ``merge_plan``, ``MergeRun`` or ``select_teachers`` was
    refused as ``merge() recipe: ...``, a call the user did not make; a copy of a recipe with a
    bad value as ``recipe ...``, naming no call."""
    from lmalgebra.experimental import select_teachers

    calls = {
        "merge": lmalgebra.merge,
        "merge_plan": lmalgebra.merge_plan,
        "MergeRun": MergeRun,
        "select_teachers": select_teachers,
    }
    for name, call in calls.items():
        with pytest.raises(UserInputError, match=rf"^{name}\(\) recipe: missing key 'languages'"):
            call({"teachers": {}})
        with pytest.raises(UserInputError, match=rf"^{name}\(\): recipe must be a YAML path"):
            call(3)


def test_a_bits_table_of_text_is_named(tmp_path: Path, teacher_dirs: dict[str, Path]) -> None:
    """``bits_rdt`` of a table whose numbers are strings (a CSV read with ``dtype=str``) ended
    in ``TypeError: unsupported operand type(s) for -: 'str' and 'str'``."""
    import pandas as pd

    from lmalgebra.distill.causal.bits_per_byte import BITS

    run = MergeRun(write_recipe(tmp_path, teacher_dirs))
    row = {c: 1 for c in BITS.columns} | {"language": "xx"}
    bits = pd.DataFrame([row | {"model": "wp"}, row | {"model": "s"}]).astype(str)
    with pytest.raises(UserInputError, match=r"^MergeRun\.bits_rdt\(\): bits column 'documents' "):
        run.bits_rdt(bits)
    assert run.bits_rdt(bits.assign(**{c: 1.0 for c in BITS.columns[2:]})).index.tolist() == ["s"]


def test_a_bits_table_without_students_or_with_rows_that_disagree_is_named(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``bits_rdt`` of the teachers' table alone had given an empty frame without a column, and
    of two rows of one (language, model), tables of two contexts, the last row, whichever."""
    import pandas as pd

    from lmalgebra.distill.causal.bits_per_byte import BITS

    run = MergeRun(write_recipe(tmp_path, teacher_dirs))
    row = {c: 1.0 for c in BITS.columns} | {"language": "xx"}
    teacher, student = row | {"model": "wp"}, row | {"model": "s"}
    with pytest.raises(UserInputError, match=r"^MergeRun\.bits_rdt\(\): .* teachers alone"):
        run.bits_rdt(pd.DataFrame([teacher]))
    twice = pd.DataFrame([teacher, student, student | {"bits_per_byte": 2.0}])
    with pytest.raises(UserInputError, match="rows of model 's' on language 'xx' that disagree"):
        run.bits_rdt(twice)
    assert run.bits_rdt(pd.DataFrame([teacher, student, student])).index.tolist() == ["s"]


def test_rows_the_estimator_cannot_fit_are_named_in_its_words() -> None:
    """A constant ``X`` or ``y``, or a singular ``X`` at ``alpha=0``, was refused in the run's
    words (``model 'x0' does not vary over the training spans``, ``use a larger --alpha``): a
    block the caller never named, a flag it has no use for, and no ``ValueError``."""
    rng = np.random.default_rng(0)
    X, y = rng.normal(size=(20, 3)), rng.normal(size=(20, 2))  # noqa: N806 (sklearn)
    cases = [
        (lmalgebra.LinearDecomposition(), np.ones((20, 3)), y, "^X does not vary"),
        (lmalgebra.LinearDecomposition(), X, np.ones((20, 2)), "^y does not vary"),
        (lmalgebra.LinearDecomposition(), [X, np.ones((20, 1))], y, "^X block 1 does not vary"),
        (lmalgebra.LinearDecomposition(alpha=0), np.hstack([X, X]), y, r"^X is singular .*alpha$"),
    ]
    for estimator, given, target, wanted in cases:
        with pytest.raises(ValueError, match=wanted) as caught:
            estimator.fit(given, target)
        assert isinstance(caught.value, UserInputError) and "--" not in str(caught.value)


def test_a_sentence_transformer_in_training_is_left_in_training(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A SentenceTransformer in ``train()`` mode (a notebook fine-tuning it) came back in eval
    mode, its dropout off for the rest of the training, where a ``(model, tokenizer)`` pair's
    mode is restored."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    word = models.Transformer(str(bert_dir), max_seq_length=64)
    width = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    encoder = SentenceTransformer(modules=[word, models.Pooling(width())], device="cpu")
    encoder.train()
    options = {"spans": {"length": 8, "counts": (40, 10, 10)}, "cache_dir": tmp_path}
    lmalgebra.decompose({"a": encoder, "b": str(bert_dir)}, documents(60), **options)
    assert encoder.training


def test_a_sentence_transformer_cut_to_its_special_tokens_is_named_so(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A SentenceTransformer whose ``max_seq_length`` leaves every span its two special tokens
    embeds every span alike: the refusal had named the model alone, not the length that cut
    it."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6
        from sentence_transformers.sentence_transformer import modules as models
    except ImportError:
        from sentence_transformers import models

    word = models.Transformer(str(bert_dir), max_seq_length=2)
    width = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
    encoder = SentenceTransformer(modules=[word, models.Pooling(width())], device="cpu")
    options = {"spans": {"length": 8, "counts": (40, 10, 10)}, "cache_dir": tmp_path}
    wanted = "model 'st' does not vary.*every span of it was cut at its maximum length"
    with pytest.raises(UserInputError, match=wanted + r" \(a SentenceTransformer's max_seq"):
        lmalgebra.decompose({"st": encoder, "b": str(bert_dir)}, documents(60), **options)


@pytest.mark.parametrize("kind", ["offset", "tiny", "underflow"])
def test_embeddings_whose_variation_float32_loses_are_named_so(
    kind: str, bert_dir: Path, tmp_path: Path
) -> None:
    """An array that varies in float64 but not once kept in float32 (``1e8 + x`` rounds to one
    value, ``1e-30 * x`` squares to 0, ``1e-300 * x`` is 0) had been refused as a model whose
    every embedding is the same; a column of a large constant beside varying ones still runs."""
    rng = np.random.default_rng(0)
    base = rng.normal(size=(60, 4))
    given = {"offset": base + 1e8, "tiny": base * 1e-30, "underflow": base * 1e-300}[kind]
    options = {"spans": {"counts": (40, 10, 10), "length": 3}, "cache_dir": tmp_path}
    options["reference_tokenizer"] = str(bert_dir)
    texts = [f"document {i} of a few words" for i in range(80)]
    other = rng.normal(size=(60, 3))
    with pytest.raises(UserInputError, match=r"^model 'x': its embeddings vary .* not in float32"):
        lmalgebra.decompose({"x": given, "y": other}, texts, **options)
    # lost in a held-out split alone: it had been warned of as "every test span has the same
    # embedding"; the split is named
    if kind == "offset":
        held = np.vstack([base[:50], base[50:] + 1e8])
        said = r"^model 'x': its test embeddings vary .* float32"
        with pytest.raises(UserInputError, match=said):
            lmalgebra.decompose({"x": held, "y": other}, texts, **options)
    base[:, 0] = 1e8
    lmalgebra.decompose({"x": base, "y": other}, texts, **options)


def test_what_the_system_refuses_is_one_line_from_python_too(
    bert_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line words a path too long for the file system, a refused permission, a full
    disk or memory the machine could not give in one line; from Python they were raw tracebacks
    (``OSError: [Errno 36] File name too long``, a document given as a string being read as a
    corpus path). Each is one ``UserInputError`` naming the path, as on the command line."""
    long = str(tmp_path / ("x" * 300))
    for call in (
        lambda: Decomposition.load(long),
        lambda: lmalgebra.read_texts(long),
        lambda: lmalgebra.spans({"a": str(bert_dir)}, " ".join(documents(20))),  # not a path
    ):
        with pytest.raises(UserInputError, match=r"^path too long for the file system \("):
            call()
    from lmalgebra.api import decompose as api

    def full(*args: Any, **kwargs: Any) -> Any:
        import errno
        import os

        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "f"))

    monkeypatch.setattr(api, "read_documents", full)
    with pytest.raises(UserInputError, match=r"^no space left on device .* while writing"):
        lmalgebra.read_texts(tmp_path)


def test_texts_given_as_a_dataframe_are_named(bert_dir: Path) -> None:
    """A DataFrame iterates as its column names: ``decompose(models, frame)`` had run on the
    documents ``"text"`` and ``"lang"`` and was refused, if at all, as too little text."""
    import pandas as pd

    frame = pd.DataFrame({"text": documents(60), "lang": ["en"] * 60})
    wanted = r"^texts is a DataFrame, which iterates as its column names \(text, lang\)"
    for call in (lmalgebra.decompose, lmalgebra.spans):
        with pytest.raises(UserInputError, match=wanted):
            call({"a": str(bert_dir), "b": str(bert_dir)}, frame)
    assert len(lmalgebra.spans({"a": str(bert_dir)}, frame["text"])) > 0


def test_a_path_argument_starting_with_a_tilde_is_the_home_directory(
    decomposition: Decomposition, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``save("~/run")``, ``Decomposition.load("~/run")``, ``report("~/r.html")`` and
    ``MergeRun.load("~/x")`` made (or looked in) a directory named ``~`` in the current one,
    where ``decompose(out="~/run")`` and every setting read it as the home directory."""
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    saved = copy.copy(decomposition)
    assert saved.save("~/run") == home / "run"
    assert Decomposition.load("~/run").run_dir == home / "run"
    assert saved.report("~/r.html") == home / "r.html"
    missing = f"^run directory {re.escape(str(home / 'x'))} does not exist"
    with pytest.raises(UserInputError, match=missing):
        MergeRun.load("~/x")
    assert list(here.iterdir()) == []


def test_keep_saved_beside_restart_is_refused(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``merge(..., keep_saved=True, restart=True)`` (and ``pretrain``'s) trained the saved
    student again from step 0: ``restart`` won in silence over what ``keep_saved`` promised."""
    from lmalgebra.api.pretrain import pretrain

    recipe = write_recipe(tmp_path, teacher_dirs)
    wanted = "keep_saved=True would be ignored: restart=True trains again from step 0"
    with pytest.raises(UserInputError, match=rf"^merge\(\): {wanted}") as caught:
        lmalgebra.merge(recipe, "train", keep_saved=True, restart=True)
    assert isinstance(caught.value, ValueError)
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserInputError, match=rf"^pretrain\(\): {wanted}"):
        pretrain(_causal_spec(tmp_path), keep_saved=True, restart=True)
    assert not (tmp_path / "t").exists()


def test_a_training_spec_overrides_the_keys_it_was_given(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``students={"s": TrainingSpec(steps=3)}`` had replaced the recipe's whole training with
    the class's defaults (its batch size 8 became 32, its lr 1e-3 became 5e-4, a warm-up of 100
    steps for 3), where ``{"steps": 3}`` and ``--training.steps 3`` set the steps alone."""
    from lmalgebra.api.merge import _training, recipe_of

    recipe = recipe_of(write_recipe(tmp_path, teacher_dirs, training=TINY_TRAINING))
    by_keys = _training(recipe, {"steps": 3}, "test")
    assert _training(recipe, lmalgebra.TrainingSpec(steps=3), "test") == by_keys
    assert (by_keys.steps, by_keys.batch_size, by_keys.lr) == (3, 8, 1e-3)


def test_nulls_over_python_objects_say_why_there_is_no_copy(
    bert_dir: Path, bert2_dir: Path
) -> None:
    """``study={"nulls": True}`` over two ``(model, tokenizer)`` pairs was refused because "no
    model here has trained weights", which both had: the study makes no random copy of a
    Python object. The message says so."""
    from transformers import AutoModel, AutoTokenizer

    pairs = {
        name: (AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path))
        for name, path in (("a", bert_dir), ("b", bert2_dir))
    }
    wanted = "models given as Python objects have no copy"
    said = re.escape('--study.nulls (study={"nulls": True}) would add nothing: ')
    with pytest.raises(UserInputError, match="^" + said + ".*" + wanted):
        lmalgebra.decompose(pairs, documents(60), study={"nulls": True})


def test_a_heatmap_drawn_from_another_thread_waits_for_the_call_running(
    decomposition: Decomposition, tmp_path: Path
) -> None:
    """``Decomposition.heatmap`` reads and draws into its run directory, as a call does, but
    was no call: from another thread it ran while a call wrote there (taking that call's lock
    for its own)."""
    import threading
    import time

    from lmalgebra.api.runtime import library_entry

    saved = copy.copy(decomposition)
    saved.save(tmp_path / "run")
    assert saved.heatmap is not None  # drawn: asked again, it reads the run, quickly
    release, events = threading.Event(), []

    @library_entry
    def call() -> None:
        events.append("call")
        release.wait(10)
        events.append("/call")

    first = threading.Thread(target=call)
    first.start()
    while not events:
        time.sleep(0.01)
    drawer = threading.Thread(target=lambda: events.append(saved.heatmap.name))
    drawer.start()
    time.sleep(0.3)
    assert events == ["call"]
    release.set()
    first.join(10)
    drawer.join(10)
    assert events == ["call", "/call", "pairwise_r2_test.png"]


def test_a_value_outside_a_literal_names_the_choices() -> None:
    """``read_texts(path, doc_sep="para")`` was refused as ``doc_sep must be DocSep``, the name
    of a type alias the caller cannot see; the message lists the choices."""
    wanted = "read_texts(): doc_sep must be 'auto', 'line' or 'blank', got 'para'"
    with pytest.raises(UserInputError, match=re.escape(wanted) + "$"):
        lmalgebra.read_texts("corpus.txt", doc_sep="para")


def test_a_tuple_cut_short_is_named_as_too_few_values(tmp_path: Path) -> None:
    """``spans={"counts": (40, 10)}`` (or ``counts: [40, 10]`` in a recipe) was refused as
    ``missing key 'spans.counts.2'``, a key no recipe has."""
    from lmalgebra.lmd.settings.recipe import load_config

    wanted = r"key 'spans.counts': too few values \(none at position 3\)$"
    with pytest.raises(UserInputError, match=r"^decompose\(\): " + wanted):
        lmalgebra.decompose({"a": "x", "b": "y"}, ["text"], spans={"counts": (40, 10)})
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "models: [{name: a, path: x}, {name: b, path: y}]\ncorpus: {paths: [c.txt]}\n"
        "spans: {counts: [40, 10]}\n",
        encoding="utf-8",
    )
    with pytest.raises(UserInputError, match=wanted):
        load_config(recipe, {})


def test_a_path_object_where_a_setting_holds_text_is_its_text(bert_dir: Path) -> None:
    """``reference_tokenizer=Path(...)``, a model given as ``{"path": Path(...)}`` or a corpus
    of ``paths=[Path(...)]`` had been refused as "Input should be a valid string", where
    ``texts``, ``out`` and ``cache_dir`` take a ``Path``."""
    from lmalgebra.sources.corpus import CorpusSpec

    texts = documents(60)
    spans = {"length": 8, "counts": (40, 10, 10)}
    by_text = lmalgebra.spans({"a": str(bert_dir)}, texts, spans=spans)
    assert lmalgebra.spans({"a": {"path": bert_dir}}, texts, spans=spans).equals(by_text)
    assert lmalgebra.spans({}, texts, spans=spans, reference_tokenizer=bert_dir).equals(by_text)
    assert CorpusSpec(paths=[Path("c.txt")]).paths == ["c.txt"]


def test_keep_saved_keeps_only_a_teacher_of_this_spec(tmp_path: Path) -> None:
    """``pretrain(spec, keep_saved=True)`` had returned a saved teacher of other sizes, another
    tokenizer or text edited since (a demo's corpus cut by hand) as the spec's, unsaid: it is
    refused naming what differs; one trained for other steps is kept, as documented."""
    from lmalgebra.api.pretrain import pretrain

    spec = _causal_spec(tmp_path)
    saved = pretrain(spec)
    before = (saved / "model.safetensors").read_bytes()
    longer = spec.model_copy(update={"training": spec.training.model_copy(update={"steps": 3})})
    assert pretrain(longer, keep_saved=True) == saved
    wider = spec.model_copy(
        update={"tokenizer": spec.tokenizer.model_copy(update={"vocab_size": 301})}
    )
    with pytest.raises(
        UserInputError,
        match=r"keep_saved: .* other inputs \(spec\.tokenizer\.vocab_size 300 -> 301\)",
    ):
        pretrain(wider, keep_saved=True)
    (tmp_path / "c.txt").write_text("other text\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"other inputs \(corpus text '.*' -> '.*'\)"):
        pretrain(spec, keep_saved=True)
    assert (saved / "model.safetensors").read_bytes() == before


def test_keep_saved_refuses_a_model_of_another_kind(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    """``pretrain(spec, keep_saved=True)`` over a teacher of another kind had been refused as
    one made from other inputs, naming sizes and tokenizer keys (or returned where none
    differed); over a merge run's student it returned the student as the spec's teacher. Both
    are refused as making one there refuses them, and nothing is written."""
    from causal_fixtures import taught_causal_recipe, train_causal
    from hostile_helpers import digests
    from lmalgebra.api.pretrain import MaskedPretrainSpec, pretrain

    spec = _causal_spec(tmp_path)
    saved = pretrain(spec)
    kept = spec.model_dump(exclude={"tokenizer", "model", "training"})
    masked = MaskedPretrainSpec(**kept, tokenizer={"vocab_size": 300})
    before = digests(saved)
    with pytest.raises(UserInputError, match=r"holds a causal teacher .* makes a masked teacher"):
        pretrain(masked, keep_saved=True)
    assert digests(saved) == before
    training = {"steps": 2, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 2}
    (tmp_path / "merge").mkdir()
    recipe = taught_causal_recipe(tmp_path / "merge", causal_teacher_dirs, training)
    student = train_causal(recipe, "student")
    inside = spec.model_copy(update={"out": student})
    with pytest.raises(UserInputError, match=r"would go inside .* which holds a merge run"):
        pretrain(inside, keep_saved=True)
    copied = tmp_path / "copied-student"
    shutil.copytree(student, copied)
    with pytest.raises(UserInputError, match=r"holds a model of kind 'causal-student'"):
        pretrain(spec.model_copy(update={"out": copied}), keep_saved=True)


def test_a_student_directory_holding_a_teacher_is_refused(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    """A teacher ``pretrain`` made, copied to a student's ``model/``, had been kept by
    ``merge(..., keep_saved=True)`` as the student, scored by ``evaluate`` as the student, and
    trained over, its own files left among the student's; a model lmalgebra did not write
    there had been trained over, unsaid."""
    from causal_fixtures import taught_causal_recipe
    from hostile_helpers import digests
    from lmalgebra.api.pretrain import pretrain

    teacher = pretrain(_causal_spec(tmp_path))
    (tmp_path / "merge").mkdir()
    training = {"steps": 2, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 2}
    recipe = taught_causal_recipe(tmp_path / "merge", causal_teacher_dirs, training)
    model = tmp_path / "merge" / "run" / "s9" / "model"
    shutil.copytree(teacher, model)
    before = digests(model)
    wanted = rf"^student directory {re.escape(str(model))} holds a causal teacher"
    for keep in (True, False):
        with pytest.raises(UserInputError, match=wanted):
            lmalgebra.merge(recipe, "train", students={"s9": None}, keep_saved=keep)
    with pytest.raises(UserInputError, match=wanted):
        MergeRun.load(tmp_path / "merge" / "run").evaluate(students=["s9"])
    assert digests(model) == before
    # a Hugging Face model lmalgebra did not write, where no training of the student ran
    users = tmp_path / "merge" / "run" / "s8" / "model"
    shutil.copytree(causal_teacher_dirs["bl"], users)
    before = digests(users)
    with pytest.raises(UserInputError, match=r"holds a model lmalgebra did not write"):
        lmalgebra.merge(recipe, "train", students={"s8": None})
    assert digests(users) == before


def test_a_call_gives_torchs_random_state_back_as_the_caller_left_it(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A ``random:`` model (like a student's initialisation or training) seeds torch's global
    generator: a notebook's own draws after the call had followed the call's seed, and whether
    it found its embeddings cached."""
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    models = {"a": str(bert_dir), "r": f"random:{bert_dir}"}
    spans = {"length": 8, "counts": (40, 10, 10)}
    lmalgebra.decompose(models, documents(60), spans=spans, cache_dir=tmp_path, progress=False)
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize(
    ("key", "value", "wanted"),
    [
        ("alpha", 0.01, None),  # an older release's plain number: read, and shown
        ("alpha", "0.01", "its 'alpha' is '0.01'"),
        ("models", "a,b", "its 'models' is 'a,b'"),  # had been read as models a, ',' and b
        ("models", None, "its 'models' is None"),  # a KeyError from repr
    ],
)
def test_a_summary_read_unchecked_holds_what_a_run_writes(
    key: str, value: Any, wanted: str | None, decomposition: Decomposition, tmp_path: Path
) -> None:
    """A summary without its checksum and file record (an older release's) is read unchecked:
    edited, its fields had ended in a traceback (``repr``) or been read as other models."""
    import json

    run = decomposition.save(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    del summary["sha256"], summary["files"]
    summary[key] = value
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    if wanted is None:
        assert "alpha 0.01;" in repr(Decomposition.load(run))
        return
    with pytest.raises(UserInputError, match=f"summary.json is damaged: {re.escape(wanted)}"):
        Decomposition.load(run)


def test_a_run_whose_fits_table_has_no_row_is_named(
    decomposition: Decomposition, tmp_path: Path
) -> None:
    """A ``fits.csv`` of its header alone, in a run read unchecked, had been loaded, and the
    object's ``repr`` ended in an IndexError."""
    import json

    run = decomposition.save(tmp_path / "run")
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    del summary["sha256"], summary["files"]
    (run / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    fits = run / "fits.csv"
    fits.write_text(fits.read_text(encoding="utf-8").splitlines()[0] + "\n", encoding="utf-8")
    with pytest.raises(UserInputError, match=r"holds no fit \(its tables have no row\)"):
        Decomposition.load(run)


def test_a_summary_edited_in_the_object_is_not_taken_for_the_run_written_again(
    decomposition: Decomposition, tmp_path: Path
) -> None:
    """``result.summary.pop("seconds")`` (to print the rest) had had ``heatmap``, ``report()``
    and ``save()`` refuse the untouched directory as "written again since"."""
    loaded = Decomposition.load(decomposition.save(tmp_path / "run"))
    loaded.summary.pop("seconds")
    assert loaded.save(tmp_path / "copy").is_dir() and loaded.heatmap is not None


def test_a_run_read_back_whose_directory_is_gone_names_the_remedy(
    decomposition: Decomposition, tmp_path: Path
) -> None:
    """A decomposition read back, saved to a copy, its directory then removed: ``report()`` and
    ``save()`` refused it naming the directory gone, no word of what to do (the object copies
    from its source, 8bab236): the line says to load the copy or compute it again."""
    import shutil

    loaded = Decomposition.load(decomposition.save(tmp_path / "run"))
    loaded.save(tmp_path / "copy")
    shutil.rmtree(tmp_path / "run")
    for call in (lambda: loaded.report(tmp_path / "r.html"), lambda: loaded.save(tmp_path / "c2")):
        with pytest.raises(UserInputError) as caught:
            call()
        said = str(caught.value)
        assert "no longer holds this decomposition" in said and "Decomposition.load a copy" in said
    assert Decomposition.load(tmp_path / "copy").summary == loaded.summary


def test_text_or_a_model_name_no_file_can_hold_is_named(bert_dir: Path, tmp_path: Path) -> None:
    """A lone surrogate (a byte decoded with ``errors='surrogateescape'``, or an undecodable
    byte of a command line) in a document or a model name had ended in a UnicodeEncodeError
    traceback, a name's after the run's ``config.yaml`` was written."""
    texts = documents(60)
    texts[3] += " caf\udce9"
    spans = {"length": 8, "counts": (40, 10, 10)}
    with pytest.raises(UserInputError, match=r"^texts\[3\] holds '\\udce9' at position \d+"):
        lmalgebra.spans({"a": str(bert_dir)}, texts, spans=spans)
    out = tmp_path / "run"
    models = {"a\udce9": str(bert_dir), "b": str(bert_dir)}
    with pytest.raises(UserInputError, match="a model name is UTF-8 text"):
        lmalgebra.decompose(models, documents(60), out=out, spans=spans, progress=False)
    assert not out.exists()


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_a_call_runs_with_gradients_whatever_mode_the_caller_is_in(
    mode: str, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """Under a notebook's ``torch.set_grad_enabled(False)`` (or ``inference_mode``), training
    and ``merge_plan``'s timing of a step ended in "element 0 of tensors does not require
    grad"; the caller's mode is kept after the call."""
    import torch

    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT)
    with getattr(torch, mode)():
        assert len(lmalgebra.merge_plan(recipe))
        assert not torch.is_grad_enabled()


def test_the_plans_chosen_and_fits_columns_mask_its_rows(bert_dir: Path, bert2_dir: Path) -> None:
    """``plan[plan.chosen]`` had failed ("Cannot mask with non-boolean array containing NA"):
    the columns held True/False on the total rows and None on the phases', as objects."""
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    spans = {"length": 8, "counts": (40, 10, 10)}
    plan = lmalgebra.decompose_plan(models, documents(60), timed=False, spans=spans)
    chosen = plan[plan.chosen]
    assert chosen[["method", "precision", "phase"]].values.tolist() == [
        ["exact", "float64", "total"]
    ]
    assert len(plan[plan.fits]) == (plan["phase"] == "total").sum()


def test_an_inspection_of_a_run_not_taught_yet_gives_numbers(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """Before ``teach`` the store's figures are not known: their columns had held None as
    objects, neither summed nor plotted; they are numbers, missing."""
    run = lmalgebra.merge(write_recipe(tmp_path, teacher_dirs), "prepare")
    frame = run.inspect().frame()
    assert frame["store_bytes_per_masked_token"].dtype == np.float64
    assert frame["store_bytes_per_masked_token"].isna().all() and frame["examples"].sum() > 0


def test_a_rule_across_a_calls_settings_names_the_call(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A rule across the keys of a Python call's settings (``lambda_value`` beside a linear
    schedule, one model to decompose) had been raised from inside the argument check, or by
    the settings, without the call that was made: each names it, as a bad argument does. The
    command line, which calls the same functions, names its flags alone."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    linear = {"lambda_schedule": "linear", "lambda_value": 0.3}
    for call, said in (
        (lambda: lmalgebra.merge_plan(recipe, training=linear), "merge_plan() training: "),
        (lambda: lmalgebra.merge(recipe, ["train"], students={"s": linear}), "merge() students: "),
        (lambda: lmalgebra.decompose_plan({"a": np.eye(3, 2)}), "decompose_plan(): "),
    ):
        with pytest.raises(UserInputError) as caught:
            call()
        assert str(caught.value).startswith(said), str(caught.value)
    flags = ["--training.lambda_schedule", "linear", "--training.lambda_value", "0.3"]
    for dry in ([], ["--dry-run"]):
        code, stderr = cli(["merge", "train", str(recipe), *flags, *dry])
        line = assert_one_line(code, stderr, ["training.lambda_value 0.3 would be ignored"])
        assert "()" not in line, line
    assert not (tmp_path / "run").exists()


def test_a_recipe_path_holding_brackets_is_no_python_call(tmp_path: Path, cli) -> None:
    """``validate()`` told a Python call's source from a file's by the ``()`` in its name: a
    recipe in ``p()/`` had its rule across keys prefixed with the path, as a call's is, where
    the same recipe elsewhere was not. A call is a type now (``Call``), not a spelling."""
    text = (
        "models: [{name: a, path: package:minilm}, {name: b, path: package:minilm-sre}]\n"
        "corpus: {paths: [package:wiki-en]}\nalpha: 3\nstudy: {alpha_select: gcv}\n"
    )
    lines = []
    for folder in ("p()", "plain"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "r.yaml").write_text(text)
        code, stderr = cli(["decompose", str(tmp_path / folder / "r.yaml"), "--dry-run"])
        lines.append(assert_one_line(code, stderr, ["--alpha 3 would be ignored"]))
    assert lines[0] == lines[1]
    assert "r.yaml" not in lines[0], lines[0]


def test_a_table_with_no_row_has_the_dtypes_of_one_with_rows() -> None:
    """``MergeRun.coverage`` of an evaluation that covered no language (too little held-out
    text) had every column ``object``, where one with rows has text, float and integer columns:
    a frame built from no row takes each column's dtype from its field, for every table the API
    gives as a DataFrame."""
    from lmalgebra.api.frames import frame
    from lmalgebra.distill.causal.bits_per_byte import BITS
    from lmalgebra.distill.masked.scores import SCORES
    from lmalgebra.evaluate.lmd_coverage import COVERAGE
    from lmalgebra.lmd.rundir.schema import TABLES

    sample = {str: "a", float: 0.5, int: 1, bool: True}
    for table in (BITS, SCORES, COVERAGE, *TABLES.values()):
        hints = typing.get_type_hints(table.row)
        if not all(hints[c] in sample for c in table.columns):  # int | None: object either way
            continue
        row = table.row(**{c: sample[hints[c]] for c in table.columns})
        assert frame(table, []).dtypes.to_dict() == frame(table, [row]).dtypes.to_dict(), table


def _message_texts(tree: ast.AST) -> list[str]:
    """The text of every string in ``tree`` but docstrings and the command line's form given to
    ``either`` (which names the call beside it), an f-string's parts joined."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
    } | {
        id(node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "either"
    }
    texts = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) and id(node) not in docstrings:
            texts.append(
                "".join(p.value if isinstance(p, ast.Constant) else "{}" for p in node.values)
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            texts += [node.value] if id(node) not in docstrings else []
    return texts


def test_a_stage_to_run_is_named_as_a_command_and_as_a_call(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """A refusal reached from ``merge()`` or ``MergeRun`` told the caller to run
    `lmalgebra merge prepare RECIPE` (a causal run's student without a model: `lmalgebra merge
    train`, which trains another student): every message that names a stage to run names the
    call beside the command, and the student it is for."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    with pytest.raises(UserInputError, match=r"RECIPE` \(merge\(recipe, 'prepare'\)\) first"):
        lmalgebra.merge(recipe, "teach")
    from lmalgebra.storage.lockfile import refuse_other_kind

    run = tmp_path / "other"
    (run / "examples").mkdir(parents=True)  # a merge run's
    (run / "recipe.yaml").write_text("{}\n", encoding="utf-8")
    with pytest.raises(UserInputError) as caught:  # had named `lmalgebra pretrain` to pretrain()
        refuse_other_kind(run, "pretrain")
    assert "`lmalgebra pretrain`" not in str(caught.value)
    named = lmalgebra.core.errors.merge_stage("train", "s2", restart=True)
    assert "--name s2 --restart" in named and "students={'s2': None}, restart=True" in named
    package = Path(lmalgebra.__file__).parent
    for path in sorted(package.rglob("*.py")):
        if "cli" in path.relative_to(package).parts or path.name in ("errors.py", "model_card.py"):
            continue  # the command line's own, the helper that names both, a model's card
        for text in _message_texts(ast.parse(path.read_text(encoding="utf-8"))):
            assert not re.search(r"`lmalgebra merge [\w{}]+( RECIPE)?[^`(]*`", text), (path, text)


@pytest.mark.parametrize("settings", [{"size": 1, "bootstrap": 10}, {"bootstrap": 0, "level": 0.9}])
def test_a_selection_setting_refused_from_python_is_named_by_its_keyword(
    settings: dict[str, Any], tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``select_teachers(recipe, size=1, bootstrap=10)`` was refused as ``--bootstrap 10 would
    be ignored ... (--size above 1)``, in flags the call has not: a setting is named by its
    key, the flag's name and the keyword alike."""
    from lmalgebra.experimental import select_teachers

    with pytest.raises(UserInputError, match="would be ignored") as caught:
        select_teachers(write_recipe(tmp_path, teacher_dirs), **settings)
    assert "--" not in str(caught.value)


@pytest.mark.parametrize("shape", [(4, 0), (0, 3), (4,)])
def test_an_array_of_no_column_or_row_says_what_it_lacks(shape: tuple[int, ...]) -> None:
    """An array of shape (75, 0) was refused as not 2-D (spans, dim), which it is: the line
    says it needs a row per span and a column at least."""
    from lmalgebra.sources.kinds.python_objects import GivenArrays

    with pytest.raises(UserInputError, match=r"a row per span and a column at least, got shape"):
        GivenArrays("x", np.zeros(shape))


def test_a_generator_inside_a_mapping_argument_reaches_the_call_whole() -> None:
    """``merge_plan(recipe, training={"teachers": (t for t in ["wp"])})`` was refused as
    ``training.teachers is empty``: the check of the argument's type had read the generator,
    and the call found it exhausted. It is read into a list before the check."""
    from lmalgebra.api.merge import merge_plan
    from lmalgebra.api.runtime import check_arguments

    names = (t for t in ["wp", "sp"])
    bound = check_arguments(merge_plan.__wrapped__, "r.yaml", training={"teachers": names})
    assert bound.arguments["training"] == {"teachers": ["wp", "sp"]}


def test_a_merge_recipe_built_from_its_base_class_says_how_to_build_one() -> None:
    """``MergeRecipe(**recipe)``, as "a MergeRecipe built in Python" reads, was refused as
    ``unknown key 'example_length'`` (a key of every masked recipe), or with only the keys all
    recipes share as a bare TypeError: one UserInputError naming ``model_validate``."""
    from lmalgebra import MergeRecipe

    shared = {"languages": {"xx": {"corpus": {"paths": ["x.txt"]}, "teachers": ["t"]}}}
    said = r"^MergeRecipe: MergeRecipe is the base .* MergeRecipe.model_validate\(mapping\)"
    for data in (shared, {**shared, "example_length": 64}, {**shared, "objective": "causal"}):
        with pytest.raises(UserInputError, match=said) as caught:
            MergeRecipe(**data, teachers={"t": {"path": "t"}})
        assert isinstance(caught.value, ValueError)  # as every settings class's refusal is


def test_no_bootstrap_beside_a_set_of_one_is_taken() -> None:
    """``select_teachers(size=1, bootstrap=0)`` was refused as "bootstrap 0 would be ignored":
    0 asks for no interval, which a set of one gets. Its level and seed are still refused."""
    from lmalgebra.experimental.selection.selection_spec import SelectionSpec

    assert SelectionSpec(size=1, bootstrap=0).bootstrap == 0
    with pytest.raises(UserInputError, match=r"level 0\.9 would be ignored: .*size above 1"):
        SelectionSpec(size=1, bootstrap=0, level=0.9)


def test_a_key_of_the_causal_training_given_to_training_spec_names_its_class() -> None:
    """``TrainingSpec(objective_mix=...)`` (for a causal student, as the docs build a
    ``TrainingSpec``) said "unknown key" alone: the key is a causal training's, which the
    line names now."""
    with pytest.raises(UserInputError, match=r"^TrainingSpec: unknown key 'objective_mix': a key "):
        lmalgebra.TrainingSpec(objective_mix={"ce": 1.0})
    with pytest.raises(UserInputError, match=r"config\.CausalTrainingSpec \(built on "):
        lmalgebra.TrainingSpec(label_smoothing=0.1)
    with pytest.raises(UserInputError, match=r"^TrainingSpec: unknown key 'stepz'$"):
        lmalgebra.TrainingSpec(stepz=3)


def test_a_key_of_a_sibling_settings_class_names_that_class() -> None:
    """``MaskedStudentSpec(init=...)`` (a causal student's key) and
    ``MaskedRecipe.model_validate({"teacher_text": ...})`` said "unknown key" alone, where a key
    of a class built on the one given is named: a class built on the same base is too."""
    from lmalgebra.distill.recipe import MaskedRecipe
    from lmalgebra.distill.student import MaskedStudentSpec

    said = r"a key of lmalgebra\.distill\.student\.CausalStudentSpec \(built on ModelSpec, as "
    with pytest.raises(UserInputError, match=r"^MaskedStudentSpec: unknown key 'init': " + said):
        MaskedStudentSpec(init="x")
    with pytest.raises(UserInputError, match=r"recipe\.CausalRecipe \(built on MergeRecipe, as "):
        MaskedRecipe.model_validate({"teacher_text": {}})
    with pytest.raises(UserInputError, match=r"^MaskedStudentSpec: unknown key 'initt'$"):
        MaskedStudentSpec(initt="x")
