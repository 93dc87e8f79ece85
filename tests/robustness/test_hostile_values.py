"""Values that used to pass validation and break later (deep in a model, as a misleading message,
after the embedding work) are refused where they are read, naming the value, before any work."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from causal_fixtures import write_causal_recipe
from hostile_helpers import assert_one_line, built_store, refused_before_embedding
from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe
from tiny import documents

DECOMPOSE = {
    # a span length of the sweep that no document reaches had been refused after the main
    # measurement (every model embedded), the sweep's shorter lengths embedded too
    # more k-fold folds than training spans: refused after the main measurement too
    "folds_beyond_the_training_spans": (
        ["--study.alpha_select", "kfold", "--study.blocks", "30", "--study.folds", "30"],
        ["--study.folds 30 (study={'folds': 30})", "the training split has"],
    ),
    "sweep_length_beyond_the_documents": (
        ["--study.lengths", "4,100000"],
        ["--study.lengths 100000 (study={'lengths': [4, 100000]})", "no training span of 100000"],
    ),
    # learning-curve sizes that are all the whole training split: capped, the curve's one point
    # was the main fit again (exit 0)
    "train_sizes_beyond_the_training_spans": (
        ["--study.train_sizes", "100000,200000"],
        [
            "--study.train_sizes [100000, 200000] (study={'train_sizes': [100000, 200000]})",
            "would be ignored",
        ],
    ),
    # one span has no variance: every held-out R^2 had been NaN (exit 0), and one training span
    # had been blamed on the first model ("does not vary")
    "a_split_of_one_span": (
        ["--spans.counts", "40,1,1"],
        ["--spans.counts: [40, 1, 1]", "every split needs 2 spans at least"],
    ),
    "nan_fraction": (["--spans.fractions", "nan,0.5,0.5"], ["spans.fractions", "finite", "nan"]),
    "inf_alpha": (["--alpha", "inf"], ["--alpha", "finite", "inf"]),
    "nan_alpha": (["--alpha", "nan"], ["--alpha", "finite", "nan"]),
    # a negative seed had ended in numpy's traceback once the spans were embedded
    "negative_seed": (
        ["--study.bootstrap", "10", "--study.seed=-1"],
        ["study.seed", "a seed from 0 to 18446744073709551615", "-1"],
    ),
}


@pytest.mark.parametrize("case", list(DECOMPOSE))
def test_decompose_values(
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


RECIPES = {
    "example_length_beyond_teacher": (
        {"example_length": 200},
        ["example_length 200", "128 positions", "teacher 'sp'"],
    ),
    "nan_heldout": ({"heldout_fraction": float("nan")}, ["heldout_fraction", "nan"]),
    "inf_learning_rate": (
        {"training": {**TINY_TRAINING, "lr": float("inf")}},
        ["training.lr", "finite", "inf"],
    ),
    "nan_dropout": ({"student": {**TINY_STUDENT, "dropout": float("nan")}}, ["dropout", "nan"]),
    "nan_masking": ({"masking": {"probability": float("nan")}}, ["masking.probability", "nan"]),
    # YAML's true where an integer or a number is promised: pydantic had read it as 1
    "bool_steps": (
        {"training": {**TINY_TRAINING, "steps": True}},
        ["training.steps", "a boolean is no integer", "True"],
    ),
    "bool_learning_rate": (
        {"training": {**TINY_TRAINING, "lr": True}},
        ["training.lr", "a boolean is no number", "True"],
    ),
    "bool_top_k": ({"top_k": True}, ["top_k", "a boolean is no integer", "True"]),
    # a field of several types (a list, or language -> list): pydantic's path named the member
    # types tried ('training.teachers.list[str]'); the key and what it expects are named
    "bool_teachers": (
        {"training": {**TINY_TRAINING, "teachers": True}},
        ["key 'training.teachers': ", "a valid list or a valid dictionary", "True"],
    ),
    # an integer no 64-bit integer holds had reached torch (an overflow traceback)
    "positions_beyond_64_bits": (
        {"student": {**TINY_STUDENT, "max_position_embeddings": 2**63}},
        ["student.max_position_embeddings", "64-bit integer", str(2**63)],
    ),
    "number_teacher": (
        {"training": {**TINY_TRAINING, "teachers": ["wp", 3]}},
        ["key 'training.teachers.1': ", "a valid string", "3"],
    ),
    "number_teacher_of_a_language": (
        {"training": {**TINY_TRAINING, "teachers": {"yy": [None]}}},
        ["key 'training.teachers.yy.0': ", "a valid string", "None"],
    ),
    # seeds numpy takes no negative one of, torch none beyond 2**64 - 1: tracebacks, the
    # first from the dry run too
    "negative_masking_seed": ({"masking": {"seed": -1}}, ["masking.seed", "a seed from 0 to"]),
    "training_seed_beyond_64_bits": (
        {"training": {**TINY_TRAINING, "seed": 2**64}},
        ["training.seed", "a seed from 0 to", str(2**64)],
    ),
}


@pytest.mark.parametrize("case", list(RECIPES))
@pytest.mark.parametrize("command", ["prepare", "train"])
def test_merge_recipe_values(
    case: str, command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    overrides, needles = RECIPES[case]
    recipe = write_recipe(tmp_path, teacher_dirs, **overrides)
    code, stderr = cli(["merge", command, str(recipe), "--no-progress"])
    assert_one_line(code, stderr, needles)
    assert not (tmp_path / "run").exists()


def test_example_length_at_the_teacher_limit_is_accepted(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """128 positions for BERT; RoBERTa's 130 minus its padding offset of two."""
    from lmalgebra.distill.masked.teachers import open_teachers
    from lmalgebra.distill.recipe import load_recipe

    recipe = load_recipe(write_recipe(tmp_path, teacher_dirs, example_length=128))
    assert set(open_teachers(recipe)) == {"wp", "sp"}
    data = yaml.safe_load((tmp_path / "recipe.yaml").read_text())
    data["example_length"] = 129
    (tmp_path / "recipe.yaml").write_text(yaml.safe_dump(data))
    from lmalgebra.core.errors import UserInputError

    with pytest.raises(UserInputError, match="example_length 129 exceeds the 128 positions"):
        open_teachers(load_recipe(tmp_path / "recipe.yaml"))


