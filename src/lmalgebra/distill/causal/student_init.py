"""A causal student started from a pre-trained causal LM (``student.init``), as DistilBERT was
from BERT: the model's weights and tokenizer, and with ``student.layers`` only the decoder layers
listed (in that order, renumbered from 0); embeddings, final norm and head are kept whole.

Any architecture ``AutoModelForCausalLM`` loads: its decoder layers are the one ``ModuleList`` as
long as ``config.num_hidden_layers``. Keeping a subset also renumbers each layer's ``layer_idx``
(its slot in the key-value cache) and subsets per-layer settings (``config.layer_types``: Gemma's
sliding or full attention per layer), so the saved student loads in plain transformers.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError, counted, merge_stage
from lmalgebra.core.settings import home_expanded
from lmalgebra.distill.student import CausalStudentSpec, check_layer_list
from lmalgebra.distill.teachers import load_lm, max_positions, model_config, refuse_other_head
from lmalgebra.sources.gguf_models import GGUF_PREFIX
from lmalgebra.sources.kinds import source_of
from lmalgebra.sources.model_source import named_as
from lmalgebra.sources.models import ModelRef

log = logging.getLogger(__name__)
ROLE = "student.init"


@dataclass(frozen=True)
class InitModel:
    """The model a student starts from, resolved.

    Attributes:
        given: ``student.init`` as written; ref: it, parsed; directory: where it resolved to.
        depth: its decoder layers; layers: those kept (None: every one).
        hashes: its fingerprint (weights, tokenizer, config; GGUF hash and quantisation for a
            GGUF file); empty when opened without weights (a dry run).
    """

    given: str
    ref: ModelRef
    directory: Path
    depth: int
    layers: list[int] | None
    hashes: dict[str, str]

    def record(self) -> dict[str, Any]:
        """What a student's checkpoints and ``lmalgebra.json`` record of where it started."""
        return {"reference": self.given, "layers": self.layers, "hashes": self.hashes}

    @property
    def positions(self) -> int:
        """The longest input the model reads (its ``config.json``)."""
        found = max_positions(self.directory)
        if found is None:
            raise UserInputError(
                f"student.init {self.given!r}: its config.json gives no context length"
            )
        return found

    def refuse_foreign_ids(self, largest: int) -> None:
        """Refuse a student token id ``largest`` past the rows of the model's token embeddings
        (its ``config.json``'s ``vocab_size``): tokenizer files of another model beside its
        weights, on which the forward pass would fail."""
        rows = model_config(self.directory).get("vocab_size")
        if isinstance(rows, int) and not isinstance(rows, bool) and largest >= rows:
            raise UserInputError(
                f"student.init {self.given!r}: the tokenizer gives token id {largest}, beyond "
                f"the {rows} rows of the model's token embeddings: is it this model's own "
                "tokenizer?"
            )


def init_reference(given: str) -> ModelRef:
    """``student.init`` as a model reference (``ModelRef.parse``'s spellings); refused unless it
    names a model with weights to start from."""
    ref = ModelRef.parse(given)
    if not ref.source.pretrained:
        raise UserInputError(
            f"student.init {given!r} must name a causal LM with weights (a directory, hub "
            "id, package:NAME or gguf:FILE)"
        )
    return ref


def refuse_init_inside(spec: CausalStudentSpec, student: Path) -> None:
    """Refuse ``spec.init`` naming a path inside ``student``, the directory of the student it
    would start (its saved model, a checkpoint): training would write over the model it starts
    from, and its checkpoints, which record that model's hashes, could never be resumed."""
    if spec.init is None:
        return
    local = home_expanded(Path(init_reference(spec.init).path.removeprefix(GGUF_PREFIX)))
    if not local.exists():
        return  # refused as no model by open_init, or a hub id
    found, own = local.resolve(), student.resolve()
    if found == own or own in found.parents:
        raise UserInputError(
            f"student.init {spec.init!r} is inside {student}, the directory of the student it "
            "would start: training would write over the model it starts from and could never "
            f"resume; copy that model elsewhere, or train a student of another name "
            f"({merge_stage('train', 'OTHER')})"
        )


def open_init(
    spec: CausalStudentSpec, memo_dir: Path | None = None, weights: bool = True
) -> InitModel | None:
    """The model ``spec.init`` names, resolved, checked (a causal LM; ``spec.layers`` within its
    depth) and fingerprinted (``weights=False``: neither fetched nor hashed); None without one."""
    if spec.init is None:
        return None
    from transformers import AutoConfig

    ref = init_reference(spec.init)
    owner = f"{ROLE} {spec.init!r}"
    source = source_of(ref, weights=weights)
    with named_as(ref.name, owner):
        directory = source.directory
    refuse_other_head(owner, directory, "causal", shown=ref.shown(directory))
    source.check_architecture("AutoModelForCausalLM", owner)
    depth = int(AutoConfig.from_pretrained(directory).num_hidden_layers)
    if spec.layers is not None:
        check_layer_list(spec.layers, depth)
    with named_as(ref.name, owner):
        hashes = source.fingerprint(memo_dir) if weights else {}
    return InitModel(spec.init, ref, directory, depth, spec.layers, hashes)


def init_student(init: InitModel) -> Any:
    """The model ``init`` names, float32 (the weights a student trains; lower precision is the
    training loop's autocast), keeping ``init.layers``; a refusal names it as given."""
    import torch

    owner = f"{ROLE} {init.given!r}"  # as given, as open_init names it (the dry run too)
    model = load_lm(init.ref, init.directory, "causal", owner=owner).to(torch.float32)
    if init.layers is not None:
        keep_layers(model, init.layers)
    return model


def decoder_layers(model: Any) -> tuple[Any, str]:
    """The module holding ``model``'s decoder layers and the attribute they are under (the
    ``ModuleList`` of ``config.num_hidden_layers`` entries)."""
    import torch

    depth = model.config.num_hidden_layers
    found = [
        (parent, name)
        for parent in model.modules()
        for name, child in parent.named_children()
        if isinstance(child, torch.nn.ModuleList) and len(child) == depth
    ]
    if len(found) != 1:
        raise UserInputError(
            f"student.layers: cannot tell which of {type(model).__name__}'s module lists holds "
            f"its {counted(depth, 'decoder layer')} ({counted(len(found), 'candidate')})"
        )
    return found[0]


def keep_layers(model: Any, layers: list[int]) -> None:
    """Keep ``model``'s decoder ``layers`` (in that order), renumbered from 0, in place."""
    import torch

    parent, name = decoder_layers(model)
    kept = [getattr(parent, name)[i] for i in layers]
    for index, layer in enumerate(kept):
        for module in layer.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = index  # its slot in the key-value cache
    setattr(parent, name, torch.nn.ModuleList(kept))
    config = model.config
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = [config.layer_types[i] for i in layers]
    config.num_hidden_layers = len(layers)
    log.info("student: decoder layers %s kept", layers)
