"""Weights that would be silently random: a model directory missing a tensor, holding tensors its
configuration has no place for, or a GGUF file whose tensors do not match its declared
architecture is refused in one line naming the model and a tensor, wherever its weights are read
(a model to embed, a teacher, a student's ``init``, a GGUF file's dequantised model)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from gguf_fixtures import tiny_llama, write_llama_gguf
from hostile_helpers import assert_one_line
from lmalgebra.core.errors import UserInputError
from lmalgebra.distill.teachers import load_lm
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from tiny import build_bert_mlm

DROPPED = "encoder.layer.1.attention.self.query.weight"


def _edit_weights(
    directory: Path, drop: str | None = None, add: str | None = None, shrink: str | None = None
) -> None:
    """Remove the tensor whose name ends with ``drop``, add a tensor named ``add`` and make the
    one whose name ends with ``shrink`` a 3x3 tensor."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    if drop is not None:
        (name,) = [key for key in tensors if key.endswith(drop)]
        del tensors[name]
    if shrink is not None:
        (name,) = [key for key in tensors if key.endswith(shrink)]
        tensors[name] = torch.zeros(3, 3)
    if add is not None:
        tensors[add] = torch.zeros(4, 4)
    save_file(tensors, str(path), metadata={"format": "pt"})


@pytest.fixture
def bert_copy(bert_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(bert_dir, tmp_path / "bert"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object]:
    return tiny_llama()


def test_a_model_to_embed_missing_a_tensor_is_refused_naming_it(bert_copy: Path) -> None:
    _edit_weights(bert_copy, drop=DROPPED)
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=f"model 'enc'.*lacks 1 .*{DROPPED}.*random"):
        source_of(ref, bert_copy).load()


def test_a_model_to_embed_with_a_layer_beyond_its_configuration_is_refused(
    bert_copy: Path,
) -> None:
    _edit_weights(bert_copy, add="encoder.layer.5.output.dense.weight")
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=r"model 'enc'.*encoder\.layer\.5\.output"):
        source_of(ref, bert_copy).load()


def test_a_tensor_of_another_shape_is_named_with_both_shapes(
    bert_copy: Path, tmp_path: Path
) -> None:
    """transformers raises on it pointing at a log line that is hidden; the line names it."""
    _edit_weights(bert_copy, shrink=DROPPED)
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=f"model 'enc'.*{DROPPED} .files 3x3, model 32x32"):
        source_of(ref, bert_copy).load()
    teacher = build_bert_mlm(tmp_path / "mlm")
    _edit_weights(teacher, shrink=DROPPED)
    ref = ModelRef(name="mlm", path=str(teacher))
    with pytest.raises(UserInputError, match=f"teacher 'mlm'.*{DROPPED} .files 3x3") as caught:
        load_lm(ref, teacher, "masked")
    assert "\n" not in str(caught.value) and "above report" not in str(caught.value)


def _as_integers(directory: Path) -> str:
    """The query weight of layer 1 stored as int32 (values x100, truncated); its name."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    (name,) = [key for key in tensors if key.endswith(DROPPED)]
    tensors[name] = (tensors[name] * 100).to(torch.int32)
    save_file(tensors, str(path), metadata={"format": "pt"})
    return name


def test_a_weight_stored_as_integers_is_refused_naming_it(
    bert_copy: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A floating-point weight stored as int32 loaded cast to float (its values truncated): a
    damaged or foreign file, refused naming the tensor, for a model to embed and a teacher (a
    head-model checkpoint, its names under ``bert.``); the same weight in bfloat16 loads."""
    intact = load_file(bert_copy / "model.safetensors")
    name = _as_integers(bert_copy)
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=rf"model 'enc'.*1 of .*{name} in I32.*cast"):
        source_of(ref, bert_copy).load()
    teacher = Path(shutil.copytree(teacher_dirs["wp"], tmp_path / "wp"))
    name = _as_integers(teacher)
    with pytest.raises(UserInputError, match=rf"teacher 'wp'.*{name} in I32"):
        load_lm(ModelRef(name="wp", path=str(teacher)), teacher, "masked")
    half = {k: v.to(torch.bfloat16) if k.endswith(DROPPED) else v for k, v in intact.items()}
    save_file(half, str(bert_copy / "model.safetensors"), metadata={"format": "pt"})
    source_of(ref, bert_copy).load()


def test_a_weight_stored_as_integers_is_refused_by_the_plan_too(
    bert_copy: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """The dtype is in the header the plan reads: ``decompose --dry-run`` and a teacher's plan
    had passed a weight stored as int32, which the run then refused."""
    name = _as_integers(bert_copy)
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=rf"model 'enc'.*1 of .*{name} in I32.*cast"):
        source_of(ref, bert_copy, weights=False).check_architecture(remember=False)
    teacher = Path(shutil.copytree(teacher_dirs["wp"], tmp_path / "wp"))
    name = _as_integers(teacher)
    with pytest.raises(UserInputError, match=rf"teacher 'wp'.*{name} in I32"):
        source_of(ModelRef(name="wp", path=str(teacher)), teacher).check_architecture(
            "AutoModelForMaskedLM", "teacher 'wp'"
        )


