"""ONNX encoders: parity with the PyTorch model through the one embedding loop, refusals, refs."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.sources.embed import EmbedSpec, embed
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.model_source import check_layer
from lmalgebra.sources.models import ModelRef
from onnx_export import export_onnx
from tiny import sentences

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory, bert_dir: Path) -> dict[str, Path]:
    """The tiny BERT exported four ways, plus a file that is not a graph."""
    root = tmp_path_factory.mktemp("onnx")
    three = ("input_ids", "attention_mask", "token_type_ids")
    garbage = root / "garbage.onnx"
    garbage.write_bytes(b"this is not a protobuf" * 10)
    return {
        "plain": export_onnx(bert_dir, root / "plain" / "model.onnx"),
        "all": export_onnx(bert_dir, root / "all.onnx", three, "all"),
        "ids_only": export_onnx(bert_dir, root / "ids_only.onnx", ("input_ids",)),
        "pooled": export_onnx(bert_dir, root / "pooled.onnx", outputs="pooled"),
        "garbage": garbage,
    }


def _load(path: Path, tokenizer: Path, name: str = "o") -> tuple[object, object]:
    ref = ModelRef.parse(f"{name}=onnx:{path}#{tokenizer}")
    directory = ref.source.resolve()
    return source_of(ref, directory).load(), source_of(ref, directory).load_tokenizer()


def _torch(bert_dir: Path) -> tuple[object, object]:
    ref = ModelRef(name="t", path=str(bert_dir))
    return source_of(ref, bert_dir).load(), source_of(ref, bert_dir).load_tokenizer()


SPECS = [
    EmbedSpec(batch_size=7),
    EmbedSpec(pooling="first", batch_size=5),
    EmbedSpec(pooling="last", exclude_special=True, batch_size=4, max_length=12),
]


@pytest.mark.parametrize("graph", ["plain", "all"])
@pytest.mark.parametrize("spec", SPECS, ids=["mean", "first", "last-cut"])
def test_onnx_embeddings_equal_the_torch_model(
    graphs: dict[str, Path], bert_dir: Path, graph: str, spec: EmbedSpec
) -> None:
    texts = sentences(40, seed=5)
    onnx_model, onnx_tok = _load(graphs[graph], bert_dir)
    torch_model, torch_tok = _torch(bert_dir)
    got, got_report = embed(texts, onnx_model, onnx_tok, spec)
    want, want_report = embed(texts, torch_model, torch_tok, spec)
    assert got.shape == want.shape == (40, 32)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    assert got_report == want_report
    assert spec.max_length is None or got_report.truncated > 0  # the cut path ran


def test_hidden_state_outputs_give_every_layer(graphs: dict[str, Path], bert_dir: Path) -> None:
    texts = sentences(12, seed=6)
    onnx_model, onnx_tok = _load(graphs["all"], bert_dir)
    torch_model, torch_tok = _torch(bert_dir)
    for layer in (0, 1, -2):
        check_layer("o", onnx_model, layer)
        spec = EmbedSpec(layer=layer, batch_size=5)
        got, _ = embed(texts, onnx_model, onnx_tok, spec)
        want, _ = embed(texts, torch_model, torch_tok, spec)
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)
    with pytest.raises(UserInputError, match=r"layer 3 does not exist \(2 layers"):
        check_layer("o", onnx_model, 3)


def test_last_state_only_graph_refuses_other_layers(
    graphs: dict[str, Path], bert_dir: Path
) -> None:
    onnx_model, _ = _load(graphs["plain"], bert_dir)
    check_layer("o", onnx_model, -1)
    with pytest.raises(UserInputError) as err:
        check_layer("o", onnx_model, 1)
    assert "exposes only its last hidden state" in str(err.value)
    assert str(graphs["plain"]) in str(err.value)
    assert "hidden_states.0..N" in str(err.value)


def test_token_ids_beyond_the_graphs_vocabulary_name_the_tokenizer(
    graphs: dict[str, Path], bert_dir: Path
) -> None:
    """Ids past the graph's embedding table (a tokenizer of another model) had been refused with
    "a smaller --max_length may help"; the message says what is wrong."""
    import torch

    onnx_model, _ = _load(graphs["plain"], bert_dir)
    ids = torch.tensor([[2, 250, 3]])
    with pytest.raises(UserInputError, match="token id 250, beyond the 200 rows") as err:
        onnx_model(ids, torch.ones_like(ids))
    assert "own tokenizer" in str(err.value) and "max_length" not in str(err.value)


def test_depth_for_layer_studies(graphs: dict[str, Path], bert_dir: Path) -> None:
    def ref(graph: str) -> ModelRef:
        return ModelRef.parse(f"o=onnx:{graphs[graph]}#{bert_dir}")

    assert source_of(ref("all"), graphs["all"]).depth() == 2
    assert source_of(ModelRef(name="t", path=str(bert_dir)), bert_dir).depth() == 2
    with pytest.raises(UserInputError, match="exposes only its last hidden state"):
        source_of(ref("plain"), graphs["plain"]).depth()
    with pytest.raises(UserInputError, match="precomputed embeddings file: no layers"):
        source_of(ModelRef.parse("v=precomputed:/x.npy"), Path("/x.npy")).depth()


@pytest.mark.parametrize(
    ("graph", "needles"),
    [
        ("garbage", ["cannot read ONNX file"]),
        ("ids_only", ["lacks the input(s) attention_mask", "declares: input_ids"]),
        ("pooled", ["no 3-D float output", "pooled (2-D tensor(float))"]),
    ],
)
def test_bad_graphs_are_refused_naming_the_file(
    graphs: dict[str, Path], bert_dir: Path, graph: str, needles: list[str]
) -> None:
    with pytest.raises(UserInputError) as err:
        _load(graphs[graph], bert_dir, name="bad")
    message = str(err.value)
    assert message.startswith("model 'bad': ")
    assert str(graphs[graph]) in message
    for needle in needles:
        assert needle in message
    assert "\n" not in message


def test_a_graph_of_fixed_batch_and_length_is_refused_by_plan_and_load(
    bert_dir: Path, tmp_path: Path
) -> None:
    """An export without dynamic axes takes one batch shape only: the plan had passed it and
    the first batch failed in onnxruntime's words, advising a smaller --max_length."""
    path = export_onnx(bert_dir, tmp_path / "fixed.onnx", dynamic=False)
    ref = ModelRef.parse(f"o=onnx:{path}#{bert_dir}")
    needle = r"model 'o': ONNX file .*fixed\.onnx fixes .* \(input_ids \[2, 5\].*dynamic axes"
    with pytest.raises(UserInputError, match=needle):
        source_of(ref, weights=False).shape()
    with pytest.raises(UserInputError, match=needle):
        source_of(ref).load()


