"""Precomputed embeddings and the span exporter: formats, order checks, refusals, a mixed run."""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from lmalgebra.cli import main
from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import order_digest, span_sha256
from lmalgebra.core.splits import SPLITS
from lmalgebra.lmd.embeddings.cache import EmbeddingCache
from lmalgebra.lmd.measure import ModelPool, draw_texts
from lmalgebra.lmd.settings.recipe import DecomposeConfig
from lmalgebra.lmd.spans.draw import RunSpans, SpanPlanSpec, draw_run_spans, export_spans
from lmalgebra.sources.corpus import read_documents
from lmalgebra.sources.embed import embed
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.precomputed import SHARD_ROWS, PrecomputedSplit, load_precomputed

SMALL = ["-T", "8", "--spans.counts", "60,12,12"]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
Cli = Callable[[list[str]], tuple[int | str | None, str]]


@pytest.fixture(scope="module")
def plan(bert_dir: Path, corpus_txt: Path) -> RunSpans:
    spec = SpanPlanSpec.model_validate(
        {
            "models": [{"name": "a", "path": str(bert_dir)}],
            "corpus": {"paths": [str(corpus_txt)]},
            "spans": {"length": 8, "counts": [60, 12, 12]},
        }
    )
    return draw_run_spans(spec)


def _rows(plan: RunSpans) -> list[str]:
    return [t for s in SPLITS for t in plan.texts[s]]


@pytest.fixture(scope="module")
def vectors(plan: RunSpans, bert_dir: Path) -> np.ndarray:
    """The tiny BERT's embeddings of the run's spans, rows in export order: (84, 32) float32."""
    ref = ModelRef(name="a", path=str(bert_dir))
    spec = DecomposeConfig.model_validate(
        {
            "models": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}],
            "corpus": {"paths": []},
        }
    ).embed_spec()
    out, _ = embed(
        _rows(plan),
        source_of(ref, bert_dir).load(),
        source_of(ref, bert_dir).load_tokenizer(),
        spec,
    )
    return out


