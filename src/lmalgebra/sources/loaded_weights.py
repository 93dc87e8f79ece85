"""What transformers left out when it loaded a model: weights the files lack or hold beyond it.

transformers fills a weight the files lack with fresh random values and drops a tensor the model
has no place for, then reports both in a log line the toolkit's quiet logging hides: the model
loads, the command exits 0 and its results change from run to run. Every model the toolkit reads
weights from (a model to embed, a teacher, a student's ``init``, a GGUF file's dequantised
model) passes :func:`refuse_incomplete` instead, which names the model and a few tensors. Before
any weights are read (a dry run too), :func:`refuse_planned_gaps` says the same from the
safetensors headers alone, matched to the tensors the architecture built on the ``meta`` device
expects by transformers' own renaming, base-model prefix and tied-weight rules.

Two kinds of report are expected and pass: tensors of a part the loaded class does not have (a
checkpoint's language-model head or pooler when the bare model is loaded, a pre-training head
beside the masked-LM head), and weights the caller says it never uses (``unused``: the pooler of
a model read for its hidden states).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lmalgebra.core.errors import UserInputError, counted

SHOWN = 3  # tensors named in a message; the count says how many more
FINITE_SLICE = 1 << 22  # values of a weight checked for NaN or inf at once

# keyword arguments of every checked ``from_pretrained``: transformers then reports what it left
# out instead of raising on a tensor of another shape (a message that points at a log line the
# toolkit's quiet logging hides), so :func:`refuse_incomplete` can name the tensor
CHECKED_LOAD: dict[str, Any] = {"output_loading_info": True, "ignore_mismatched_sizes": True}


# a language model's head, by its auto class: how a message names it, the command that trains one
HEADS = {
    "AutoModelForMaskedLM": ("masked-LM", "lmalgebra pretrain masked"),
    "AutoModelForCausalLM": ("causal-LM", "lmalgebra pretrain causal"),
}


def refuse_headless(owner: str, shown: str, auto: str, base: str, missing: Iterable[str]) -> None:
    """Refuse a language model whose files lack weights of its head alone (every ``missing``
    key outside its base model ``base``): a random head would produce confident nonsense."""
    keys = sorted(missing)
    if auto not in HEADS or not keys or any(key.startswith(f"{base}.") for key in keys):
        return
    what, command = HEADS[auto]
    listed_keys = ", ".join(keys[:SHOWN]) + (" ..." if len(keys) > SHOWN else "")
    raise UserInputError(
        f"{owner}: {shown} has no trained {what} head (missing weights: {listed_keys}); "
        f"pre-train one with `{command}` or use another"
    )


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
    owner: str,
    directory: Path,
    model: Any,
    info: dict[str, Any],
    unused: tuple[str, ...] = (),
    shown: str | None = None,
) -> None:
    """Refuse ``model`` (loaded from ``directory`` with :data:`CHECKED_LOAD`, which
    gave ``info``) when a weight it uses was missing from the files, a tensor of the files
    found no place in it or a weight holds NaN or inf. ``unused``: module names (``"pooler"``)
    whose missing weights do not matter to the caller. ``owner`` starts the message ("model
    'x'"); ``shown`` names the model in it (default: ``directory``; the file as given for a
    GGUF file's dequantised model)."""
    shown = shown or str(directory)
    _refuse_gaps(
        owner,
        shown,
        info.get("missing_keys", ()),
        {key for key in info.get("unexpected_keys", ()) if _part_of_model(model, key)},
        {_shapes(key) for key in info.get("mismatched_keys", ())},
        unused,
    )
    stored = _header_shapes(str(directory), safetensors_files(directory))
    prefix, weights = getattr(model, "base_model_prefix", ""), set(model.state_dict())
    _refuse_doubled(owner, shown, _doubled(stored, prefix, weights))
    _refuse_integral(owner, shown, _integer_weights(stored, model))
    non_finite = _non_finite_weights(model)
    if non_finite:
        raise UserInputError(
            f"{owner}: {shown} holds NaN or inf in {len(non_finite)} of the model's weights "
            f"({listed(non_finite)}); every output computed through them would be NaN: the "
            "file is damaged"
        )


def _refuse_integral(owner: str, shown: str, integral: set[str]) -> None:
    """The one line for floating-point weights stored as integers (``name in I32``), whether
    found by a load or from the files' headers."""
    if integral:
        raise UserInputError(
            f"{owner}: {shown} stores {len(integral)} of the model's floating-point weights "
            f"as integers ({listed(integral)}); transformers would cast them to float: the "
            "file is damaged or not this model's"
        )


def _doubled(stored: Iterable[str], prefix: str, weights: set[str]) -> set[str]:
    """The model's weights ``stored`` twice, under their name with the base-model prefix and
    without it (``h.0.mlp.c_fc.weight`` beside ``transformer.h.0.mlp.c_fc.weight``): each pair
    is one weight to transformers, which loads one of the two without a word."""
    names = set(stored)
    return {
        f"{prefix}.{key}"
        for key in names
        if prefix and f"{prefix}.{key}" in names and {key, f"{prefix}.{key}"} & weights
    }


def _refuse_doubled(owner: str, shown: str, doubled: set[str]) -> None:
    """The one line for weights stored twice (:func:`_doubled`), whether found by a load or
    from the files' headers."""
    if doubled:
        raise UserInputError(
            f"{owner}: {shown} holds {len(doubled)} of the model's weights twice, with the "
            f"base-model prefix and without it ({listed(doubled)}); transformers would load one "
            "of each pair and drop the other: the files are not one model's"
        )


def _integral(dtype: str) -> bool:
    """Whether a safetensors dtype (``I32``, ``BOOL``, ``F16``) holds no floating-point values."""
    return dtype == "BOOL" or dtype[:1] in ("I", "U")


def _non_finite_weights(model: Any) -> set[str]:
    """The names of ``model``'s floating-point weights that hold a NaN or an infinity."""
    return {
        name
        for name, param in model.named_parameters()
        if param.is_floating_point() and not _finite(param)
    }


def _finite(param: Any) -> bool:
    """Whether every value of ``param`` is finite, read in slices of :data:`FINITE_SLICE`
    values: a mask of a whole embedding table would take as much memory again."""
    import torch

    with torch.no_grad():
        flat = param.detach().reshape(-1)
        return all(
            bool(torch.isfinite(flat[start : start + FINITE_SLICE]).all())
            for start in range(0, flat.numel(), FINITE_SLICE)
        )


def _refuse_gaps(
    owner: str,
    shown: str,
    missing: Iterable[str],
    unplaced: set[str],
    mismatched: set[str],
    unused: tuple[str, ...],
) -> None:
    """The one line for weights the files lack (``unused`` module names aside), hold beyond
    the model or hold in other shapes, whether found by a load or from the files' headers."""
    lacked = {key for key in missing if not any(part in unused for part in key.split("."))}
    if lacked:
        raise UserInputError(
            f"{owner}: {shown} lacks {len(lacked)} of the model's weights "
            f"({listed(lacked)}); transformers would fill them with random values"
        )
    if unplaced:
        raise UserInputError(
            f"{owner}: {shown} holds {counted(len(unplaced), 'weight')} its configuration has no "
            f"place for ({listed(unplaced)}); config.json does not describe these weights"
        )
    if mismatched:
        raise UserInputError(
            f"{owner}: {shown} holds {counted(len(mismatched), 'weight')} of other shapes than its "
            f"configuration gives ({listed(mismatched)}); transformers would fill them with "
            "random values"
        )


def safetensors_files(directory: Path, owner: str | None = None) -> list[Path]:
    """The safetensors files ``from_pretrained`` reads in ``directory``: ``model.safetensors``,
    else those its sharded checkpoint's index names (none: ``.bin`` weights, or no weights).
    With ``owner`` (how a message starts), an index that cannot be read or that names a file
    that is not there or one outside ``directory`` is refused, naming it, as the load would
    fail on it; without, such an index gives no files. A shard in a folder of the directory is
    one of its files (:func:`lmalgebra.sources.model_files.weight_files` hashes it)."""
    import json

    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    index = directory / "model.safetensors.index.json"
    if not index.is_file():
        return []
    try:
        names = json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()
        files = [directory / str(name) for name in sorted(set(names))]
        if not files:  # transformers fails on it with an IndexError, after the plan passed
            raise ValueError("its weight_map names no weight file")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        if owner is None:
            return []
        raise UserInputError(
            f"{owner}: {index} is no index of a sharded checkpoint ({type(err).__name__}: "
            f"{err}); transformers cannot load the model from it"
        ) from None
    outside = [name for name in sorted({str(n) for n in names}) if _outside(name)]
    if outside:  # transformers refuses the index: a shard outside the model's directory
        if owner is None:
            return []
        raise UserInputError(
            f"{owner}: {index} names {len(outside)} weight files outside {directory} "
            f"({listed(outside)}); transformers loads no shard from outside the model's directory"
        )
    absent = [f.name for f in files if not f.is_file()]
    if absent and owner is not None:
        raise UserInputError(
            f"{owner}: {index} names {len(absent)} weight files that are not in {directory} "
            f"({listed(absent)}); transformers cannot load the model without them"
        )
    return [] if absent else files


def _outside(name: str) -> bool:
    """Whether a shard's ``name`` in an index leaves the model's directory, as transformers
    tells it: an absolute path, or one through ``..`` (not by following links: a hub snapshot's
    shards are links into its cache)."""
    return bool(Path(name).anchor) or ".." in Path(name).parts


def _header_shapes(owner: str, files: list[Path]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Each tensor's name, shape and dtype (``F32``) in ``files``, read from their headers (no
    weights read); a header safetensors cannot read is refused, naming the file (the load would
    fail on it). A tensor two files hold is refused: transformers loads one of the two, the
    index's choice aside, without a word."""
    from safetensors import safe_open

    shapes: dict[str, tuple[tuple[int, ...], str]] = {}
    held: dict[str, Path] = {}  # the file holding each tensor
    for path in files:
        try:  # a file this user may not read is no damaged one
            path.open("rb").close()
        except OSError as err:
            raise UserInputError(f"{owner}: cannot read {path}: {err.strerror or err}") from None
        try:
            with safe_open(str(path), "pt") as handle:
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle is no dict)
                    found = handle.get_slice(key)
                    shapes[key] = (tuple(found.get_shape()), found.get_dtype())
                    _refuse_twice(owner, path, held.setdefault(key, path), handle.keys())
        except UserInputError:
            raise
        except Exception as err:  # safetensors' own error types
            raise UserInputError(
                f"{owner}: {path} is damaged: safetensors cannot read its header ({err})"
            ) from None
    return shapes