PRETRAIN = {
    "two_token_examples": (
        ["--example_length", "2"],
        ["--example_length", "'2'", "greater than or equal to 8"],
    ),
    "nan_heldout": (["--heldout_fraction", "nan"], ["--heldout_fraction", "nan"]),
    "inf_learning_rate": (["--training.lr", "inf"], ["--training.lr", "inf"]),
    # the line had not named the setting that held out every document
    "heldout_fraction_that_keeps_nothing": (
        ["--heldout_fraction", "0.9999"],
        ["heldout_fraction 0.9999 holds out all 20 of its documents", "lower heldout_fraction"],
    ),
    # the tokenizers library's trainer set memory aside for every entry asked: the process had
    # aborted (exit 134, a Rust backtrace), and 2**63 - 1 had ended in a PanicException
    "vocabulary_beyond_the_trainer": (
        ["--tokenizer.vocab_size", "1000000000"],
        ["tokenizer.vocab_size 1000000000", "too large", "at most 4194304"],
    ),
}


@pytest.mark.parametrize("case", list(PRETRAIN))
def test_pretrain_values(case: str, tmp_path: Path, cli) -> None:
    flags, needles = PRETRAIN[case]
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(documents(20)) + "\n", encoding="utf-8")
    out = tmp_path / "teacher"
    args = [
        "pretrain",
        "masked",
        "--corpus.paths",
        str(corpus),
        "--language",
        "xx",
        "--tokenizer.vocab_size",
        "120",
    ]
    code, stderr = cli([*args, "--out", str(out), "--training.steps", "2", *flags])
    assert_one_line(code, stderr, needles)
    assert not out.exists()