@pytest.fixture
def cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Cli:
    """``lmalgebra ARGS`` in-process; returns (exit code, stderr without colour)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))

    def run(args: list[str]) -> tuple[int | str | None, str]:
        monkeypatch.setattr(sys, "argv", ["lmalgebra", *args])
        capsys.readouterr()
        try:
            main()
        except SystemExit as stop:
            return stop.code, ANSI.sub("", capsys.readouterr().err)
        return 0, ANSI.sub("", capsys.readouterr().err)

    return run


def write_npy(path: Path, vectors: np.ndarray, digest: str | None) -> Path:
    np.save(path, vectors)
    if digest is not None:
        path.with_name(path.name + ".spans.sha256").write_text(digest + "\n")
    return path


def write_parquet(
    path: Path, vectors: np.ndarray, column: str, values: list[str], fixed: bool = False
) -> Path:
    kind = pa.list_(pa.float32(), vectors.shape[1]) if fixed else pa.list_(pa.float32())
    embedding = pa.array(list(vectors), type=kind)
    pq.write_table(pa.table({column: values, "embedding": embedding}), path)
    return path


def write_safetensors(path: Path, vectors: np.ndarray, digest: str | None) -> Path:
    save_file(
        {"embeddings": vectors}, str(path), metadata={"spans_sha256": digest} if digest else None
    )
    return path


def _all_rows(given: object) -> np.ndarray:
    splits = given.splits  # type: ignore[attr-defined]
    return np.vstack([np.vstack(list(splits[s].chunks())) for s in SPLITS])


# --- the exporter ---------------------------------------------------------------------------


def test_order_digest_equals_a_naive_hash_of_the_exported_lines(
    plan: RunSpans, tmp_path: Path
) -> None:
    digest_path = export_spans(plan, tmp_path / "spans.jsonl")
    assert digest_path == tmp_path / "spans.sha256"
    records = [json.loads(line) for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert [r["text"] for r in records] == _rows(plan)
    assert [r["row"] for r in records] == list(range(84))
    assert [r["split"] for r in records] == ["train"] * 60 + ["validation"] * 12 + ["test"] * 12
    assert [r["index"] for r in records[60:72]] == list(range(12))
    naive = hashlib.sha256()
    for r in records:
        assert r["sha256"] == hashlib.sha256(r["text"].encode()).hexdigest()
        naive.update(f"{r['split']}\t{r['sha256']}\n".encode())
    assert digest_path.read_text().strip() == naive.hexdigest() == plan.order_digest
    assert order_digest(plan.texts) == plan.order_digest
    moved = {**plan.texts, "validation": plan.texts["validation"][::-1]}
    assert order_digest(moved) != plan.order_digest


def test_spans_command_exports_exactly_what_a_decomposition_draws(
    cli: Cli, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    out = tmp_path / "spans.jsonl"
    code, err = cli(
        [
            "spans",
            "--models",
            f"a={bert_dir}",
            "--corpus.paths",
            str(corpus_txt),
            *SMALL,
            "--out",
            str(out),
        ]
    )
    assert code == 0, err
    exported = [json.loads(line)["text"] for line in out.read_text().splitlines()]
    config = DecomposeConfig.model_validate(
        {
            "models": [
                {"name": "a", "path": str(bert_dir)},
                {"name": "v", "path": str(tmp_path / "later.npy"), "kind": "precomputed"},
                {"name": "b", "path": str(bert2_dir)},
            ],
            "corpus": {"paths": [str(corpus_txt)]},
            "spans": {"length": 8, "counts": [60, 12, 12]},
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    (tmp_path / "later.npy").write_bytes(b"")  # the pool resolves every path; the file comes later
    texts, hashes = draw_texts(ModelPool(config), read_documents(config.corpus), config.spans)
    assert exported == [t for s in SPLITS for t in texts[s]]
    assert (tmp_path / "spans.sha256").read_text().strip() == hashes["spans_order"]
    # a recipe naming the not-yet-made vectors file exports the same spans
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(config.model_dump(mode="json", exclude={"out", "cache_dir"})))
    code, err = cli(["spans", str(recipe), "--out", str(tmp_path / "again.jsonl")])
    assert code == 0, err
    assert (tmp_path / "again.jsonl").read_text() == out.read_text()


# --- formats --------------------------------------------------------------------------------


def test_every_format_loads_back_the_same_rows(
    plan: RunSpans, vectors: np.ndarray, tmp_path: Path
) -> None:
    ids = [span_sha256(t) for t in _rows(plan)]
    files = {
        "npy": write_npy(tmp_path / "v.npy", vectors.astype(np.float64), plan.order_digest),
        "parquet-ids": write_parquet(tmp_path / "ids.parquet", vectors, "span_sha256", ids),
        "parquet-text": write_parquet(tmp_path / "t.parquet", vectors, "text", _rows(plan), True),
        "safetensors": write_safetensors(tmp_path / "v.safetensors", vectors, plan.order_digest),
    }
    json_form = tmp_path / "j.npy"
    np.save(json_form, vectors)
    (tmp_path / "j.npy.spans.json").write_text(json.dumps({"spans_sha256": plan.order_digest}))
    files["npy-json"] = json_form
    for kind, path in files.items():
        given = load_precomputed("v", path, plan.texts)
        assert given.rows == 84 and given.dim == 32, kind
        assert {s: given.splits[s].rows for s in SPLITS} == plan.counts, kind
        rows = _all_rows(given)
        assert rows.dtype == np.float32, kind
        np.testing.assert_allclose(rows, vectors, rtol=0, atol=1e-7, err_msg=kind)


def test_blocks_line_up_with_the_embedding_cache(tmp_path: Path) -> None:
    default = inspect.signature(EmbeddingCache).parameters["shard_rows"].default
    assert default == SHARD_ROWS
    data = np.arange(5000 * 3, dtype=np.float32).reshape(5000, 3)
    split = PrecomputedSplit(lambda a, b: data[a:b], 5000, 3)
    cache = EmbeddingCache(tmp_path, {"model": "m"}, ["x"] * 5000)
    assert split.ranges == cache.ranges
    blocks = list(split.chunks([2, 0]))
    np.testing.assert_array_equal(blocks[0], data[4096:])
    np.testing.assert_array_equal(blocks[1], data[:2048])
    np.testing.assert_array_equal(np.vstack(list(split.chunks())), data)


# --- refusals -------------------------------------------------------------------------------


def _refusals(plan: RunSpans, vectors: np.ndarray, tmp: Path) -> dict[str, tuple[Path, list[str]]]:
    ids = [span_sha256(t) for t in _rows(plan)]
    swapped = ids[:]
    swapped[3], swapped[70] = swapped[70], swapped[3]
    other = ids[:]
    other[5] = span_sha256("some other text")
    sick = vectors.copy()
    sick[66, 4] = np.nan
    return {
        "row_count": (
            write_npy(tmp / "short.npy", vectors[:-1], plan.order_digest),
            ["has 83 rows but the run has 84 spans", "train 60, validation 12, test 12"],
        ),
        "no_order": (
            write_npy(tmp / "bare.npy", vectors, None),
            ["carries no span order", "attrs['spans_sha256']) to", "unchecked_order: true"],
        ),
        "wrong_digest": (
            write_npy(tmp / "stale.npy", vectors, "0" * 64),
            ["made for other spans", "`lmalgebra spans` (lmalgebra.spans())"],
        ),
        "other_order": (
            write_parquet(tmp / "swapped.parquet", vectors, "span_sha256", swapped),
            ["2 rows do not match", "first row 3", "train span 3", "another order"],
        ),
        "other_spans": (
            write_parquet(tmp / "other.parquet", vectors, "span_sha256", other),
            ["1 row does not match", "first row 5", "belong to other spans"],
        ),
        "no_ids": (
            write_parquet(tmp / "noid.parquet", vectors, "title", ["x"] * 84),
            ["carries no span order", "no 'span_sha256' or 'text' column"],
        ),
        "no_metadata": (
            write_safetensors(tmp / "nometa.safetensors", vectors, None),
            ["carries no span order", "no 'spans_sha256' metadata"],
        ),
        "non_finite": (
            write_npy(tmp / "nan.npy", sick, plan.order_digest),
            ["non-finite", "row 66", "validation span 6"],
        ),
        "three_d": (write_npy(tmp / "cube.npy", vectors.reshape(84, 4, 8), None), ["3-D"]),
        "integers": (write_npy(tmp / "int.npy", vectors.astype(np.int32), None), ["non-float"]),
        "pickled": (_pickled(tmp / "obj.npy"), ["cannot read", "as .npy"]),
        "damaged_header": (_damaged_header(tmp / "head.npy", vectors), ["cannot read", "as .npy"]),
        "wrong_tensor": (_tensor(tmp / "named.safetensors", vectors), ["no tensor 'embeddings'"]),
        "uneven": (_uneven(tmp / "uneven.parquet"), ["row 1", "different length"]),
        "suffix": (tmp / "v.csv", ["not a file of embeddings"]),
    }


def _pickled(path: Path) -> Path:
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    return path


def _damaged_header(path: Path, vectors: np.ndarray) -> Path:
    """A ``.npy`` whose header dict is cut: numpy's parser had raised tokenize's TokenError,
    a traceback."""
    np.save(path, vectors)
    data = bytearray(path.read_bytes())
    data[10:20] = b"x" * 10
    path.write_bytes(bytes(data))
    return path


def _tensor(path: Path, vectors: np.ndarray) -> Path:
    save_file({"vectors": vectors}, str(path))
    return path


def _uneven(path: Path) -> Path:
    pq.write_table(pa.table({"embedding": [[1.0, 2.0], [1.0], [3.0, 4.0]]}), path)
    return path


REFUSALS = [
    "row_count",
    "no_order",
    "wrong_digest",
    "other_order",
    "other_spans",
    "no_ids",
    "no_metadata",
    "non_finite",
    "three_d",
    "integers",
    "pickled",
    "damaged_header",
    "wrong_tensor",
    "uneven",
    "suffix",
]


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_files_are_refused_naming_model_and_file(
    case: str, plan: RunSpans, vectors: np.ndarray, tmp_path: Path
) -> None:
    path, needles = _refusals(plan, vectors, tmp_path)[case]
    path.touch()
    with pytest.raises(UserInputError) as err:
        load_precomputed("vec", path, plan.texts)
    message = str(err.value)
    assert message.startswith("model 'vec': "), message
    assert str(path) in message
    for needle in needles:
        assert needle in message, message


def test_embeddings_whose_squares_overflow_are_refused_naming_the_model(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """Finite float32 values of 1e30: the statistics' float32 products overflowed, numpy's
    overflow warning was printed and the run was refused as "alpha times a basis model's
    variance overflows", blaming alpha; the model is named now, and no warning printed."""
    import warnings

    import lmalgebra
    from tiny import documents

    texts, shape = documents(120), {"spans": {"length": 8, "counts": (60, 12, 12)}}
    rows = len(lmalgebra.spans({}, texts, **shape, reference_tokenizer=str(tokenizer_dir)))
    a, b = _related(rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserInputError, match=r"^model 'b': its variance over the training"):
            lmalgebra.decompose(
                {"a": a, "b": b * np.float32(1e30)},
                texts,
                **shape,
                reference_tokenizer=str(tokenizer_dir),
                cache_dir=tmp_path / "cache",
                progress=False,
            )


