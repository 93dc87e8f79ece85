"""What every model of a run answers, whatever its kind: the protocol of a model source.

A model reaches a run named by a reference (a recipe entry, a command-line flag; its kind's class
is registered in :mod:`lmalgebra.sources.kinds`) or as a Python object handed to
``lmalgebra.decompose()`` (:mod:`lmalgebra.sources.kinds.python_objects`). Either way it answers
the same questions: what a dry run needs without its weights (whether it has a tokenizer, its
sizes: :meth:`ModelSource.shape`), its fingerprint, then its tokenizer, depth and embeddings of
spans (computed, or :meth:`ModelSource.rows` it holds already). Nothing else tests a kind.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import ConfigDict, Field, field_validator
from pydantic_core import PydanticCustomError
from typing_extensions import Self

from lmalgebra.core.errors import MODEL_NAMING, UserInputError, counted
from lmalgebra.core.remote_code import announce_remote_code
from lmalgebra.core.settings import PathText, Settings, home_expanded
from lmalgebra.core.text_files import absent, unencodable
from lmalgebra.sources.embed_spec import EmbedSpec, TokenReport
from lmalgebra.sources.model_files import ModelShape, memoised_hash
from lmalgebra.sources.packaged import PACKAGE_PREFIX, asset_path
from lmalgebra.sources.tokenizers import TOKENIZER_FILES, fast_tokenizer

if TYPE_CHECKING:
    import numpy as np

    from lmalgebra.sources.precomputed import PrecomputedSplit


# what joins the names of a basis of several models: fits.csv's ``basis`` column, and a flag's
# list (``--basis a,b``) and the weights file's metadata
BASIS_JOINERS = ("+", ",")
# the target of group_r2.csv's last row, the mean over the models: the name of no model
GROUP_MEAN = "mean"


class ModelFields(Settings):
    """What a model reference says (``ModelRef`` parses and checks it against its kind)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Short name used in tables and file names.")
    path: PathText = Field(
        description="Hugging Face hub id, local model directory, package:NAME (packaged model) "
        "or gguf:FILE (a GGUF file, dequantised once into the cache)."
    )
    revision: str | None = Field(default=None, description="Hub revision (branch, tag or commit).")
    random_init: bool = Field(
        default=False,
        description="Use the architecture with freshly initialised weights (a null baseline).",
    )
    seed: int = Field(default=0, description="Seed of the random initialisation.")
    trust_remote_code: bool = Field(
        default=False, description="Allow code shipped with the model to run (off unless asked)."
    )
    kind: str = Field(
        default="transformers",
        description="transformers: a Hugging Face model; onnx: an ONNX encoder file run with "
        "onnxruntime; precomputed: a .npy/.parquet/.safetensors file of span embeddings; "
        "memory: a Python object given to lmalgebra.decompose() (not loadable from a recipe). "
        "A path prefix onnx: or precomputed: sets it too.",
    )
    tokenizer: PathText | None = Field(
        default=None,
        description="ONNX models: tokenizer directory, hub id, package:NAME or gguf:FILE (default: "
        "the ONNX file's own folder, or the packaged model's tokenizer).",
    )
    unchecked_order: bool = Field(
        default=False,
        description="Precomputed models: accept a file that carries no span order "
        "(a .npy without its .spans.sha256 sidecar).",
    )

    @field_validator("name")
    @classmethod
    def _name_as_tables_read_it(cls, name: str) -> str:
        """A name the run's tables give back as it is: a blank one, or one with spaces around
        it, which a table's cell read back loses (its rows then matched no model: NaN), or one
        no file can hold (a lone surrogate, an undecodable byte of a command line), which had
        ended in a traceback after the run's configuration was written."""
        if not name.strip() or name != name.strip():
            raise PydanticCustomError(
                "model_name", "a model name is a non-blank string without spaces around it"
            )
        if unencodable(name) is not None:
            raise PydanticCustomError(
                "model_name",
                "a model name is UTF-8 text (a lone surrogate, a byte of no character, is none)",
            )
        joiner = next((c for c in BASIS_JOINERS if c in name), None)
        if joiner is not None:  # 'x+y' had read as the group of x and y in fits.csv
            raise PydanticCustomError(
                "model_name",
                f"a model name holds no {joiner!r}, which joins the names of a basis of "
                "several models (fits.csv's '+', a flag's list's ','): it would read as several "
                f"models; name it otherwise ({MODEL_NAMING})",
            )
        if name == GROUP_MEAN:  # group_r2.csv had held two rows 'mean', the model's and theirs
            raise PydanticCustomError(
                "model_name",
                f"a model name is not {GROUP_MEAN!r}, the target of group_r2.csv's row of the "
                "mean over the models: the model's row would read as theirs; name it otherwise "
                f"({MODEL_NAMING})",
            )
        return name

    def shown(self, directory: Path) -> str:
        """How a message names the model read from ``directory``: the reference as the user
        gave it where the directory is the toolkit's (a GGUF file's dequantised model in the
        cache or a temporary one, an unpacked packaged model), else the directory."""
        derived = self.path.startswith(("gguf:", "package:"))  # GGUF_PREFIX, PACKAGE_PREFIX
        return self.path if derived else str(directory)


