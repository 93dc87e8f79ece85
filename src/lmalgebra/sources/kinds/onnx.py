"""ONNX encoders: a ``.onnx`` file (or an exported folder) run with onnxruntime, with a named
tokenizer (``onnx:FILE#TOKENIZER``, ``tokenizer:`` in a recipe, or the file's own folder), shaped
like a Hugging Face model for the one embedding loop.

``sources.embed.embed`` calls ``model(input_ids=..., attention_mask=...,
output_hidden_states=...)`` and reads ``model.config``; :class:`OnnxEncoder` answers both, so
batching, length sorting, truncation and pooling stay in that loop. The session is fed the inputs
its graph declares: ``input_ids`` and ``attention_mask`` (required), ``token_type_ids`` (zeros) and
``position_ids`` (0..seq-1) when declared. The output is the graph's last hidden state: an output
named ``last_hidden_state``, else the last of ``hidden_states.<i>``, else its first 3-D float
output. Other layers are available only when the graph exposes every hidden state as outputs named
``hidden_states.0`` .. ``hidden_states.<layers>``.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from lmalgebra.core.errors import UserInputError, counted, either
from lmalgebra.core.fingerprint import sha256_json
from lmalgebra.core.text_files import require_file
from lmalgebra.sources.embed_spec import EmbedSpec, TokenReport
from lmalgebra.sources.model_files import ModelShape, architecture, memoised_hash
from lmalgebra.sources.model_source import ReferencedModel, exists
from lmalgebra.sources.packaged import ONNX_ASSETS, PACKAGE_PREFIX
from lmalgebra.sources.tokenizers import TOKENIZER_FILES, resolve_tokenizer

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)


class OnnxModel(ReferencedModel):
    """An ONNX encoder, which the embedding loop drives like an ``AutoModel``; it runs on the
    CPU whatever the device. It has layers only when the graph exposes ``hidden_states.0..N``."""

    prefix: ClassVar[str | None] = "onnx:"
    suffixes: ClassVar[tuple[str, ...]] = (".onnx",)
    options: ClassVar[tuple[str, ...]] = ("tokenizer",)
    what: ClassVar[str] = "an ONNX graph"
    # onnxruntime runs the graph on the CPU, in the graph's own precision
    IGNORES: ClassVar[tuple[str, ...]] = ("dtype", "device", "weights_dtype", "device_map")
    _graph: OnnxEncoder | None = None  # the plan's session, opened on first use

    @classmethod
    def named_by(cls, path: str) -> tuple[str, str | None] | None:
        """``onnx:FILE[#TOKENIZER]``, or a packaged ONNX model (``package:NAME``)."""
        if path.startswith(PACKAGE_PREFIX) and path.removeprefix(PACKAGE_PREFIX) in ONNX_ASSETS:
            return path, None
        found = super().named_by(path)
        if found is None or "#" not in found[0] or exists(found[0]):  # a file named so
            return found
        file, _, tokenizer = found[0].rpartition("#")
        return file, tokenizer or None

    def resolve(self, weights: bool = True) -> Path:
        """The ONNX file (of an exported folder: ``model.onnx``, or its only ``.onnx`` file)."""
        path = self.local_file("ONNX file")
        if path.is_dir():
            found = [path / "model.onnx"] if (path / "model.onnx").exists() else []
            found = found or sorted(path.glob("*.onnx"))
            if len(found) != 1:
                raise UserInputError(
                    f"model {self.name!r}: {path} holds {len(found)} .onnx files; name one of them"
                )
            # a FIFO is never opened: it would wait for a writer
            path = require_file(found[0], f"model {self.name!r}: ONNX file")
        return path

    def tokenizer_directory(self) -> Path:
        """Where its tokenizer lives: ``ref.tokenizer``, the packaged model's default, or the
        ONNX file's own folder when it holds tokenizer files."""
        ref, onnx_file = self.ref, self.directory
        source = ref.tokenizer
        if source is None and ref.path.startswith(PACKAGE_PREFIX):
            source = ONNX_ASSETS.get(ref.path.removeprefix(PACKAGE_PREFIX))
        if source is None:
            if any((onnx_file.parent / f).is_file() for f in TOKENIZER_FILES):
                return onnx_file.parent
            raise UserInputError(
                f"model {ref.name!r}: an ONNX model needs a tokenizer: onnx:FILE#TOKENIZER on "
                "the command line or tokenizer: in the recipe (a directory, hub id, "
                "package:NAME or gguf:FILE)"
            )
        return resolve_tokenizer(source, f"model {ref.name!r}", self.weights)

    def load(
        self, device: str = "cpu", weights_dtype: str = "float32", device_map: str | None = None
    ) -> Any:
        if device != "cpu":
            log.warning("model %r: an ONNX graph runs on the CPU, not on %s", self.name, device)
        return OnnxEncoder.load(self.name, self.directory, sibling_config(self.directory))

    def embed(self, texts: list[str], spec: EmbedSpec) -> tuple[np.ndarray, TokenReport]:
        if self._loaded is None and spec.dtype != "float32":
            log.warning("model %r: an ONNX graph runs in its own precision", self.name)
        return super().embed(texts, spec)

    def depth(self) -> int:
        model = self.load()
        model.check_layer(0)
        return int(model.config.num_hidden_layers)

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        """The graph and its external data, the tokenizer's files, the sibling config."""
        directory = self.directory
        config = {"kind": "onnx", "config": sibling_config(directory)}
        return {
            "weights": memoised_hash(_onnx_files(directory), directory.parent, memo_dir),
            "tokenizer": self.tokenizer_hash(memo_dir),
            "config": sha256_json(config),
        }

    def check_planned_layer(self, layer: int) -> None:
        """Refuse a layer the graph does not expose, from its declared outputs (the plan's
        session; nothing is run), by the dry run too."""
        self._planned_graph().check_layer(layer)

    def _planned_graph(self) -> OnnxEncoder:
        """The graph as a plan reads it (opened once for the plan's checks and sizes)."""
        if self._graph is None:
            path = self.planning_path()
            self._graph = OnnxEncoder.load(self.name, path, sibling_config(path))
        return self._graph

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        """Its width from the graph's declared outputs, its sizes from a sibling config."""
        path = self.planning_path()
        encoder = self._planned_graph()
        width = int(encoder.config.hidden_size)
        layer, _, hidden, intermediate = architecture(sibling_config(path), width)
        return self._shape(width, layer, path.stat().st_size, hidden, intermediate)


def sibling_config(path: Path) -> dict[str, Any]:
    """The ``config.json`` beside an ONNX file, if any (``{}`` otherwise)."""
    config = path.parent / "config.json"
    try:
        return dict(json.loads(config.read_text())) if config.is_file() else {}
    except (json.JSONDecodeError, TypeError, ValueError):
        log.warning("ignoring %s: not a JSON object", config)
        return {}


# an external-data entry of a tensor in the graph's protobuf: key "location", then its value
_LOCATION = re.compile(rb"\x0a\x08location\x12")


def _onnx_files(path: Path) -> list[Path]:
    """The graph and its external-data files: those its tensors name (``location``: any name,
    ``weights.bin`` or one file a tensor, which an edit had changed without the cache key
    seeing it), and ``<name>_data``, ``<name>.data``."""
    named = {path.with_name(path.name + s) for s in ("_data", ".data")}
    named |= {path.parent / name for name in _locations(path.read_bytes())}
    return [path, *sorted(p for p in named if p.is_file() and p != path)]


def _locations(graph: bytes) -> set[str]:
    """The external-data file names a serialised ONNX graph's tensors give (read from the
    protobuf's bytes: the ``onnx`` package is no dependency)."""
    names = set()
    for found in _LOCATION.finditer(graph):
        at, size, shift = found.end(), 0, 0
        while at < len(graph) and shift < 35:  # a varint: the value's length
            byte = graph[at]
            size, at, shift = size | (byte & 0x7F) << shift, at + 1, shift + 7
            if byte < 0x80:
                break
        names.add(graph[at : at + size].decode("utf-8", errors="replace"))
    return names


REQUIRED_INPUTS = ("input_ids", "attention_mask")
OPTIONAL_INPUTS = ("token_type_ids", "position_ids")
_HIDDEN = re.compile(r"^hidden_states?[._](\d+)$")
_FLOATS = ("tensor(float)", "tensor(float16)", "tensor(double)")
_INTS = {"tensor(int64)": np.int64, "tensor(int32)": np.int32}


@dataclass(frozen=True)
class OnnxConfig:
    """The few ``config`` fields the embedding loop reads (``None`` when the graph hides them)."""

    hidden_size: int
    num_hidden_layers: int | None = None
    max_position_embeddings: int | None = None
    pad_token_id: int | None = None
    model_type: str = "onnx"


@dataclass(frozen=True)
class OnnxOutput:
    """``last_hidden_state (batch, seq, hidden) float``; every layer's when asked and exposed."""

    last_hidden_state: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None


def _one_line(err: Exception) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 300 else text[:297] + "..."


def open_session(name: str, path: Path) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``path``; a ``UserInputError`` if unreadable."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise UserInputError(
            f"model {name!r}: ONNX models need onnxruntime: pip install 'lmalgebra[onnx]'"
        ) from None
    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: graph-optimiser notices are not for users
    try:
        return ort.InferenceSession(
            str(path), sess_options=options, providers=ort.get_available_providers()
        )
    except Exception as err:  # onnxruntime raises several types for a bad or missing file
        raise UserInputError(
            f"model {name!r}: cannot read ONNX file {path}: {_one_line(err)}"
        ) from None


