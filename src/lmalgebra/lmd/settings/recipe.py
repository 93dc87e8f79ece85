"""The decomposition recipe: models, corpus, spans, embedding and solver settings, outputs."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, model_validator

from lmalgebra.core.errors import MODEL_NAMING, UserInputError
from lmalgebra.core.precision import (
    DeviceChoice,
    DtypeChoice,
    check_bf16,
    device_type,
    resolve_dtype_name,
)
from lmalgebra.core.recipe_files import Call, flag_keys, read_yaml, validate
from lmalgebra.core.settings import (
    COMMAND_LINE,
    PathText,
    Settings,
    home_expanded,
    recipe_paths,
    refuse_found_elsewhere,
    refuse_ignored,
    setting,
)
from lmalgebra.lmd.settings.scale import ScaleSpec
from lmalgebra.lmd.settings.spans import SpanSpec
from lmalgebra.lmd.settings.study import StudySpec
from lmalgebra.sources.corpus import CorpusSpec, split_language
from lmalgebra.sources.embed_spec import EmbedSpec, Pooling
from lmalgebra.sources.models import ModelRef, refuse_same_model
from lmalgebra.stats.choices import EXACT_SHAPLEY, AlphaMode, Products
from lmalgebra.storage.output_paths import default_cache_dir

REFERENCE_TOKENIZER_HELP = (
    "Tokenizer that cuts the spans (T counts its tokens): a model's name, or a tokenizer "
    "directory, hub id or package:NAME that is no model of the run (nothing is embedded for it). "
    "Default: the first model that has a tokenizer."
)


# what only a model that embeds text reads (a file of precomputed embeddings is read as it is)
EMBEDDING_SETTINGS = (
    "layer",
    "pooling",
    "exclude_special",
    "dtype",
    "device",
    "weights_dtype",
    "device_map",
    "batch_size",
    "max_length",
)
# what an ONNX graph does not read, where every model is one (or a file of its span embeddings)
ONNX_ONLY = (
    "models torch runs (every model here is an ONNX graph, which onnxruntime runs on the CPU in "
    "its own precision, or a file of its span embeddings)"
)


class DecomposeConfig(Settings):
    """Everything a decomposition run needs; every field is also a recipe key."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    models: list[ModelRef] = Field(
        description="Two or more models, in basis order. On the command line, one flag per model: "
        "[NAME=][random:]PATH_OR_HUB_ID[@REVISION], [NAME=]gguf:FILE, "
        "[NAME=]onnx:FILE[#TOKENIZER] or [NAME=]precomputed:FILE."
    )
    corpus: CorpusSpec = Field(description="The text the spans are cut from.")
    spans: SpanSpec = Field(
        default_factory=SpanSpec, description="How documents become spans, and how many per split."
    )
    reference_tokenizer: PathText | None = Field(default=None, description=REFERENCE_TOKENIZER_HELP)
    layer: int = Field(
        default=-1, description="Hidden layer to pool (negative counts from the last)."
    )
    pooling: Pooling = Field(
        default="mean", description="mean over real tokens, first token, or last real token."
    )
    exclude_special: bool = Field(default=False, description="Leave special tokens out of pooling.")
    dtype: DtypeChoice = Field(
        default="float32",
        description="Forward-pass precision: float32, bfloat16 (autocast; weights and pooling "
        "stay float32) or auto (bfloat16 where the hardware has it natively).",
    )
    device: DeviceChoice = Field(
        default="cpu", description="Where the models run: cpu, cuda, or auto (cuda when present)."
    )
    weights_dtype: Literal["float32", "bfloat16"] = Field(
        default="float32",
        description="Precision the weights are loaded in: bfloat16 halves a model's memory (a "
        "model larger than one device at float32); its forward pass is then bfloat16, pooled "
        "in float32.",
    )
    device_map: Literal["auto"] | None = Field(
        default=None,
        description="auto: spread each model over this process's devices layer by layer "
        "(Accelerate's big-model loading: its GPUs in order, then the CPU); under several "
        "processes on one machine each takes an equal share of the GPUs. Needs device cuda or "
        "auto.",
    )
    batch_size: int = Field(default=32, ge=1, description="Spans per forward pass.")
    max_length: int | None = Field(
        default=None, ge=2, description="Cap on tokens per span per model."
    )
    products: Products = Field(
        default="float32",
        description="Precision of the Gram products of the pass over embeddings (rows centred "
        "first; accumulated in float64 either way). float64 when a basis is singular at float32 "
        "resolution and the alpha is tiny.",
    )
    alpha: float = Field(default=1e-2, ge=0, description="Ridge strength (see alpha_mode).")
    alpha_mode: AlphaMode = Field(
        default="relative",
        description="'relative': alpha times each basis model's mean variance; 'absolute'.",
    )
    target: str | None = Field(
        default=None, description="Also fit this one model on the models named by basis."
    )
    basis: list[str] | None = Field(
        default=None, description="Basis models of the target fit (names, with target)."
    )
    study: StudySpec = Field(default_factory=StudySpec, description="Sweeps and statistics.")
    scale: ScaleSpec = Field(
        default_factory=ScaleSpec,
        description="Wide studies: exact or reduced statistics, their precision, the memory.",
    )
    save_weights: bool = Field(default=False, description="Write fitted weights as safetensors.")
    save_statistics: bool = Field(
        default=False,
        description="Write each split's second moments as stats/{split}.safetensors, for fits "
        "of your own later (D x D float64 each: 190 MiB at D = 4,992).",
    )
    figures: bool = Field(
        default=False,
        description="Also draw the run's figures (pairwise_r2_test.png, plots/*.png); "
        "`lmalgebra report RUN_DIR` draws them for a finished run at any time.",
    )
    out: Path = Field(default=Path("runs/decompose"), description="Output directory.")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Cache root for everything the command caches: embeddings, spans, hashes, "
        "packaged and dequantised GGUF models ($LMALGEBRA_CACHE, else ~/.cache/lmalgebra).",
    )
    progress: bool = Field(default=True, description="Progress bars (in a log: a line a minute).")

    @model_validator(mode="after")
    def _check(self) -> DecomposeConfig:
        names = [m.name for m in self.models]
        if len(names) < 2:
            raise UserInputError(f"decomposition needs at least two models, got {len(names)}")
        if len(set(names)) != len(names):
            dup = sorted({n for n in names if names.count(n) > 1})
            raise UserInputError(
                f"model names must be unique; repeated: {', '.join(dup)} (name each model: "
                f"{MODEL_NAMING})"
            )
        refuse_same_model(self.models)
        if (self.target is None) != (self.basis is None):
            raise UserInputError(f"{setting('target')} and {setting('basis')} go together")
        if self.device_map is not None and self.device == "cpu":  # auto falls back as it says
            default = "" if "device" in self.model_fields_set else " (the default)"
            device, device_map = setting("device"), setting("device_map")
            raise UserInputError(
                f"{device_map} {self.device_map} spreads each model over the GPUs, and {device} "
                f"cpu{default} runs the models on the CPU: give {device} cuda or auto with it, "
                f"or leave {device_map} out"
            )
        default_alpha = type(self).model_fields["alpha"].default
        if self.study.alpha_select != "fixed" and self.alpha != default_alpha:
            raise UserInputError(
                f"{setting('alpha')} {self.alpha:g} would be ignored: "
                f"{setting('study.alpha_select')} {self.study.alpha_select} chooses alpha over "
                f"{setting('study.alpha_grid')}; give one of the two"
            )
        if self.alpha == 0 and self.study.alpha_select == "fixed":  # no penalty to scale
            penalty = f"{setting('alpha')} above 0 (a ridge penalty)"
            refuse_ignored(self, setting(""), {"alpha_mode": penalty})
        if self.target is not None and self.basis is not None:
            if self.target not in names:
                raise UserInputError(
                    f"target {self.target!r} is not among the models ({', '.join(names)})"
                )
            if self.target in self.basis:
                raise UserInputError(f"the basis contains the target {self.target!r}")
            unknown = [b for b in self.basis if b not in names]
            if unknown:
                raise UserInputError(f"basis model {unknown[0]!r} is not among the models")
            if not self.basis:
                raise UserInputError("the basis is empty")
            if len(set(self.basis)) != len(self.basis):  # the solver's line, by the plan too
                raise UserInputError(f"the basis names a model twice: {list(self.basis)}")
        if self.scale.reduced:  # its statistics of principal coordinates take float32 products
            exact = f"{setting('scale.method')} exact"
            refuse_ignored(self, setting(""), {"products": exact})
        if self.study.lengths is not None and set(self.study.lengths) == {self.spans.length}:
            raise UserInputError(  # its one row would be the main fits again
                f"{setting('study.lengths')} {self.study.lengths} would be ignored: its one "
                f"length is the run's own ({setting('spans.length')} {self.spans.length}); list "
                "other lengths beside it"
            )
        if self.pooling == "first":  # the state at position 0, whatever the special tokens
            pooling = f"{setting('pooling')} mean or last"
            refuse_ignored(self, setting(""), {"exclude_special": pooling})
        fixed = [m.name for m in self.models if m.source.fixed_spans]
        self.refuse_embedding_settings(fixed)
        unread = [m.source.IGNORES for m in self.models if m.name not in fixed]
        self.refuse_unread(unread, ONNX_ONLY)
        if fixed and (self.study.lengths or self.study.languages):
            raise UserInputError(
                f"model {fixed[0]!r} is a file of precomputed embeddings of this run's spans; "
                "the span-length and language sweeps draw other spans"
            )
        if self.study.attribution and not self.study.bootstrap and len(names) <= EXACT_SHAPLEY + 1:
            sampled = f"Shapley values of more than {EXACT_SHAPLEY + 1} models (sampled"
            exact = f"those of {len(names)} are exact)"
            bootstrap = f"{setting('study.bootstrap')} and {sampled}; {exact}"
            refuse_ignored(self.study, setting("study."), {"seed": bootstrap})
        for name in self.study.layer_map or []:
            if name not in names:
                raise UserInputError(
                    f"layer_map model {name!r} is not among the models ({', '.join(names)})"
                )
        return self

    def refuse_embedding_settings(self, fixed: list[str]) -> None:
        """Refuse a setting of embedding (:data:`EMBEDDING_SETTINGS`) of its own when every
        model is one of ``fixed``, vectors of the run's spans given as they are (files of
        precomputed embeddings; arrays given to ``lmalgebra.decompose()``): nothing embeds."""
        if set(fixed) >= {m.name for m in self.models}:
            what = "models that embed text (every model here is given as its span embeddings)"
            refuse_ignored(self, setting(""), dict.fromkeys(EMBEDDING_SETTINGS, what))

    def refuse_unread(self, unread: Sequence[Collection[str]], what: str) -> None:
        """Refuse a setting of embedding of its own that none of the models embedding text
        reads (``unread``: those each does not read, its ``ModelSource.IGNORES``; ``what``
        names the models that read them)."""
        common = [s for s in EMBEDDING_SETTINGS if unread and all(s in u for u in unread)]
        refuse_ignored(self, setting(""), dict.fromkeys(common, what))

    def resolved(self) -> DecomposeConfig:
        """This configuration with ``dtype: auto`` replaced by the dtype it resolves to here, as
        recorded in ``config.yaml`` (an ``auto`` run on another machine may be another run)."""
        if self.dtype != "auto":
            return self
        return self.model_copy(update={"dtype": self.embed_spec().dtype})

    def embed_spec(self) -> EmbedSpec:
        """The embedding settings, device and dtype resolved for this machine (``auto`` logs
        its choice; an unusable device or dtype is refused here, before any model loads)."""
        device = device_type(self.device, "decompose device")
        dtype = resolve_dtype_name(self.dtype, device, "decompose dtype")
        if self.weights_dtype == "bfloat16":
            check_bf16(device, "decompose weights_dtype", "use float32")
        return EmbedSpec(
            self.layer,
            self.pooling,
            self.exclude_special,
            dtype,
            self.batch_size,
            self.max_length,
            device=str(device),
            weights_dtype=self.weights_dtype,
            device_map=self.device_map,
        )