def _refuse_twice(owner: str, path: Path, first: Path, keys: Iterable[str]) -> None:
    """The one line for tensors ``path`` holds that ``first``, an earlier file of the set, holds
    too (``keys``: those of ``path``)."""
    if first == path:
        return
    from safetensors import safe_open

    with safe_open(str(first), "pt") as handle:
        twice = set(keys) & set(handle.keys())
    raise UserInputError(
        f"{owner}: {path} and {first.name} hold the same tensors, {len(twice)} of them "
        f"({listed(twice)}); transformers would load one of each pair, whichever file the index "
        "names, and drop the other: the files are not one model's"
    )


def refuse_planned_gaps(
    owner: str, directory: Path, shown: str, auto: str, unused: tuple[str, ...] = ()
) -> None:
    """Refuse, before any weights are read, a model directory whose safetensors files lack a
    weight the ``auto`` form of its architecture uses, hold one it has no place for or hold one
    of another shape, in :func:`refuse_incomplete`'s words (``shown`` names the directory).
    The tensors are read from the files' headers and matched to those of the model built on the
    ``meta`` device as ``from_pretrained`` matches them: its key renamings, the base-model
    prefix (a checkpoint of the bare model read into a head model, and the reverse), tied
    weights (one of a tied pair is enough), ``_keys_to_ignore_on_load_missing`` and buffers
    that are not saved. Anything it cannot tell from names and shapes alone (a tensor a
    converter splits or fuses, weights other than safetensors, a quantised checkpoint, a model
    transformers cannot build on ``meta``) is left to the load's check. An index naming files
    that are not there, or a header safetensors cannot read, is refused too: the load would
    fail on it."""
    files = safetensors_files(directory, owner)
    if not files:
        return
    stored = _header_shapes(owner, files)
    try:
        gaps = _planned_gaps(directory, auto, stored)
    except Exception:  # transformers' internals of another release: the load checks it
        return
    if gaps is None:
        return
    missing, unplaced, mismatched, integral, base, expected = gaps
    _refuse_doubled(owner, shown, _doubled(stored, base, expected))
    refuse_headless(owner, shown, auto, base, missing)
    _refuse_gaps(owner, shown, missing, unplaced, mismatched, unused)
    _refuse_integral(owner, shown, integral)


