"""A Hugging Face model: a local directory, a hub id, ``package:NAME`` or ``gguf:FILE``.

The reference is resolved to a local directory first (a hub snapshot lands in the Hugging Face
cache, a GGUF file is dequantised into a model directory in the lmalgebra cache), so every loader
reads a plain directory and the weights hash is always a hash of files. With ``random_init`` the
architecture gets fresh, seeded weights (a null baseline).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.fingerprint import sha256_json, unseal
from lmalgebra.core.precision import device_map_memory
from lmalgebra.core.remote_code import (
    announce_remote_code,
    load_failure,
    refuse_code_replaced,
    shipped_code,
)
from lmalgebra.core.settings import home_expanded
from lmalgebra.core.text_files import absent
from lmalgebra.sources.gguf_models import (
    GGUF_PREFIX,
    PROVENANCE,
    RECORD_CHECK,
    file_directory,
    read_provenance,
)
from lmalgebra.sources.hub import looks_local, snapshot
from lmalgebra.sources.loaded_weights import (
    CHECKED_LOAD,
    refuse_incomplete,
    refuse_planned_gaps,
    safetensors_files,
)
from lmalgebra.sources.model_files import (
    ModelShape,
    architecture,
    config_int,
    config_sizes,
    config_width,
    memoised_hash,
    read_config,
    refuse_damaged,
    remember_memo,
    weight_files,
)
from lmalgebra.sources.model_source import ReferencedModel, refuse_missing_layer
from lmalgebra.sources.packaged import PACKAGE_PREFIX, asset_path
from lmalgebra.sources.tokenizers import TOKENIZER_FILES

_AUTO_KINDS = {
    "AutoModel": "base model",
    "AutoModelForCausalLM": "causal language model",
    "AutoModelForMaskedLM": "masked language model",
}


class TransformersModel(ReferencedModel):
    """A Hugging Face model, loaded as its bare ``AutoModel`` (hidden states)."""

    options: ClassVar[tuple[str, ...]] = ("revision", "random_init")
    runs_remote_code: ClassVar[bool] = True
    transformers_model: ClassVar[bool] = True
    what: ClassVar[str] = "a transformers model"

    @property
    def pretrained(self) -> bool:
        return not self.ref.random_init

    def resolve(self, weights: bool = True) -> Path:
        """``weights=False``: a hub snapshot of the tokenizer files and ``config.json`` alone, or
        a GGUF file's configuration and tokenizer without dequantising it into the cache."""
        ref = self.ref
        if ref.path.startswith(PACKAGE_PREFIX):
            return asset_path(ref.path.removeprefix(PACKAGE_PREFIX), weights, "model")
        if ref.path.startswith(GGUF_PREFIX):
            return file_directory(
                ref.path.removeprefix(GGUF_PREFIX), f"model {ref.name!r}", weights
            )
        local = home_expanded(Path(ref.path))
        if local.is_symlink() and not local.exists():  # no hub id: a link to nothing
            raise UserInputError(f"model {ref.name!r}: {ref.path} {absent(local)}")
        if local.is_dir():
            if ref.revision is not None:  # a hub revision: a directory has one version only
                raise UserInputError(
                    f"model {ref.name!r}: revision {ref.revision!r} would be ignored: it applies "
                    f"to a Hugging Face hub id only, and {ref.path} is a local directory"
                )
            config = local / "config.json"
            if not config.is_file():
                why = _no_config(config)
                raise UserInputError(
                    f"model {ref.name!r}: {local} is not a model directory ({why})"
                )
            return local
        if local.exists():
            what = "a file" if local.is_file() else "a FIFO, socket or device"
            raise UserInputError(f"model {ref.name!r}: {ref.path} is {what}, not a model directory")
        if looks_local(ref.path):
            raise UserInputError(f"model {ref.name!r}: directory {ref.path} does not exist")
        patterns = None if weights else [*TOKENIZER_FILES, "config.json"]
        return snapshot(f"model {ref.name!r}", ref.path, ref.revision, patterns)

    def load(
        self, device: str = "cpu", weights_dtype: str = "float32", device_map: str | None = None
    ) -> Any:
        """Weights are float32 unless ``weights_dtype`` is ``bfloat16`` (half the memory of a
        model too large for one device; its forward pass is then bfloat16); ``device_map="auto"``
        spreads the model over the devices, layer by layer. Files that lack weights the model
        uses, or hold weights it has no place for, are refused."""
        import torch
        from transformers import AutoConfig, AutoModel

        ref, directory = self.ref, self.directory
        if not ref.random_init:  # a model written here is read as it was written, or not at all
            refuse_damaged(f"model {ref.name!r}", directory)
        if ref.trust_remote_code:
            announce_remote_code(ref.name, directory)
        # float32 whatever the checkpoint stores, unless asked: weights kept in half precision
        # make every product half precision, autocast or not
        dtype = torch.bfloat16 if weights_dtype == "bfloat16" else torch.float32
        placement = {} if device_map is None else {"device_map": device_map, **device_map_memory()}
        remote = ref.trust_remote_code
        try:
            if ref.random_init:
                config = AutoConfig.from_pretrained(directory, trust_remote_code=remote)
                torch.manual_seed(ref.seed)
                model = AutoModel.from_config(config, trust_remote_code=remote).to(dtype)
            else:
                model, info = AutoModel.from_pretrained(
                    directory, dtype=dtype, trust_remote_code=remote, **CHECKED_LOAD, **placement
                )
                # hidden states are all that is read: a pooler the files lack goes unused
                refuse_incomplete(
                    f"model {ref.name!r}",
                    directory,
                    model,
                    info,
                    unused=("pooler",),
                    shown=ref.shown(directory),
                )
        except UserInputError:
            raise
        except Exception as err:
            raise UserInputError(
                f"model {ref.name!r}: cannot load from {directory}: {load_failure(err)}"
            ) from err
        if getattr(model, "hf_device_map", None) is not None:
            return model.eval()  # placed layer by layer: left where Accelerate put it
        return model.to(device).eval()

    def load_tokenizer(self) -> Any:
        """Its fast tokenizer; one whose own vocabulary (added tokens aside) runs past the rows
        of the token embeddings ``config.json`` gives is refused, by the plan too: any text
        reaching those ids fails, where the run had refused it only once a span held one."""
        tokenizer = super().load_tokenizer()
        directory = self.tokenizer_directory()
        if self.ref.trust_remote_code or not (directory / "config.json").is_file():
            return tokenizer
        rows = config_int(read_config(self.name, directory / "config.json"), ("vocab_size",))
        tokens = getattr(tokenizer, "vocab_size", 0)
        if rows and isinstance(tokens, int) and tokens > rows:
            raise UserInputError(
                f"model {self.name!r}: the tokenizer has {tokens} tokens (ids up to {tokens - 1}), "
                f"beyond the {rows} rows of the model's token embeddings (the vocab_size of its "
                "config.json): is it this model's own tokenizer?"
            )
        return tokenizer

    def depth(self) -> int:
        from transformers import AutoConfig

        remote = self.ref.trust_remote_code
        return int(
            AutoConfig.from_pretrained(self.directory, trust_remote_code=remote).num_hidden_layers
        )

    def check_planned_layer(self, layer: int) -> None:
        if self.ref.trust_remote_code:  # its configuration is its own code's to read
            return
        config = read_config(self.name, self.planning_path() / "config.json")
        # whichever family's key names the depth (GPT-2's n_layer): the run reads it so
        refuse_missing_layer(self.name, config_sizes(config)[0] or None, layer)

    def check_architecture(
        self,
        auto: str = "AutoModel",
        owner: str | None = None,
        memo_dir: Path | None = None,
        remember: bool = True,
    ) -> None:
        """Refuse a model whose configuration transformers cannot read, or whose architecture
        has no ``auto`` form, from ``config.json`` alone, and one whose safetensors files lack
        a weight of that form, hold one it has no place for or one of another shape, from the
        files' headers alone (the load's words; no weights read, so a dry run refuses it too).
        A model allowed to run its own code may bring an architecture of its own: it is left to
        its load, so that none of its code runs before then. ``owner`` starts the message.

        ``memo_dir``: where a passed check is remembered (``remember``; a dry run only reads),
        keyed on ``config.json`` and the weight files as they are and the transformers release,
        so a run whose embeddings are all cached does not import transformers to check again."""
        if self.ref.trust_remote_code:
            return
        directory = self.planning_path()
        memo = _architecture_memo(directory, auto, memo_dir)
        if memo is not None and memo.is_file():
            return
        import transformers
        from transformers import AutoConfig

        owner = owner or f"model {self.name!r}"
        shown = self.ref.shown(directory)
        refuse_code_replaced(owner, shown, directory, auto)
        try:
            config = AutoConfig.from_pretrained(directory)
        except Exception as err:
            raise UserInputError(
                f"{owner}: transformers cannot read the configuration in {shown}: "
                f"{load_failure(err)}"
            ) from err
        mapping = getattr(transformers, auto)._model_mapping
        if type(config) not in mapping:
            kind = _AUTO_KINDS.get(auto, auto)
            raise UserInputError(
                f"{owner}: transformers has no {kind} for the {config.model_type!r} "
                f"architecture of {shown}"
            )
        if auto == "AutoModel":
            _refuse_unreadable_text(owner, shown, config, mapping[type(config)])
        if self.pretrained:  # the bare model's pooler goes unused: hidden states are read
            unused = ("pooler",) if auto == "AutoModel" else ()
            refuse_planned_gaps(owner, directory, shown, auto, unused)
            # a local directory's weights are there to list (a plan's hub snapshot holds none)
            if home_expanded(Path(self.ref.path)).is_dir() and not weight_files(directory, owner):
                raise UserInputError(f"{owner}: no weight files in {shown}")
        if memo is not None and remember:
            remember_memo(memo, "checked\n")

    def fingerprint(self, memo_dir: Path | None = None) -> dict[str, str]:
        """Weights (or config and seed if random), tokenizer and config, and the code it ships
        when allowed to run it (``code``, its Python files); for a model
        dequantised from a GGUF file also ``gguf_sha256`` and ``quantisation`` (llama.cpp's
        file type, e.g. ``MOSTLY_Q4_K_M``)."""
        ref, directory = self.ref, self.directory
        config = json.loads((directory / "config.json").read_text())
        if ref.random_init:
            weights = sha256_json({"config": config, "seed": ref.seed, "random_init": True})
        else:
            files = weight_files(directory, f"model {ref.name!r}")
            if not files:
                raise UserInputError(f"model {ref.name!r}: no weight files in {directory}")
            weights = memoised_hash(files, directory, memo_dir)
        hashes = {
            "weights": weights,
            "tokenizer": self.tokenizer_hash(memo_dir),
            "config": sha256_json(config),
        }
        code = shipped_code(directory) if ref.trust_remote_code else []
        if code:  # the code it runs computes its outputs as much as its weights do
            hashes["code"] = memoised_hash(code, directory, memo_dir)
        return {**hashes, **_gguf_origin(directory, f"model {ref.name!r}")}

    def shape(self, bytes_per_weight: int = 4) -> ModelShape:
        path = self.planning_path()
        config = read_config(self.name, path / "config.json")
        width = config_width(config)  # 0: not named (the plan cannot be made)
        layer, total, hidden, intermediate = architecture(config, width)
        on_disk = sum(p.stat().st_size for p in weight_files(path))
        # weights are loaded in float32 whatever the checkpoint stores (or bfloat16 when asked);
        # the files' size stands in for an architecture the config does not describe
        weight_bytes = bytes_per_weight * total or on_disk
        return self._shape(width, layer, weight_bytes, hidden, intermediate)