def load_config(
    recipe: Path | None, overrides: dict[str, Any], call: str | None = None
) -> DecomposeConfig:
    """A recipe file (optional) with command-line values laid over it. ``call``: the Python
    call that reads the file (``decompose_recipe() recipe``), whose refusals name the file's
    keys as keys, where the command line's name them as flags (``--study.level``, a Python
    caller had been told of flags)."""
    data = read_yaml(recipe, shipped=True) if recipe is not None else {}
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    source = str(recipe) if recipe else COMMAND_LINE
    flagged = flag_keys(overrides)
    config = validate(DecomposeConfig, data, Call(f"{call} {source}") if call else source, flagged)
    if recipe is not None:  # a relative path of the file found beside it alone: named
        base = home_expanded(recipe).absolute().parent
        texts = recipe_paths(config, overrides, ("out", "cache_dir"))
        names = {m.name for m in config.models}  # a reference_tokenizer naming a model
        split = [(key, split_language(text)[1]) for key, text in texts if text not in names]
        refuse_found_elsewhere(split, recipe, base, "the recipe's directory")
    return config


# Fields that say where and how a run is shown or stored, not what it computes: a run resumed or
# redone with other values of these is the same run.
INCIDENTAL = (
    "out",
    "cache_dir",
    "progress",
    "batch_size",
    "device",
    "device_map",
    "figures",
    "save_statistics",
)


def config_yaml(config: DecomposeConfig) -> str:
    """The resolved configuration as written to ``config.yaml``."""
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)


def run_identity(data: dict[str, Any]) -> dict[str, Any]:
    """What makes a decomposition this decomposition: its resolved configuration, less
    ``INCIDENTAL`` fields (and the memory its plan was held to)."""
    identity = {k: v for k, v in data.items() if k not in INCIDENTAL}
    if isinstance(identity.get("scale"), dict):
        scale = {k: v for k, v in identity.pop("scale").items() if k != "memory_gib"}
        defaults = ScaleSpec().model_dump(mode="json", exclude={"memory_gib"})
        if scale != defaults:  # runs at the defaults keep the identity they had before
            identity["scale"] = scale
    # newer keys at their defaults are left out too, for the same reason
    if identity.get("weights_dtype") == "float32":
        del identity["weights_dtype"]
    study = identity.get("study")
    if isinstance(study, dict) and study.get("similarity") is True:
        identity["study"] = {k: v for k, v in study.items() if k != "similarity"}
    return identity
