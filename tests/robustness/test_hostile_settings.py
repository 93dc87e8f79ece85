"""A setting is applied, or refused: one that the rest of the configuration would make the run
ignore is refused in one line naming both, before any work, instead of a run that records a
value it never used."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest

import lmalgebra
from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, refused_before_embedding
from lmalgebra.core.errors import UserInputError
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe
from tiny import documents

DECOMPOSE = {
    "alpha_beside_alpha_select": (
        ["--alpha", "0.5", "--study.alpha_select", "gcv"],
        ["--alpha 0.5", "ignored", "alpha_select gcv"],
    ),
    "folds_without_kfold": (
        ["--study.folds", "3", "--study.alpha_select", "validation"],
        ["--study.folds 3", "ignored", "kfold"],
    ),
    "level_without_bootstrap": (
        ["--study.level", "0.9"],
        ["--study.level 0.9", "ignored", "--study.bootstrap"],
    ),
    "blocks_without_bootstrap_or_kfold": (
        ["--study.blocks", "8", "--study.alpha_select", "gcv"],
        ["--study.blocks 8", "ignored", "--study.bootstrap", "kfold"],
    ),
    "alpha_grid_with_a_fixed_alpha": (
        ["--study.alpha_grid", "0.1,1"],
        ["--study.alpha_grid [0.1, 1.0]", "ignored", "alpha_select"],
    ),
    "null_seed_without_nulls": (
        ["--study.null_seed", "7"],
        ["--study.null_seed 7", "ignored", "--study.nulls"],
    ),
    "attribution_split_without_attribution": (
        ["--study.attribution_split", "test"],
        ["--study.attribution_split 'test'", "ignored", "--study.attribution"],
    ),
    "seed_without_bootstrap_or_attribution": (
        ["--study.seed", "4"],
        ["--study.seed 4", "ignored", "--study.bootstrap", "--study.attribution"],
    ),
    # Shapley values of up to 9 models are exact: the seed had been recorded and never drawn
    "seed_of_exact_shapley_values": (
        ["--study.attribution", "--study.seed", "4"],
        ["--study.seed 4", "ignored", "more than 9 models (sampled; those of 2 are exact)"],
    ),
    # a reduced or sketched run takes float32 products of its principal coordinates: the
    # setting had been recorded in config.yaml and ignored
    "float64_products_of_a_reduced_run": (
        ["--products", "float64", "--scale.method", "reduced"],
        ["--products 'float64' would be ignored", "--scale.method exact"],
    ),
    # a model mapped from itself: the table had been written empty (its own pairs skipped)
    "layer_map_of_one_model_with_itself": (
        ["--study.layer_map", "a,a"],
        ["layer_map names 'a' twice", "name two models"],
    ),
    "probes_of_the_exact_method": (
        ["--scale.probes", "8"],
        ["--scale.probes 8", "ignored", "--scale.method reduced or sketch"],
    ),
    # spreading a model over the GPUs where the models run on the CPU: it did nothing there
    "device_map_on_the_cpu": (
        ["--device_map", "auto", "--device", "cpu"],
        ["--device_map auto", "--device cpu runs", "--device cuda or auto"],
    ),
    "device_map_on_the_default_cpu": (
        ["--device_map", "auto"],
        ["--device_map auto", "--device cpu (the default)"],
    ),
    # the first position's state is taken whatever its token: the switch had changed nothing
    "exclude_special_beside_first_token_pooling": (
        ["--pooling", "first", "--exclude_special"],
        ["--exclude_special True would be ignored", "--pooling mean or last"],
    ),
    # a sweep of the run's own span length alone: its one row had repeated the main fits
    "a_length_sweep_of_the_run_s_own_length": (
        ["--study.lengths", "8"],
        ["--study.lengths [8] would be ignored", "--spans.length 8"],
    ),
    # no ridge penalty to scale: recorded, and a run of the other mode refused as another
    "alpha_mode_without_a_penalty": (
        ["--alpha", "0", "--alpha_mode", "absolute"],
        ["--alpha_mode 'absolute' would be ignored", "--alpha above 0"],
    ),
}


@pytest.mark.parametrize("case", list(DECOMPOSE))
def test_decompose_settings_that_would_be_ignored(
    case: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    flags, needles = DECOMPOSE[case]
    models = {"a": bert_dir, "b": bert2_dir}
    refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)


@pytest.mark.parametrize("flags", [["--weights_dtype", "bfloat16"], ["--dtype", "bfloat16"]])
def test_settings_of_torch_are_refused_where_every_model_is_an_onnx_graph(
    flags: list[str],
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """onnxruntime runs a graph on the CPU in its own precision: a decomposition of ONNX graphs
    alone had recorded ``--weights_dtype`` (and ``--device_map``) without a word, ``--dtype``
    and ``--device`` with a warning per model. Beside a model torch runs they apply to it."""
    from onnx_export import export_onnx

    pairs = (("a", bert_dir), ("b", bert2_dir))
    models = {n: f"onnx:{export_onnx(d, tmp_path / n / 'model.onnx')}#{d}" for n, d in pairs}
    needles = [f"{flags[0]} 'bfloat16' would be ignored", "every model here is an ONNX graph"]
    refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)
    mixed = {"a": models["a"], "b": str(bert2_dir)}
    plan = lmalgebra.decompose_plan(mixed, documents(40), timed=False, weights_dtype="bfloat16")
    assert len(plan)


def test_a_per_language_study_of_one_language_is_refused(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``--study.languages`` over a corpus of one language (``en=PATH``) had written its one row,
    the main fits again, as a study of languages."""
    models = {"a": bert_dir, "b": bert2_dir}
    labelled = Path(f"en={corpus_txt}")  # the corpus entry LANG=PATH
    needles = [
        '--study.languages (study={"languages": True}) would be ignored',
        "one language (en)",
    ]
    flags = ["--study.languages"]
    refused_before_embedding(cli, models, labelled, flags, needles, tmp_path, monkeypatch)