def exists(path: str) -> bool:
    """Whether ``path`` (a leading ``~`` the home directory) names anything on this machine, a
    link to nothing included: a model reference that does is the path it is, whatever it holds
    (an ``=``, an ``@`` or a ``#``, which otherwise part a name, a revision or a tokenizer)."""
    return os.path.lexists(home_expanded(Path(path)))


class ModelSource:
    """One model of a run: class attributes say what it is, methods read, load, embed and hash
    it. ``has_tokenizer``: it can cut the spans; ``cached``: its embeddings are kept in the
    embedding cache; ``python_object``: it was handed to ``lmalgebra.decompose()``;
    ``fixed_spans``: it holds vectors of this run's spans (no sweep may draw others);
    ``transformers_model``: it loads as a transformers model (a tagger reads each word's hidden
    state from it, a teacher its head);
    ``what``: what it is, as messages name it; ``IGNORES``: the run's embedding settings it does
    not read (an object loaded already)."""

    has_tokenizer: ClassVar[bool] = True
    cached: ClassVar[bool] = True
    python_object: ClassVar[bool] = False
    fixed_spans: ClassVar[bool] = False
    transformers_model: ClassVar[bool] = False
    what: ClassVar[str] = "a model"
    IGNORES: ClassVar[tuple[str, ...]] = ()
    name: str
    kind: str

    @property
    def pretrained(self) -> bool:
        """Whether it is an architecture with trained weights: what a student can start from,
        a new head be put on, or a ``nulls`` study copy with random weights."""
        return False

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        """Its sizes for a plan, its weights unread (``bytes_per_weight``: as they would load)."""
        raise NotImplementedError

    def check_architecture(
        self,
        auto: str = "AutoModel",
        owner: str | None = None,
        memo_dir: Path | None = None,
        remember: bool = True,
    ) -> None:
        """Refuse an architecture without an ``auto`` form (``AutoModelForCausalLM``...) before
        any work, a passed check remembered in ``memo_dir`` if ``remember``; ``owner`` starts
        the message. Only a Hugging Face architecture has anything to check."""

    def check_planned_layer(self, layer: int) -> None:
        """Refuse ``layer`` before any weights load where the configuration says the model
        lacks it (a dry run too); a kind without one is checked at its load."""

    def check_planned_tokenizer(self) -> None:
        """Refuse, before any weights load (a dry run too), a tokenizer the run would refuse
        (missing, not fast, empty); a model given as a Python object is checked when given."""

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        """Hashes of what changes its numbers (``weights``, ``tokenizer``, ``config``...), file
        hashes memoised in ``memo_dir``."""
        raise NotImplementedError

    def load_tokenizer(self) -> Any:
        """Its fast tokenizer (spans are cut with the offsets only fast ones report)."""
        raise UserInputError(f"model {self.name!r}: no tokenizer")

    def depth(self) -> int:
        """Number of hidden layers (the embedding output is layer 0), for layer studies."""
        raise UserInputError(f"model {self.name!r}: no layers")

    def rows(
        self, texts: Mapping[str, list[str]], order: str
    ) -> dict[str, PrecomputedSplit] | None:
        """Its vectors of each split's spans ``texts`` (order digest ``order``), checked against
        them; None when it embeds them instead."""
        return None

    def span_rows(self) -> int:
        """Its rows of span embeddings, read without them (a file's header); 0 when it embeds
        the spans instead (one of ``fixed_spans`` gives a row per span of the run)."""
        return 0

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        """Its vectors of ``texts``, and what its tokenizer made of them."""
        raise UserInputError(f"model {self.name!r} embeds no text")

    def release(self) -> None:
        """Drop loaded weights (a sweep over many settings would otherwise keep them all)."""

    def locate(self) -> Self:
        """Find its files now (a hub model is fetched): refused before any work, not after."""
        return self

    def _shape(self, width: int, *sizes: int) -> ModelShape:
        """Its shape: ``width``, then parameters, weight bytes, hidden and intermediate sizes."""
        parameters, weight_bytes, hidden, intermediate = (*sizes, 0, 0, 0, 0)[:4]
        return ModelShape(
            self.name, self.kind, width, parameters, weight_bytes, hidden, intermediate, self.cached
        )


