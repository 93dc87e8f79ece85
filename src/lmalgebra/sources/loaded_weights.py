"""What transformers left out when it loaded a model: weights the files lack or hold beyond it.

transformers fills a weight the files lack with fresh random values and drops a tensor the model
has no place for, then reports both in a log line the toolkit's quiet logging hides: the model
loads, the command exits 0 and its results change from run to run. Every model the toolkit reads
weights from (a model to embed, a teacher, a student's ``init``, a GGUF file's dequantised
model) passes :func:`refuse_incomplete` instead, which names the model and a few tensors.

Two kinds of report are expected and pass: tensors of a part the loaded class does not have (a
checkpoint's language-model head or pooler when the bare model is loaded, a pre-training head
beside the masked-LM head), and weights the caller says it never uses (``unused``: the pooler of
a model read for its hidden states).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError

SHOWN = 3  # tensors named in a message; the count says how many more

# keyword arguments of every checked ``from_pretrained``: transformers then reports what it left
# out instead of raising on a tensor of another shape (a message that points at a log line the
# toolkit's quiet logging hides), so :func:`refuse_incomplete` can name the tensor
CHECKED_LOAD: dict[str, Any] = {"output_loading_info": True, "ignore_mismatched_sizes": True}


def listed(keys: Iterable[str]) -> str:
    names = sorted(keys)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _part_of_model(model: Any, key: str) -> bool:
    """Whether the checkpoint tensor ``key`` belongs to a module ``model`` has (so it should
    have been loaded): its own module exists, or the key runs into a layer list past its end.
    A key of a whole part the model lacks (``cls.predictions.bias`` for a bare ``BertModel``)
    does not."""
    import torch

    modules = dict(model.named_modules())
    prefix = getattr(model, "base_model_prefix", "")
    parts = key.split(".")
    if prefix and parts[0] == prefix and prefix not in modules:
        parts = parts[1:]  # a head-model checkpoint read into the bare model
    deepest: Any = model
    for depth in range(1, len(parts)):
        found = modules.get(".".join(parts[:depth]))
        if found is None:  # a layer past the end of a list, or a part the model lacks
            return isinstance(deepest, torch.nn.ModuleList | torch.nn.ModuleDict)
        deepest = found
    return True  # its module is there, without that tensor


def refuse_incomplete(
    owner: str, directory: Path, model: Any, info: dict[str, Any], unused: tuple[str, ...] = ()
) -> None:
    """Refuse ``model`` (loaded from ``directory`` with :data:`CHECKED_LOAD`, which
    gave ``info``) when a weight it uses was missing from the files or a tensor of the files
    found no place in it. ``unused``: module names (``"pooler"``) whose missing weights do not
    matter to the caller. ``owner`` starts the message ("model 'x'")."""
    missing = {
        key
        for key in info.get("missing_keys", ())
        if not any(part in unused for part in key.split("."))
    }
    if missing:
        raise UserInputError(
            f"{owner}: {directory} lacks {len(missing)} of the model's weights "
            f"({listed(missing)}); transformers would fill them with random values"
        )
    unplaced = {key for key in info.get("unexpected_keys", ()) if _part_of_model(model, key)}
    if unplaced:
        raise UserInputError(
            f"{owner}: {directory} holds {len(unplaced)} weights its configuration has no "
            f"place for ({listed(unplaced)}); config.json does not describe these weights"
        )
    mismatched = {_shapes(key) for key in info.get("mismatched_keys", ())}
    if mismatched:
        raise UserInputError(
            f"{owner}: {directory} holds {len(mismatched)} weights of other shapes than its "
            f"configuration gives ({listed(mismatched)}); transformers would fill them with "
            "random values"
        )
    integral = _integer_weights(directory, model)
    if integral:
        raise UserInputError(
            f"{owner}: {directory} stores {len(integral)} of the model's floating-point weights "
            f"as integers ({listed(integral)}); transformers would cast them to float: the "
            "file is damaged or not this model's"
        )


def _integer_weights(directory: Path, model: Any) -> set[str]:
    """The tensors of ``directory``'s safetensors files (their headers alone) stored in an
    integer or boolean dtype where ``model`` has a floating-point parameter of that name (a
    head-model checkpoint's ``base_model_prefix`` aside), as ``name in I32``. Integer buffers
    (``position_ids``) and a quantised model's own integer parameters are no such weights."""
    import json

    from safetensors import safe_open

    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        files = ["model.safetensors"] if (directory / "model.safetensors").is_file() else []
    floating = {n for n, p in model.named_parameters() if p.dtype.is_floating_point}
    prefix = getattr(model, "base_model_prefix", "") + "."
    found = set()
    for name in files:
        with safe_open(str(directory / name), "pt") as handle:
            for key in handle.keys():  # noqa: SIM118 (a safetensors handle is no dict)
                dtype = handle.get_slice(key).get_dtype()
                named = {key, key.removeprefix(prefix), prefix + key}
                if (dtype == "BOOL" or dtype[:1] in ("I", "U")) and named & floating:
                    found.add(f"{key} in {dtype}")
    return found


def _shapes(key: Any) -> str:
    """A mismatched-key report, ``(name, shape in the files, shape in the model)`` or a bare
    name, as ``name (files 3x3, model 32x32)``."""
    if not isinstance(key, tuple):
        return str(key)
    name, *shapes = key
    if len(shapes) != 2:
        return str(name)
    stored, wanted = ("x".join(str(n) for n in shape) for shape in shapes)
    return f"{name} (files {stored}, model {wanted})"