def test_a_weight_stored_twice_under_the_base_model_prefix_is_refused(
    bert_copy: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A weight stored under its name and again under ``bert.`` + its name (other values) is
    one weight to transformers, which loaded one of the two without a word: refused naming it,
    by the plan (from the headers) and by the load, for a model to embed and a teacher."""
    tensors = load_file(bert_copy / "model.safetensors")
    tensors[f"bert.{DROPPED}"] = 2 * tensors[DROPPED]
    save_file(tensors, str(bert_copy / "model.safetensors"), metadata={"format": "pt"})
    ref = ModelRef(name="enc", path=str(bert_copy))
    twice = rf"model 'enc'.*holds 1 of the model's weights twice.*\(bert\.{DROPPED}\)"
    with pytest.raises(UserInputError, match=twice):
        source_of(ref, bert_copy, weights=False).check_architecture(remember=False)
    with pytest.raises(UserInputError, match=twice):
        source_of(ref, bert_copy).load()
    teacher = Path(shutil.copytree(teacher_dirs["wp"], tmp_path / "wp"))
    tensors = load_file(teacher / "model.safetensors")
    tensors[DROPPED] = tensors[f"bert.{DROPPED}"].clone()
    save_file(tensors, str(teacher / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserInputError, match=rf"teacher 'wp'.*twice.*bert\.{DROPPED}"):
        load_lm(ModelRef(name="wp", path=str(teacher)), teacher, "masked")


def test_a_stale_index_beside_model_safetensors_is_not_read(
    bert_copy: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """transformers reads ``model.safetensors`` before any index: an index left from a sharded
    save, naming shards since removed, had refused the model to embed (naming a shard the load
    never opens) and ended a teacher's load in a ``FileNotFoundError`` traceback."""
    shard = "model-00001-of-00002.safetensors"
    index = {"metadata": {}, "weight_map": {"pooler.dense.weight": shard}}
    teacher = Path(shutil.copytree(teacher_dirs["wp"], tmp_path / "wp"))
    for directory in (bert_copy, teacher):
        (directory / "model.safetensors.index.json").write_text(json.dumps(index))
    source_of(ModelRef(name="enc", path=str(bert_copy)), bert_copy).load()
    load_lm(ModelRef(name="wp", path=str(teacher)), teacher, "masked")


def test_a_head_model_still_embeds_as_its_bare_encoder(tmp_path: Path) -> None:
    """The masked LM's head is no part of the bare model and the pooler goes unused: both pass."""
    directory = build_bert_mlm(tmp_path / "mlm")
    model = source_of(ModelRef(name="mlm", path=str(directory)), directory).load()
    assert type(model).__name__ == "BertModel"


def test_cli_decompose_with_a_damaged_model_is_one_line(
    bert_copy: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    _edit_weights(bert_copy, drop=DROPPED)
    code, stderr = cli(
        [
            "decompose",
            "--models",
            f"a={bert_copy}",
            "--models",
            f"b={bert2_dir}",
            "--corpus.paths",
            str(corpus_txt),
            "--out",
            str(tmp_path / "out"),
            "--cache_dir",
            str(tmp_path / "cache"),
        ]
    )
    assert_one_line(code, stderr, ["model 'a'", str(bert_copy), DROPPED])


@pytest.mark.parametrize(
    ("drop", "add", "needle"),
    [
        ("layers.1.mlp.up_proj.weight", None, "layers.1.mlp.up_proj.weight"),
        (None, "model.layers.2.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"),
    ],
)
@pytest.mark.parametrize("role", ["teacher", "student.init"])
def test_a_causal_lm_with_weights_not_its_own_is_refused(
    llama, tmp_path: Path, role: str, drop: str | None, add: str | None, needle: str
) -> None:
    model, tokenizer = llama
    model.save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    _edit_weights(tmp_path / "lm", drop=drop, add=add)
    ref = ModelRef(name="lm", path=str(tmp_path / "lm"))
    with pytest.raises(UserInputError, match=f"{role} 'lm'.*{needle}") as caught:
        load_lm(ref, tmp_path / "lm", "causal", role=role)
    assert "\n" not in str(caught.value)


def test_a_gguf_file_whose_tensors_miss_layers_is_refused_and_not_cached(
    llama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header declares three layers, the tensors hold two: the third would be random."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    model, tokenizer = llama
    config = json.loads(model.config.to_json_string())
    model.config.num_hidden_layers = 3
    try:
        path = write_llama_gguf(model, tokenizer, tmp_path / "short.gguf")
    finally:
        model.config.num_hidden_layers = config["num_hidden_layers"]
    with pytest.raises(UserInputError, match=r"model 'short'.*short.gguf.*layers\.2\."):
        ModelRef.parse(f"gguf:{path}").source.resolve()
    assert not (tmp_path / "cache").exists()  # an empty gguf/ (and cache) had been left


def _foreign_gguf(llama: tuple[Any, Any], path: Path, change: str) -> Path:
    """A GGUF file of the tiny Llama with a tensor beyond its two layers (``extra``), of a name
    no Llama has (``unknown``) or of half its size (``smaller``) written beside its own, or one
    of its weights flattened (``flattened``: as many values, which the plan had passed)."""
    import numpy as np

    import gguf_fixtures

    own = gguf_fixtures._tensors

    def edited(model: Any) -> dict[str, np.ndarray]:
        tensors = own(model)
        ones = np.ones(32, dtype=np.float32)
        if change == "extra":
            tensors["blk.2.attn_norm.weight"] = ones
        elif change == "unknown":
            tensors["foo.bar.weight"] = ones
        elif change == "flattened":  # as many values, of other axes
            tensors["blk.0.ffn_up.weight"] = tensors["blk.0.ffn_up.weight"].reshape(-1).copy()
        else:
            tensors["blk.0.attn_norm.weight"] = ones[:16].copy()
        return tensors

    gguf_fixtures._tensors = edited
    try:
        return write_llama_gguf(*llama, path)
    finally:
        gguf_fixtures._tensors = own


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("extra", "no place for (blk.2.attn_norm.weight)"),
        ("unknown", "no place for (foo.bar.weight)"),
        ("smaller", "other sizes than the 'llama' model it declares (blk.0.attn_norm.weight"),
        ("flattened", "declares (blk.0.ffn_up.weight (file 2048, model 64x32))"),
    ],
)
def test_a_gguf_file_with_tensors_not_of_its_architecture_is_refused_by_plan_and_run(
    llama,
    corpus_txt: Path,
    bert_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
    needle: str,
    dry_run: bool,
    cli,
) -> None:
    """transformers skipped a tensor of a name the declared architecture lacks without a word;
    the dry run, which dequantises nothing, had passed every such file."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    path = _foreign_gguf(llama, tmp_path / "odd.gguf", change)
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache"), *(["--dry-run"] if dry_run else [])]
    code, stderr = cli(args)
    assert_one_line(code, stderr, ["model 'a'", str(path), needle])
    assert not (tmp_path / "out").exists()
    gguf_entries = tmp_path / "cache" / "gguf"
    assert not gguf_entries.exists() or not [
        p for p in gguf_entries.iterdir() if not p.name.endswith(".lock")
    ]


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ("mistral", "holds a 'mistral' model, which transformers cannot read from GGUF"),
        ("integers", "stores 1 of the model's weights as integers (blk.0.attn_norm.weight in I32)"),
    ],
)
def test_a_gguf_file_transformers_cannot_dequantise_is_refused_by_plan_and_run(
    llama,
    corpus_txt: Path,
    bert_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: str,
    needle: str,
    dry_run: bool,
    cli,
) -> None:
    """A file declaring ``mistral`` (whose tensors the gguf package has no names for: llama.cpp
    writes Mistral as ``llama``), and a weight stored as integers, which no GGUF dequantiser
    reads: the dry run had planned both, exit 0, and the run failed in transformers' words."""
    import numpy as np

    import gguf_fixtures

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "odd.gguf"
    if change == "mistral":
        write_llama_gguf(*llama, path, architecture="mistral")
    else:
        own = gguf_fixtures._tensors
        integral = {"blk.0.attn_norm.weight": np.ones(32, dtype=np.int32)}
        monkeypatch.setattr(gguf_fixtures, "_tensors", lambda model: {**own(model), **integral})
        write_llama_gguf(*llama, path)
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache"), *(["--dry-run"] if dry_run else [])]
    assert_one_line(*cli(args), ["model 'a'", str(path), needle])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("architecture", ["qwen2moe", "qwen3moe"])
def test_an_architecture_named_as_llama_cpp_names_it_is_read(
    llama,
    corpus_txt: Path,
    bert_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    architecture: str,
    cli,
) -> None:
    """llama.cpp writes Qwen2-MoE as ``qwen2moe``, which transformers reads as ``qwen2_moe``:
    the file had been refused as an architecture transformers cannot read. This one holds a
    Llama's tensors, so the load names the experts it lacks."""
    from lmalgebra.sources.gguf_models import checked_gguf

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    path = write_llama_gguf(*llama, tmp_path / "moe.gguf", architecture=architecture)
    header, config = checked_gguf(path, "model 'a'")
    assert header["architecture"] == architecture
    assert config.model_type == architecture.replace("moe", "_moe")
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache")]
    assert_one_line(*cli(args), ["model 'a'", str(path), "of the model's weights", "experts"])
    assert not (tmp_path / "out").exists()


def _retyped(source: Path, target: Path, model_type: str) -> Path:
    """A copy of ``source`` whose ``config.json`` names ``model_type`` and no architecture."""
    shutil.copytree(source, target)
    config = json.loads((target / "config.json").read_text())
    config.pop("architectures", None)
    (target / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    return target


@pytest.mark.parametrize("dry_run", [True, False])
def test_an_architecture_transformers_cannot_read_is_refused_before_any_work(
    bert_dir: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, dry_run: bool, cli
) -> None:
    odd = _retyped(bert_dir, tmp_path / "odd", "nonsense")
    args = ["decompose", "--models", f"a={odd}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache"), *(["--dry-run"] if dry_run else [])]
    code, stderr = cli(args)
    assert_one_line(code, stderr, ["model 'a'", str(odd), "nonsense"])
    assert not (tmp_path / "out").exists()


def _saved_model(kind: str, bert_dir: Path, target: Path) -> Path:
    """A tiny model of ``kind`` (``t5``: an encoder-decoder; ``vit``: images) with ``bert_dir``'s
    tokenizer beside it."""
    import transformers

    if kind == "t5":
        config: Any = transformers.T5Config(
            vocab_size=128, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8
        )
        model: Any = transformers.T5Model(config)
    else:
        config = transformers.ViTConfig(
            hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
        )
        model = transformers.ViTModel(config)
    model.save_pretrained(target)
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt"):
        if (bert_dir / name).is_file():
            shutil.copy(bert_dir / name, target / name)
    return target


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(
    ("kind", "why"), [("t5", "encoder-decoder"), ("vit", "reads no token ids")]
)
def test_a_model_that_reads_no_text_alone_is_refused_before_any_work(
    kind: str,
    why: str,
    dry_run: bool,
    bert2_dir: Path,
    bert_dir: Path,
    corpus_txt: Path,
    tmp_path: Path,
    cli,
) -> None:
    """An encoder-decoder or a model of images had passed every check, the dry run planning it,
    and the run had stopped in a traceback from its forward pass (``You must specify exactly
    one of input_ids or inputs_embeds``)."""
    odd = _saved_model(kind, bert_dir, tmp_path / kind)
    args = ["decompose", "--models", f"a={odd}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache"), "--no-progress"]
    code, stderr = cli([*args, *(["--dry-run"] if dry_run else [])])
    assert_one_line(code, stderr, ["model 'a'", str(odd), why])
    assert not (tmp_path / "out").exists()