def test_the_default_alpha_beside_alpha_select_is_no_conflict(
    bert_dir: Path, bert2_dir: Path
) -> None:
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    plan = lmalgebra.decompose_plan(models, documents(40), study={"alpha_select": "gcv"})
    assert len(plan) > 0


@pytest.mark.parametrize("command", ["train", "train --dry-run"])
def test_a_constant_kd_weight_under_an_annealed_schedule_is_refused(
    command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    training = {**TINY_TRAINING, "lambda_value": 0.3}  # lambda_schedule: linear, the default
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    words = command.split()
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], "--no-progress"])
    assert_one_line(code, stderr, ["training.lambda_value 0.3", "ignored", "linear"])
    assert not (tmp_path / "run").exists()
    constant = write_recipe(
        tmp_path, teacher_dirs, training={**training, "lambda_schedule": "constant"}
    )
    assert lmalgebra.merge_plan(constant).train_s.gt(0).all()  # applied: accepted


@pytest.mark.parametrize("command", ["train", "train --dry-run"])
def test_distillation_settings_of_a_run_that_distils_nothing_are_refused(
    command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``gold_only: true`` beside a temperature of its own: the temperature was recorded, never
    used. Named with the setting that makes it so."""
    training = {**TINY_TRAINING, "gold_only": True, "temperature": 2.0}
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    words = command.split()
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], "--no-progress"])
    assert_one_line(code, stderr, ["training.temperature 2.0", "ignored", "training.gold_only"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", ["train", "train --dry-run"])
def test_sampling_settings_the_recipe_gives_nothing_to_choose_from_are_refused(
    command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``multi_teacher: best`` where every language keeps one teacher, and a language
    ``sampling_exponent`` in a recipe of one language, were recorded and never used."""
    words = command.split()
    best = {**TINY_TRAINING, "multi_teacher": "best", "teachers": ["wp"]}
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=best)
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], "--no-progress"])
    assert_one_line(code, stderr, ["training.multi_teacher 'best'", "ignored", "several teachers"])
    one = {"xx": {"corpus": {"paths": [str(tmp_path / "xx.txt")]}, "teachers": ["wp"]}}
    sampled = {**TINY_TRAINING, "sampling_exponent": 0.3}
    recipe = write_recipe(
        tmp_path, {"wp": teacher_dirs["wp"]}, student=TINY_STUDENT, training=sampled, languages=one
    )
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], "--no-progress"])
    assert_one_line(code, stderr, ["training.sampling_exponent 0.3", "ignored", "languages"])
    assert not (tmp_path / "run").exists()
    applied = {**sampled, "multi_teacher": "best"}  # two languages, yy of two teachers
    both = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=applied)
    assert lmalgebra.merge_plan(both).train_s.gt(0).all()  # applied: accepted


CHOICES = {
    "teachers_of_ce_alone": (
        ["--training.objective_mix", "{ce: 1}", "--training.teachers", "{xx: [bl]}"],
        ["--training.teachers {'xx': ['bl']} would be ignored under --training.objective_mix {ce}"],
    ),
    "best_of_gold_only": (
        ["--training.gold_only", "--training.multi_teacher", "best"],
        ["--training.multi_teacher 'best' would be ignored under --training.gold_only:"],
    ),
    "best_at_kd_weight_0": (
        [
            *("--training.lambda_schedule", "constant", "--training.lambda_value", "0"),
            *("--training.multi_teacher", "best"),
        ],
        ["--training.multi_teacher 'best' would be ignored under --training.lambda_value 0"],
    ),
}


@pytest.mark.parametrize("command", ["train", "train --dry-run"])
@pytest.mark.parametrize("case", list(CHOICES))
def test_a_choice_of_teachers_is_refused_where_a_causal_student_distils_nothing(
    command: str, case: str, tmp_path: Path, causal_teacher_dirs: dict[str, Path], cli
) -> None:
    """A causal student reads an example's text, the same in every teacher's copy: under CE
    alone, gold labels alone or a KD weight of 0, ``training.teachers`` and ``multi_teacher``
    chose nothing, and had been recorded. A CE-only baseline over a recipe that chooses its
    teachers (for its distilled students) is accepted: the choice is not its own."""
    flags, needles = CHOICES[case]
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs)
    words = command.split()
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], *flags, "--no-progress"])
    assert_one_line(code, stderr, [*needles, "reads an example's text alone"])
    assert not (tmp_path / "run").exists()
    training = {"teachers": {"xx": ["bl"]}}
    chosen = write_causal_recipe(tmp_path, causal_teacher_dirs, training=training)
    assert len(lmalgebra.merge_plan(chosen, training={"objective_mix": {"ce": 1.0}})) > 0


@pytest.mark.parametrize("command", ["prepare", "prepare --dry-run"])
def test_a_sample_seed_without_samples_is_refused(
    command: str, tmp_path: Path, causal_teacher_dirs: dict[str, Path], cli
) -> None:
    """``causal.samples: 0`` draws nothing: a ``sample_seed`` beside it was recorded, never
    used. Refused naming both; with samples drawn it is accepted."""
    causal = {"example_bytes": 300, "samples": 0, "sample_seed": 7}
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, causal=causal)
    words = command.split()
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], "--no-progress"])
    assert_one_line(code, stderr, ["causal.sample_seed 7", "ignored", "causal.samples"])
    assert not (tmp_path / "run").exists()
    drawn = write_causal_recipe(tmp_path, causal_teacher_dirs, causal={**causal, "samples": 2})
    assert len(lmalgebra.merge_plan(drawn, stages="prepare")) > 0  # applied: accepted


