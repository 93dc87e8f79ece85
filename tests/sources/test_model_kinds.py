"""A kind of model is one class registered by kind: one defined here, registered at test time in
the registry alone, is parsed, planned, fingerprinted, embedded and decomposed like the others."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

import lmalgebra
from lmalgebra import UserInputError, decompose
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.sources.embed_spec import EmbedSpec, TokenReport
from lmalgebra.sources.kinds import KINDS
from lmalgebra.sources.model_files import ModelShape
from lmalgebra.sources.model_source import ReferencedModel
from lmalgebra.sources.models import ModelRef
from tiny import documents

WIDTH = 6
SPANS = {"length": 8, "counts": (60, 20, 20)}


class RandomVectors(ReferencedModel):
    """``toy:DIRECTORY``: the tokenizer in DIRECTORY cuts the spans (loaded as any referenced
    model's is), and each span's vector is drawn from a generator seeded by its text: the same
    every run, related to no model."""

    prefix: ClassVar[str | None] = "toy:"
    what: ClassVar[str] = "a toy model"
    embedded: ClassVar[list[int]] = []  # spans embedded, over every instance

    def resolve(self, weights: bool = True) -> Path:
        return Path(self.ref.path)

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        self.embedded.append(len(texts))
        seeds = [list(hashlib.sha256(text.encode()).digest()) for text in texts]
        rows = [np.random.default_rng(seed).standard_normal(WIDTH) for seed in seeds]
        return np.asarray(rows, np.float32).reshape(-1, WIDTH), TokenReport(0.0, 0, len(texts))

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        return {
            "weights": sha256_json({"toy": WIDTH}),
            "tokenizer": sha256_json(str(self.directory)),
            "config": sha256_json({"kind": "toy"}),
        }

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        return self._shape(WIDTH)


@pytest.fixture
def toy_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(KINDS, "toy", RandomVectors)
    monkeypatch.setattr(RandomVectors, "embedded", [])


def test_a_registered_kind_is_parsed_by_its_prefix_and_checked_like_the_others(
    toy_kind: None, bert_dir: Path
) -> None:
    ref = ModelRef.parse(f"toy:{bert_dir}")
    assert (ref.kind, ref.path, ref.name) == ("toy", str(bert_dir), bert_dir.name)
    assert isinstance(ref.source, RandomVectors)
    assert ModelRef(name="r", path=f"toy:{bert_dir}").kind == "toy"
    with pytest.raises(UserInputError, match="random_init does not apply to a toy model"):
        ModelRef(name="r", path=str(bert_dir), kind="toy", random_init=True)


def test_an_unregistered_kind_is_refused_naming_the_kinds(toy_kind: None) -> None:
    with pytest.raises(Exception, match="'transformers', 'onnx', 'precomputed', 'memory' or 'toy'"):
        ModelRef(name="r", path="/x", kind="other")


def test_a_registered_kind_is_planned_and_decomposed(
    toy_kind: None, bert_dir: Path, tmp_path: Path
) -> None:
    models = {"a": str(bert_dir), "r": f"toy:{bert_dir}"}
    texts, cache = documents(120), tmp_path / "cache"
    plan = lmalgebra.decompose_plan(models, texts, timed=False, spans=SPANS, cache_dir=cache)
    assert RandomVectors.embedded == []  # a plan embeds nothing
    assert plan.attrs["models"].set_index("model").loc["r", "width"] == WIDTH
    result = decompose(models, texts, spans=SPANS, cache_dir=cache, progress=False)
    assert sum(RandomVectors.embedded) == 100  # every span once
    assert result.names == ["a", "r"]
    assert result.config["models"][1]["kind"] == "toy"
    assert result.pairwise().loc["r", "a"] < 0.5  # random vectors: not a model's
    again = decompose(models, texts, spans=SPANS, cache_dir=cache, progress=False)
    assert sum(RandomVectors.embedded) == 100  # read back from the embedding cache
    assert again.pairwise().loc["r", "a"] == pytest.approx(result.pairwise().loc["r", "a"])


def test_no_module_outside_the_kinds_tests_a_model_kind_by_name() -> None:
    """A model's kind is looked up once, where its reference is parsed; everything else asks the
    source's class attributes, so a new kind needs no branch elsewhere."""
    kinds = "|".join(KINDS)
    compared = re.compile(rf'(==|!=) *"({kinds})"|"({kinds})" *(==|!=)')
    src = Path(lmalgebra.__file__).parent
    allowed = {src / "sources" / "models.py", src / "sources" / "model_source.py"}
    found = [
        f"{path.relative_to(src)}:{number}"
        for path in sorted(src.rglob("*.py"))
        if path.parent != src / "sources" / "kinds" and path not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if compared.search(line)
    ]
    assert found == []


@pytest.mark.parametrize("text", [" ", "x= ", "random: "])
def test_a_reference_of_blanks_names_no_path(text: str) -> None:
    """A reference of blanks alone (``--models " "``) had been refused as a model name ``' '``
    (``key 'name'``), the name made from the path it does not give."""
    with pytest.raises(UserInputError, match=r"names no path or hub id$"):
        ModelRef.parse(text)


@pytest.mark.parametrize(
    "family", ["Bert", "DebertaV2", "XLMRoberta", "Albert", "T5", "GPT2", "Llama", "Gemma"]
)
def test_every_vocabulary_file_transformers_reads_is_a_tokenizer_file(family: str) -> None:
    """The files of a tokenizer that transformers reads (its class's ``vocab_files_names``)
    are hashed into the model's identity and fetched for a plan: DeBERTa's ``spm.model`` had
    been left out, so an edit of it went unseen."""
    import transformers

    from lmalgebra.sources.tokenizers import TOKENIZER_FILES

    names = getattr(transformers, f"{family}Tokenizer").vocab_files_names.values()
    assert set(names) <= set(TOKENIZER_FILES)