def test_a_teacher_or_init_of_no_causal_architecture_is_refused_from_its_config(
    bert_dir: Path, tmp_path: Path
) -> None:
    from lmalgebra.distill.causal.student_init import open_init
    from lmalgebra.distill.causal.teachers import teacher_tokenizer
    from lmalgebra.distill.student import CausalStudentSpec

    encoder = _retyped(bert_dir, tmp_path / "enc", "distilbert")
    ref = ModelRef(name="enc", path=str(encoder))
    with pytest.raises(UserInputError, match=r"teacher 'enc'.*no causal language model.*distil"):
        teacher_tokenizer(ref, encoder, 5)
    spec = CausalStudentSpec(init=str(encoder))
    with pytest.raises(UserInputError, match=r"student\.init .*no causal language model"):
        open_init(spec, weights=False)


@pytest.mark.parametrize("weights", [True, False])
def test_an_init_that_is_no_model_is_named_as_student_init(
    causal_teacher_dirs: dict[str, Path], tmp_path: Path, weights: bool
) -> None:
    """A missing ``student.init`` directory was named "model 'nothere'" (the name its path
    gives), where a damaged one is named ``student.init``; a directory without weight files the
    same (the dry run, ``weights=False``, does not look for them)."""
    from lmalgebra.distill.causal.student_init import open_init
    from lmalgebra.distill.student import CausalStudentSpec

    missing = tmp_path / "nothere"
    with pytest.raises(UserInputError) as caught:
        open_init(CausalStudentSpec(init=str(missing)), weights=weights)
    assert str(caught.value) == f"student.init {str(missing)!r}: directory {missing} does not exist"
    bare = tmp_path / "bare"
    shutil.copytree(next(iter(causal_teacher_dirs.values())), bare)
    for path in bare.glob("*.safetensors"):
        path.unlink()
    if weights:
        with pytest.raises(UserInputError, match=rf"^student\.init {re.escape(repr(str(bare)))}:"):
            open_init(CausalStudentSpec(init=str(bare)), weights=weights)