def test_unchecked_order_accepts_a_bare_npy_but_never_a_wrong_digest(
    plan: RunSpans, vectors: np.ndarray, tmp_path: Path
) -> None:
    bare = write_npy(tmp_path / "bare.npy", vectors, None)
    np.testing.assert_array_equal(_all_rows(load_precomputed("v", bare, plan.texts, True)), vectors)
    stale = write_npy(tmp_path / "stale.npy", vectors, "f" * 64)
    with pytest.raises(UserInputError, match="made for other spans"):
        load_precomputed("v", stale, plan.texts, True)


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling link"])
def test_a_digest_sidecar_that_is_no_file_is_named_as_such(
    kind: str, plan: RunSpans, vectors: np.ndarray, tmp_path: Path
) -> None:
    """The order digest beside a ``.npy`` made a FIFO, a directory or a link to nothing had been
    called absent ("carries no span order (no ... next to it); write the digest ... to" the
    path that is there)."""
    import os

    path = write_npy(tmp_path / "v.npy", vectors, None)
    sidecar = tmp_path / "v.npy.spans.sha256"
    if kind == "fifo":
        os.mkfifo(sidecar)
    elif kind == "directory":
        sidecar.mkdir()
    else:
        sidecar.symlink_to(tmp_path / "gone")
    with pytest.raises(UserInputError, match=f"model 'vec': digest file {sidecar} (is|is a)"):
        load_precomputed("vec", path, plan.texts)