def test_a_causal_vocabulary_beyond_the_trainer_is_refused(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], cli
) -> None:
    """Causal pretraining's tokenizer and a causal student's ``train:KIND:SIZE``, by the dry
    run too: the process had aborted in the tokenizers library's trainer."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(documents(20)) + "\n", encoding="utf-8")
    out = tmp_path / "teacher"
    size = ["--tokenizer.vocab_size", str(2**63 - 1)]
    args = ["pretrain", "causal", "--corpus.paths", str(corpus), "--language", "xx", *size]
    code, stderr = cli([*args, "--out", str(out), "--training.steps", "1"])
    assert_one_line(code, stderr, ["tokenizer.vocab_size", "too large", "bytelevel-bpe"])
    assert not out.exists()
    student = {
        "hidden_size": 32,
        "num_layers": 1,
        "num_heads": 2,
        "tokenizer": f"train:bpe:{10**9}",
    }
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, student=student)
    code, stderr = cli(["merge", "train", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["student.tokenizer 'train:bpe:1000000000'", "too large"])


def test_an_integer_beyond_64_bits_on_the_command_line_is_refused(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, monkeypatch, cli
) -> None:
    flags = ["--batch_size", str(2**63)]
    needles = ["batch_size", "64-bit integer", str(2**63)]
    models = {"a": bert_dir, "b": bert2_dir}
    refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("change", "needles"),
    [
        (
            {"training": {**TINY_TRAINING, "batch_size": 10**15}},
            ["not enough memory", "make it smaller"],
        ),
        (
            {"student": {**TINY_STUDENT, "hidden_size": 10**15}},
            ["hidden_size 1000000000000000", "GiB", "make it smaller"],
        ),
        (
            {"student": {**TINY_STUDENT, "num_layers": 10**12}},
            ["num_layers 1000000000000", "GiB", "make it smaller"],
        ),
    ],
    ids=["training batch", "student width", "student depth"],
)
def test_a_setting_beyond_the_machine_s_memory_ends_in_one_line(
    change: dict[str, object],
    needles: list[str],
    tmp_path: Path,
    teacher_dirs: dict[str, Path],
    monkeypatch,
    cli,
) -> None:
    """A training batch or a student far beyond the machine (beyond any address space, so no
    allocation succeeds however the kernel overcommits): the plan and the stage had ended in
    numpy's or torch's allocation traceback, and a student of a trillion layers had been
    planned, then built layer by layer until memory ran out. The student is refused from its
    sizes, before it is built."""
    from hostile_helpers import built_store

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    recipe = built_store(tmp_path, teacher_dirs)
    data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    recipe.write_text(yaml.safe_dump({**data, **change}), encoding="utf-8")
    for dry in (["--dry-run"], []):
        code, stderr = cli(["merge", "train", str(recipe), "--no-progress", *dry])
        assert_one_line(code, stderr, needles)
    assert not (tmp_path / "run" / "student" / "model").exists()


def test_a_masked_language_holding_out_no_example_is_not_scored(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``heldout_fraction: 0``: ``merge evaluate`` of a masked run wrote, exit 0, accuracy 0 and
    perplexity 1.00 for every model, each scored on no example (a causal run refused it)."""
    training = {**TINY_TRAINING, "steps": 1}
    recipe = str(built_store(tmp_path, teacher_dirs, heldout_fraction=0.0, training=training))
    assert cli(["merge", "train", recipe, "--no-progress"])[0] == 0
    run = tmp_path / "run"
    code, stderr = cli(["merge", "evaluate", str(run)])
    assert_one_line(code, stderr, ["language 'xx'", str(run), "no held-out example"])
    assert not (run / "evaluation").exists()


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"alpha_mode": "absolute"},
        {"study": {"alpha_select": "gcv"}},
        {"scale": {"method": "reduced"}},
        {"scale": {"method": "sketch", "components": 1}},
    ],
    ids=["relative", "absolute", "gcv", "reduced", "sketch"],
)
def test_a_model_whose_embeddings_do_not_vary_is_named(
    settings: dict, bert_dir: Path, tmp_path: Path
) -> None:
    """Every span's vector the same had been a traceback (the sketch: ``SVD did not converge``),
    a table of NaN R^2 with exit 0 (an absolute alpha), or a message naming no model (GCV: "no
    alpha of the grid gives a finite gcv criterion"; "use a larger --alpha", which scales
    with the model's variance of 0)."""
    import lmalgebra
    from lmalgebra.core.errors import UserInputError

    texts = documents(40)
    spans = {"length": 8, "counts": (20, 5, 5)}
    rows = len(lmalgebra.spans({"m": str(bert_dir)}, texts, spans=spans))
    constant = np.full((rows, 4), 3.0, np.float32)
    constant[-1] = 4.0  # a test span's: the array varies, its training spans do not
    with pytest.raises(UserInputError, match=r"model 'b' does not vary over the training spans"):
        lmalgebra.decompose(
            {"a": str(bert_dir), "b": constant},
            texts,
            spans=spans,
            cache_dir=tmp_path,
            progress=False,
            **settings,
        )


def test_text_that_gives_a_split_one_span_is_refused(bert_dir: Path) -> None:
    """Text that gives a split a single span (however many it asks for) had left its R^2 NaN in
    every table: refused once the spans are drawn, as a split without any is."""
    from transformers import AutoTokenizer

    from lmalgebra.lmd.settings.spans import SpanSpec, TooLittleTextError, assign_splits, draw_spans

    docs = documents(80)
    spec = SpanSpec(length=8, counts=(40, 10, 10), per_doc=1)
    dropped = set(assign_splits(docs, spec)["test"][1:])  # the test split keeps one document
    kept = [doc for i, doc in enumerate(docs) if i not in dropped]
    with pytest.raises(TooLittleTextError, match="only one test span of 8 tokens"):
        draw_spans(kept, AutoTokenizer.from_pretrained(bert_dir), spec)