def _with_tokenizer_of(model: Path, other: Path, target: Path) -> Path:
    """A copy of ``model`` whose tokenizer files are ``other``'s."""
    shutil.copytree(model, target)
    for found in target.glob("tokenizer*"):
        found.unlink()
    for found in other.glob("tokenizer*"):
        shutil.copy(found, target / found.name)
    return target


def test_a_tokenizer_of_another_model_is_named_not_an_index_error(
    bert_dir: Path, bert2_dir: Path, gpt2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A BERT directory holding a GPT-2 tokenizer (ids up to 299, 200 rows of token
    embeddings): embedding it, or tagging with it, ended in torch's ``IndexError: index out
    of range in self`` traceback, exit 1; then it was refused once a span reached an id past
    the table, and the dry run passed it. The tokenizer's size is compared with the table's,
    by the dry run too."""
    mixed = _with_tokenizer_of(bert_dir, gpt2_dir, tmp_path / "mixed")
    words = ["model 'a'", "the tokenizer has 300 tokens", "beyond the 200 rows", "own tokenizer"]
    args = ["decompose", "--models", f"a={mixed}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    for flags in (["--dry-run"], []):
        code, stderr = cli([*args, "--cache_dir", str(tmp_path / "cache"), *flags])
        assert_one_line(code, stderr, words)
    bank = tmp_path / "bank"
    bank.mkdir()
    sentence = "1\tthe\t_\tDET\t_\t_\t_\t_\t_\t_\n2\tcat\t_\tNOUN\t_\t_\t_\t_\t_\t_\n\n"
    for split in ("train", "dev", "test"):
        (bank / f"tiny-ud-{split}.conllu").write_text(sentence * 4, encoding="utf-8")
    for mode in ("probe", "finetune"):
        out = tmp_path / f"pos-{mode}"
        code, stderr = cli(
            [
                *["evaluate-pos", str(bank), "--models", f"a={mixed}", "--mode", mode],
                *["--epochs", "1", "--out", str(out)],
            ]
        )
        assert_one_line(code, stderr, words)


@pytest.mark.parametrize("objective", ["masked", "causal"])
def test_a_teacher_or_scored_model_with_another_models_tokenizer_is_named(
    objective: str,
    teacher_dirs: dict[str, Path],
    causal_teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """A teacher whose tokenizer files are another teacher's (ids past its token embeddings):
    ``merge teach`` ended in torch's ``IndexError`` traceback, and so did ``merge
    bits-per-byte`` of such a causal LM."""
    import yaml

    from causal_fixtures import write_causal_recipe
    from merge_fixtures import write_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    if objective == "masked":  # BERT of 200 rows, RoBERTa's tokenizer of 260 tokens
        mixed = _with_tokenizer_of(teacher_dirs["wp"], teacher_dirs["sp"], tmp_path / "mixed")
        recipe = write_recipe(tmp_path, {**teacher_dirs, "wp": mixed})
        name = "wp"
    else:  # a unigram model of 286 rows, a byte-level tokenizer of 300
        teachers = causal_teacher_dirs
        mixed = _with_tokenizer_of(teachers["uni"], teachers["bl"], tmp_path / "mixed")
        recipe = write_causal_recipe(tmp_path, {**teachers, "uni": mixed})
        name = "uni"
    words = [f"teacher {name!r}", "the tokenizer has", "own tokenizer"]
    code, stderr = cli(["merge", "run", str(recipe), "--no-progress"])
    assert_one_line(code, stderr, words)
    if objective == "causal":  # scored over a run of the teachers as they are
        (tmp_path / "good").mkdir()
        good = write_causal_recipe(tmp_path / "good", teachers)
        assert cli(["merge", "prepare", str(good), "--no-progress"])[0] == 0
        run = yaml.safe_load(good.read_text())["output_dir"]
        args = ["merge", "bits-per-byte", run, "--models", f"x={mixed}", "--languages", "xx"]
        code, stderr = cli(args)
        assert_one_line(code, stderr, ["model 'x'", "the tokenizer has 300 tokens"])


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_student_init_with_another_models_tokenizer_is_named(
    dry_run: bool,
    causal_teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``student.init`` a causal LM of 286 rows beside a byte-level tokenizer of 300: training
    ended in torch's ``IndexError`` traceback, and its dry run planned it, exit 0."""
    from causal_fixtures import write_causal_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    teachers = causal_teacher_dirs
    mixed = _with_tokenizer_of(teachers["uni"], teachers["bl"], tmp_path / "mixed")
    training = {"steps": 1, "batch_size": 2, "warmup_steps": 1}
    recipe = write_causal_recipe(
        tmp_path, teachers, student={"init": str(mixed)}, training=training
    )
    code, stderr = cli(["merge", "run", str(recipe), "--no-progress"])  # the store, built
    assert code == 0, stderr
    args = ["merge", "train", str(recipe), "--no-progress"] + (["--dry-run"] if dry_run else [])
    code, stderr = cli(args)
    words = [f"student.init {str(mixed)!r}", "the tokenizer has 300 tokens", "own tokenizer"]
    assert_one_line(code, stderr, words)


def _saved(model: Any, tokenizer: Any, directory: Path, **save: Any) -> Path:
    model.save_pretrained(directory, **save)
    tokenizer.save_pretrained(directory)
    return directory


def _drop_from_shards(directory: Path, suffix: str) -> str:
    """Remove the tensor whose name ends with ``suffix`` from whichever shard holds it."""
    for path in sorted(directory.glob("*.safetensors")):
        tensors = load_file(path)
        found = [key for key in tensors if key.endswith(suffix)]
        if found:
            del tensors[found[0]]
            save_file(tensors, str(path), metadata={"format": "pt"})
            return found[0]
    raise AssertionError(f"no tensor ends with {suffix}")


@pytest.mark.parametrize("role", ["student.init", "teacher"])
def test_a_causal_lm_missing_a_weight_is_refused_by_the_dry_run_naming_it(
    llama,
    causal_teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    role: str,
    cli,
) -> None:
    """A ``student.init`` (or a teacher) whose safetensors file lacks a weight: the dry run had
    printed its plan, exit 0, and training refused it. The dry run now refuses it in training's
    words from the file's header, the weights unread; a whole model, a sharded one, one whose
    tied ``lm_head`` is absent from its file and one saved as the bare model all pass it."""
    from safetensors import safe_open

    from causal_fixtures import write_causal_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    model, tokenizer = llama
    whole = _saved(model, tokenizer, tmp_path / "lm")
    with safe_open(str(whole / "model.safetensors"), "pt") as handle:
        assert "lm_head.weight" not in handle.keys()  # noqa: SIM118 (tied: not in the file)
    sharded = _saved(model, tokenizer, tmp_path / "sharded", max_shard_size="20KB")
    assert (sharded / "model.safetensors.index.json").is_file()
    bare = _saved(model.model, tokenizer, tmp_path / "bare")  # names without "model."
    config = json.loads((whole / "config.json").read_text())
    (bare / "config.json").write_text(json.dumps(config))  # a causal LM's configuration

    def dry_run(directory: Path) -> tuple[int, str]:
        teachers = dict(causal_teacher_dirs)
        if role == "teacher":
            teachers["bl"] = directory
            student: dict[str, Any] = {"tokenizer": "uni"}
        else:
            student = {"init": str(directory)}
        root = tmp_path / f"recipe-{directory.name}"
        root.mkdir(exist_ok=True)
        short = {"example_bytes": 60, "samples": 4, "sample_seed": 7}  # the 64 positions'
        recipe = write_causal_recipe(root, teachers, student=student, causal=short)
        return cli(["merge", "run", str(recipe), "--dry-run", "--no-progress"])

    for intact in (whole, sharded, bare):
        code, stderr = dry_run(intact)
        assert code == 0, stderr
    owner = f"student.init {str(whole)!r}" if role == "student.init" else "teacher 'bl'"
    for directory in (whole, sharded):
        dropped = _drop_from_shards(directory, "layers.1.mlp.up_proj.weight")
        code, stderr = dry_run(directory)
        owner = owner.replace(str(whole), str(directory))
        assert_one_line(code, stderr, [owner, f"{directory} lacks 1 of the model's", dropped])
        assert not (tmp_path / f"recipe-{directory.name}" / "run").exists()
    dropped = _drop_from_shards(bare, "embed_tokens.weight")  # the tied pair, both gone
    code, stderr = dry_run(bare)
    assert_one_line(code, stderr, [str(bare), "lacks 2 of the model's", "lm_head.weight"])


def test_a_model_to_embed_or_masked_teacher_missing_a_weight_is_refused_by_the_dry_run(
    bert_copy: Path,
    bert2_dir: Path,
    corpus_txt: Path,
    teacher_dirs: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    cli,
) -> None:
    """``decompose --dry-run`` and the masked ``merge run --dry-run`` planned a model whose file
    lacks a weight, exit 0: both refuse it as the run does."""
    from merge_fixtures import write_recipe

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    _edit_weights(bert_copy, drop=DROPPED)
    args = ["decompose", "--models", f"a={bert_copy}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out"), "--dry-run"]
    code, stderr = cli([*args, "--cache_dir", str(tmp_path / "cache")])
    assert_one_line(code, stderr, ["model 'a'", f"{bert_copy} lacks 1", DROPPED])
    assert not (tmp_path / "out").exists()
    teacher = Path(shutil.copytree(teacher_dirs["sp"], tmp_path / "sp"))
    recipe = write_recipe(tmp_path, {**teacher_dirs, "sp": teacher})
    code, stderr = cli(["merge", "run", str(recipe), "--dry-run", "--no-progress"])
    assert code == 0, stderr
    _edit_weights(teacher, drop="encoder.layer.1.output.dense.weight")
    code, stderr = cli(["merge", "run", str(recipe), "--dry-run", "--no-progress"])
    assert_one_line(code, stderr, ["teacher 'sp'", "lacks 1", "encoder.layer.1.output.dense"])