def test_ce_alone_or_gold_only_refuses_what_only_distillation_reads() -> None:
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import CausalTrainingSpec

    with pytest.raises(UserInputError, match=r"^lambda_schedule .constant. .*ignored.*\{ce\}"):
        CausalTrainingSpec(objective_mix={"ce": 1.0}, lambda_schedule="constant", lambda_value=0.3)
    with pytest.raises(UserInputError, match=r"objective_mix would be ignored.*gold_only"):
        CausalTrainingSpec(objective_mix={"alm": 1.0}, gold_only=True)


VALIDATED = {"validation_every": 2, "validation_fraction": 0.2}
# settings a constant KD weight of 0 or 1 makes training ignore: (settings, the message's words)
UNWEIGHTED = {
    "candidates_beside_value": (
        {"lambda_value": 0.3, "lambda_candidates": [0.1, 0.9], **VALIDATED},
        r"^lambda_value 0\.3 would be ignored: lambda_candidates",
    ),
    "temperature_at_zero": (
        {"lambda_value": 0.0, "temperature": 2.0},
        r"^temperature 2\.0 would be ignored: lambda_value 0 ",
    ),
    "balance_at_zero": (
        {"lambda_value": 0.0, "kd_balance": "gradient"},
        r"^kd_balance 'gradient' would be ignored: lambda_value 0 ",
    ),
    "mix_at_zero": (
        {"lambda_value": 0.0, "objective_mix": {"prefix_kl": 1.0}},
        r"^objective_mix \{'prefix_kl': 1\.0\} would be ignored",
    ),
    "temperature_at_zero_candidates": (
        {"lambda_candidates": [0.0], "temperature": 2.0, **VALIDATED},
        r"^temperature 2\.0 would be ignored: lambda_candidates \[0\.0\]",
    ),
    "smoothing_at_one": (
        {"lambda_value": 1.0, "label_smoothing": 0.1},
        r"^label_smoothing 0\.1 would be ignored: lambda_value 1 ",
    ),
    "smoothing_at_one_candidates": (
        {"lambda_candidates": [1.0], "label_smoothing": 0.1, **VALIDATED},
        r"^label_smoothing 0\.1 would be ignored: lambda_candidates \[1\.0\]",
    ),
}


@pytest.mark.parametrize("case", list(UNWEIGHTED))
def test_a_setting_a_constant_kd_weight_makes_idle_is_refused(case: str) -> None:
    """A constant KD weight of 0 weighs the distillation term by nothing (its temperature,
    balance and losses do nothing), one of 1 the CE term (its label smoothing does nothing), and
    ``lambda_candidates`` give the weight of each run (a ``lambda_value`` beside them was
    ignored, yet recorded): each is refused naming both keys, where training had run without
    them."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import CausalTrainingSpec

    settings, wanted = UNWEIGHTED[case]
    with pytest.raises(UserInputError, match=wanted):
        CausalTrainingSpec(lambda_schedule="constant", **settings)
    CausalTrainingSpec(lambda_schedule="constant", lambda_value=0.0)  # CE alone: accepted
    CausalTrainingSpec(lambda_schedule="constant", lambda_candidates=[0.0, 1.0], **VALIDATED)


def test_a_patience_fewer_validations_cannot_reach_is_refused() -> None:
    """``validation_every`` 100 over 4 steps validates once (at the last step): a ``patience`` of
    3 can never stop the run, yet it trained and recorded it; refused naming the three keys.
    Enough validations to stop after: accepted."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import CausalTrainingSpec

    given = {"steps": 4, "warmup_steps": 1, "validation_fraction": 0.2}
    with pytest.raises(UserInputError, match=r"^patience 3 would be ignored: .*every 100"):
        CausalTrainingSpec(**given, validation_every=100, patience=3)
    with pytest.raises(UserInputError, match=r"validates 4 time\(s\)"):
        CausalTrainingSpec(**given, validation_every=1, patience=4)
    CausalTrainingSpec(**given, validation_every=1, patience=3)
    # steps 0 saves the model as it starts, keeping the training section (a baseline's)
    CausalTrainingSpec(steps=0, validation_fraction=0.2, validation_every=1, patience=1)


def test_a_loss_of_weight_zero_in_the_mix_is_refused() -> None:
    """``objective_mix: {alm: 1, uld: 0}`` trained on ALM alone (the ULD term was never
    computed) and recorded the mix as given: refused naming the loss."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import CausalTrainingSpec

    with pytest.raises(UserInputError, match=r"objective_mix: uld weight 0 would be ignored"):
        CausalTrainingSpec(objective_mix={"alm": 1.0, "uld": 0.0})
    with pytest.raises(UserInputError, match="give at least one positive weight"):
        CausalTrainingSpec(objective_mix={"alm": 0.0})


def test_a_masked_students_temperature_at_kd_weight_zero_is_refused() -> None:
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import TrainingSpec

    with pytest.raises(UserInputError, match=r"^temperature 2\.0 would be ignored"):
        TrainingSpec(lambda_schedule="constant", lambda_value=0.0, temperature=2.0)
    TrainingSpec(lambda_schedule="linear", temperature=2.0)  # annealed from 1: applied


def test_a_baseline_beside_a_recipes_distilled_students_drops_their_kd_settings(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``--training.gold_only`` over a recipe that distils at temperature 2 trains the baseline,
    recording the settings it ran with, not the distilled students' temperature."""
    from lmalgebra.distill.pipeline import training_of
    from lmalgebra.distill.recipe import load_recipe

    training = {**TINY_TRAINING, "temperature": 2.0, "lambda_schedule": "constant"}
    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs, training=training))
    spec = training_of(recipe, {"gold_only": True}, "--training")
    assert spec.gold_only and spec.temperature == 1.0 and spec.lambda_schedule == "linear"
    assert training_of(recipe, {}, "--training").temperature == 2.0


