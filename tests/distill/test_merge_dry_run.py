"""``lmalgebra merge ... --dry-run`` and ``lmalgebra.api.merge.merge_plan``: what a run will do,
found before it runs, against what the stages then make.

The counts and the store's bytes must equal what ``prepare`` and ``teach`` write; the FLOPs of
the time model must equal torch's own count of a real forward pass; a dry run writes nothing.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.flop_counter import FlopCounterMode

import lmalgebra
from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
from hostile_helpers import ANSI, assert_one_line, run_cli
from lmalgebra import UserInputError
from lmalgebra.api.merge import merge_plan
from lmalgebra.cli import main
from lmalgebra.distill.masked.student_model import build_masked_lm
from lmalgebra.distill.run.time_estimate import LOAD_SECONDS, ModelShape, measure_speed
from lmalgebra.distill.student import MaskedStudentSpec
from lmalgebra.distill.teachers import model_config
from lmalgebra.storage.shard_set import ShardSet
from lmalgebra.train.masked_head import masked_logits
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def recipe(tmp_path: Path, teacher_dirs: dict[str, Path]) -> Path:
    return write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING)


@pytest.mark.parametrize("command", [["run"], ["prepare"]])
def test_a_dry_run_writes_nothing_and_prints_the_plan(
    command: list[str],
    recipe: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = files(tmp_path)
    args = ["merge", command[0], str(recipe), *command[1:], "--dry-run"]
    code, out, err = _cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert files(tmp_path) == before
    # every stage has its estimate: no note of the causal student that has none
    assert "causal student" not in " ".join(out.split()), out


def test_counts_and_store_bytes_are_what_prepare_and_teach_make(recipe: Path) -> None:
    plan = merge_plan(recipe)
    assert list(plan[["language", "teacher"]].itertuples(index=False, name=None)) == [
        ("xx", "wp"),
        ("yy", "wp"),
        ("yy", "sp"),
    ]
    run = lmalgebra.merge(recipe, ["prepare", "teach"])
    for row in plan.to_dict("records"):
        masked = ShardSet.existing(run.run_dir / "masked" / row["language"] / row["teacher"])
        topk = ShardSet.existing(run.run_dir / "topk" / row["language"] / row["teacher"])
        examples = ShardSet.existing(run.run_dir / "examples" / row["language"])
        assert row["examples"] == masked.rows == examples.manifest["examples"]
        assert row["heldout"] == examples.manifest["heldout"]
        assert row["predicted_tokens"] == masked.manifest["masked_tokens"]
        shards = sorted(topk.directory.glob("shard-*.arrow"))
        assert row["store_bytes"] == sum(p.stat().st_size for p in shards)  # exactly
        assert row["store_bytes"] == topk.nbytes


def test_times_are_positive_and_grow_with_the_work(recipe: Path) -> None:
    plan = merge_plan(recipe)
    stages = ["prepare_s", "teach_s", "vocab_s", "train_s", "evaluate_s"]
    assert all(math.isfinite(v) and v > 0 for v in plan[stages].to_numpy().ravel())
    longer = merge_plan(recipe, training={"steps": 60})
    compute = plan.train_s.sum() - LOAD_SECONDS  # the student is built once whatever the steps
    assert longer.train_s.sum() - LOAD_SECONDS > 2 * compute  # ten times the steps (probes vary)
    assert list(longer.store_bytes) == list(plan.store_bytes)


def _counted(model: object, batch: dict[str, torch.Tensor]) -> int:
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        masked_logits(model, batch)
    return int(counter.get_total_flops())


def _batch() -> dict[str, torch.Tensor]:
    ids = torch.randint(5, 100, (3, 17))
    rows, cols = torch.tensor([0, 0, 1, 2, 2]), torch.tensor([1, 4, 2, 3, 9])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "rows": rows, "cols": cols}


@pytest.mark.parametrize("teacher", ["wp", "sp"])
def test_flops_equal_torchs_count_of_a_teacher_forward(
    teacher: str, teacher_dirs: dict[str, Path]
) -> None:
    from transformers import AutoModelForMaskedLM

    directory = teacher_dirs[teacher]
    # eager attention: its matmuls are counted (a fused kernel's are not, on CPU); the trimmed
    # last layer's attention is always the fused kernel
    model = AutoModelForMaskedLM.from_pretrained(directory, attn_implementation="eager")
    shape = ModelShape.from_config(model_config(directory), 0)
    assert shape.trimmed and shape.last_layer_attention(17, 5) > 0
    expected = shape.forward_flops(3, 17, 5) - shape.last_layer_attention(17, 5)
    assert expected == _counted(model.eval(), _batch())


def test_flops_of_a_factorised_student() -> None:
    spec = MaskedStudentSpec(**{**TINY_STUDENT, "embedding_size": 16})
    model = build_masked_lm(spec, 120)
    model.config._attn_implementation = "eager"
    shape = ModelShape(2, 32, 64, 16, 120)
    assert shape.forward_flops(3, 17, 5) == _counted(model.eval(), _batch())


def test_flops_of_a_bert_student_with_its_last_layer_trimmed() -> None:
    model = build_masked_lm(MaskedStudentSpec(**TINY_STUDENT), 120)
    model.config._attn_implementation = "eager"
    shape = ModelShape(2, 32, 64, 32, 120, trimmed=True)
    untrimmed = ModelShape(2, 32, 64, 32, 120)
    expected = shape.forward_flops(3, 17, 5) - shape.last_layer_attention(17, 5)
    assert expected == _counted(model.eval(), _batch())
    assert expected < untrimmed.forward_flops(3, 17, 5)


def test_probes_measure_something() -> None:
    speed = measure_speed("cpu")
    # each probe is a best-of timing: on a loaded machine their order is not guaranteed
    assert 0 < speed.layer_forward < 1
    assert 0 < speed.layer_training < 1
    assert 1e6 < speed.rate(64, 32, 64) < 1e15  # FLOP/s, any CPU
    shape = ModelShape(2, 32, 64, 32, 200)
    one = speed.batch_seconds(shape, [(8, 20, 12)])
    assert speed.batch_seconds(shape, [(8, 20, 12)] * 4) == pytest.approx(4 * one)
    assert speed.batch_seconds(shape, [(8, 20, 12)], training=True) > one


def test_recipe_errors_are_those_of_a_run(recipe: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    data["example_length"] = 500
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(lmalgebra.UserInputError, match="example_length 500"):
        merge_plan(bad)


@pytest.mark.parametrize("where", ["a file", "another kind"])
def test_an_output_directory_the_run_refuses_the_dry_run_refuses_alike(
    where: str,
    tmp_path: Path,
    teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The run's checks of its directory write nothing, so the dry run makes them too: the same
    one line, not a plan of a run that would be refused."""
    target = tmp_path / "target"
    if where == "a file":
        target.write_text("mine\n", encoding="utf-8")
    else:  # a decomposition run
        target.mkdir()
        (target / "summary.json").write_text("{}", encoding="utf-8")
        (target / "config.yaml").write_text("models: []\n", encoding="utf-8")
    recipe = write_recipe(
        tmp_path, teacher_dirs, student=TINY_STUDENT, training=TINY_TRAINING, output_dir=str(target)
    )
    before = files(tmp_path)
    messages = []
    for dry in (["--dry-run"], []):
        code, err = run_cli(["merge", "prepare", str(recipe), *dry], monkeypatch, capsys)
        assert code == 2 and "Traceback" not in err, err
        messages.append(ANSI.sub("", err).strip().splitlines()[-1])
    assert messages[0] == messages[1] and str(target) in messages[0], messages
    assert files(tmp_path) == before


