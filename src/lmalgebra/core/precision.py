"""Where the heavy stages run and in which precision: devices, and bfloat16 where it is safe.

Embedding, teacher inference and training can run their matrix products in bfloat16 under
``torch.autocast`` (weights stay float32). That is fast only where the hardware has bfloat16
arithmetic: CPUs with the ``avx512_bf16`` or ``amx_bf16`` instructions, and CUDA devices that
support it natively. Elsewhere torch emulates it: the numbers are right but slower than float32.
So ``auto`` picks bfloat16 only where it is native, and an explicit ``bfloat16`` where it is not
is refused unless ``LMALGEBRA_ALLOW_SLOW_BF16=1`` (tests and numerical comparisons on any CPU).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lmalgebra.core.errors import UserInputError
from lmalgebra.core.memory import available_bytes

if TYPE_CHECKING:  # torch is imported by the functions that use it: the CLI parses without it
    import torch

log = logging.getLogger(__name__)

DtypeChoice = Literal["float32", "bfloat16", "auto"]
DeviceChoice = Literal["auto", "cpu", "cuda"]

# where the CPU's instruction-set flags are read; tests point it at a file of their own
CPUINFO = Path("/proc/cpuinfo")
CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")
ALLOW_SLOW_BF16 = "LMALGEBRA_ALLOW_SLOW_BF16"
_DTYPE_NAMES = ("float32", "bfloat16")


def cpu_flags(cpuinfo: Path | None = None) -> set[str] | None:
    """The CPU's feature flags from ``cpuinfo`` (default :data:`CPUINFO`); None if unreadable."""
    try:
        text = (cpuinfo or CPUINFO).read_text(errors="replace")
    except OSError:
        return None
    flags: set[str] = set()
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name.strip() in ("flags", "Features"):  # x86 and ARM spell the line differently
            flags.update(value.split())
    return flags


def bf16_support(device: torch.device | str, cpuinfo: Path | None = None) -> tuple[bool, str]:
    """Whether ``device`` computes in bfloat16 natively, and why (the flags found or missing).
    A CPU is judged by its flags alone (torch is not imported)."""
    kind = device.split(":")[0] if isinstance(device, str) else device.type
    if kind == "cuda":
        import torch

        device = torch.device(device)
        # torch counts emulated bfloat16 as supported by default: ask for native support only
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{torch.cuda.get_device_name(device)} supports bfloat16"
        return False, f"{torch.cuda.get_device_name(device)} has no native bfloat16"
    if kind != "cpu":
        return False, f"bfloat16 support on {kind} devices is not checked"
    path = cpuinfo or CPUINFO
    flags = cpu_flags(path)
    if flags is None:
        return False, f"{path} is unreadable, so the CPU's bfloat16 support is unknown"
    found = [flag for flag in CPU_BF16_FLAGS if flag in flags]
    if found:
        return True, f"the CPU has {' and '.join(found)}"
    return False, f"the CPU has neither {' nor '.join(CPU_BF16_FLAGS)}"


