"""Causal students started from a pre-trained model (``student.init``): a layer subset keeps the
source's weights bit for bit, an untrained student scores its source's bits per byte, a short
merge run from a GGUF file saves a student that plain transformers loads and generates with,
and every bad setting is one line (exit 2 on the command line)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
from gguf_fixtures import tiny_llama, write_llama_gguf
from hostile_helpers import assert_one_line, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill import pipeline as stages
from lmalgebra.distill.causal.bits_per_byte import bits_per_byte
from lmalgebra.distill.causal.student_init import init_student, open_init
from lmalgebra.distill.layout import write_model_directory
from lmalgebra.distill.pipeline import train_student
from lmalgebra.distill.recipe import load_recipe, parse_recipe
from lmalgebra.distill.student import CausalStudentSpec
from lmalgebra.train.config import CausalTrainingSpec
from lmalgebra.train.run_fingerprint import CheckpointMismatchError
from merge_fixtures import write_recipe
from tiny import sentences

TRAINING = {"steps": 3, "batch_size": 4, "lr": 3e-3, "warmup_steps": 0, "log_every": 1}


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama of four layers, 512 positions (a whole 300-byte example), saved."""
    model, tokenizer = tiny_llama(seed=1, layers=4, positions=512)
    directory = tmp_path_factory.mktemp("llama")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def llama_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same kind of Llama as a GGUF file."""
    model, tokenizer = tiny_llama(seed=2, layers=3, positions=512)
    return write_llama_gguf(model, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def _saved_student(source: Path, out: Path, layers: list[int] | None = None) -> Path:
    """The untrained student ``student: {init: source, layers: ...}``, written as ``train``
    writes one."""
    init = open_init(CausalStudentSpec(init=str(source), layers=layers))
    assert init is not None
    tokenizer = AutoTokenizer.from_pretrained(source)
    return write_model_directory(out, init_student(init), tokenizer, {"kind": "causal-student"})


def _renamed(key: str, layers: list[int]) -> str:
    """A student's state-dict key as the source's (layer ``j`` is the source's ``layers[j]``)."""
    return re.sub(r"(layers|\.h)\.(\d+)\.", lambda m: f"{m[1]}.{layers[int(m[2])]}.", key)


@pytest.mark.parametrize(
    ("source", "layers"),
    [("llama", [3, 0, 2]), ("llama", [1]), ("gpt2", [1, 0])],
)
def test_layer_subset_equals_the_source_layers_bit_for_bit(
    llama_dir: Path, causal_teacher_dirs, tmp_path: Path, source: str, layers: list[int]
) -> None:
    """Every tensor of the saved student is the source's, layer j the source's ``layers[j]``;
    the other layers are gone."""
    path = llama_dir if source == "llama" else causal_teacher_dirs["bl"]
    saved = _saved_student(path, tmp_path / "student", layers)
    original = AutoModelForCausalLM.from_pretrained(path).state_dict()
    student = AutoModelForCausalLM.from_pretrained(saved)
    assert student.config.num_hidden_layers == len(layers)
    got = student.state_dict()
    depth = AutoModelForCausalLM.from_pretrained(path).config.num_hidden_layers
    dropped = [i for i in range(depth) if i not in layers]
    kept = {k for k in original if not any(re.search(rf"(layers|\.h)\.{i}\.", k) for i in dropped)}
    assert {_renamed(k, layers) for k in got} == kept
    for key, tensor in got.items():
        assert torch.equal(tensor, original[_renamed(key, layers)]), key


def _tiny_gemma3(directory: Path) -> Path:
    """A random tiny Gemma 3 of six layers, sliding (window 4) and full attention mixed."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    _, tokenizer = tiny_llama(seed=3)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        max_position_embeddings=128,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(3)
    Gemma3ForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.mark.parametrize(("source", "layers"), [("llama", [3, 0, 2]), ("gemma3", [5, 0, 3])])
def test_a_subset_computes_what_a_model_built_at_that_depth_computes(
    llama_dir: Path, tmp_path: Path, source: str, layers: list[int]
) -> None:
    """The reference: the architecture built natively with ``len(layers)`` layers (Gemma's
    per-layer attention kinds subset alike) holding the source's kept weights. Logits and a
    greedy continuation through the key-value cache are identical."""
    path = llama_dir if source == "llama" else _tiny_gemma3(tmp_path / "gemma3")
    saved = AutoModelForCausalLM.from_pretrained(_saved_student(path, tmp_path / "s", layers))
    original = AutoModelForCausalLM.from_pretrained(path)
    config = original.config
    config.num_hidden_layers = len(layers)
    if source == "gemma3":
        config.layer_types = [config.layer_types[i] for i in layers]
        assert len(set(config.layer_types)) == 2  # both kinds among the kept layers
    reference = AutoModelForCausalLM.from_config(config)
    weights = {key: original.state_dict()[_renamed(key, layers)] for key in reference.state_dict()}
    reference.load_state_dict(weights, strict=True)
    ids = torch.tensor([[1, *range(10, 30)]])
    with torch.no_grad():
        for model in (saved, reference):
            model.eval()
        assert torch.equal(saved(ids).logits, reference(ids).logits)
        greedy = {"max_new_tokens": 8, "do_sample": False}
        assert torch.equal(saved.generate(ids, **greedy), reference.generate(ids, **greedy))


def test_untrained_student_scores_its_sources_bits_per_byte(
    llama_dir: Path, causal_teacher_dirs, tmp_path: Path
) -> None:
    texts = {"xx": sentences(12, seed=21), "yy": [" ".join(sentences(30, seed=22))]}
    for name, source in (("llama", llama_dir), ("gpt2", causal_teacher_dirs["bl"])):
        saved = _saved_student(source, tmp_path / name)
        want, got = (
            bits_per_byte(source, texts, context=48),
            bits_per_byte(saved, texts, context=48),
        )
        for lang in texts:  # the same weights through the same kernels
            assert got[lang].tokens == want[lang].tokens > 0
            assert got[lang].nats == want[lang].nats, (name, lang)


@pytest.fixture(scope="module")
def run_recipe(tmp_path_factory: pytest.TempPathFactory, causal_teacher_dirs) -> Path:
    """The causal fixtures' run, prepared and taught; its student comes later."""
    root = tmp_path_factory.mktemp("init-run")
    path = write_causal_recipe(root, causal_teacher_dirs, student=CAUSAL_STUDENT)
    recipe = load_recipe(path)
    stages.prepare(recipe, progress=False)
    stages.teach(recipe, progress=False)
    return path


def _with_student(recipe_path: Path, student: dict[str, Any], name: str = "init.yaml") -> Path:
    data = yaml.safe_load(recipe_path.read_text(encoding="utf-8"))
    data.update(student=student, training=TRAINING)
    path = recipe_path.with_name(name)
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    return path


def test_merge_run_trains_a_student_started_from_a_gguf_file(
    run_recipe: Path, llama_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three steps from ``gguf:FILE``, layers [2, 0]: the saved student loads in plain
    transformers, generates, moved from its start, and records where it started."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    student = {"init": f"gguf:{llama_gguf}", "layers": [2, 0]}
    recipe = load_recipe(_with_student(run_recipe, student))
    spec = CausalTrainingSpec.model_validate({**TRAINING, "objective_mix": {"alm": 1.0}})
    saved = train_student(recipe, "from-gguf", spec, False)
    model = AutoModelForCausalLM.from_pretrained(saved)
    tokenizer = AutoTokenizer.from_pretrained(saved)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 2
    generate = pipeline("text-generation", model=model, tokenizer=tokenizer)
    assert generate("the river", max_new_tokens=4, do_sample=False)[0]["generated_text"].startswith(
        "the river"
    )
    meta = json.loads((saved / "lmalgebra.json").read_text())
    started = meta["student_init"]
    assert started["reference"] == f"gguf:{llama_gguf}" and started["layers"] == [2, 0]
    assert {"weights", "tokenizer", "gguf_sha256", "quantisation"} <= set(started["hashes"])
    assert meta["student_tokenizer"]["tokenizer"] == f"init:gguf:{llama_gguf}"
    assert [json.loads(line)["step"] for line in (saved.parent / "train_log.jsonl").open()] == [
        1,
        2,
        3,
    ]
    init = open_init(recipe.student)
    assert init is not None
    start = init_student(init).state_dict()
    final = load_file(str(saved / "model.safetensors"))
    assert any(not torch.equal(start[k], final[k]) for k in final)
    # the same layers in another order: the same configuration, but not the same start
    other = load_recipe(_with_student(run_recipe, {**student, "layers": [0, 2]}, "other.yaml"))
    with pytest.raises(CheckpointMismatchError, match="the model the student starts from"):
        train_student(other, "from-gguf", spec, False)
    # a recipe's dump (the run directory's copy) reads back as the same student
    assert parse_recipe(recipe.model_dump(mode="json"), "dump").student == recipe.student


def test_dry_run_plans_a_student_started_from_a_model(run_recipe: Path, llama_dir: Path) -> None:
    recipe = load_recipe(
        _with_student(run_recipe, {"init": str(llama_dir), "layers": [0]}, "p.yaml")
    )
    rows = stages.objective_of(recipe).plan(recipe.training)
    assert rows and all(row["train_s"] > 0 for row in rows)


def _causal(student: dict[str, Any], teachers: dict[str, Path]) -> dict[str, Any]:
    return {
        "objective": "causal",
        "languages": {"xx": {"corpus": {"paths": ["x.txt"]}, "teachers": ["bl"]}},
        "teachers": {"bl": {"path": str(teachers["bl"])}},
        "student": student,
    }


@pytest.mark.parametrize(
    ("student", "needles"),
    [
        ({"init": "m", "hidden_size": 64}, ["student.hidden_size", "beside student.init"]),
        ({"init": "m", "num_layers": 2}, ["student.num_layers", "beside student.init"]),
        ({"init": "m", "tokenizer": "bl"}, ["student.tokenizer", "beside student.init"]),
        ({"init": "m", "layers": []}, ["student.layers is empty"]),
        ({"init": "m", "layers": [0, 2, 0]}, ["lists layer 0 more than once"]),
        ({"init": "m", "layers": [-1]}, ["layer -1 does not exist"]),
        ({"layers": [0], "tokenizer": "bl"}, ["student.layers needs student.init"]),
    ],
)
def test_bad_student_settings_are_one_line(
    causal_teacher_dirs, student: dict[str, Any], needles: list[str]
) -> None:
    with pytest.raises(UserInputError) as err:
        parse_recipe(_causal(student, causal_teacher_dirs), "r.yaml")
    assert "\n" not in str(err.value)
    for needle in needles:
        assert needle in str(err.value)


def test_init_on_a_masked_recipe_names_the_setting(tmp_path: Path, teacher_dirs) -> None:
    path = write_recipe(tmp_path, teacher_dirs, student={"init": "m"})
    with pytest.raises(UserInputError, match=r"student\.init.*causal recipes") as err:
        load_recipe(path)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("init", "needles"),
    [
        ("random:{llama}", ["student.init", "with weights"]),
        ("{bert}", ["holds a masked LM"]),
    ],
)
def test_init_that_is_no_causal_lm_with_weights(
    llama_dir: Path, teacher_dirs, init: str, needles: list[str]
) -> None:
    spec = CausalStudentSpec(init=init.format(llama=llama_dir, bert=teacher_dirs["wp"]))
    with pytest.raises(UserInputError) as err:
        open_init(spec)
    for needle in needles:
        assert needle in str(err.value)


def test_layer_beyond_the_model_stops_merge_train_with_one_line(
    run_recipe: Path, llama_dir: Path, monkeypatch, capsys
) -> None:
    path = _with_student(run_recipe, {"init": str(llama_dir), "layers": [0, 4]}, "bad.yaml")
    code, err = run_cli(["merge", "train", str(path), "--no-progress"], monkeypatch, capsys)
    assert_one_line(code, err, ["student.layers", "layer 4 does not exist", "4 layers"])


@pytest.mark.slow
def test_a_student_of_smollm2s_first_and_last_layers_generates(tmp_path: Path) -> None:
    """The packaged SmolLM2-135M (dequantised into the user's cache on first use, minutes):
    its first and last six layers as a Llama of twelve that plain transformers loads."""
    layers = [0, 1, 2, 3, 4, 5, 24, 25, 26, 27, 28, 29]
    init = open_init(CausalStudentSpec(init="package:smollm2-135m", layers=layers))
    assert init is not None and init.depth == 30 and init.hashes["quantisation"] == "MOSTLY_Q4_1"
    tokenizer = AutoTokenizer.from_pretrained(init.directory)
    saved = write_model_directory(tmp_path / "s", init_student(init), tokenizer, {"kind": "test"})
    model = AutoModelForCausalLM.from_pretrained(saved)
    assert type(model).__name__ == "LlamaForCausalLM" and model.config.num_hidden_layers == 12
    generate = pipeline(
        "text-generation", model=model, tokenizer=AutoTokenizer.from_pretrained(saved)
    )
    out = generate("The capital of France is", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("The capital of France is")


@pytest.mark.parametrize("dry_run", [True, False])
def test_an_init_inside_the_students_own_directory_is_refused(
    run_recipe: Path, llama_dir: Path, dry_run: bool, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """``student.init: RUN/own/model`` trained as ``--name own``: training had started from
    the saved model and written over it, and its checkpoints (recording that model's hashes)
    could then never be resumed. Refused, by the dry run too; another name may start from it."""
    import shutil

    own = run_recipe.parent / "run" / "own" / "model"
    if not own.exists():
        shutil.copytree(llama_dir, own)
    recipe = _with_student(run_recipe, {"init": str(own)}, "own.yaml")
    before = sorted(p.name for p in own.iterdir())
    flags = ["--no-progress", *(["--dry-run"] if dry_run else [])]
    code, err = run_cli(
        ["merge", "train", str(recipe), "--name", "own", *flags], monkeypatch, capsys
    )
    assert_one_line(
        code, err, [f"student.init '{own}' is inside", "merge train RECIPE --name OTHER"]
    )
    assert sorted(p.name for p in own.iterdir()) == before
    if dry_run:
        args = ["merge", "train", str(recipe), "--name", "other", "--dry-run"]
        code, err = run_cli(args, monkeypatch, capsys)
        assert code == 0, err
