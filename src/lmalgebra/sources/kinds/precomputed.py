"""Precomputed span embeddings: a ``.npy``, ``.parquet`` or ``.safetensors`` file of vectors, one
per span of the run (``precomputed:FILE``), checked against the run's spans when read."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.sources.model_files import ModelShape, memoised_hash
from lmalgebra.sources.model_source import ReferencedModel
from lmalgebra.sources.precomputed import SUFFIXES, PrecomputedSplit, file_shape, load_precomputed


class PrecomputedFile(ReferencedModel):
    """A file of vectors: no tokenizer, no network, no layers; its rows are the embeddings."""

    prefix: ClassVar[str | None] = "precomputed:"
    suffixes: ClassVar[tuple[str, ...]] = SUFFIXES
    options: ClassVar[tuple[str, ...]] = ("unchecked_order",)
    has_tokenizer: ClassVar[bool] = False
    cached: ClassVar[bool] = False
    fixed_spans: ClassVar[bool] = True
    what: ClassVar[str] = "a file of precomputed embeddings"

    def resolve(self, weights: bool = True) -> Path:
        path = self.local_file("embeddings file")
        if not path.is_file() or path.suffix.lower() not in SUFFIXES:
            raise UserInputError(
                f"model {self.name!r}: {path} is not a file of embeddings ({', '.join(SUFFIXES)})"
            )
        return path

    def load_tokenizer(self) -> Any:
        raise UserInputError(f"model {self.name!r} is a precomputed embeddings file: no tokenizer")

    def load(
        self, device: str = "cpu", weights_dtype: str = "float32", device_map: str | None = None
    ) -> Any:
        raise UserInputError(f"model {self.name!r} is a file of precomputed embeddings: no network")

    def depth(self) -> int:
        raise UserInputError(f"model {self.name!r} is a precomputed embeddings file: no layers")

    def rows(self, texts: Mapping[str, list[str]], order: str) -> dict[str, PrecomputedSplit]:
        found = load_precomputed(self.name, self.directory, texts, self.ref.unchecked_order, order)
        return found.splits

    def span_rows(self) -> int:
        """Its rows, one per span of the run, read from the file's header."""
        return file_shape(self.name, self.planning_path())[0]

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        return {
            "weights": memoised_hash([self.directory], self.directory.parent, memo_dir),
            "tokenizer": sha256_json(None),
            "config": sha256_json({"kind": "precomputed"}),
        }

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        return self._shape(file_shape(self.name, self.planning_path())[1])