@pytest.mark.parametrize(
    ("kind", "flags", "said"),
    [
        ("head-only", [], "pretrain masked or causal"),
        ("masked", ["--tokenizer.vocab_size", "100", "--model.dropout", "0"], "model.dropout"),
        ("causal", ["--tokenizer.vocab_size", "300", "--model.dropout", "0"], "model.dropout"),
    ],
)
def test_dropout_masks_of_a_model_without_dropout_are_refused(
    kind: str, flags: list[str], said: str, tmp_path: Path, corpus_txt: Path, bert_dir: Path, cli
) -> None:
    """Head-only pretraining fits a head without dropout on cached encoder states, and a model of
    dropout 0 draws no mask: ``--training.dropout_masks torch`` was accepted and did nothing."""
    out = tmp_path / "out"
    args = ["pretrain", kind, "--corpus.paths", str(corpus_txt), "--language", "xx"]
    args += [*flags, *(["--encoder", str(bert_dir)] if kind == "head-only" else [])]
    args += ["--training.steps", "1", "--out", str(out), "--no-progress"]
    code, stderr = cli([*args, "--training.dropout_masks", "torch"])
    assert_one_line(code, stderr, ["training.dropout_masks 'torch'", "ignored", said])
    assert not out.exists()


@pytest.mark.parametrize(
    ("kind", "flags"),
    [
        ("head-only", []),
        ("masked", ["--tokenizer.vocab_size", "100"]),
        ("causal", ["--tokenizer.vocab_size", "300"]),
    ],
)
def test_training_settings_of_an_untrained_teacher_are_refused(
    kind: str, flags: list[str], tmp_path: Path, corpus_txt: Path, bert_dir: Path, cli
) -> None:
    """``pretrain --training.steps 0`` saves the model as it starts: a learning rate or batch
    size given beside it was accepted, recorded and never used; the seed (of the initialisation)
    still applies."""
    out = tmp_path / "out"
    args = ["pretrain", kind, "--corpus.paths", str(corpus_txt), "--language", "xx"]
    args += [*flags, *(["--encoder", str(bert_dir)] if kind == "head-only" else [])]
    args += ["--training.steps", "0", "--out", str(out), "--no-progress"]
    for setting, value in (("lr", "0.5"), ("batch_size", "4")):
        code, stderr = cli([*args, f"--training.{setting}", value])
        assert_one_line(code, stderr, [f"training.{setting} {value}", "ignored", "steps 0"])
        assert not out.exists()
    code, stderr = cli([*args, "--training.seed", "3"])
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("kind", "flags", "setting"),
    [
        ("head-only", ["--max_examples", "5"], "max_examples 5"),
        ("head-only", ["--example_length", "16"], "example_length 16"),
        ("head-only", ["--heldout_fraction", "0.2"], "heldout_fraction 0.2"),
        (
            "causal",
            ["--tokenizer.vocab_size", "300", "--example_length", "16"],
            "example_length 16",
        ),
    ],
)
def test_example_settings_of_an_untrained_teacher_are_refused(
    kind: str, flags: list[str], setting: str, tmp_path: Path, corpus_txt: Path, bert_dir: Path, cli
) -> None:
    """With ``--training.steps 0`` no example is trained on: a head fitted on the first
    ``max_examples`` (whose encoder states had been computed all the same), cut to
    ``example_length``, held out by ``heldout_fraction``, or a causal teacher's training
    windows, shaped nothing and were recorded."""
    out = tmp_path / "out"
    args = ["pretrain", kind, "--corpus.paths", str(corpus_txt), "--language", "xx", *flags]
    args += [*(["--encoder", str(bert_dir)] if kind == "head-only" else [])]
    code, stderr = cli([*args, "--training.steps", "0", "--out", str(out), "--no-progress"])
    assert_one_line(code, stderr, [f"{setting} would be ignored", "training.steps above 0"])
    assert not out.exists()


