"""The dry run refuses what the run would refuse: a corpus the run cannot read, or a split
given no documents, is named by ``decompose --dry-run`` in one line, before anything is planned
or written."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hostile_helpers import LATIN1, assert_one_line, refused_before_embedding


def _corpus(kind: str, path: Path) -> str:
    """A corpus the run refuses at ``path``; the words of its refusal."""
    if kind == "latin-1":
        path.write_bytes(LATIN1)
        return "byte 0xe9 at offset 3"
    if kind == "fifo":
        os.mkfifo(path)  # read by the run, it would wait for a writer; refused unread
        return "is not a regular file"
    path.write_text("\n\n", encoding="utf-8")
    return "holds no text"


@pytest.mark.parametrize("kind", ["latin-1", "fifo", "empty"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_corpus_the_run_refuses_is_refused_by_the_dry_run_too(
    kind: str,
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    words = _corpus(kind, corpus)
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus), "--out", str(out)]
    code, stderr = cli([*args, *(["--dry-run"] if dry_run else [])])
    assert_one_line(code, stderr, [f"corpus {corpus}", words])
    assert not out.exists() and not (tmp_path / "cache").exists()


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--spans.length", "100000"], "no training span of 100000 tokens"),
        (["--scale.memory_gib", "0.01"], "GiB are available"),
    ],
    ids=["spans longer than the documents", "a plan over the memory"],
)
@pytest.mark.parametrize("dry_run", [False, True])
def test_what_the_run_refuses_of_its_spans_or_memory_the_dry_run_refuses(
    flags: list[str],
    words: str,
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """Spans longer than any document holds, or a method that does not fit the memory given:
    the run refused them, the dry run planned them and exited 0 (its table, which marks the
    plan "fits: no", is printed before the same line)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--spans.counts", "20,5,5", "--out", str(out)]
    code, stderr = cli([*args, *flags, "--no-progress", *(["--dry-run"] if dry_run else [])])
    assert_one_line(code, stderr, [words])
    assert not (out / "summary.json").exists()


