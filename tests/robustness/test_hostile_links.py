"""A symbolic link to nothing, given where a model, tokenizer, corpus or output goes, is named as
such: not "a file", and not taken for a Hugging Face hub id to download."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.text_files import require_file
from lmalgebra.sources.corpus import CorpusSpec, read_documents
from lmalgebra.sources.models import ModelRef
from lmalgebra.sources.tokenizers import resolve_tokenizer
from lmalgebra.storage.output_paths import check_directory

LINKED = "which does not exist"


@pytest.fixture
def link(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``models/bert`` (relative: it reads as a hub id too), a link to a path that is gone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    made = Path("models/bert")
    made.symlink_to(tmp_path / "gone")
    return made


def test_a_model_or_tokenizer_behind_a_dangling_link_is_no_hub_id(link: Path) -> None:
    with pytest.raises(UserInputError, match=f"model 'bert': models/bert .*gone, {LINKED}"):
        ModelRef.parse(str(link)).source.resolve()
    with pytest.raises(UserInputError, match=f"tokenizer models/bert .*{LINKED}"):
        resolve_tokenizer(str(link), "student")
    with pytest.raises(UserInputError, match=f"GGUF file models/bert .*{LINKED}"):
        ModelRef.parse(f"gguf:{link}").source.resolve()


def test_a_dangling_link_is_not_called_a_file(link: Path) -> None:
    with pytest.raises(UserInputError, match=f"output directory models/bert .*{LINKED}"):
        check_directory(link)
    with pytest.raises(UserInputError, match=f"corpus models/bert .*{LINKED}"):
        read_documents(CorpusSpec(paths=[str(link)]))
    with pytest.raises(UserInputError, match=f"recipe models/bert .*{LINKED}"):
        require_file(link, "recipe")