def _planned_gaps(
    directory: Path, auto: str, stored: dict[str, tuple[tuple[int, ...], str]]
) -> tuple[set[str], set[str], set[str], set[str], str, set[str]] | None:
    """What :func:`refuse_incomplete` would find missing, unplaced, mismatched and stored as
    integers were the tensors ``stored`` (name: shape, dtype) loaded into the ``auto`` model of
    ``directory``'s configuration, the model's base-model prefix and its weights' names; None
    for a quantised checkpoint, whose tensors its quantiser names."""
    import re

    import torch
    import transformers
    from transformers import AutoConfig
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    config = AutoConfig.from_pretrained(directory)
    if getattr(config, "quantization_config", None):  # its modules are the quantiser's to make
        return None
    with torch.device("meta"):
        model = getattr(transformers, auto).from_config(config)
    expected = model.state_dict()  # parameters and saved buffers
    prefix = model.base_model_prefix
    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    missing, unexpected, mismatched, integral = set(expected), set(), set(), set()
    for key, (shape, dtype) in sorted(stored.items()):
        renamed, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if renamed not in expected and key in expected:
            renamed, pattern = rename_source_key(key, [], [], prefix, expected)
        if pattern is not None:  # split or fused at load: its names only say it is there
            targets = by_pattern[pattern].target_patterns
            found = {renamed.replace(targets[0], t) for t in targets}
            if renamed in expected:
                missing -= found
            else:
                unexpected |= found
            continue
        if renamed not in expected:
            unexpected.add(renamed)
            continue
        missing.discard(renamed)
        if _integral(dtype) and expected[renamed].is_floating_point():
            integral.add(f"{key} in {dtype}")
        if tuple(expected[renamed].shape) != shape:
            mismatched.add(_shapes((renamed, shape, tuple(expected[renamed].shape))))
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    groups: dict[str, set[str]] = {}
    for target, source in tied.items():
        groups.setdefault(source, {source}).add(target)
    for group in groups.values():
        if group - missing:  # one of a tied group in the files gives the others theirs
            missing -= group
    patterns = [*(model._keys_to_ignore_on_load_missing or ())]
    missing = {k for k in missing if not any(re.search(p, k) for p in patterns)}
    unplaced = {k for k in unexpected if _part_of_model(model, k)}
    ignored = [*(getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ())]
    ignored += [r"rotary_emb\.inv_freq", r"(^|\.)position_ids$"]
    unplaced = {k for k in unplaced if not any(re.search(p, k) for p in ignored)}
    return missing, unplaced, mismatched, integral, prefix, set(expected)


def _integer_weights(stored: dict[str, tuple[tuple[int, ...], str]], model: Any) -> set[str]:
    """The tensors ``stored`` (a model's files' headers: name, shape and dtype) in an integer
    or boolean dtype where ``model`` has a floating-point parameter of that name (a head-model
    checkpoint's ``base_model_prefix`` aside), as ``name in I32``. Integer buffers
    (``position_ids``) and a quantised model's own integer parameters are no such weights."""
    floating = {n for n, p in model.named_parameters() if p.dtype.is_floating_point}
    prefix = getattr(model, "base_model_prefix", "") + "."
    return {
        f"{key} in {dtype}"
        for key, (_, dtype) in stored.items()
        if _integral(dtype) and {key, key.removeprefix(prefix), prefix + key} & floating
    }


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