def native_bf16(device: str = "auto") -> bool:
    """Whether ``device`` (``auto``: a GPU when there is one, as Accelerate trains) computes in
    bfloat16 natively: what an ``auto`` precision of a plan resolves by."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return bf16_support(device)[0]


def check_bf16(device: torch.device | str, owner: str, remedy: str) -> None:
    """Refuse bfloat16 on ``device`` without native support (one line naming ``owner``, the
    reason and ``remedy``), unless ``LMALGEBRA_ALLOW_SLOW_BF16=1``."""
    supported, why = bf16_support(device)
    if supported:
        return
    if os.environ.get(ALLOW_SLOW_BF16) == "1":
        log.warning("%s: bfloat16 is emulated on %s (%s): correct but slow", owner, device, why)
        return
    raise UserInputError(
        f"{owner}: bfloat16 is not native on {device} ({why}); {remedy}, or set "
        f"{ALLOW_SLOW_BF16}=1 to run it emulated (correct but slow)"
    )


def resolve_dtype(requested: str, device: torch.device | str, owner: str) -> torch.dtype:
    """The compute dtype for ``requested`` (float32, bfloat16 or auto) on ``device``.

    ``auto``: bfloat16 where ``device`` has it natively, else float32; one info line says which
    and why. An explicit ``bfloat16`` without native support is refused (see :func:`check_bf16`).
    """
    import torch

    name = resolve_dtype_name(requested, device, owner)
    return torch.bfloat16 if name == "bfloat16" else torch.float32


def resolve_dtype_name(
    requested: str, device: torch.device | str, owner: str
) -> Literal["float32", "bfloat16"]:
    """:func:`resolve_dtype` as the name a cache key records (``float32`` or ``bfloat16``),
    without importing torch for a CPU."""
    if requested == "auto":
        supported, why = bf16_support(device)
        chosen: Literal["float32", "bfloat16"] = "bfloat16" if supported else "float32"
        log.info("%s auto: %s on %s (%s)", owner, chosen, device, why)
        return chosen
    if requested not in _DTYPE_NAMES:
        raise UserInputError(
            f"{owner}: {requested!r} is not a dtype; use float32, bfloat16 or auto"
        )
    if requested == "bfloat16":
        check_bf16(device, owner, "use float32 or auto")
        return "bfloat16"
    return "float32"


def dtype_name(dtype: torch.dtype) -> str:
    """``float32`` / ``bfloat16``: the name recorded in cache and store keys."""
    return str(dtype).removeprefix("torch.")


def device_type(requested: str, owner: str = "device") -> str:
    """``cpu`` or ``cuda``: the kind of device :func:`resolve_device` gives ``requested``,
    refused as it refuses. torch is not imported where the answer is known without it: ``cpu``
    asked for, or ``auto`` under a CPU-only build of torch (its version says ``+cpu``)."""
    if requested == "cpu" or (requested == "auto" and _cpu_only_torch()):
        return "cpu"
    return resolve_device(requested, owner).type


def _cpu_only_torch() -> bool:
    """Whether the installed torch is a CPU-only build, read from its package version (a CUDA
    build has no ``+cpu`` suffix), unless torch is imported already."""
    import sys
    from importlib import metadata

    if "torch" in sys.modules:
        return not sys.modules["torch"].cuda.is_available()
    try:
        return metadata.version("torch").endswith("+cpu")
    except metadata.PackageNotFoundError:
        return False


def resolve_device(requested: str, owner: str = "device") -> torch.device:
    """``auto``: CUDA when present, else the CPU; ``cuda`` without CUDA is refused.

    Under several processes each takes the GPU of its local rank (``LOCAL_RANK``)."""
    import torch

    if requested not in ("auto", "cpu", "cuda"):
        raise UserInputError(f"{owner}: {requested!r} is not a device; use auto, cpu or cuda")
    if requested == "cpu" or (requested == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise UserInputError(
            f"{owner}: cuda asked for, but torch sees no CUDA device (torch "
            f"{torch.__version__}); use cpu or auto"
        )
    local = launch_count("LOCAL_RANK", 0)
    return torch.device("cuda", local % torch.cuda.device_count())


def module_device(module: Any) -> torch.device | None:
    """The device of a module's first parameter; None for a module without parameters (an
    ONNX graph, a parameter-free module)."""
    parameters = getattr(module, "parameters", None)
    first = next(iter(parameters()), None) if callable(parameters) else None
    return None if first is None else first.device


def compute_context(device: torch.device, dtype: torch.dtype) -> Any:
    """The context a forward pass runs in: autocast to ``dtype`` on ``device``'s kind, or
    nothing for float32 (weights, and so the computation, are float32 already)."""
    import torch

    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def device_share(local_rank: int, local_size: int, gpus: int) -> list[int]:
    """The GPUs of process ``local_rank`` of ``local_size`` on a machine of ``gpus``: an equal,
    contiguous share (every process shares them all when there are fewer GPUs than processes)."""
    if gpus < local_size:
        return list(range(gpus))
    per = gpus // local_size
    return list(range(local_rank * per, (local_rank + 1) * per))


def device_map_memory() -> dict[str, Any]:
    """``max_memory`` keeping ``device_map="auto"`` on this process's share of the GPUs (and the
    CPU) when a launcher started several processes on this machine; nothing otherwise."""
    import torch

    local_size = launch_count("LOCAL_WORLD_SIZE", 1)
    if local_size == 1 or not torch.cuda.is_available():
        return {}
    gpus = torch.cuda.device_count()
    mine = device_share(launch_count("LOCAL_RANK", 0), local_size, gpus)
    memory: dict[Any, int] = {
        i: int(torch.cuda.get_device_properties(i).total_memory) if i in mine else 0
        for i in range(gpus)
    }
    memory["cpu"] = int(available_bytes() / local_size)
    return {"max_memory": memory}


# what launchers set for each process of a run (``launch_count`` reads them)
# How long a rank of several processes waits for the others at a collective (seconds): the main
# rank alone runs ``merge prepare`` and ``merge vocab`` while the others wait, which can take hours
# on a large corpus (torch's own limit is 30 minutes with gloo, 10 with NCCL)
TIMEOUT_VARIABLE = "LMALGEBRA_DIST_TIMEOUT"
DEFAULT_TIMEOUT_S = 6 * 3600.0


def wait_limit() -> float:
    """Seconds a rank waits for the others: ``$LMALGEBRA_DIST_TIMEOUT``, else 6 hours; one line
    naming it where it is no positive number."""
    text = os.environ.get(TIMEOUT_VARIABLE, "").strip()
    if not text:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (0 < seconds < math.inf):
        raise UserInputError(
            f"${TIMEOUT_VARIABLE} {text!r} is no positive number of seconds: how long a rank of "
            "several processes waits for the others (unset: 6 hours)"
        )
    return seconds


LAUNCH_VARIABLES = ("WORLD_SIZE", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK")


def launch_count(name: str, default: int) -> int:
    """The integer a launcher (torchrun, ``accelerate launch``) sets in the environment variable
    ``name`` (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``LOCAL_RANK``, ``RANK``), ``default`` where
    it is unset or empty; one line naming it where it is no integer (``int()``'s traceback had ended
    the command)."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise UserInputError(
            f"${name} {text!r} is no integer: launchers (torchrun, accelerate launch) set it to "
            "count or number the processes of a run; unset it for one process"
        ) from None