def test_folder_with_one_graph_and_missing_paths(
    graphs: dict[str, Path], bert_dir: Path, tmp_path: Path
) -> None:
    ref = ModelRef.parse(f"onnx:{graphs['plain'].parent}#{bert_dir}")
    assert ref.source.resolve() == graphs["plain"]
    with pytest.raises(UserInputError, match=r"ONNX file .* does not exist"):
        ModelRef.parse(f"x=onnx:{tmp_path / 'none.onnx'}#{bert_dir}").source.resolve()
    with pytest.raises(UserInputError, match="needs a tokenizer"):
        source_of(ModelRef.parse(f"x=onnx:{graphs['all']}"), graphs["all"]).load_tokenizer()
    with pytest.raises(UserInputError, match=r"tokenizer directory .* does not exist"):
        ref = ModelRef.parse(f"x=onnx:{graphs['all']}#{tmp_path / 'no-tok'}")
        source_of(ref, graphs["all"]).load_tokenizer()


def test_fingerprint_covers_graph_and_tokenizer(
    graphs: dict[str, Path], bert_dir: Path, tmp_path: Path
) -> None:
    def prints(graph: Path, tokenizer: Path) -> dict[str, str]:
        ref = ModelRef.parse(f"o=onnx:{graph}#{tokenizer}")
        return ref.source.fingerprint(tmp_path / "memo")

    base = prints(graphs["plain"], bert_dir)
    assert prints(graphs["plain"], bert_dir) == base  # memoised, stable
    assert prints(graphs["all"], bert_dir)["weights"] != base["weights"]
    copy = tmp_path / "tok"
    copy.mkdir()
    for path in bert_dir.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors"):
            (copy / path.name).write_bytes(path.read_bytes())
    assert prints(graphs["plain"], copy) == base  # same tokenizer bytes, same hashes
    config = copy / "tokenizer_config.json"
    config.write_text(config.read_text().replace("{", '{"model_max_length": 64, ', 1))
    changed = prints(graphs["plain"], copy)
    assert changed["tokenizer"] != base["tokenizer"]
    assert changed["weights"] == base["weights"]