class ReferencedModel(ModelSource):
    """A model named by a reference, of the kind registered for ``ref.kind``: found where
    ``directory`` says, else resolved on first use (``weights=False``: enough for a plan).

    ``prefix``: the path prefix naming the kind on the command line (``onnx:``); ``suffixes``:
    its files', a file named by prefix being named after its stem; ``options``: the reference's
    fields that apply to this kind alone; ``runs_remote_code``: whether
    ``lmalgebra.decompose(trust_remote_code=...)`` applies to it.
    """

    prefix: ClassVar[str | None] = None
    suffixes: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[str, ...]] = ()
    runs_remote_code: ClassVar[bool] = False

    def __init__(
        self, ref: ModelFields, directory: Path | None = None, weights: bool = True
    ) -> None:
        self.ref, self.name, self.kind, self.weights = ref, ref.name, ref.kind, weights
        self._directory, self._planned = directory, directory
        self._loaded: tuple[Any, Any] | None = None

    @classmethod
    def named_by(cls, path: str) -> tuple[str, str | None] | None:
        """``(path, tokenizer)`` when the command-line ``path`` names this kind, else None."""
        if cls.prefix is None or not path.startswith(cls.prefix):
            return None
        return path.removeprefix(cls.prefix), None

    def resolve(self, weights: bool = True) -> Path:
        """The local path of the model: its directory (a hub snapshot is downloaded if
        needed), or its file. ``weights=False``: enough to plan a run."""
        raise NotImplementedError

    @property
    def directory(self) -> Path:
        if self._directory is None:
            self._directory = self.resolve(self.weights)
        return self._directory

    def locate(self) -> Self:
        self._directory = self.directory
        return self

    def planning_path(self) -> Path:
        """Its path as far as a plan needs it (no weights fetched)."""
        if self._planned is None:
            self._planned = self._directory or self.resolve(weights=False)
        return self._planned

    def tokenizer_directory(self) -> Path:
        """Where its tokenizer's files are (its own directory unless the kind says otherwise)."""
        return self.directory

    def check_planned_tokenizer(self) -> None:
        """Its tokenizer loaded as a plan finds it (no weights fetched, nothing unpacked or
        dequantised into the cache), refused as the run refuses it; a model whose tokenizer
        runs remote code is left to the run (a plan runs none)."""
        if self.has_tokenizer and not self.ref.trust_remote_code:
            type(self)(self.ref, self.planning_path(), weights=False).load_tokenizer()

    def load_tokenizer(self) -> Any:
        directory, remote = self.tokenizer_directory(), self.ref.trust_remote_code
        if remote:
            announce_remote_code(self.name, directory)
        return fast_tokenizer(directory, f"model {self.name!r}", remote)

    def tokenizer_hash(self, memo_dir: Path | None) -> str:
        """The hash of its tokenizer's files (memoised in ``memo_dir``)."""
        directory = self.tokenizer_directory()
        files = [directory / f for f in TOKENIZER_FILES if (directory / f).is_file()]
        return memoised_hash(files, directory, memo_dir)

    def load(
        self, device: str = "cpu", weights_dtype: str = "float32", device_map: str | None = None
    ) -> Any:
        """The network the embedding loop drives, in eval mode on ``device``."""
        raise UserInputError(f"model {self.name!r}: no network to load")

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        from lmalgebra.sources.embed import embed

        if self._loaded is None:  # loaded on first use
            model = self.load(spec.device, spec.weights_dtype, spec.device_map)
            for layer in spec.layers or (spec.layer,):
                check_layer(self.name, model, layer)
            self._loaded = (model, self.load_tokenizer())
        return embed(texts, *self._loaded, spec, owner=f"model {self.name!r}")

    def release(self) -> None:
        self._loaded = None

    def local_file(self, what: str) -> Path:
        """The file (or folder) the reference names: a packaged asset, or a local path."""
        ref = self.ref
        if ref.path.startswith(PACKAGE_PREFIX):
            return asset_path(ref.path.removeprefix(PACKAGE_PREFIX), kind="model")
        path = home_expanded(Path(ref.path))
        if not path.exists():
            raise UserInputError(f"model {ref.name!r}: {what} {ref.path} {absent(path)}")
        if not path.is_file() and not path.is_dir():  # never opened: it would wait for a writer
            raise UserInputError(
                f"model {ref.name!r}: {what} {ref.path} is a FIFO, socket or device, not a file"
            )
        return path


def check_layer(name: str, model: Any, layer: int) -> None:
    """Refuse a hidden-layer index the model does not have (0 = embeddings, -1 = the last)."""
    own = getattr(model, "check_layer", None)  # an ONNX graph's: the layers it exposes
    if own is not None:
        own(layer)
        return
    refuse_missing_layer(name, getattr(model.config, "num_hidden_layers", None), layer)


def refuse_missing_layer(name: str, layers: Any, layer: int) -> None:
    """Refuse ``layer`` of a model of ``layers`` hidden layers (not an int: not known)."""
    if isinstance(layers, int) and not -(layers + 1) <= layer <= layers:
        raise UserInputError(
            f"model {name!r}: layer {layer} does not exist "
            f"({counted(layers, 'layer')}; use 0..{layers} or -{layers + 1}..-1)"
        )


@contextmanager
def named_as(name: str, owner: str) -> Iterator[None]:
    """A refusal of model ``name``'s source (``model 'NAME': ...``: no such directory, a
    tokenizer of another model...) named by ``owner`` (``teacher 'wp'``, ``student.init
    'PATH'``), the role the user gave it in."""
    try:
        yield
    except UserInputError as err:
        said = str(err).removeprefix(f"model {name!r}:")
        if said == str(err):
            raise
        raise UserInputError(f"{owner}:{said}") from None