def test_a_sharded_checkpoint_missing_a_shard_or_an_unreadable_header_is_refused_by_the_plan(
    llama, tmp_path: Path
) -> None:
    """An index naming a shard that is gone, or a file whose header safetensors cannot read:
    the dry run had passed both (the header check gave up), and training failed in
    transformers' words. Both are refused from the files, naming the file, before any weights
    are read; the load names ``student.init`` as given, as the plan does."""
    from lmalgebra.distill.causal.student_init import InitModel, init_student, open_init
    from lmalgebra.distill.student import CausalStudentSpec

    model, tokenizer = llama
    sharded = _saved(model, tokenizer, tmp_path / "sharded", max_shard_size="20KB")
    gone = sorted(sharded.glob("model-0*.safetensors"))[1]
    gone.unlink()
    with pytest.raises(UserInputError) as caught:
        open_init(CausalStudentSpec(init=str(sharded)), weights=False)
    said = str(caught.value)
    assert said.startswith(f"student.init {str(sharded)!r}: ") and gone.name in said, said
    assert "index.json names 1 weight files that are not in" in said
    garbled = _saved(model, tokenizer, tmp_path / "garbled")
    (garbled / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(UserInputError, match=r"garbled/model\.safetensors is damaged: safet"):
        open_init(CausalStudentSpec(init=str(garbled)), weights=False)
    lacking = _saved(model, tokenizer, tmp_path / "lacking")
    _edit_weights(lacking, drop="layers.1.mlp.up_proj.weight")
    init = InitModel(str(lacking), ModelRef.parse(str(lacking)), lacking, 2, None, {})
    with pytest.raises(UserInputError, match=rf"^student\.init {re.escape(repr(str(lacking)))}:"):
        init_student(init)


@pytest.mark.parametrize("shard", ["", "../elsewhere/model-00001-of-00001.safetensors"])
def test_an_index_naming_no_weight_file_is_refused_by_the_plan_and_the_load(
    shard: str, bert_copy: Path, bert2_dir: Path, corpus_txt: Path, tmp_path: Path, cli
) -> None:
    """A sharded checkpoint's index whose ``weight_map`` is empty, beside a shard: the dry run
    had planned it, exit 0, and the run ended in transformers' ``list index out of range``.
    One naming a shard outside the model's directory, which transformers refuses to load, is
    named as such (its shard is no file of the model, to be hashed with it)."""
    weights = bert_copy / "model.safetensors"
    index = bert_copy / "model.safetensors.index.json"
    if shard:
        (tmp_path / "elsewhere").mkdir()
        names = load_file(weights)
        weights.rename(tmp_path / "elsewhere" / "model-00001-of-00001.safetensors")
        index.write_text(json.dumps({"weight_map": dict.fromkeys(names, shard)}))
        said = ["model 'a'", str(index), "names 1 weight files outside", shard]
    else:
        weights.rename(bert_copy / "model-00001-of-00001.safetensors")
        index.write_text(json.dumps({"metadata": {}, "weight_map": {}}))
        said = ["model 'a'", str(index), "names no weight file"]
    args = ["decompose", "--models", f"a={bert_copy}", "--models", f"b={bert2_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache")]
    for dry_run in (["--dry-run"], []):
        assert_one_line(*cli([*args, *dry_run]), said)
        assert not (tmp_path / "out").exists()