@pytest.mark.parametrize("location", ["weights.bin", "model.onnx.data"])
def test_fingerprint_covers_external_data_of_any_name(
    graphs: dict[str, Path], bert_dir: Path, tmp_path: Path, location: str
) -> None:
    """A graph whose tensors live in an external-data file of another name than
    ``<graph>_data``/``.data`` (``weights.bin``, as ``onnx.save_model`` names it) had a cache key
    that left the file out: its weights edited, the cached embeddings of the old weights were
    read."""
    import onnx

    graph = tmp_path / "ext" / "model.onnx"
    graph.parent.mkdir()
    onnx.save_model(
        onnx.load(str(graphs["plain"])),
        str(graph),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=location,
        size_threshold=0,
    )
    ref = ModelRef.parse(f"o=onnx:{graph}#{bert_dir}")
    before = ref.source.fingerprint(tmp_path / "memo")["weights"]
    data = graph.parent / location
    weights = np.frombuffer(data.read_bytes(), dtype=np.float32) * 1.5
    data.write_bytes(weights.tobytes())
    assert ref.source.fingerprint(tmp_path / "memo")["weights"] != before


def test_model_ref_forms() -> None:
    onnx = ModelRef.parse("l3=onnx:/m/x.onnx#package:minilm")
    assert (onnx.name, onnx.kind, onnx.path, onnx.tokenizer) == (
        "l3",
        "onnx",
        "/m/x.onnx",
        "package:minilm",
    )
    assert ModelRef.parse("onnx:/m/encoder.onnx").name == "encoder"
    vectors = ModelRef.parse("precomputed:/data/api@v2.npy")
    assert (vectors.name, vectors.kind, vectors.path) == (
        "api@v2",
        "precomputed",
        "/data/api@v2.npy",
    )
    packaged = ModelRef.parse("package:minilm-l3-onnx")
    assert (packaged.kind, packaged.name) == ("onnx", "minilm-l3-onnx")
    # the existing forms are unchanged
    hub = ModelRef.parse("b=org/model@main")
    assert (hub.kind, hub.path, hub.revision, hub.tokenizer) == (
        "transformers",
        "org/model",
        "main",
        None,
    )
    null = ModelRef.parse("random:/m/dir")
    assert (null.name, null.random_init, null.kind) == ("dir-random", True, "transformers")
    # recipe forms: a prefix in path, or kind + tokenizer keys; a dump round-trips
    from_yaml = ModelRef.model_validate({"name": "o", "path": "onnx:/m/x.onnx", "tokenizer": "t"})
    assert from_yaml == ModelRef.model_validate(
        {"name": "o", "path": "/m/x.onnx", "kind": "onnx", "tokenizer": "t"}
    )
    assert ModelRef.model_validate(from_yaml.model_dump()) == from_yaml


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"path": "/d", "tokenizer": "t"}, "tokenizer does not apply to a transformers model"),
        ({"path": "/x.npy", "kind": "precomputed", "revision": "r"}, "revision does not apply"),
        ({"path": "onnx:/x.onnx", "random_init": True}, "random_init does not apply"),
        ({"path": "/d", "unchecked_order": True}, "unchecked_order does not apply"),
        ({"path": "onnx:/x.onnx", "kind": "precomputed"}, "path says onnx but kind is"),
    ],
)
def test_model_ref_rules(data: dict[str, object], needle: str) -> None:
    with pytest.raises(UserInputError, match=needle):
        ModelRef.model_validate({"name": "m", **data})