def _gguf_origin(directory: Path, owner: str) -> dict[str, str]:
    """What a model dequantised from a GGUF file adds to its fingerprint, from the record
    written beside it (:data:`PROVENANCE`): the file's sha256 (``gguf_sha256``) and its
    ``quantisation``; none for a directory without that record. A record that cannot be read,
    was edited since (its checksum) or names no file's sha256 is refused, naming it (``owner``
    starts the message): a dequantised model copied out of the cache, its record damaged since,
    had ended the command in a traceback."""
    path = directory / PROVENANCE
    if not path.is_file():
        return {}
    try:
        record = read_provenance(directory) or {}
        if unseal(record, RECORD_CHECK) is False:
            raise ValueError(f"edited since it was written: its {RECORD_CHECK} is another")
        if not isinstance(record["sha256"], str):
            raise TypeError("its sha256 is no text")
        return {"gguf_sha256": record["sha256"], "quantisation": str(record["quantisation"])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise UserInputError(
            f"{owner}: {path} is damaged ({type(err).__name__}: {err}): the GGUF file the model "
            "was dequantised from cannot be read from it; restore it, or remove it"
        ) from None


def _refuse_unreadable_text(owner: str, shown: str, config: Any, found: Any) -> None:
    """Refuse a base model that does not read text from its token ids alone, as its hidden
    states are read here: an encoder-decoder (its forward pass needs the decoder's inputs too)
    or a model of images or sound (no ``input_ids``). Its forward pass had raised mid-run."""
    import inspect

    model_class = found[0] if isinstance(found, list | tuple) else found
    named = f"{model_class.__name__} ({config.model_type!r} architecture of {shown})"
    if getattr(config, "is_encoder_decoder", False):
        why = "is an encoder-decoder, whose forward pass needs the decoder's inputs too"
    elif "input_ids" not in inspect.signature(model_class.forward).parameters:
        why = "reads no token ids (a model of images or sound)"
    else:
        return
    raise UserInputError(
        f"{owner}: transformers' {named} {why}; lmalgebra reads hidden states of a model "
        "that takes text as token ids alone (an encoder, or a decoder)"
    )


# the architecture checks' own version, in their memo's key: a check added since is made once
# more on every model
CHECKS = 3


def _architecture_memo(directory: Path, auto: str, memo_dir: Path | None) -> Path | None:
    """Where a passed architecture check of ``directory`` is remembered (None: nowhere, or no
    ``config.json`` to key it on)."""
    config = directory / "config.json"
    if memo_dir is None or not config.is_file():
        return None
    from importlib.metadata import version

    found = config.stat()
    stamp = [str(config.resolve()), found.st_size, found.st_mtime_ns, found.st_ctime_ns]
    weights = [_stamp(path) for path in safetensors_files(directory)]
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        weights.append(_stamp(index))
    key = sha256_json([auto, *stamp, found.st_ino, weights, version("transformers"), CHECKS])
    return memo_dir / f"architecture-{key}.checked"


def _stamp(path: Path) -> list[Any]:
    """What changes whenever ``path``'s bytes do (its header with them)."""
    found = path.stat()
    return [path.name, found.st_size, found.st_mtime_ns, found.st_ctime_ns, found.st_ino]


def _no_config(config: Path) -> str:
    """Why a model directory's ``config.json`` is no file it can read, as its message ends."""
    if config.is_dir():
        return "its config.json is a directory"
    if config.exists() or config.is_symlink():  # a FIFO, a link to nothing
        return f"its config.json {absent(config)}"
    return "no config.json"