def test_precomputed_ref_validation(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match=r"embeddings file .*missing\.npy does not exist"):
        ModelRef.parse(f"v=precomputed:{tmp_path / 'missing.npy'}").source.resolve()
    with pytest.raises(UserInputError, match="precomputed embeddings file: no tokenizer"):
        source_of(ModelRef.parse("v=precomputed:/x.npy"), Path("/x.npy")).load_tokenizer()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("layer", 5),
        ("pooling", "last"),
        ("batch_size", 4),
        ("max_length", 9),
        ("dtype", "bfloat16"),
    ],
)
def test_embedding_settings_of_a_run_that_embeds_nothing_are_refused(
    setting: str, value: object
) -> None:
    """Every model a file of precomputed embeddings: ``--layer 5`` or ``--pooling last`` had
    been accepted and recorded, and did nothing; beside a model that embeds, they apply."""
    models = [
        {"name": "a", "path": "/x/a.npy", "kind": "precomputed"},
        {"name": "b", "path": "/x/b.npy", "kind": "precomputed"},
    ]
    data = {"models": models, "corpus": {"paths": []}, setting: value}
    # from Python, the key as the call was given it (the command line names the flag)
    refused = f"(^|: ){setting} .* would be ignored: .*given as its span embeddings"
    with pytest.raises(UserInputError, match=refused):
        DecomposeConfig.model_validate(data)
    mixed = {**data, "models": [models[0], {"name": "c", "path": "/x/c"}]}
    assert getattr(DecomposeConfig.model_validate(mixed), setting) == value
    # arrays given to the Python API, by the call and its plan alike
    from lmalgebra import decompose, decompose_plan

    arrays = {"a": np.eye(30, 4, dtype=np.float32), "b": np.eye(30, 4, 1, np.float32)}
    for call in (decompose, decompose_plan):
        with pytest.raises(UserInputError, match=refused):
            call(arrays, ["some text"], reference_tokenizer="/x/tok", **{setting: value})


