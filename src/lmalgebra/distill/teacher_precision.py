"""Device and compute precision of teacher inference (``merge teach``), and how the teacher
store's key records the precision.

A store computed in bfloat16 holds other numbers than a float32 one, so the dtype the recipe's
``dtype`` resolves to is part of the key of ``topk/`` and ``logprobs/``: a float32 store is
never reused for a bfloat16 request, nor the reverse. The device is not: it changes where the
numbers are computed, not what they are.
"""

from __future__ import annotations

from typing import Any

import torch

from lmalgebra.core.precision import dtype_name, resolve_device, resolve_dtype
from lmalgebra.distill.recipe import MergeRecipe


def inference_setup(recipe: MergeRecipe) -> tuple[torch.device, torch.dtype]:
    """Where teacher inference runs and in which dtype, resolved for this machine (``auto``
    logs its choice; an unusable device or an unsupported bfloat16 is refused in one line)."""
    device = resolve_device(recipe.device, "merge recipe device")
    return device, resolve_dtype(recipe.dtype, device, "merge recipe dtype")


def dtype_key(dtype: torch.dtype | str) -> dict[str, Any]:
    """The store-key entry of a compute dtype.

    float32 adds nothing, so stores computed before the option existed keep their key (and
    students trained on them resume); any other dtype is named.
    """
    name = dtype if isinstance(dtype, str) else dtype_name(dtype)
    return {} if name == "float32" else {"dtype": name}


def accepted_dtypes(recipe: MergeRecipe) -> tuple[str, ...]:
    """The store dtypes a reader of the store accepts for the recipe's ``dtype``: ``auto`` may
    have resolved to either on the machine that ran ``merge teach``."""
    return ("float32", "bfloat16") if recipe.dtype == "auto" else (recipe.dtype,)