def test_a_tensor_two_shards_hold_is_refused_by_the_plan_and_the_load(
    llama, tmp_path: Path
) -> None:
    """A sharded checkpoint whose first shard also holds a copy (other values) of a tensor the
    index maps to another: transformers loads the later file's, the index's choice aside, and
    the plan and the load had passed it. Both refuse it, naming the two files and the tensor."""
    import torch

    from lmalgebra.distill.causal.student_init import InitModel, init_student, open_init
    from lmalgebra.distill.student import CausalStudentSpec

    model, tokenizer = llama
    sharded = _saved(model, tokenizer, tmp_path / "sharded", max_shard_size="20KB")
    first, *_, last = sorted(sharded.glob("model-0*.safetensors"))
    key = sorted(load_file(last))[0]
    tensors = load_file(first)
    tensors[key] = torch.zeros_like(load_file(last)[key])
    save_file(tensors, str(first), metadata={"format": "pt"})
    said = [last.name, first.name, key, "transformers would load one"]
    with pytest.raises(UserInputError) as caught:
        open_init(CausalStudentSpec(init=str(sharded)), weights=False)
    assert all(s in str(caught.value) for s in said), caught.value
    init = InitModel(str(sharded), ModelRef.parse(str(sharded)), sharded, 2, None, {})
    with pytest.raises(UserInputError) as caught:
        init_student(init)
    assert all(s in str(caught.value) for s in said), caught.value


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(
    ("drop", "architecture", "needle"),
    [
        ((), "gpt2", ""),
        (("blk.1.ffn_down.weight",), "gpt2", "(transformer.h.1.mlp.c_proj.weight)"),
        ((), "llama-as-gpt2", "lacks 16 of the weights of the 'gpt2' model it declares"),
    ],
)
def test_a_gpt2_gguf_file_is_checked_from_its_header_by_plan_and_run(
    llama,
    corpus_txt: Path,
    bert_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    drop: tuple[str, ...],
    architecture: str,
    needle: str,
    dry_run: bool,
    cli,
) -> None:
    """A GGUF file declaring ``gpt2`` had been left to the check of the loaded model, which the
    dry run never makes: a file lacking a weight, or holding another model's tensors, was
    planned, then refused by the run."""
    from gguf_fixtures import write_gpt2_gguf

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    path = tmp_path / "g.gguf"
    if architecture == "gpt2":
        write_gpt2_gguf(llama[1], path, drop=drop)
    else:
        write_llama_gguf(*llama, path, architecture="gpt2")
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={bert_dir}"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    args += ["--cache_dir", str(tmp_path / "cache"), *(["--dry-run"] if dry_run else [])]
    code, stderr = cli(args)
    if not needle:
        assert code == 0, stderr
        return
    assert_one_line(code, stderr, ["model 'a'", str(path), needle])
    assert not (tmp_path / "out").exists()


