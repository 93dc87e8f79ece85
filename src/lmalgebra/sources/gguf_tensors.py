"""A GGUF file's tensors against the architecture it declares, read from its header alone.

transformers builds the model its configuration describes, then takes from the file each tensor
whose name that architecture has: a tensor of no such name is skipped without a word, and a
weight the file lacks keeps its random start. :func:`refuse_foreign_tensors` compares the
tensor names and sizes of the file's header with the parameters of that model, built without
memory (on the meta device), so a dry run, which dequantises nothing, refuses the file as the
run does, before anything is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError, counted
from lmalgebra.sources.loaded_weights import listed

# architectures whose tensor processor stores some tensors under names of its own (experts
# merged): checked once loaded, by the report of transformers (which a dry run never makes).
# gpt2's processor only transposes tensors and files ``output.weight`` as the head, the name
# its table gives too: it is checked here
_RENAMING = frozenset({"qwen2moe", "qwen3moe", "gpt_oss", "gpt-oss", "minimax-m2"})
# GGUF tensor types of integers: no floating-point weight is stored so, and the gguf package
# dequantises none of them (the load had failed on one, after the dry run had passed the file)
_INTEGRAL = frozenset({"I8", "I16", "I32", "I64"})


def model_class(config: Any) -> Any:
    """The transformers class a GGUF file's configuration is loaded as: its causal LM when
    transformers has one, else the bare model."""
    from transformers import AutoModel, AutoModelForCausalLM

    causal = type(config) in AutoModelForCausalLM._model_mapping
    return AutoModelForCausalLM if causal else AutoModel


def refuse_foreign_tensors(
    path: Path,
    config: Any,
    architecture: str,
    tensors: dict[str, tuple[tuple[int, ...], str]],
    owner: str,
) -> None:
    """Refuse GGUF file ``path`` (of ``config``, declaring ``architecture``, holding tensors of
    ``(shape, GGUF type)`` by name, the shape in the file's order, ``((576, 49152), "Q8_0")``)
    when a tensor is stored as integers,
    when transformers has no names for the tensors of the model its configuration gives, or when
    it lacks a weight the model uses, holds a tensor the model has no place for, or one of
    another size or shape. An architecture whose loader renames tensors is left to the check of the
    loaded model."""
    import gguf
    import torch

    _refuse_integral(path, {name: kind for name, (_, kind) in tensors.items()}, owner)
    shapes = {name: shape for name, (shape, _) in tensors.items()}
    with torch.device("meta"):
        model = model_class(config).from_config(config)
    _refuse_unnamed(path, model, owner)
    if architecture in _RENAMING or architecture not in gguf.MODEL_ARCH_NAMES.values():
        return
    mapping = _weights_map(model, config, architecture)
    missing = _missing(model, mapping, set(shapes))
    if missing:
        raise UserInputError(
            f"{owner}: {path} lacks {len(missing)} of the weights of the {architecture!r} "
            f"model it declares ({listed(missing)}); transformers would fill them with random "
            "values"
        )
    foreign = set(shapes) - set(mapping)
    if foreign:
        raise UserInputError(
            f"{owner}: {path} holds {counted(len(foreign), 'tensor')} the {architecture!r} "
            f"model it declares has no place for ({listed(foreign)}); transformers would drop "
            "them: the file is not the model its metadata describes"
        )
    other = _other_sizes(model, mapping, shapes)
    if other:
        raise UserInputError(
            f"{owner}: {path} holds {counted(len(other), 'tensor')} of other sizes than the "
            f"{architecture!r} model it declares ({listed(other)}); the file is not the model "
            "its metadata describes"
        )


def _refuse_integral(path: Path, types: dict[str, str], owner: str) -> None:
    """The one line for tensors ``types`` (name: GGUF type) gives an integer type."""
    integral = {f"{name} in {kind}" for name, kind in types.items() if kind in _INTEGRAL}
    if integral:
        raise UserInputError(
            f"{owner}: {path} stores {len(integral)} of the model's weights as integers "
            f"({listed(integral)}); transformers cannot dequantise them: the file is damaged or "
            "not this model's"
        )


def _refuse_unnamed(path: Path, model: Any, owner: str) -> None:
    """Refuse the GGUF file ``path`` whose configuration gives ``model`` (built on the meta
    device) when transformers finds no GGUF names for that model's tensors, as its load looks
    them up (its ``model_type`` in the gguf package's table of architectures: a file declaring
    ``mistral``, which llama.cpp writes as ``llama``, has none). Another failure of that lookup
    is left to the load."""
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    try:
        get_gguf_hf_weights_map(model, TensorProcessor())
    except NotImplementedError:
        model_type = model.config.model_type
        raise UserInputError(
            f"{owner}: {path} holds a {model_type!r} model, which transformers cannot read from "
            f"GGUF (the gguf package names no tensors of a {model_type!r} model); convert the "
            "original checkpoint instead, or give its Hugging Face directory"
        ) from None
    except Exception:  # transformers' internals of another release: the load says what fails
        return


def _weights_map(model: Any, config: Any, architecture: str) -> dict[str, str]:
    """GGUF tensor name -> the model's parameter name, as transformers' loader maps them: the
    longest tail of the parameter's dotted name that the architecture's table of GGUF names
    knows (a submodule's names below a prefix the table leaves out)."""
    import gguf

    arch = next(key for key, value in gguf.MODEL_ARCH_NAMES.items() if value == architecture)
    table = gguf.get_tensor_name_map(arch, config.num_hidden_layers)
    mapping: dict[str, str] = {}
    for hf_name, _ in model.named_parameters(remove_duplicate=False):
        stem, dot, suffix = hf_name.rpartition(".")
        parts = stem.split(".") if dot else [hf_name]
        for start in range(len(parts)):
            found = table.get_name(".".join(parts[start:]))
            if found is not None:
                mapping.setdefault(found + (dot + suffix if dot else ""), hf_name)
                break
    return mapping


def _missing(model: Any, mapping: dict[str, str], names: set[str]) -> set[str]:
    """The model's parameters no tensor of the file fills: a parameter shared by several names
    (tied embeddings) is filled when any of them is."""
    filled = {hf for name, hf in mapping.items() if name in names}
    groups: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(param), []).append(name)
    return {names[0] for names in groups.values() if not filled.intersection(names)}


def _other_sizes(
    model: Any, mapping: dict[str, str], shapes: dict[str, tuple[int, ...]]
) -> set[str]:
    """``name (file 32x64, model 64x32)`` of each tensor (its ``shapes`` in the file's order,
    shown in the model's) of other sizes than its parameter: another element count, or other
    axes. Axes are compared as transformers' loaders may change them (a transposed weight, a
    unit axis added): a weight reshaped to other sizes of the same count (flattened) had passed
    the plan, and the run refused it."""
    params = dict(model.named_parameters(remove_duplicate=False))
    found = set()
    for name, shape in shapes.items():
        param = params.get(mapping.get(name, ""))
        if param is not None and _axes(shape) != _axes(tuple(param.shape)):
            file, wanted = ("x".join(map(str, s)) for s in (shape[::-1], tuple(param.shape)))
            found.add(f"{name} (file {file}, model {wanted})")
    return found


def _axes(shape: tuple[int, ...]) -> list[int]:
    """A shape's sizes but those of 1, in order of size."""
    return sorted(size for size in shape if size != 1)