class OnnxEncoder:
    """An ONNX encoder graph behind the interface of a bare Hugging Face ``AutoModel``.

    Args:
        name: model name, for messages.
        path: the ``.onnx`` file.
        session: its ``onnxruntime.InferenceSession``.
        extra: ``config.json`` fields found next to the file (optimum exports ship one), or {}.
    """

    def __init__(self, name: str, path: Path, session: Any, extra: dict[str, Any]):
        self.name, self.path, self.session = name, path, session
        declared = {i.name: i for i in session.get_inputs()}
        missing = [n for n in REQUIRED_INPUTS if n not in declared]
        if missing:
            raise UserInputError(
                f"model {name!r}: ONNX file {path} lacks the input(s) {', '.join(missing)} "
                f"(it declares: {', '.join(declared) or 'none'})"
            )
        unknown = [n for n in declared if n not in REQUIRED_INPUTS + OPTIONAL_INPUTS]
        odd = [n for n, i in declared.items() if n not in unknown and i.type not in _INTS]
        if unknown or odd:
            raise UserInputError(
                f"model {name!r}: ONNX file {path} declares input(s) an encoder cannot feed: "
                f"{', '.join(f'{n} ({declared[n].type})' for n in unknown + odd)}"
            )
        self.inputs = {n: _INTS[i.type] for n, i in declared.items()}
        _refuse_fixed(name, path, "input", declared.values())
        outputs = session.get_outputs()
        floats3d = [o for o in outputs if o.type in _FLOATS and len(o.shape) == 3]
        if not floats3d:
            found = ", ".join(f"{o.name} ({len(o.shape)}-D {o.type})" for o in outputs)
            raise UserInputError(
                f"model {name!r}: ONNX file {path} has no 3-D float output "
                f"(batch, sequence, hidden); its outputs: {found or 'none'}"
            )
        self.hidden = _hidden_outputs([o.name for o in floats3d])
        names = [o.name for o in floats3d]
        if "last_hidden_state" in names:
            self.last = "last_hidden_state"
        else:
            self.last = self.hidden[-1] if self.hidden else names[0]
        _refuse_fixed(name, path, "output", [o for o in floats3d if o.name == self.last])
        log.debug("model %s: last hidden state from ONNX output %r", name, self.last)
        width = next(o.shape[-1] for o in floats3d if o.name == self.last)
        layers = len(self.hidden) - 1 if self.hidden else extra.get("num_hidden_layers")
        self.config = OnnxConfig(
            hidden_size=width if isinstance(width, int) else self._probe_width(),
            num_hidden_layers=layers,
            max_position_embeddings=extra.get("max_position_embeddings"),
            pad_token_id=extra.get("pad_token_id"),
            model_type=str(extra.get("model_type", "onnx")),
        )

    @classmethod
    def load(cls, name: str, path: Path, extra: dict[str, Any] | None = None) -> OnnxEncoder:
        """Open and validate ``path`` (see the class); every problem is a ``UserInputError``."""
        return cls(name, path, open_session(name, path), extra or {})

    def check_layer(self, layer: int) -> None:
        """Refuse a layer the graph does not expose (0 = embeddings, -1 = the last)."""
        if not self.hidden:
            if layer != -1:
                raise UserInputError(
                    f"model {self.name!r}: ONNX file {self.path} exposes only its last hidden "
                    f"state, so layer {layer} is not available: use "
                    f"{either('--layer -1', 'layer=-1')}, or export the graph with every hidden "
                    "state as outputs hidden_states.0..N"
                )
            return
        layers = len(self.hidden) - 1
        if not -(layers + 1) <= layer <= layers:
            raise UserInputError(
                f"model {self.name!r}: layer {layer} does not exist "
                f"({counted(layers, 'layer')}; use 0..{layers} or -{layers + 1}..-1)"
            )

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        output_hidden_states: bool = False,
        **_: Any,
    ) -> OnnxOutput:
        """Run ``input_ids, attention_mask (batch, seq) int`` through the graph."""
        import torch

        if output_hidden_states and not self.hidden:
            self.check_layer(0)
        feeds = self._feeds(input_ids.cpu().numpy(), attention_mask.cpu().numpy())
        wanted = [self.last, *(self.hidden if output_hidden_states else [])]
        try:
            results = self.session.run(wanted, feeds)
        except Exception as err:  # e.g. a sequence longer than the graph's position table
            raise UserInputError(
                f"model {self.name!r}: ONNX file {self.path} failed on a batch of shape "
                f"{list(input_ids.shape)}: {_one_line(err)} ({_remedy(err, input_ids)})"
            ) from None
        tensors = [torch.from_numpy(np.ascontiguousarray(r)) for r in results]
        if tuple(tensors[0].shape[:2]) != tuple(input_ids.shape):
            raise UserInputError(
                f"model {self.name!r}: ONNX file {self.path} gives output {self.last!r} of shape "
                f"{list(tensors[0].shape)} for a batch of shape {list(input_ids.shape)}; "
                "expected (batch, sequence, hidden)"
            )
        return OnnxOutput(tensors[0], tuple(tensors[1:]) if output_hidden_states else None)

    def _feeds(self, ids: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.zeros_like(ids)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.broadcast_to(np.arange(ids.shape[1]), ids.shape).copy()
        return {n: v.astype(self.inputs[n], copy=False) for n, v in feeds.items()}

    def _probe_width(self) -> int:
        """Hidden width of a graph whose output shape leaves it symbolic: run two tokens."""
        ids = np.zeros((1, 2), dtype=np.int64)
        feeds = self._feeds(ids, np.ones_like(ids))
        try:
            (hidden,) = self.session.run([self.last], feeds)
        except Exception as err:
            raise UserInputError(
                f"model {self.name!r}: ONNX file {self.path} fails on a two-token input: "
                f"{_one_line(err)}"
            ) from None
        return int(hidden.shape[-1])


def _refuse_fixed(name: str, path: Path, what: str, declared: Iterable[Any]) -> None:
    """Refuse a graph whose inputs (or last hidden state) have a fixed batch size or sequence
    length (an export without dynamic axes): batches of every size and length are fed, and
    onnxruntime had failed on the first one, in a line that advised a smaller --max_length."""
    fixed = [f"{d.name} {list(d.shape)}" for d in declared if _fixed(d.shape)]
    if fixed:
        raise UserInputError(
            f"model {name!r}: ONNX file {path} fixes the batch size or sequence length of its "
            f"{what} ({', '.join(fixed)}); texts are fed in batches of any size and length: "
            "export it with dynamic axes for both (dynamic_axes in torch.onnx.export)"
        )


def _fixed(shape: Any) -> bool:
    """Whether a declared shape gives its first two axes (batch, sequence) as numbers."""
    return isinstance(shape, list | tuple) and any(isinstance(d, int) for d in shape[:2])


def _hidden_outputs(names: list[str]) -> list[str]:
    """Outputs ``hidden_states.<i>`` in layer order, if they cover 0..n without gaps; else []."""
    found = {int(m.group(1)): n for n in names if (m := _HIDDEN.match(n))}
    if found and sorted(found) == list(range(len(found))):
        return [found[i] for i in range(len(found))]
    if found:
        log.warning("ONNX hidden-state outputs %s are not numbered 0..n; ignored", sorted(found))
    return []


def _remedy(err: Exception, input_ids: Any) -> str:
    """What to try after the graph failed on ``input_ids``: an index beyond a table of the
    graph is a token id past its vocabulary (a tokenizer of another model) when the batch holds
    such an id and is no longer than the table, else a position past its position table."""
    found = re.search(r"out of data bounds.*?\[-?\d+\s*,\s*(\d+)\]", str(err))
    if found is not None:
        rows = int(found.group(1)) + 1
        largest = int(input_ids.max())
        if largest >= rows and input_ids.shape[-1] <= rows:
            return (
                f"the tokenizer gives token id {largest}, beyond the {rows} rows of a table of "
                "the graph: is it this model's own tokenizer?"
            )
    return f"a smaller {either('--max_length', 'max_length=')} may help"