@pytest.mark.parametrize("command", ["train", "train --dry-run"])
def test_dropout_masks_of_a_student_without_dropout_are_refused(
    command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    student = {**TINY_STUDENT, "dropout": 0.0}
    training = {**TINY_TRAINING, "dropout_masks": "torch"}
    recipe = write_recipe(tmp_path, teacher_dirs, student=student, training=training)
    words = command.split()
    code, stderr = cli(["merge", words[0], str(recipe), *words[1:], "--no-progress"])
    assert_one_line(code, stderr, ["training.dropout_masks 'torch'", "ignored", "student.dropout"])
    assert not (tmp_path / "run").exists()
    kept = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    assert lmalgebra.merge_plan(kept).train_s.gt(0).all()  # a student with dropout: accepted


def test_a_warmup_given_longer_than_the_run_is_refused(
    tmp_path: Path, corpus_txt: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``--training.warmup_steps 50`` with ``steps 2``: the peak learning rate the user set was
    never reached, without a word. Refused naming both, pre-training and recipes alike."""
    out = tmp_path / "out"
    args = ["pretrain", "masked", "--corpus.paths", str(corpus_txt), "--language", "xx"]
    args += ["--tokenizer.vocab_size", "100", "--training.steps", "2", "--out", str(out)]
    code, stderr = cli([*args, "--training.warmup_steps", "50", "--no-progress"])
    assert_one_line(code, stderr, ["training.warmup_steps 50", "training.steps 2"])
    assert not out.exists()
    training = {**TINY_TRAINING, "warmup_steps": 7}  # steps 6
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    for flags in (["--dry-run"], []):
        code, stderr = cli(["merge", "train", str(recipe), *flags, "--no-progress"])
        assert_one_line(code, stderr, ["training.warmup_steps 7", "training.steps 6"])
    assert not (tmp_path / "run").exists()


def test_the_default_warmup_longer_than_the_run_is_kept_and_warned_of(
    tmp_path: Path, teacher_dirs: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    """A recipe that leaves ``warmup_steps`` at its default (100) trains six steps as runs
    recorded with it did (its numbers unchanged), and says the peak is not reached."""
    training = {k: v for k, v in TINY_TRAINING.items() if k != "warmup_steps"}
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    caplog.set_level(logging.WARNING)
    lmalgebra.merge(recipe, ["prepare", "teach", "vocab", "train"])
    assert "training.warmup_steps 100 exceeds training.steps 6" in caplog.text
    assert "0.06 of training.lr" in caplog.text


def test_a_probe_setting_with_finetune_is_refused(bert_dir: Path, tmp_path: Path, cli) -> None:
    """``--probe_batch_words`` sets the probe's optimisation steps; ``--mode finetune`` fits no
    probe, and had accepted it, recording a setting that did nothing."""
    args = ["evaluate-pos", str(tmp_path / "bank"), "--models", f"a={bert_dir}"]
    args += ["--mode", "finetune", "--probe_batch_words", "100", "--out", str(tmp_path / "out")]
    code, stderr = cli(args)
    assert_one_line(code, stderr, ["--probe_batch_words 100 would be ignored", "--mode probe"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--epochs", "2", "--patience", "5"], ["--patience 5 would be ignored", "has 2"]),
        (["--mode", "finetune", "--patience", "4"], ["--patience 4 would be ignored", "has 3"]),
    ],
)
def test_a_patience_the_epochs_never_reach_is_refused(
    flags: list[str], needles: list[str], bert_dir: Path, tmp_path: Path, cli
) -> None:
    """A run stops early once ``--patience`` epochs in a row have not improved on the best, the
    first epoch's at least: a run of no more epochs than that never stops early, and had
    recorded the setting all the same."""
    args = ["evaluate-pos", str(tmp_path / "bank"), "--models", f"a={bert_dir}", *flags]
    code, stderr = cli([*args, "--out", str(tmp_path / "out")])
    assert_one_line(code, stderr, [*needles, "--epochs"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("fields", "needles"),
    [
        ({"path": "bert", "seed": 5}, ["seed 5 would be ignored", "random_init"]),
        (
            {"path": "x.npy", "kind": "precomputed", "trust_remote_code": True},
            ["trust_remote_code would be ignored", "precomputed embeddings runs no code"],
        ),
        (
            {"path": "x.onnx", "kind": "onnx", "trust_remote_code": True},
            ["trust_remote_code would be ignored", "an ONNX graph runs no code"],
        ),
        (
            {"path": "package:minilm", "revision": "main"},
            ["revision 'main' would be ignored", "hub id only", "package:minilm"],
        ),
        (
            {"path": "gguf:m.gguf", "revision": "v1"},
            ["revision 'v1' would be ignored", "hub id only", "gguf:m.gguf"],
        ),
        # a recipe's GGUF teacher: transformers builds the architecture, and reads no code
        (
            {"path": "gguf:m.gguf", "trust_remote_code": True},
            ["trust_remote_code would be ignored", "gguf:m.gguf runs no code"],
        ),
    ],
)
def test_a_model_reference_field_its_model_would_ignore_is_refused(
    fields: dict[str, object], needles: list[str]
) -> None:
    """A seed without ``random_init`` (the weights are read, nothing is drawn), code trust for
    a model that runs none, a hub revision of a packaged model or a GGUF file: each had been
    accepted and recorded in the run's configuration, and did nothing."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.sources.models import ModelRef

    with pytest.raises(UserInputError) as err:
        ModelRef(name="a", **fields)
    assert all(n in str(err.value) for n in needles), str(err.value)
    assert str(err.value).startswith("model 'a': ")


def test_a_revision_of_a_local_directory_is_refused(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``a=DIR@v9``: a directory has one version; the revision was recorded in config.yaml and
    the directory read as it is."""
    models = {"a": Path(f"{bert_dir}@v9"), "b": bert2_dir}
    needles = ["model 'a': revision 'v9' would be ignored", "is a local directory"]
    refused_before_embedding(cli, models, corpus_txt, [], needles, tmp_path, monkeypatch)


def test_trust_remote_code_that_no_model_takes_is_refused(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, cli
) -> None:
    """``--trust-remote-code`` applies to the ``--models`` of the command line: beside a
    recipe's models alone it had been dropped without a word (the recipe's models ran without
    it), and so had ``trust_remote_code=True`` given to ``decompose()`` with arrays."""
    import numpy as np

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        f"models:\n- name: a\n  path: {bert_dir}\n- name: b\n  path: {bert2_dir}\n"
        f"corpus:\n  paths: [{corpus_txt}]\n"
    )
    out = tmp_path / "out"
    code, stderr = cli(["decompose", str(recipe), "--trust-remote-code", "--out", str(out)])
    assert_one_line(code, stderr, ["--trust-remote-code would be ignored", "--models"])
    assert not out.exists()
    from lmalgebra.core.errors import UserInputError

    arrays = {"a": np.eye(4, 3), "b": np.eye(4, 2)}
    with pytest.raises(UserInputError, match="trust_remote_code would be ignored: it applies"):
        lmalgebra.decompose_plan(arrays, ["x y z"] * 4, trust_remote_code=True)
    # GGUF files alone: the flag had been set on them, and ran nothing
    gguf = ["--models", "a=gguf:a.gguf", "--models", "b=gguf:b.gguf", "--trust-remote-code"]
    code, stderr = cli(["decompose", *gguf, "--corpus.paths", str(corpus_txt), "--out", str(out)])
    assert_one_line(code, stderr, ["--trust-remote-code would be ignored", "GGUF"])


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("text_column", "body"),
        ("split", "test"),
        ("language_column", "lang"),
        ("doc_sep", "line"),
    ],
)
def test_a_corpus_field_no_file_of_the_corpus_reads_is_refused(
    flag: str, value: str, tmp_path: Path
) -> None:
    """A ``text_column`` beside text files alone (it names a field of records), a ``split``
    beside no saved dataset, a ``language_column`` beside no records file, a ``doc_sep``
    beside no text file: each was accepted, recorded and never read."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.sources.corpus import CorpusSpec, corpus_paths, read_documents

    text = tmp_path / "a.txt"
    text.write_text("one document\n\nanother one\n", encoding="utf-8")
    records = tmp_path / "b.jsonl"
    records.write_text('{"text": "a record", "body": "x", "lang": "en"}\n', encoding="utf-8")
    paths = [str(records)] if flag == "doc_sep" else [str(text)]
    with pytest.raises(UserInputError) as err:
        corpus_paths(CorpusSpec(paths=paths, **{flag: value}))
    assert f"corpus.{flag} {value!r} would be ignored" in str(err.value)
    assert paths[0] in str(err.value)
    # read where a file of the corpus reads it
    if flag in ("text_column", "language_column"):
        assert read_documents(CorpusSpec(paths=[str(text), str(records)], **{flag: value}))
    if flag == "doc_sep":
        assert read_documents(CorpusSpec(paths=[str(text)], doc_sep="line"))


PLUGIN_POINTS = """[lmalgebra.causal_losses]
notaloss = fakeplug.mod:NUMBER
broken = fakeplug.broken:LOSS
misnamed = fakeplug.mod:MISNAMED

[lmalgebra.embedding_inits]
initmissing = fakeplug.nowhere:seed
notcallable = fakeplug.mod:NUMBER
"""


@pytest.fixture
def fake_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An installed package ``fakeplug`` whose entry points in both of lmalgebra's groups name a
    number, a module that raises on import, a loss under another name, and a missing module."""
    from lmalgebra.core import plugins

    root = tmp_path / "site"
    (root / "fakeplug-0.1.dist-info").mkdir(parents=True)
    (root / "fakeplug-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n", encoding="utf-8"
    )
    (root / "fakeplug-0.1.dist-info" / "entry_points.txt").write_text(
        PLUGIN_POINTS, encoding="utf-8"
    )
    (root / "fakeplug").mkdir()
    (root / "fakeplug" / "__init__.py").write_text("", encoding="utf-8")
    (root / "fakeplug" / "mod.py").write_text(
        "from lmalgebra.train.cross_tokenizer import LOSSES\nNUMBER = 42\n"
        "MISNAMED = LOSSES['alm']\n",
        encoding="utf-8",
    )
    (root / "fakeplug" / "broken.py").write_text("raise RuntimeError('boom')\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(root))
    plugins.declared.cache_clear()
    yield root
    plugins.declared.cache_clear()


@pytest.mark.parametrize(
    ("name", "wanted"),
    [
        ("notaloss", r"entry point 'notaloss' \(fakeplug\.mod:NUMBER\) is of type int, not a loss"),
        ("broken", r"entry point 'broken' .* its module raised RuntimeError: boom"),
        ("misnamed", r"entry point 'misnamed' names the loss 'alm'"),
    ],
)
def test_a_loss_entry_point_that_is_no_loss_is_one_line(
    name: str, wanted: str, fake_plugins: Path
) -> None:
    """An installed package's entry point that names no loss, or whose module raises on import,
    had stopped ``merge train`` (and its dry run) with a ``TypeError`` or the module's own
    traceback: one line naming the entry point now."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import CausalTrainingSpec

    with pytest.raises(UserInputError, match=wanted):
        CausalTrainingSpec(objective_mix={name: 1.0})


def test_a_broken_entry_point_a_recipe_does_not_name_leaves_its_refusal_alone(
    fake_plugins: Path,
) -> None:
    """An installed package's broken loss entry point stopped a recipe that never named it: the
    refusal of ``temperature`` beside untempered losses lists the tempered ones, and listing
    them loaded every entry point, so the user read the other package's fault instead."""
    from lmalgebra.core.errors import UserInputError
    from lmalgebra.train.config import CausalTrainingSpec

    wanted = r"^temperature 2 would be ignored: none of sampled is tempered \(tempered: "
    with pytest.raises(UserInputError, match=wanted) as caught:
        CausalTrainingSpec(
            objective_mix={"sampled": 1.0}, temperature=2.0, lambda_schedule="constant"
        )
    assert "notaloss" not in str(caught.value) and "alm" in str(caught.value)


def test_an_embedding_init_entry_point_the_run_refuses_is_refused_by_the_dry_run_too(
    fake_plugins: Path, tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``student.init_embeddings`` naming an entry point that does not load passed the dry run
    (training refused it after the store was built); one naming no function stopped training
    with ``TypeError: 'int' object is not callable``. Both are one line, in the plan too."""
    from lmalgebra.core.errors import UserInputError

    for name, wanted in (
        ("initmissing", r"entry point 'initmissing' \(fakeplug\.nowhere:seed\) does not load"),
        ("notcallable", r"entry point 'notcallable' .* is of type int, not a function"),
    ):
        student = {**TINY_STUDENT, "init_embeddings": name}
        recipe = write_recipe(tmp_path, teacher_dirs, student=student)
        with pytest.raises(UserInputError, match=wanted):
            lmalgebra.merge_plan(recipe)
        assert not (tmp_path / "run").exists()


def test_an_experimental_loss_warns_once_when_a_run_accepts_it(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    """The command line imports ``lmalgebra.experimental`` silently, so a recipe naming ``uld``
    had trained without the warning its documentation promises; and loading the loss to check
    its name warned even when the recipe was then refused (``{uld: 1, alm: 0}``). The warning
    now waits for a plan or a run that accepts the recipe, and is given once, naming ``uld``
    (not the other experimental loss, which the settings' checks load too)."""
    import subprocess
    import sys

    recipes = {}
    for name, mix in (("refused", {"uld": 1, "alm": 0}), ("accepted", {"uld": 1})):
        (tmp_path / name).mkdir()
        training = {"objective_mix": mix}
        recipes[name] = write_causal_recipe(tmp_path / name, causal_teacher_dirs, training=training)
    refused, accepted = recipes["refused"], recipes["accepted"]
    code = (
        "import sys, lmalgebra, lmalgebra.cli.experimental\n"
        "try:\n"
        f"    lmalgebra.merge_plan({str(refused)!r})\n"
        "except lmalgebra.UserInputError as err:\n"
        "    print('refused:', err, file=sys.stderr, flush=True)\n"
        "print('---', file=sys.stderr, flush=True)\n"
        f"lmalgebra.merge_plan({str(accepted)!r}); lmalgebra.merge_plan({str(accepted)!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", code], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    before, after = done.stderr.split("---")
    assert "recipe.yaml: training.objective_mix: alm weight 0" in before, done.stderr
    assert "ExperimentalWarning" not in before, done.stderr
    assert after.count("ExperimentalWarning: training.objective_mix: uld is") == 1, after
    assert "mined_kl" not in done.stderr


def test_the_command_line_gives_a_python_warning_in_one_line(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    """An experimental loss's warning under the command line read as two lines of Python's: our
    source file and line, then ``return command(**values, ...)``, which a user cannot act on.
    It is one line of the command's log, as its other warnings are."""
    import subprocess
    import sys

    training = {"objective_mix": {"uld": 1}}
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, training=training)
    done = subprocess.run(
        [sys.executable, "-m", "lmalgebra", "merge", "run", str(recipe), "--dry-run"],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "LMALGEBRA_CACHE": str(tmp_path / "cache")},
    )
    assert done.returncode == 0, done.stderr
    lines = [ln for ln in done.stderr.splitlines() if "ExperimentalWarning" in ln]
    assert lines == [
        "WARNING py.warnings: ExperimentalWarning: training.objective_mix: uld is experimental: "
        "its recorded evidence misses its target (lmalgebra.experimental.FEATURES says which "
        "and why)"
    ], done.stderr
    assert "return command(" not in done.stderr and ".py:" not in done.stderr


def test_random_copies_of_models_without_trained_weights_are_refused(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``--study.nulls`` over ``random:`` models (or ONNX graphs, vectors) had run to the end
    with no random copy fitted: ``nulls.csv`` held the shuffled null alone, exit 0."""
    models = {"a": f"random:{bert_dir}", "b": f"random:{bert2_dir}"}
    needles = ['--study.nulls (study={"nulls": True}) would add nothing', "random:"]
    for dry in ([], ["--dry-run"]):
        flags = ["--study.nulls", *dry]
        refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)
    # one model of trained weights has a copy, and no other copy to be fitted on: its copy had
    # been embedded, and nothing fitted on it
    models = {"a": str(bert_dir), "b": f"random:{bert2_dir}"}
    needles = ['--study.nulls (study={"nulls": True}) would add nothing', "only 'a' is one"]
    for dry in ([], ["--dry-run"]):
        flags = ["--study.nulls", *dry]
        refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)


@pytest.mark.parametrize("dry", [False, True], ids=["run", "plan"])
def test_a_layer_study_of_embeddings_given_as_they_are_is_refused_before_embedding(
    dry: bool, bert_dir: Path, tmp_path: Path
) -> None:
    """A layer map of a model given as its span embeddings, or a layer sweep where every model
    is one, had been planned by the dry run and refused by the run after its whole main
    measurement (every model embedded)."""
    texts = documents(40)
    spans = {"length": 8, "counts": (20, 5, 5)}
    rows = len(lmalgebra.spans({"m": str(bert_dir)}, texts, spans=spans))
    vectors = np.random.default_rng(0).normal(size=(rows, 4))
    options = {"spans": spans, "cache_dir": tmp_path / "cache", "progress": False}
    call = lmalgebra.decompose_plan if dry else lmalgebra.decompose
    reference = {"reference_tokenizer": str(bert_dir)}
    cases = (
        ({"a": str(bert_dir), "b": vectors}, {"study": {"layer_map": ["a", "b"]}}, "map b"),
        ({"a": vectors, "b": vectors}, {"study": {"layers": True}, **reference}, r"layers.*sweeps"),
    )
    for models, settings, wanted in cases:
        with pytest.raises(UserInputError, match=wanted) as err:
            call(models, texts, **settings, **options)
        assert "\n" not in str(err.value) and "array of embeddings" in str(err.value)
    assert not (tmp_path / "cache" / "embeddings").exists()


def test_merge_train_takes_a_causal_students_own_settings_from_flags(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], teacher_dirs: dict[str, Path], cli
) -> None:
    """``merge train`` had flags for the settings both objectives share only: a causal
    student's own (``label_smoothing``, ``objective_mix``, ``validation_*``, ``patience``,
    ``lambda_candidates``, ``kd_balance``) could be set in a recipe alone, though the docs say
    every training setting has its flag. They are flags now; a masked recipe refuses them,
    naming the key."""
    import json

    from causal_fixtures import taught_causal_recipe

    training = {"steps": 1, "batch_size": 4, "warmup_steps": 0}
    (tmp_path / "causal").mkdir()
    (tmp_path / "masked").mkdir()
    recipe = taught_causal_recipe(tmp_path / "causal", causal_teacher_dirs, training)
    smoothing = ["--training.label_smoothing", "0.1", "--training.objective_mix", "{ce: 1}"]
    args = ["merge", "train", str(recipe), "--name", "smoothed", *smoothing, "--no-progress"]
    code, stderr = cli(args)
    assert code == 0, stderr
    model = recipe.parent / "run" / "smoothed" / "model"
    saved = json.loads((model / "lmalgebra.json").read_text())
    assert saved["training"]["label_smoothing"] == 0.1
    assert saved["training"]["objective_mix"] == {"ce": 1.0}
    masked = write_recipe(tmp_path / "masked", teacher_dirs, student=TINY_STUDENT)
    code, stderr = cli(["merge", "train", str(masked), "--training.label_smoothing", "0.1"])
    assert_one_line(code, stderr, ["label_smoothing"])


@pytest.mark.parametrize("command", ["decompose", "experimental select"])
def test_bootstrap_replicates_beyond_any_use_are_refused(
    command: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``--study.bootstrap 10**18``: planned by the dry run, the run ended in numpy's "array is
    too big" traceback drawing the replicates (the selection's ``--bootstrap`` likewise)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    many = str(10**18)
    if command == "decompose":
        args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
        args += ["--corpus.paths", str(corpus_txt), "--spans.counts", "20,5,5"]
        args += ["--out", str(tmp_path / "out"), "--study.bootstrap", many, "--no-progress"]
    else:
        recipe = write_recipe(tmp_path, teacher_dirs)
        args = ["experimental", "select", str(recipe), "--bootstrap", many, "--no-progress"]
    code, stderr = cli(args)
    assert_one_line(code, stderr, ["bootstrap", many, "less than or equal to 100000"])


def test_one_model_under_two_names_is_refused(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """``m/a`` and ``./m/a`` (or a link to it) as two models had been embedded twice and each
    fitted on the other, its copy (R^2 1). Refused before any work, by the dry run and from
    Python; a random-weights copy of it, and arrays of the same shape, are other models."""
    monkeypatch.chdir(bert_dir.parent)
    link = tmp_path / "link"
    link.symlink_to(bert_dir)
    corpus = ["--corpus.paths", str(corpus_txt), "--dry-run"]
    for other in (f"./{bert_dir.name}", f"{bert_dir.name}/", str(link)):
        args = ["decompose", "--models", f"p={bert_dir.name}", "--models", f"q={other}"]
        code, stderr = cli([*args, *corpus])
        assert_one_line(code, stderr, ["models 'p' and 'q' are the same model", other])
    with pytest.raises(UserInputError, match="models 'p' and 'q' are the same model"):
        lmalgebra.decompose_plan({"p": str(bert_dir), "q": f"{bert_dir}/."}, documents(40))
    spans = {"length": 8, "counts": (20, 5, 5)}
    copy = {"p": str(bert_dir), "q": f"random:{bert_dir}"}
    assert len(lmalgebra.decompose_plan(copy, documents(40), timed=False, spans=spans))
    arrays = {"p": np.eye(30, 4), "q": np.eye(30, 4, 1)}
    assert len(lmalgebra.decompose_plan(arrays, documents(40), timed=False, spans=spans))


def test_training_sizes_beyond_the_training_spans_are_said_to_be_cut(
    bert_dir: Path, bert2_dir: Path, tmp_path: Path
) -> None:
    """``train_sizes`` above the training spans the text gives had been cut to the whole split
    without a word (the curve's point there is the main fit again); the run says so among its
    warnings, naming the sizes and the spans, once."""
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    spans = {"length": 8, "counts": (20, 5, 5)}
    result = lmalgebra.decompose(
        models,
        documents(40),
        spans=spans,
        study={"train_sizes": [5, 100, 200]},
        cache_dir=tmp_path,
        progress=False,
    )
    said = [w for w in result.summary["warnings"] if "train_sizes" in w]
    assert len(said) == 1, result.summary["warnings"]
    assert "100, 200: more than the 20 training spans the text gave, so cut to 20" in said[0]
    assert 'study={"train_sizes": [...]}' in said[0]


def test_an_untrained_causal_teacher_of_few_positions_is_not_refused_its_example_length(
    tmp_path: Path, cli
) -> None:
    """``pretrain causal --training.steps 0`` of a model of fewer than 128 positions had been
    refused whatever was given: the default ``example_length`` (128) as beyond the positions,
    and one given as ignored by a run that trains nothing. The windows are checked against the
    positions only where training cuts them; a run that trains still refuses them."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(documents(20)) + "\n", encoding="utf-8")
    args = ["pretrain", "causal", "--corpus.paths", str(corpus), "--language", "xx"]
    args += ["--model.hidden_size", "32", "--model.max_position_embeddings", "64"]
    args += ["--tokenizer.vocab_size", "300", "--no-progress", "--out", str(tmp_path / "t")]
    code, stderr = cli([*args, "--training.steps", "1"])
    assert_one_line(code, stderr, ["example_length 128 exceeds the model's 64 positions"])
    code, stderr = cli([*args, "--training.steps", "0"])
    assert code == 0, stderr
    assert (tmp_path / "t" / "lmalgebra.json").is_file()