# --- through the command line ---------------------------------------------------------------


@pytest.fixture(scope="module")
def broken_onnx(tmp_path_factory: pytest.TempPathFactory, bert_dir: Path) -> Path:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx_export import export_onnx

    return export_onnx(bert_dir, tmp_path_factory.mktemp("onnx") / "ids_only.onnx", ("input_ids",))


@pytest.mark.parametrize("case", ["row_count", "no_order", "other_order", "non_finite", "onnx"])
def test_cli_refusals_exit_2_with_one_line(
    case: str,
    cli: Cli,
    plan: RunSpans,
    vectors: np.ndarray,
    bert_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    if case == "onnx":
        graph = request.getfixturevalue("broken_onnx")
        model, needles = f"o=onnx:{graph}#{bert_dir}", ["model 'o'", str(graph), "attention_mask"]
    else:
        path, needles = _refusals(plan, vectors, tmp_path)[case]
        model, needles = f"v=precomputed:{path}", ["model 'v'", *needles]
    out = tmp_path / "out"
    models = ["--models", f"a={bert_dir}", "--models", model]
    code, err = cli(
        ["decompose", *models, "--corpus.paths", str(corpus_txt), *SMALL, "--out", str(out)]
    )
    assert code == 2, err
    assert "Traceback" not in err
    lines = re.findall(r"^error: .*$", err, flags=re.MULTILINE)
    assert len(lines) == 1 and err.rstrip().endswith(lines[0]), err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (out / "summary.json").exists()


# --- a mixed run ----------------------------------------------------------------------------


def test_torch_onnx_and_precomputed_models_in_one_decomposition(
    cli: Cli, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    """a (PyTorch), b (PyTorch), b-onnx (b exported to ONNX), a-vectors (a's embeddings of the
    exported spans, computed outside the run): each twin is explained by its original at R^2 ~1."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    from onnx_export import export_onnx

    flags = ["--corpus.paths", str(corpus_txt), "-T", "8", "--spans.counts", "200,25,25"]
    spans = tmp_path / "spans.jsonl"
    code, err = cli(["spans", "--models", f"a={bert_dir}", *flags, "--out", str(spans)])
    assert code == 0, err
    texts = [json.loads(line)["text"] for line in spans.read_text().splitlines()]
    ref = ModelRef(name="a", path=str(bert_dir))
    spec = DecomposeConfig.model_validate(
        {
            "models": [{"name": "a", "path": "x"}, {"name": "b", "path": "y"}],
            "corpus": {"paths": []},
        }
    ).embed_spec()
    rows, _ = embed(
        texts, source_of(ref, bert_dir).load(), source_of(ref, bert_dir).load_tokenizer(), spec
    )
    vectors = write_npy(tmp_path / "a.npy", rows, (tmp_path / "spans.sha256").read_text().strip())
    graph = export_onnx(bert2_dir, tmp_path / "b.onnx", ("input_ids", "attention_mask"))

    out = tmp_path / "run"
    models = [f"a={bert_dir}", f"b={bert2_dir}", f"b-onnx=onnx:{graph}#{bert2_dir}"]
    models.append(f"a-vectors=precomputed:{vectors}")
    code, err = cli(
        ["decompose", *(x for m in models for x in ("--models", m)), *flags, "--out", str(out)]
    )
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"] == ["a", "b", "b-onnx", "a-vectors"]
    assert summary["spans"] == {"train": 200, "validation": 25, "test": 25}
    table = (out / "pairwise_r2_test.csv").read_text().splitlines()
    assert table[0].split(",")[1:] == ["a", "b", "b-onnx", "a-vectors"]
    r2 = {line.split(",")[0]: line.split(",")[1:] for line in table[1:]}
    assert float(r2["a-vectors"][0]) > 0.999  # from a
    assert float(r2["a"][3]) > 0.999  # a from its vectors
    assert float(r2["b-onnx"][1]) > 0.999  # from b
    assert float(r2["b"][2]) > 0.999
    assert float(r2["a"][1]) < 0.99  # different models stay different
    provenance = json.loads((out / "provenance.json").read_text())
    assert provenance["hashes"]["spans_order"] == (tmp_path / "spans.sha256").read_text().strip()


# --- a reference tokenizer that is no model of the run --------------------------------------


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tiny import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer-only"))


@pytest.fixture
def nothing_embedded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if any model is loaded or any span embedded."""
    from transformers import AutoModel

    import lmalgebra.sources.embed
    from lmalgebra.sources.kinds.transformers import TransformersModel

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was loaded or a span embedded")

    monkeypatch.setattr(AutoModel, "from_pretrained", refuse)
    monkeypatch.setattr(AutoModel, "from_config", refuse)
    monkeypatch.setattr(TransformersModel, "load", refuse)
    monkeypatch.setattr(lmalgebra.sources.embed, "embed", refuse)


def _related(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Two arrays of span embeddings, the second nearly a linear function of the first."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((rows, 12))
    b = a @ rng.standard_normal((12, 6)) + 0.05 * rng.standard_normal((rows, 6))
    return a.astype(np.float32), b.astype(np.float32)


def test_precomputed_files_alone_cut_by_a_tokenizer_directory_embed_nothing(
    cli: Cli, tokenizer_dir: Path, corpus_txt: Path, tmp_path: Path, nothing_embedded: None
) -> None:
    flags = ["--corpus.paths", str(corpus_txt), *SMALL, "--reference_tokenizer", str(tokenizer_dir)]
    code, err = cli(["spans", *flags, "--out", str(tmp_path / "spans.jsonl")])  # no model at all
    assert code == 0, err
    digest = (tmp_path / "spans.sha256").read_text().strip()
    a, b = _related(len((tmp_path / "spans.jsonl").read_text().splitlines()))
    files = [write_npy(tmp_path / f"{n}.npy", v, digest) for n, v in (("a", a), ("b", b))]
    models = ["--models", f"a=precomputed:{files[0]}", "--models", f"b=precomputed:{files[1]}"]
    out = tmp_path / "run"
    code, err = cli(["decompose", *models, *flags, "--out", str(out)])
    assert code == 0, err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["models"] == ["a", "b"]
    # nothing tokenised them: no figure, where 0.0 tokens per span had been reported
    assert summary["tokens_per_span"] == summary["truncated_spans"] == {"a": None, "b": None}
    table = (out / "pairwise_r2_test.csv").read_text().splitlines()
    assert float(table[2].split(",")[1]) > 0.95  # b from a


# What a decomposition of cached or precomputed embeddings runs in a fresh process, printing the
# heavy libraries it imported: neither transformers (no model loads) nor matplotlib (no figure
# unless asked).
IMPORTED = """
import sys
from lmalgebra.cli import main
sys.argv = ["lmalgebra", *sys.argv[1:]]
try:
    main()
except SystemExit as stop:
    assert not stop.code, stop.code
print(sorted(m for m in ("transformers", "matplotlib") if m in sys.modules))
"""


def test_a_cached_decomposition_loads_no_model_library_and_draws_figures_only_when_asked(
    cli: Cli, bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path
) -> None:
    import os
    import subprocess

    from lmalgebra import Decomposition

    models = ["--models", f"a={bert_dir}", "--models", f"b={bert2_dir}"]
    flags = ["--corpus.paths", str(corpus_txt), *SMALL]
    code, err = cli(["decompose", *models, *flags, "--out", str(tmp_path / "first")])
    assert code == 0, err  # spans and embeddings made once, and cached
    assert not list((tmp_path / "first").rglob("*.png"))  # no figure unless asked

    env = {**os.environ, "LMALGEBRA_CACHE": str(tmp_path / "cache")}
    command = [sys.executable, "-c", IMPORTED, "decompose", *models, *flags]

    def imported(*extra: str) -> str:
        """The heavy libraries a fresh process imported for the cached run, as it printed them."""
        done = subprocess.run(
            [*command, *extra], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip().splitlines()[-1]

    assert imported("--out", str(tmp_path / "again")) == "[]"
    assert imported("--figures", "--out", str(tmp_path / "drawn")) == "['matplotlib']"
    drawn_dir = tmp_path / "drawn"
    pngs = sorted(p.relative_to(drawn_dir).as_posix() for p in drawn_dir.rglob("*.png"))
    assert "pairwise_r2_test.png" in pngs and "plots/pairwise_r2_test_clustered.png" in pngs
    # the same tables either way: figures are no part of a run's identity or results
    for name in ("pairwise_r2_test.csv", "group_r2.csv"):
        assert (tmp_path / "again" / name).read_bytes() == (tmp_path / "drawn" / name).read_bytes()

    # asked for from Python, the heatmap of a run written without figures is drawn then
    heatmap = Decomposition.load(tmp_path / "again").heatmap
    assert heatmap == tmp_path / "again" / "pairwise_r2_test.png"
    assert heatmap.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_arrays_alone_cut_by_a_tokenizer_directory_embed_nothing(
    tokenizer_dir: Path, bert_dir: Path, tmp_path: Path, nothing_embedded: None
) -> None:
    import lmalgebra
    from tiny import documents

    texts, shape = documents(120), {"spans": {"length": 8, "counts": (60, 12, 12)}}
    table = lmalgebra.spans({}, texts, **shape, reference_tokenizer=str(tokenizer_dir))
    # the same spans as the model whose tokenizer this is would cut (its tokenizer alone loads)
    as_model = lmalgebra.spans({"m": str(bert_dir)}, texts, **shape)
    assert table.text.tolist() == as_model.text.tolist() and len(table) == 84
    a, b = _related(len(table))
    result = lmalgebra.decompose(
        {"a": a, "b": b},
        texts,
        **shape,
        reference_tokenizer=str(tokenizer_dir),
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    assert result.pairwise("test").loc["b", "a"] > 0.95
    assert result.config["reference_tokenizer"] == str(tokenizer_dir)


def test_a_bad_reference_tokenizer_is_one_error_naming_it(
    bert_dir: Path, bert2_dir: Path, tmp_path: Path
) -> None:
    from lmalgebra import decompose
    from tiny import documents

    (tmp_path / "empty").mkdir()
    (tmp_path / "file.json").write_text("{}")
    texts, shape = (
        documents(120),
        {"spans": {"length": 8, "counts": (60, 12, 12)}, "progress": False},
    )
    two = {"a": str(bert_dir), "b": str(bert2_dir)}
    vectors = np.eye(84, 4, dtype=np.float32)
    cases = {
        str(tmp_path / "nowhere"): (two, ["does not exist", "nor is it a model of this run: a, b"]),
        str(tmp_path / "empty"): (two, ["cannot load a tokenizer from"]),
        str(tmp_path / "file.json"): (two, ["is a file, not a directory"]),
        "some-org/some-tokenizer": (two, ["could not be reached", "offline"]),
        "v": ({"v": vectors, "w": vectors}, ["has no tokenizer", "tokenizer directory"]),
    }
    for reference, (models, needles) in cases.items():
        with pytest.raises(UserInputError) as caught:
            decompose(models, texts, **shape, reference_tokenizer=reference, cache_dir=tmp_path)
        message = str(caught.value)
        assert message.startswith(f"reference_tokenizer {reference!r}"), message
        for needle in needles:
            assert needle in message, message
    with pytest.raises(UserInputError, match=r"no model has a tokenizer.*reference_tokenizer"):
        decompose({"v": vectors, "w": vectors}, texts, **shape, cache_dir=tmp_path)