# --- causal recipes: the same plan, of a causal store --------------------------------------


@pytest.fixture
def causal_recipe(tmp_path: Path, causal_teacher_dirs: dict[str, Path]) -> Path:
    training = {"steps": 4, "batch_size": 4, "warmup_steps": 1, "checkpoint_every": 2}
    return write_causal_recipe(
        tmp_path, causal_teacher_dirs, student=CAUSAL_STUDENT, training=training
    )


@pytest.mark.parametrize("objective", ["masked", "causal"])
@pytest.mark.parametrize("stage", ["teach", "vocab", "train"])
def test_a_later_stage_alone_on_an_unprepared_run_is_refused_by_its_dry_run_too(
    objective: str,
    stage: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``merge teach``, ``vocab`` or ``train`` alone reads what ``prepare`` wrote: on a run never
    prepared the stage refuses, naming the first input it misses, and its dry run refuses in the
    same line (it had planned the stage, or named the run's examples instead); neither writes
    anything."""
    recipe = request.getfixturevalue("recipe" if objective == "masked" else "causal_recipe")
    _same_refusal(["merge", stage, str(recipe)], tmp_path, monkeypatch, capsys)


def _same_refusal(
    args: list[str],
    root: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> str:
    """``lmalgebra ARGS --dry-run`` and ``lmalgebra ARGS`` refuse in the same one line, and
    write nothing under ``root``; the line."""
    before = files(root)
    lines = []
    for dry in (["--dry-run"], []):
        code, _out, err = _cli([*args, *dry], monkeypatch, capsys)
        assert code == 2 and "Traceback" not in err, err
        lines.append(ANSI.sub("", err).strip().splitlines()[-1])
    assert lines[0] == lines[1], lines
    assert re.search(
        r"run `lmalgebra merge \w+ RECIPE` \(merge\(recipe, '\w+'\)\) first|no union vocabulary",
        lines[1],
    )
    assert files(root) == before
    return lines[0]


@pytest.mark.parametrize(
    ("objective", "built", "missing"),
    [
        ("masked", ["prepare"], "topk/xx/wp is missing or incomplete"),
        ("masked", ["prepare", "teach"], "vocab is missing"),
        ("causal", ["prepare"], "logprobs/xx/bl is missing or incomplete"),
    ],
    ids=["masked-untaught", "masked-no-vocab", "causal-untaught"],
)
def test_train_before_the_stages_it_reads_is_refused_by_its_dry_run_too(
    objective: str,
    built: list[str],
    missing: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A run prepared but not taught, or taught without its vocabulary: ``merge train`` refuses
    naming the stage to run first, and its dry run had planned the training (exit 0)."""
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe

    recipe = request.getfixturevalue("recipe" if objective == "masked" else "causal_recipe")
    pipeline.run_stages(load_recipe(recipe), built, progress=False)  # type: ignore[arg-type]
    line = _same_refusal(["merge", "train", str(recipe)], tmp_path, monkeypatch, capsys)
    assert missing in line


def _cli(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """``lmalgebra ARGS``: (exit status, stdout, stderr)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr("sys.argv", ["lmalgebra", *args])
    capsys.readouterr()
    try:
        main()
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", [["run"], ["prepare"]])
def test_a_causal_dry_run_prints_the_plan_and_writes_nothing(
    command: list[str],
    causal_recipe: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = files(tmp_path)
    args = ["merge", command[0], str(causal_recipe), "--dry-run"]
    code, out, err = _cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert "Dry run of" in out and "Time per stage" in out
    for language, teacher in (("xx", "bl"), ("xx", "uni"), ("yy", "wp")):
        assert re.search(rf"{language}\s+.\s+{teacher}\s", out), out
    assert files(tmp_path) == before
    assert not re.search(r"^\W*vocab\b", out, flags=re.MULTILINE)  # no stage of a causal run


def test_a_causal_dry_run_of_a_stage_it_lacks_is_refused_as_the_run_is(
    causal_recipe: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    before = files(tmp_path)
    messages = []
    for dry in (["--dry-run"], []):
        code, _out, err = _cli(["merge", "vocab", str(causal_recipe), *dry], monkeypatch, capsys)
        assert code == 2 and "Traceback" not in err, err
        messages.append(ANSI.sub("", err).strip().splitlines()[-1])
    assert messages[0] == messages[1] and "no union vocabulary" in messages[0]
    assert files(tmp_path) == before
    with pytest.raises(lmalgebra.UserInputError, match="no union vocabulary"):
        merge_plan(causal_recipe, stages=["vocab"])
    assert "vocab_s" not in merge_plan(causal_recipe, stages=["prepare", "vocab", "train"])


def test_causal_counts_and_store_bytes_are_what_prepare_and_teach_make(causal_recipe: Path) -> None:
    plan = merge_plan(causal_recipe)
    assert list(plan[["language", "teacher"]].itertuples(index=False, name=None)) == [
        ("xx", "bl"),
        ("xx", "uni"),
        ("yy", "wp"),
    ]
    run = lmalgebra.merge(causal_recipe, ["prepare", "teach"])
    for row in plan.to_dict("records"):
        tokens = ShardSet.existing(run.run_dir / "tokens" / row["language"] / row["teacher"])
        logprobs = ShardSet.existing(run.run_dir / "logprobs" / row["language"] / row["teacher"])
        examples = ShardSet.existing(run.run_dir / "examples" / row["language"])
        assert row["examples"] == tokens.rows == examples.manifest["examples"]
        assert row["heldout"] == examples.manifest["heldout"]
        assert row["tokens"] == row["predicted_tokens"] == tokens.manifest["tokens"]
        shards = sorted(logprobs.directory.glob("shard-*.arrow"))
        assert row["store_bytes"] == sum(p.stat().st_size for p in shards)  # exactly
    assert "vocab_s" not in plan  # a causal recipe has no vocabulary stage
    for stage in ("prepare_s", "teach_s", "train_s", "evaluate_s"):
        assert (plan[stage] > 0).all() and plan[stage].map(math.isfinite).all(), stage


def test_a_causal_recipe_without_a_student_tokenizer_plans_its_store(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs)
    plan = merge_plan(recipe)
    assert plan.train_s.isna().all()  # `merge train` would refuse it: no estimate
    assert (plan.teach_s > 0).all() and (plan.evaluate_s > 0).all()
    with pytest.raises(UserInputError, match="student needs a tokenizer"):
        merge_plan(recipe, stages=["train"])  # training alone: refused as training refuses it


def test_the_dry_run_refuses_what_training_refuses(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A ``training.teachers`` naming no teacher of the recipe had been planned (timed, exit 0),
    then refused by ``merge train``: the dry run says what the run would."""
    training = {**TINY_TRAINING, "teachers": ["nope"]}
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    for command in (["train", str(recipe), "--dry-run"], ["train", str(recipe)]):
        code, stderr = cli(["merge", *command, "--no-progress"])
        assert_one_line(code, stderr, ["training.teachers", "'nope'"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("teachers", "key"),
    [(["bl", "bl"], "training.teachers"), ({"xx": ["bl", "uni", "bl"]}, "training.teachers.xx")],
)
def test_a_teacher_listed_twice_in_training_teachers_is_refused(
    tmp_path: Path,
    causal_teacher_dirs: dict[str, Path],
    teachers: list[str] | dict[str, list[str]],
    key: str,
    cli,
) -> None:
    """``training.teachers: [bl, bl]`` (or a language's list naming one twice) was planned and
    trained as if named once; ``languages.<lang>.teachers`` refuses a repeat, and so does it, by
    the dry run too."""
    training = {"steps": 1, "batch_size": 2, "teachers": teachers}
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, training=training)
    code, stderr = cli(["merge", "train", str(recipe), "--dry-run", "--no-progress"])
    assert_one_line(code, stderr, [f"{key} lists teacher 'bl' more than once"])
    assert not (tmp_path / "run").exists()


def test_the_estimate_reads_a_configuration_as_the_decomposition_plan_does() -> None:
    """A configuration naming a size under two families' keys gives one shape to both plans
    (their key orders had differed: DistilBERT's ``hidden_dim`` is its feed-forward width)."""
    from lmalgebra.distill.run.time_estimate import ModelShape
    from lmalgebra.sources.model_files import architecture

    config = {"dim": 64, "d_model": 32, "hidden_dim": 256, "ffn_dim": 128}
    config |= {"n_layers": 2, "num_layers": 3, "vocab_size": 100}
    shape = ModelShape.from_config(config, vocab=100)
    _, _, hidden, intermediate = architecture(config, 0)
    assert (shape.hidden, shape.intermediate, shape.layers) == (hidden, intermediate, 3)
    assert (hidden, intermediate) == (32, 128)


@pytest.mark.parametrize("candidates", [None, [0.2, 0.8]], ids=["one-run", "lambda-candidates"])
def test_a_checkpoint_of_other_training_settings_is_refused_by_the_dry_run_too(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], candidates: list[float] | None
) -> None:
    """A student's checkpoint (or a ``lambda_candidates`` run's) written under other settings
    of its own (a seed, say): resuming refuses it, and the dry run had planned the training
    (it compared the data settings alone, and never a candidate's checkpoints)."""
    from causal_fixtures import taught_causal_recipe, train_causal
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.recipe import load_recipe

    training: dict[str, object] = {"steps": 2, "batch_size": 4, "warmup_steps": 1}
    training |= {"validation_fraction": 0.2, "validation_every": 1}
    if candidates:
        training |= {"lambda_candidates": candidates, "lambda_schedule": "constant"}
    path = taught_causal_recipe(tmp_path, causal_teacher_dirs, training)
    train_causal(path, "student")
    recipe = load_recipe(path)
    changed = pipeline.training_of(recipe, {"steps": 3, "seed": 3}, "test")
    refusal = r"the training settings changed \(training.seed 0 -> 3\)"
    with pytest.raises(UserInputError, match=refusal):
        pipeline.plan(recipe, changed, ["train"], "student")
    with pytest.raises(UserInputError, match=refusal):
        pipeline.train_student(recipe, "student", changed, False)
    longer = pipeline.training_of(recipe, {"steps": 3}, "test")
    assert pipeline.plan(recipe, longer, ["train"], "student")  # resumed to more steps


def test_a_candidate_run_of_more_steps_is_refused_by_the_dry_run_too(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    """A ``lambda_candidates`` run that has trained more steps than asked (its student not
    saved yet: stopped before the choice): training refuses it, and the dry run had read the
    student's own checkpoints alone, finding none, and planned the training."""
    import shutil

    from causal_fixtures import taught_causal_recipe, train_causal
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.distill import pipeline
    from lmalgebra.distill.layout import RunLayout
    from lmalgebra.distill.recipe import load_recipe

    training: dict[str, object] = {"steps": 2, "batch_size": 4, "warmup_steps": 1}
    training |= {"validation_fraction": 0.2, "validation_every": 1}
    training |= {"lambda_candidates": [0.2, 0.8], "lambda_schedule": "constant"}
    path = taught_causal_recipe(tmp_path, causal_teacher_dirs, training)
    train_causal(path, "student")
    recipe = load_recipe(path)
    shutil.rmtree(RunLayout(recipe.output_dir).model("student"))
    fewer = pipeline.training_of(recipe, {"steps": 1}, "test")
    refusal = r"lambda-0\.2 holds a run trained 2 steps: training.steps 1 would replace it"
    with pytest.raises(UserInputError, match=refusal):
        pipeline.plan(recipe, fewer, ["train"], "student")
    with pytest.raises(UserInputError, match=refusal):
        pipeline.train_student(recipe, "student", fewer, False)