def _with_nan(directory: Path) -> str:
    """Put a NaN into one weight of ``directory``'s ``model.safetensors``; returns its name."""
    path = directory / "model.safetensors"
    tensors = load_file(path)
    name = next(key for key in sorted(tensors) if key.endswith("norm.weight"))
    tensors[name][0] = float("nan")
    save_file(tensors, str(path), metadata={"format": "pt"})
    return name


@pytest.mark.parametrize("role", ["model", "teacher", "student.init", "gguf"])
def test_a_weight_holding_nan_is_refused_wherever_weights_are_read(
    llama, tmp_path: Path, role: str
) -> None:
    """A teacher whose weights held a NaN had crashed the store's first forward pass with a
    traceback, a ``student.init`` stopped training at step 1 as if the learning rate were too
    high, and a model to embed failed on its embeddings; a GGUF file is named as given, not by
    its dequantised model in the cache."""
    model, tokenizer = llama
    model.save_pretrained(tmp_path / "lm")
    tokenizer.save_pretrained(tmp_path / "lm")
    name = _with_nan(tmp_path / "lm")
    given = f"gguf:{tmp_path / 'lm.gguf'}" if role == "gguf" else str(tmp_path / "lm")
    ref = ModelRef(name="lm", path=given)
    needle = f"'lm': {re.escape(given)} holds NaN or inf .*{re.escape(name.removeprefix('model.'))}"
    with pytest.raises(UserInputError, match=needle) as caught:
        if role == "model":
            source_of(ref, tmp_path / "lm").load()
        else:
            load_lm(ref, tmp_path / "lm", "causal", role="teacher" if role == "gguf" else role)
    assert "\n" not in str(caught.value)