def test_packaged_onnx_minilm_with_the_l6_tokenizer() -> None:
    """paraphrase-MiniLM-L3 (ONNX) with all-MiniLM-L6's tokenizer on a few sentences."""
    from lmalgebra.sources.packaged import asset_path

    try:
        asset_path("minilm-l3-onnx")
        asset_path("minilm")
    except UserInputError as err:
        pytest.skip(str(err))
    started = time.perf_counter()
    ref = ModelRef.parse("l3=package:minilm-l3-onnx")
    directory = ref.source.resolve()
    model, tokenizer = source_of(ref, directory).load(), source_of(ref, directory).load_tokenizer()
    texts = [
        "The cat sits on the mat.",
        "A cat is sitting on a mat.",
        "Stock markets fell sharply on Monday.",
        "Share prices dropped steeply at the start of the week.",
    ]
    vectors, report = embed(texts, model, tokenizer, EmbedSpec(batch_size=2))
    assert vectors.shape == (4, 384)
    assert np.isfinite(vectors).all()
    assert report.truncated == 0
    unit = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    cos = unit @ unit.T
    # a paraphrase model: each sentence is closest to its paraphrase
    assert cos[0, 1] > max(cos[0, 2], cos[0, 3]) + 0.2
    assert cos[2, 3] > max(cos[2, 0], cos[2, 1]) + 0.2
    assert time.perf_counter() - started < 30


def test_weights_fingerprint_reads_the_model_directory_not_its_subfolders(
    bert_dir: Path, tmp_path: Path
) -> None:
    """A teacher made by `pretrain` keeps checkpoints under training/: they change its bytes
    between runs (and as training goes on) but not the model that loads from the directory."""
    import shutil

    model = tmp_path / "teacher"
    shutil.copytree(bert_dir, model)
    ref = ModelRef.parse(f"t={model}")
    before = ref.source.fingerprint()
    (model / "training" / "step-1").mkdir(parents=True)
    (model / "training" / "step-1" / "model.safetensors").write_bytes(b"checkpoint bytes")
    assert ref.source.fingerprint() == before
    weights = next(model.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes() + b" ")  # the model's own weights do count
    assert ref.source.fingerprint()["weights"] != before["weights"]


def test_a_packaged_onnx_graph_named_as_a_tokenizer_gives_the_one_it_runs_with() -> None:
    """``--tokenizer.path package:minilm-l3-onnx`` (and a ``reference_tokenizer``) had been
    refused as "cannot load a tokenizer from .../paraphrase-MiniLM-L3-v2.onnx" (the graph file,
    with transformers' words): it is the tokenizer the graph runs with, ``package:minilm``."""
    from lmalgebra.sources.packaged import asset_path
    from lmalgebra.sources.tokenizers import resolve_tokenizer

    try:
        asset_path("minilm")
    except UserInputError as err:
        pytest.skip(str(err))
    got = resolve_tokenizer("package:minilm-l3-onnx", "tokenizer.path", weights=False)
    assert got == resolve_tokenizer("package:minilm", "tokenizer.path", weights=False)