@pytest.mark.parametrize("mode", ["probe", "finetune"])
def test_a_pos_tagger_that_diverges_is_not_scored(
    mode: str, tmp_path: Path, bert_dir: Path, bert2_dir: Path, cli
) -> None:
    """A learning rate that takes the tagger's weights past the finite numbers had been scored
    (exit 0): its NaN outputs took tag 0 for every word, and the accuracy of that was written as
    the model's; one whose first AdamW step float32 cannot hold had ended in torch's overflow
    traceback. The first stops the run at that model (nothing written of it), the second is
    refused as read."""
    bank = tmp_path / "bank"
    bank.mkdir()
    words = [("river", "NOUN"), ("runs", "VERB"), ("old", "ADJ"), ("the", "DET")]
    sentence = "".join(
        "\t".join([str(i), form, "_", tag, *"______"]) + "\n"
        for i, (form, tag) in enumerate(words * 3, 1)
    )
    for split in ("train", "dev", "test"):
        (bank / f"x-ud-{split}.conllu").write_text(f"{sentence}\n" * 4, encoding="utf-8")
    out = tmp_path / "pos"
    models = ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args = ["evaluate-pos", str(bank), *models, "--out", str(out), "--mode", mode]
    args += ["--epochs", "4", "--no-progress"]
    code, stderr = cli([*args, "--lr", "1e300"])
    assert_one_line(code, stderr, ["lr must be positive and at most 3.4e+37", "got 1e+300"])
    code, stderr = cli([*args, "--lr", "3e37"])
    assert code == 1, stderr
    line = stderr.strip().splitlines()[-1]
    assert line.startswith("stopped: model 'a': the"), stderr
    assert "diverged at lr 3e+37" in line and "try a lower --lr (lr)" in line, stderr
    assert not out.exists()


def test_a_boolean_or_no_finite_number_as_a_mix_weight_is_refused(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], cli
) -> None:
    """``objective_mix: {alm: true}`` (in a recipe, a flag or a Python mapping) was read as the
    weight 1, as a boolean where one number is promised is not; the flag's ``{alm: .nan}`` and
    ``{alm: 1e400}`` were named as ``command line: key 'objective_mix.alm'``, not the flag."""
    import lmalgebra
    from causal_fixtures import write_causal_recipe
    from lmalgebra.core.errors import UserInputError

    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs)
    (tmp_path / "true.yaml").write_text(
        recipe.read_text().replace("top_k:", "training: {objective_mix: {alm: true}}\ntop_k:")
    )
    code, stderr = cli(["merge", "train", str(tmp_path / "true.yaml"), "--dry-run"])
    assert_one_line(code, stderr, ["key 'training.objective_mix'", "a boolean is no number"])
    for value, said in (
        ("{alm: true}", "a boolean is no number"),
        ("{alm: .nan}", "not a finite number"),
        ("{alm: 1e400}", "not a finite number"),
    ):
        args = ["merge", "train", str(recipe), "--training.objective_mix", value, "--dry-run"]
        assert_one_line(*cli(args), [f"--training.objective_mix {value!r}: {said}"])
    with pytest.raises(UserInputError, match="a boolean is no number"):
        lmalgebra.merge_plan(recipe, training={"objective_mix": {"alm": True}})
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("args", "switch", "word"),
    [
        (["merge", "train", "--dry-run", "yes", "RECIPE"], "--dry-run", "yes"),
        (["merge", "evaluate", "RUN", "--overwrite", "true"], "--overwrite", "true"),
        (["merge", "prepare", "RECIPE", "--no-progress", "False"], "--no-progress", "False"),
        (["pretrain", "causal", "--restart", "1", "SPEC"], "--restart", "1"),
    ],
    ids=["dry-run-yes", "overwrite-true", "no-progress-false", "restart-1"],
)
def test_a_switch_given_a_value_is_refused_naming_the_switch(
    args: list[str], switch: str, word: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """``--dry-run yes RECIPE`` had read ``yes`` as the recipe and refused the recipe as an extra
    argument; ``--overwrite true`` after the run, ``true`` as an extra argument: neither named
    the switch, which takes no value."""
    recipe = write_recipe(tmp_path, teacher_dirs)
    given = [str(recipe) if a in ("RECIPE", "SPEC") else a for a in args]
    given = [str(tmp_path / "run") if a == "RUN" else a for a in given]
    code, err = cli(given)
    assert_one_line(code, err, [f"{switch} is a switch and takes no value", repr(word)])
    assert not (tmp_path / "run").exists()


def test_a_file_named_as_a_yes_or_no_word_after_a_switch_is_an_argument(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recipe the user named ``yes`` after ``--dry-run`` is the recipe, read as it was."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "yes").write_text(write_recipe(tmp_path, teacher_dirs).read_text())
    code, err = cli(["merge", "prepare", "--dry-run", "yes"])
    assert code == 0, err