def test_a_gguf_file_holding_nan_is_refused_and_not_cached(
    llama, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import numpy as np

    import gguf_fixtures

    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    own = gguf_fixtures._tensors

    def with_nan(model: Any) -> dict[str, np.ndarray]:
        tensors = own(model)
        tensors["output_norm.weight"] = np.full(32, np.nan, dtype=np.float32)
        return tensors

    gguf_fixtures._tensors = with_nan
    try:
        path = write_llama_gguf(*llama, tmp_path / "nan.gguf")
    finally:
        gguf_fixtures._tensors = own
    with pytest.raises(UserInputError, match=r"nan\.gguf holds NaN or inf .*model\.norm\.weight"):
        ModelRef.parse(f"gguf:{path}").source.resolve()
    assert not (tmp_path / "cache").exists()
    (tmp_path / "cache" / "gguf").mkdir(parents=True)  # a cache in use keeps its gguf/
    with pytest.raises(UserInputError, match=r"nan\.gguf holds NaN or inf"):
        ModelRef.parse(f"gguf:{path}").source.resolve()
    built = [p for p in (tmp_path / "cache" / "gguf").iterdir() if not p.name.endswith(".lock")]
    assert built == []


def test_a_nan_past_the_first_slice_of_a_weight_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights are read for NaN or inf in slices (no mask of a whole embedding table)."""
    from lmalgebra.sources import loaded_weights

    monkeypatch.setattr(loaded_weights, "FINITE_SLICE", 4)
    model = torch.nn.Linear(3, 5)
    with torch.no_grad():
        model.weight[4, 2] = float("inf")
    assert loaded_weights._non_finite_weights(model) == {"weight"}
    with torch.no_grad():
        model.weight[4, 2] = 0.0
    assert loaded_weights._non_finite_weights(model) == set()


def test_a_pad_token_past_the_embedding_table_pads_with_a_row_of_it(
    gpt2_dir: Path, tmp_path: Path
) -> None:
    """A pad token added to the tokenizer alone (its id one past the model's rows) had ended
    the first padded batch in torch's ``IndexError: index out of range in self``: padded
    positions are masked, so a row of the table fills them and the vectors are those of the
    model without that pad token."""
    from transformers import AutoTokenizer

    from lmalgebra.sources.embed import embed
    from lmalgebra.sources.embed_spec import EmbedSpec

    padded = Path(shutil.copytree(gpt2_dir, tmp_path / "gpt2"))
    tokenizer = AutoTokenizer.from_pretrained(padded)
    tokenizer.add_special_tokens({"pad_token": "<pad>"})
    tokenizer.save_pretrained(padded)
    source = source_of(ModelRef(name="g", path=str(padded)), padded)
    assert source.load_tokenizer().pad_token_id == source.load().config.vocab_size
    texts = ["the old city", "a river", "the new king of the north"]
    got, _ = source.embed(texts, EmbedSpec())
    plain = source_of(ModelRef(name="g", path=str(gpt2_dir)), gpt2_dir)
    want, _ = embed(texts, plain.load(), plain.load_tokenizer(), EmbedSpec())
    assert (got == want).all()


def _mapped(directory: Path, auto_map: dict[str, str]) -> Path:
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    (directory / "config.json").write_text(json.dumps({**config, "auto_map": auto_map}))
    return directory


def test_a_model_shipping_its_own_code_is_refused_without_trust_remote_code(
    bert_copy: Path, teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A configuration of a built-in ``model_type`` whose ``auto_map`` names the model's own
    class: without ``trust_remote_code`` transformers had built its own class in its place and
    the run went on (exit 0), the model's code never run. Refused for a model to embed (plan and
    run) and a teacher, naming the class; an ``auto_map`` of other auto classes alone passes."""
    _mapped(bert_copy, {"AutoModel": "modeling_my.MyBert"})
    ref = ModelRef(name="enc", path=str(bert_copy))
    needle = r"model 'enc': .* ships its own code for AutoModel \(modeling_my\.MyBert.*'bert'"
    with pytest.raises(UserInputError, match=needle):
        source_of(ref, bert_copy, weights=False).check_architecture(remember=False)
    from lmalgebra.distill.pretrain.head_only import encoder_with_new_head

    with pytest.raises(UserInputError, match=r"encoder .* ships its own code for AutoModel"):
        encoder_with_new_head(ModelRef.parse(str(bert_copy)), bert_copy, 0)
    teacher = _mapped(
        Path(shutil.copytree(teacher_dirs["wp"], tmp_path / "wp")),
        {"AutoModelForMaskedLM": "modeling_my.MyBertForMaskedLM"},
    )
    with pytest.raises(UserInputError, match=r"teacher 'wp': .* for AutoModelForMaskedLM"):
        load_lm(ModelRef(name="wp", path=str(teacher)), teacher, "masked")
    _mapped(bert_copy, {"AutoModelForSequenceClassification": "modeling_my.Other"})
    source_of(ref, bert_copy, weights=False).check_architecture(remember=False)


def test_a_weight_file_this_user_may_not_read_is_named_so(
    bert_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A weight file another user owns (safetensors writes them 0600) had been called damaged,
    "safetensors cannot read its header (No such file or directory ...)": its permission is
    named."""
    opened = Path.open

    def denied(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "model.safetensors":
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)

    monkeypatch.setattr(Path, "open", denied)
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=r"model 'enc': cannot read .*safetensors: Permission"):
        source_of(ref, bert_copy, weights=False).check_architecture(remember=False)


def test_a_directory_without_weights_or_with_a_damaged_bin_file_is_named(
    bert_copy: Path,
) -> None:
    """A model directory holding no weight file passed the dry run (the run refused it); a
    ``pytorch_model.bin`` that is no tensor file was refused in torch's words, advising to load
    it again with ``weights_only=False``, which would run whatever code a pickle holds."""
    (bert_copy / "model.safetensors").unlink()
    ref = ModelRef(name="enc", path=str(bert_copy))
    with pytest.raises(UserInputError, match=r"model 'enc': no weight files in .*bert$"):
        source_of(ref, bert_copy, weights=False).check_architecture(remember=False)
    (bert_copy / "pytorch_model.bin").write_bytes(b"not a tensor file\n")
    with pytest.raises(UserInputError) as caught:
        source_of(ref, bert_copy).load()
    assert "damaged, or a pickle" in str(caught.value)
    assert "weights_only" not in str(caught.value)


def test_a_start_token_past_the_table_is_named_not_an_index_error(
    causal_teacher_dirs: dict[str, Path], tmp_path: Path
) -> None:
    """A causal LM whose tokenizer got a beginning-of-sequence token without a row for it (the
    start token every input begins with) had ended ``merge teach`` and ``merge bits-per-byte``
    in torch's ``IndexError`` traceback: it is refused naming the model and the id."""
    from transformers import AutoTokenizer

    from lmalgebra.distill.causal.bits_per_byte import score_texts

    directory = Path(shutil.copytree(causal_teacher_dirs["bl"], tmp_path / "bl"))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    tokenizer.add_special_tokens({"bos_token": "<newbos>"})
    ref = ModelRef(name="bl", path=str(directory))
    model = load_lm(ref, directory, "causal")
    with pytest.raises(UserInputError, match=r"^model 'bl': the tokenizer gives token id 300, b"):
        score_texts(model, tokenizer, ["the old city"], 32, owner="model 'bl'")


@pytest.mark.parametrize("name", ["model.safetensors", "model.safetensors.index.json"])
def test_a_weight_file_or_index_that_is_no_file_is_named_by_plan_and_run(
    bert_copy: Path, name: str
) -> None:
    """``model.safetensors`` a link to nothing had been called "no weight files"; an index
    that is a directory passed the plan and the load said "no file named model.safetensors":
    each is named, as it stands, by the plan and the run."""
    (bert_copy / "model.safetensors").unlink()
    if name == "model.safetensors":
        (bert_copy / name).symlink_to(bert_copy / "gone.safetensors")
        said = "is a symbolic link to .*gone.safetensors, which does not exist"
    else:
        (bert_copy / "model-00001-of-00001.safetensors").write_bytes(b"")
        (bert_copy / name).mkdir()
        said = "is a directory, not a file"
    ref = ModelRef(name="enc", path=str(bert_copy))
    needle = rf"^model 'enc': weight file .*{re.escape(name)} {said}$"
    with pytest.raises(UserInputError, match=needle):
        source_of(ref, bert_copy, weights=False).check_architecture(remember=False)
    with pytest.raises(UserInputError, match=needle):
        source_of(ref, bert_copy).fingerprint()