@pytest.mark.parametrize("cache", ["file", "blank"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_cache_directory_the_run_refuses_is_refused_by_the_dry_run_too(
    cache: str,
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``$LMALGEBRA_CACHE`` naming a file, or blanks alone: the run refused it, its dry run
    printed a plan and exit 0."""
    place = tmp_path / "cache"
    place.write_text("a file\n", encoding="utf-8")
    monkeypatch.setenv("LMALGEBRA_CACHE", str(place) if cache == "file" else "  ")
    args = ["decompose", f"--models=a={bert_dir}", f"--models=b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--out", str(tmp_path / "out")]
    code, stderr = cli(args + (["--dry-run"] if dry_run else []))
    assert_one_line(code, stderr, ["$LMALGEBRA_CACHE", "a file" if cache == "file" else "empty"])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_split_given_no_documents_is_refused_before_any_work(
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A test fraction of 0 had been planned by the dry run; the run refused it once it had
    read the text and cut the spans ("no test span")."""
    flags = ["--spans.fractions", "0.9,0.1,0", *(["--dry-run"] if dry_run else [])]
    needles = ["--spans.fractions: [0.9, 0.1, 0.0]", "test split no documents"]
    models = {"a": bert_dir, "b": bert2_dir}
    refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)


@pytest.mark.parametrize("init", ["missing", "masked"])
def test_a_student_init_the_stage_refuses_is_refused_by_the_dry_run_in_its_words(
    init: str,
    tmp_path: Path,
    bert_dir: Path,
    causal_teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """The dry run read the init's tokenizer before checking the model: a missing directory was
    "model 'nothere'", a masked encoder a tokenizer without a start token; now both are named
    as ``merge train`` names them, ``student.init`` and what it is."""
    from causal_fixtures import write_causal_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    given = tmp_path / "nothere" if init == "missing" else bert_dir
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, student={"init": str(given)})
    words = "does not exist" if init == "missing" else "not a causal LM"
    code, stderr = cli(["merge", "run", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, [f"student.init {str(given)!r}", words])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("target", ["file", "other files", "other files, overwrite"])
def test_decompose_plan_refuses_the_directory_decompose_refuses(
    target: str, tmp_path: Path, bert_dir: Path, bert2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decompose_plan(..., out=DIR)`` planned a run into a file or a directory of another
    kind, which ``decompose`` with the same arguments refuses (and took no ``overwrite``)."""
    import lmalgebra
    from lmalgebra import UserInputError
    from tiny import documents

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    if target == "file":
        out.write_text("mine\n", encoding="utf-8")
    else:
        out.mkdir()
        (out / "notes.txt").write_text("mine\n", encoding="utf-8")
    options = {"out": out, "spans": {"length": 8, "counts": (20, 5, 5)}}
    options |= {"overwrite": True} if target.endswith("overwrite") else {}
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    said = {}
    for call in (lmalgebra.decompose, lmalgebra.decompose_plan):
        with pytest.raises(UserInputError) as caught:
            call(models, documents(40), **options)
        said[call] = str(caught.value)
    assert said[lmalgebra.decompose] == said[lmalgebra.decompose_plan]
    assert str(out) in said[lmalgebra.decompose]


@pytest.mark.parametrize("given", ["list", "path", "latin-1 path"])
def test_decompose_plan_refuses_the_text_the_dry_run_refuses(
    given: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``decompose --dry-run`` refused spans longer than the documents can hold, and a corpus
    the run cannot read; ``decompose_plan`` with the same documents (a list, or the corpus
    path) had planned both, the corpus path unread. Both refuse them in the same line."""
    import lmalgebra
    from lmalgebra import UserInputError
    from tiny import documents

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    corpus = corpus_txt
    if given == "latin-1 path":
        corpus = tmp_path / "corpus.txt"
        corpus.write_bytes(LATIN1)
    texts = documents(120) if given == "list" else corpus
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    with pytest.raises(UserInputError) as caught:
        lmalgebra.decompose_plan(models, texts, timed=False, spans={"length": 100000})
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus), "--spans.length", "100000", "--dry-run"]
    code, stderr = cli(args)
    assert_one_line(code, stderr, [str(caught.value)])
    words = "byte 0xe9" if given == "latin-1 path" else "no training span of 100000 tokens"
    assert words in str(caught.value)


def test_span_embeddings_the_run_refuses_are_refused_by_the_plan_too(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path, monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """An array whose rows are all the same embedding, or one of more rows than the run can
    have spans (``spans.counts``, or what the documents hold), had been planned; the run
    refused the first once every other model had embedded, the second once the spans were
    drawn. A file of more rows is refused by the dry run the same way."""
    import numpy as np

    import lmalgebra
    from lmalgebra import UserInputError
    from tiny import documents

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    options = {"spans": {"length": 8, "counts": (20, 5, 5)}}
    constant = np.full((30, 4), 3.0)
    for call in (lmalgebra.decompose_plan, lmalgebra.decompose):
        with pytest.raises(UserInputError, match="model 'v' does not vary over the training"):
            call({"a": str(bert_dir), "v": constant}, documents(40), **options)
    rows = np.random.default_rng(0).normal(size=(31, 4))
    wanted = "model 'v': 31 rows of embeddings, but the run has 30 spans at most"
    with pytest.raises(UserInputError, match=wanted):
        lmalgebra.decompose_plan({"a": str(bert_dir), "v": rows}, documents(40), **options)
    # fewer rows than the counts ask for: the text may give fewer spans, left to the run
    plan = lmalgebra.decompose_plan({"a": str(bert_dir), "v": rows[:20]}, timed=False, **options)
    assert len(plan)
    np.save(tmp_path / "v.npy", rows.astype(np.float32))
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"v=precomputed:{tmp_path}/v.npy"]
    args += ["--corpus.paths", str(corpus_txt), "--spans.length", "8", "--spans.counts", "20,5,5"]
    code, stderr = cli([*args, "--dry-run"])
    assert_one_line(code, stderr, [wanted])


@pytest.mark.parametrize("part", ["", "spans"])
def test_decompose_plan_without_out_refuses_the_cache_decompose_refuses(
    part: str, tmp_path: Path, bert_dir: Path, bert2_dir: Path
) -> None:
    """``decompose_plan`` without ``out`` planned a run whose cache (its root, or ``spans/``
    below it) is a file, which ``decompose`` with the same arguments, writing no run directory
    but its cache all the same, refuses; ``decompose --dry-run`` refused it too."""
    import lmalgebra
    from lmalgebra import UserInputError
    from tiny import documents

    cache = tmp_path / "cache"
    if part:
        cache.mkdir()
    (cache / part if part else cache).write_text("mine\n", encoding="utf-8")
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    options = {"cache_dir": cache, "spans": {"length": 8, "counts": (20, 5, 5)}}
    with pytest.raises(UserInputError, match=f"cache directory {re.escape(str(cache))}"):
        lmalgebra.decompose_plan(models, documents(40), timed=False, **options)
    with pytest.raises(UserInputError, match=re.escape(str(cache / part))):
        lmalgebra.decompose(models, documents(40), **options)


@pytest.mark.parametrize("where", ["directory", "hub id"])
def test_a_reference_tokenizer_the_run_cannot_read_is_refused_by_the_dry_run_too(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch,
    cli,
    where: str,
) -> None:
    """A ``reference_tokenizer`` naming no model and no directory had been planned (exit 0),
    and so had a hub id the offline hub cannot give."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(out), "-T", "8"]
    reference = str(tmp_path / "nowhere") if where == "directory" else "nowhere-org/nowhere"
    args += ["--reference_tokenizer", reference]
    said = [
        assert_one_line(*cli([*args, *dry]), ["nowhere", "a, b"]) for dry in ([], ["--dry-run"])
    ]
    assert said[0] == said[1]
    assert not out.exists()


@pytest.mark.parametrize("family", ["bert", "gpt2"])
def test_a_layer_the_models_lack_is_refused_by_the_dry_run_too(
    family: str,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    monkeypatch,
    cli,
) -> None:
    """``--layer 99`` of two-layer models had been planned (exit 0); the run refused it once
    the first model was loaded. A GPT-2 model, whose configuration names its depth
    ``n_layer`` (and a recipe's ``layer: 1:30``, YAML's 90), had been planned still."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    first = gpt2_dir if family == "gpt2" else bert_dir
    args = ["decompose", "--models", f"a={first}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(out), "-T", "8", "--layer", "99"]
    said = [
        assert_one_line(*cli([*args, *dry]), ["model 'a'", "layer 99"])
        for dry in ([], ["--dry-run"])
    ]
    assert said[0] == said[1]
    assert not out.exists()


def test_a_basis_naming_a_model_twice_is_refused_by_the_dry_run_too(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, monkeypatch, cli
) -> None:
    """``--target a --basis b,b`` had been planned (exit 0); the run refused it from the solver,
    once every model had embedded the text."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(out), "-T", "8"]
    args += ["--target", "a", "--basis", "b,b"]
    said = [
        assert_one_line(*cli([*args, *dry]), ["the basis names a model twice: ['b', 'b']"])
        for dry in ([], ["--dry-run"])
    ]
    assert said[0] == said[1]
    assert not out.exists() and not (tmp_path / "cache").exists()


def test_a_reference_tokenizer_naming_a_model_without_one_is_refused_by_the_plan_too(
    tmp_path: Path, bert_dir: Path, corpus_txt: Path
) -> None:
    """``reference_tokenizer`` naming a model given as its span embeddings (an array, or a
    ``precomputed:`` file) had been planned; the run refused it once the corpus was read."""
    import numpy as np

    import lmalgebra
    from lmalgebra.core.errors import UserInputError

    models = {"a": str(bert_dir), "x": np.eye(5, 3, dtype=np.float32)}
    texts = corpus_txt.read_text(encoding="utf-8").splitlines()
    for call in (lmalgebra.decompose_plan, lmalgebra.decompose):
        with pytest.raises(UserInputError, match="reference_tokenizer 'x' has no tokenizer"):
            call(models, texts, reference_tokenizer="x", cache_dir=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


@pytest.fixture(scope="module")
def bert_graph(tmp_path_factory: pytest.TempPathFactory, bert_dir: Path) -> Path:
    """The tiny BERT as an ONNX graph, alone in its folder (no tokenizer beside it)."""
    from onnx_export import export_onnx

    return export_onnx(bert_dir, tmp_path_factory.mktemp("graph") / "bert.onnx")


@pytest.mark.parametrize("case", ["onnx-without", "onnx-missing", "onnx-file", "no-files"])
@pytest.mark.parametrize("dry_run", [False, True])
def test_a_tokenizer_the_run_refuses_is_refused_by_the_dry_run_too(
    case: str,
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert_graph: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """The dry run had planned an ONNX model without a tokenizer, or with one that does not
    exist or is a file; and a model directory without tokenizer files, from which transformers
    makes a tokenizer of special tokens alone, ran: every span read as [UNK]."""
    import shutil

    if case == "no-files":
        model = tmp_path / "bare"
        model.mkdir()
        for name in ("config.json", "model.safetensors"):
            shutil.copy(bert_dir / name, model / name)
        ref, needles = str(model), [f"{model} holds none of the tokenizer files"]
    else:
        absent = tmp_path / "nonexistent"  # below tmp_path: nothing else can make it
        given = {
            "onnx-without": "",
            "onnx-missing": f"#{absent}",
            "onnx-file": "#" + str(corpus_txt),
        }
        ref = f"onnx:{bert_graph}{given[case]}"
        needles = {
            "onnx-without": ["an ONNX model needs a tokenizer"],
            "onnx-missing": [f"tokenizer directory {absent} does not exist"],
            "onnx-file": [f"tokenizer {corpus_txt} is a file"],
        }[case]
    needles = ["model 'c'", *needles]
    if dry_run:
        models = {"a": bert_dir, "c": ref}
        refused_before_embedding(
            cli, models, corpus_txt, ["--dry-run"], needles, tmp_path, monkeypatch
        )
        return
    # the run refuses it where it first reads it: the spans of an ONNX model, the embedding of
    # a transformers model (model 'a' embedded before it stays cached, for the next run)
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"c={ref}"]
    args += ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "20,5,5"]
    assert_one_line(*cli([*args, "--out", str(tmp_path / "out")]), needles)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_layer_an_onnx_graph_lacks_is_refused_by_the_dry_run_too(
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert_graph: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A graph that exposes its last hidden state alone: ``--layer 1`` had been planned by the
    dry run and refused by the run once the graph loaded; both read the graph's outputs now."""
    models = {"a": bert_dir, "c": f"onnx:{bert_graph}#{bert_dir}"}
    flags = ["--layer", "1", *(["--dry-run"] if dry_run else [])]
    needles = ["model 'c'", "exposes only its last hidden state", "layer 1"]
    refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("objective", "student", "words"),
    [
        ("masked", {"vocab_size": 100}, ["student vocab_size 100 is smaller than the union"]),
        (
            "masked",
            {"max_position_embeddings": 16},
            ["student max_position_embeddings 16 is shorter than example_length"],
        ),
        ("causal", {"max_position_embeddings": 16}, ["student tokens, more than", "16 positions"]),
    ],
)
def test_a_student_too_small_for_its_data_is_refused_by_the_dry_run_too(
    objective: str,
    student: dict[str, int],
    words: list[str],
    tmp_path: Path,
    teacher_dirs: dict[str, Path],
    causal_teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A student whose vocabulary cannot hold the union vocabulary, or whose positions cannot
    hold an example (the masked ``example_length``, a causal example's student tokens, which the
    plan counts): the dry run planned it, exit 0, and ``merge train`` refused it in these words
    after the store was built."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
    from merge_fixtures import TINY_STUDENT, write_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    if objective == "masked":
        recipe = write_recipe(tmp_path, teacher_dirs, student={**TINY_STUDENT, **student})
    else:
        given = {**CAUSAL_STUDENT, **student}
        recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, student=given)
    code, stderr = cli(["merge", "run", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, words)
    assert not (tmp_path / "run").exists()


def test_a_validation_share_that_leaves_no_training_is_refused_by_the_dry_run_too(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch, cli
) -> None:
    """A ``training.validation_fraction`` that keeps every training example of a language out
    to validate on: the dry run planned it, exit 0, and ``merge train`` refused it once the
    store was built; now the dry run refuses it in training's words, from the examples it
    makes."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    training = {"validation_fraction": 0.99, "validation_every": 2}
    recipe = write_causal_recipe(
        tmp_path, causal_teacher_dirs, student=CAUSAL_STUDENT, training=training
    )
    code, stderr = cli(["merge", "run", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["training.validation_fraction 0.99", "no training example"])
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("stands", ["fifo", "directory"])
def test_a_recipe_copy_the_stage_cannot_write_is_refused_by_plan_and_teach_first(
    stands: str,
    tmp_path: Path,
    causal_teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """The run's ``recipe.yaml`` a FIFO or a directory: ``merge teach``, which writes it last,
    had taught every teacher and then refused it, and the dry runs of ``prepare``, ``teach``
    and ``run`` had planned; all refuse it first now, naming it."""
    import os

    from causal_fixtures import write_causal_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs)
    code, stderr = cli(["merge", "prepare", str(recipe)])
    assert code == 0, stderr
    copy = tmp_path / "run" / "recipe.yaml"
    copy.unlink()
    os.mkfifo(copy) if stands == "fifo" else copy.mkdir()
    said = "is not a regular file" if stands == "fifo" else "is a directory, not a file"
    for command in (["prepare", "--dry-run"], ["teach", "--dry-run"], ["run", "--dry-run"]):
        code, stderr = cli(["merge", command[0], str(recipe), *command[1:]])
        assert_one_line(code, stderr, [str(copy), said])
    code, stderr = cli(["merge", "teach", str(recipe)])
    assert_one_line(code, stderr, [str(copy), said])
    assert not (tmp_path / "run" / "logprobs").exists()


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_precision_the_machine_lacks_is_refused_by_the_dry_run_too(
    dry_run: bool,
    tmp_path: Path,
    teacher_dirs: dict[str, Path],
    cpu_without_bf16: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A teacher ``dtype`` or a ``training.mixed_precision`` this machine has no bfloat16 for:
    ``merge run`` and ``merge train`` refused them, and their dry runs planned them, exit 0."""
    from merge_fixtures import TINY_STUDENT, TINY_TRAINING, write_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    flag = ["--dry-run"] if dry_run else []
    recipe = write_recipe(tmp_path, teacher_dirs, dtype="bfloat16", student=TINY_STUDENT)
    code, stderr = cli(["merge", "run", str(recipe), *flag])
    assert_one_line(code, stderr, ["merge recipe dtype: bfloat16 is not native"])
    assert not (tmp_path / "run").exists()
    import torch

    if torch.cuda.is_available():  # Accelerate trains on a GPU when there is one
        return
    training = {**TINY_TRAINING, "mixed_precision": "bf16"}
    recipe = write_recipe(tmp_path, teacher_dirs, student=TINY_STUDENT, training=training)
    assert cli(["merge", "run", str(recipe)])[0] == 0
    code, stderr = cli(["merge", "train", str(recipe), "--no-progress", *flag])
    assert_one_line(code, stderr, ["training.mixed_precision: bfloat16 is not native"])
    assert not (tmp_path / "run" / "student").exists()


@pytest.mark.parametrize(
    ("part", "command"),
    [("vocab", "vocab"), ("topk/yy", "teach"), ("masked", "prepare")],
)
def test_a_file_where_a_stage_writes_a_directory_is_named_by_the_stage_and_its_dry_run(
    part: str, command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A file where the run's ``vocab/`` goes: ``merge vocab`` ended in a ``NotADirectoryError``
    traceback, ``merge train`` called the vocabulary missing, and every dry run planned it (a
    store's folder too: the stage named it, its dry run planned it)."""
    import shutil

    from hostile_helpers import built_store

    recipe = str(built_store(tmp_path, teacher_dirs))
    place = tmp_path / "run" / part
    shutil.rmtree(place)
    place.write_text("a file\n", encoding="utf-8")
    for flags in (["--dry-run"], []):
        code, stderr = cli(["merge", command, recipe, *flags])
        assert_one_line(code, stderr, [str(place), "is a file, not a directory"])
    if part == "vocab":
        code, stderr = cli(["merge", "train", recipe, "--no-progress"])
        assert_one_line(code, stderr, [str(place), "is a file, not a directory", "merge vocab"])
    assert place.read_text(encoding="utf-8") == "a file\n"


def test_a_finished_run_on_other_documents_or_arrays_is_refused_by_the_dry_run_too(
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """The run refuses a finished run of its configuration on a corpus edited since; the dry
    run, which reads the corpus to check it, had planned it. ``decompose_plan`` the same of an
    array given other values; with no texts given it compares none."""
    import numpy as np

    import lmalgebra
    from tiny import documents

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(corpus_txt.read_text(encoding="utf-8"), encoding="utf-8")
    out = tmp_path / "out"
    args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus), "-T", "8", "--spans.counts", "20,5,5"]
    args += ["--no-progress", "--out", str(out)]
    code, stderr = cli(args)
    assert code == 0, stderr
    assert cli([*args, "--dry-run"])[0] == 0  # the same inputs: planned
    with corpus.open("a", encoding="utf-8") as handle:
        handle.write("\n\nA document written since.\n")
    assert_one_line(*cli([*args, "--dry-run"]), [str(out), "corpus (its documents) differs"])
    texts = documents(60)
    spans = {"length": 8, "counts": (40, 10, 10)}
    rows = len(lmalgebra.spans({"a": str(bert_dir)}, texts, spans=spans))
    array = np.random.default_rng(0).normal(size=(rows, 4))
    saved = tmp_path / "saved"
    options = {"spans": spans, "out": saved, "progress": False}
    lmalgebra.decompose({"a": str(bert_dir), "v": array}, texts, **options)
    lmalgebra.decompose_plan({"a": str(bert_dir), "v": array}, texts, timed=False, **options)
    with pytest.raises(lmalgebra.UserInputError, match="model 'v' differs since"):
        lmalgebra.decompose_plan(
            {"a": str(bert_dir), "v": 2 * array}, texts, timed=False, **options
        )
    lmalgebra.decompose_plan({"a": str(bert_dir), "v": 2 * array}, timed=False, **options)


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="needs a machine without a CUDA device"
)
def test_a_device_this_machine_lacks_is_refused_by_the_plan_as_by_the_run(
    tmp_path: Path, bert_dir: Path, bert2_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``decompose_plan(..., device="cuda")`` (``decompose --dry-run --device cuda``) planned
    the run on a machine with no GPU, which ``decompose`` refuses."""
    import lmalgebra
    from lmalgebra import UserInputError
    from tiny import documents

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    models = {"a": str(bert_dir), "b": str(bert2_dir)}
    said = {}
    for call in (lmalgebra.decompose, lmalgebra.decompose_plan):
        with pytest.raises(UserInputError) as caught:
            call(models, documents(40), device="cuda", spans={"length": 8, "counts": (20, 5, 5)})
        said[call] = str(caught.value)
    assert said[lmalgebra.decompose] == said[lmalgebra.decompose_plan]
    assert said[lmalgebra.decompose].startswith("decompose device: cuda asked for")


def test_merge_plan_of_evaluate_alone_refuses_what_evaluate_refuses(
    tmp_path: Path, teacher_dirs: dict[str, Path]
) -> None:
    """``merge_plan(recipe, stages=["evaluate"])`` of a run never trained planned it (its
    evaluate stage was left out of the plan), where ``merge(recipe, ["evaluate"])`` refuses the
    student that has no model: the plan refuses it in the same line, and writes nothing."""
    import lmalgebra
    from lmalgebra import UserInputError
    from merge_fixtures import write_recipe

    recipe = write_recipe(tmp_path, teacher_dirs)
    said = []
    for call in (lmalgebra.merge_plan, lmalgebra.merge):
        with pytest.raises(UserInputError, match="student 'student' has no model") as caught:
            call(recipe, stages=["evaluate"])
        said.append(str(caught.value))
    assert said[0] == said[1]
    assert not (tmp_path / "run").exists()


def test_a_causal_student_without_a_tokenizer_is_refused_by_the_train_dry_run_too(
    tmp_path: Path, causal_teacher_dirs: dict[str, Path], cli
) -> None:
    """Neither ``student.tokenizer`` nor ``student.init``: training refuses it, and its dry run
    had planned it (``-`` for its estimates) and exited 0."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe

    student = {k: v for k, v in CAUSAL_STUDENT.items() if k != "tokenizer"}
    recipe = write_causal_recipe(tmp_path, causal_teacher_dirs, student=student)
    code, stderr = cli(["merge", "train", str(recipe), "--dry-run"])
    assert_one_line(code, stderr, ["student needs a tokenizer", "student.init"])
    code, stderr = cli(["merge", "run", str(recipe), "--dry-run"])  # no training: planned
    assert code == 0, stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("flag", "value", "said"),
    [
        ("--study.train_sizes", "1,2", "training-set sizes must be >= 2"),
        ("--study.lengths", "0,8", "span length T must be >= 1"),
        ("--study.alpha_grid", "0,1", "values must be finite and > 0"),
    ],
)
@pytest.mark.parametrize("dry_run", [True, False], ids=["dry_run", "run"])
def test_a_study_setting_out_of_range_is_named_by_its_key(
    flag: str,
    value: str,
    said: str,
    dry_run: bool,
    tmp_path: Path,
    bert_dir: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A list of the study's whose items are out of range: the line had named what was wrong
    ("training-set sizes must be >= 2, got [1, 2]") and not the flag to change (then the key,
    ``key 'study.lengths'``, of no file the command read)."""
    flags = [flag, value, *(["--dry-run"] if dry_run else [])]
    needles = [f"command line: {flag}: ", said]
    models = {"a": bert_dir, "b": bert2_dir}
    refused_before_embedding(cli, models, corpus_txt, flags, needles, tmp_path, monkeypatch)


@pytest.mark.parametrize(
    ("file", "command"),
    [
        ("examples/xx/manifest.json", "prepare"),
        ("masked/yy/sp/shard-00000.arrow", "prepare"),
        ("topk/yy/sp/manifest.json", "teach"),
        ("vocab/vocab_union.json", "vocab"),
        ("vocab/complete.json", "run"),
    ],
)
def test_a_fifo_in_place_of_a_file_a_stage_writes_again_is_refused_by_its_dry_run_too(
    file: str, command: str, tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A FIFO in place of a shard set's manifest or shard, or of a vocabulary's file: no stage
    reads it, so the stage writes it again and refuses it there in one line; its dry run had
    planned the run."""
    from hostile_helpers import built_store

    recipe = str(built_store(tmp_path, teacher_dirs))
    place = tmp_path / "run" / file
    place.unlink()
    os.mkfifo(place)
    quiet = [] if command == "vocab" else ["--no-progress"]  # vocab shows no progress
    for flags in (["--dry-run"], []):
        code, stderr = cli(["merge", command, recipe, *quiet, *flags])
        assert_one_line(code, stderr, [str(place), "is not a regular file"])


def test_a_fifo_among_a_students_model_files_is_refused_before_training(
    tmp_path: Path, teacher_dirs: dict[str, Path], cli
) -> None:
    """A FIFO in place of a saved student's ``config.json``: ``merge train --restart`` trained
    every step, then refused it as it saved the model; its dry run had planned the run. Both
    refuse it first."""
    from hostile_helpers import built_store

    recipe = str(built_store(tmp_path, teacher_dirs))
    assert cli(["merge", "train", recipe, "--no-progress"])[0] == 0
    student = tmp_path / "run" / "student"
    (student / "model" / "config.json").unlink()
    os.mkfifo(student / "model" / "config.json")
    checkpoints = {p.name: p.stat().st_mtime_ns for p in (student / "checkpoints").iterdir()}
    for flags in (["--dry-run"], []):
        code, stderr = cli(["merge", "train", recipe, "--restart", "--no-progress", *flags])
        assert_one_line(code, stderr, [str(student / "model" / "config.json"), "FIFO"])
    assert {p.name: p.stat().st_mtime_ns for p in (student / "checkpoints").iterdir()} == (
        checkpoints
    )
