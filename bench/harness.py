"""The benchmark harness: every benchmark in bench/ measures through it.

It owns the machine header (written once per result), waiting for an idle machine, running each
contender in a fresh interpreter, keeping the fastest of N attempts, peak memory, the CPU share
other processes took during each measurement, and writing figures as data
(``bench/results/<name>.json``, rendered into RESULTS.md by ``render.py``).

A contender is a function ``module:name`` of a module in bench/. It is called with JSON keyword
arguments and returns the *work*: a callable with no arguments that returns a JSON-able dict.
Everything the contender does before returning the work (imports, loading models, warm-up) is
untimed; the harness times the work alone. The child is started as
``python bench/harness.py --call module:name --kwargs JSON --result PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import hashlib
import importlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
RESULTS_DIR = BENCH / "results"
WORK = BENCH / "_work"
CLEAN = 0.05  # other processes' share of all CPUs above which a measurement is repeated
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
Work = Callable[[], dict[str, Any]]


IDLE = {"timeout": 300.0}  # seconds to wait for an idle machine (--idle-timeout)
# --tag: a result kept beside the benchmark's main one (another machine's figures), not over it
TAG = {"tag": ""}


def parse_args(parser: argparse.ArgumentParser, attempts: int = 3) -> argparse.Namespace:
    """Add the options every benchmark has (--attempts, --idle-timeout, --no-write), parse."""
    parser.add_argument("--attempts", type=int, default=attempts, help="most runs per figure")
    parser.add_argument(
        "--idle-timeout", type=float, default=300.0, help="most seconds to wait for idle CPUs"
    )
    parser.add_argument("--no-write", action="store_true", help="print the result only")
    parser.add_argument(
        "--tag",
        default="",
        help="keep this run beside the main result (results/NAME-TAG.json, its own section), "
        "e.g. the same benchmark on a CPU of another kind",
    )
    args = parser.parse_args()
    IDLE["timeout"] = args.idle_timeout
    TAG["tag"] = args.tag
    return args


# -- the machine ---------------------------------------------------------------------------------
def _cpuinfo(field: str) -> str:
    """The first value of ``field`` (the whole name) in ``/proc/cpuinfo``; "" when absent."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            if name.strip() == field:
                return value.strip()
    return ""


def cpu_id() -> str:
    """``family 6 model 143 stepping 8``: hosts of one model name and flag line (a virtual
    machine's "Intel(R) Xeon(R) Processor") can be CPUs of different speed."""
    fields = {"family": "cpu family", "model": "model", "stepping": "stepping"}
    parts = ((k, _cpuinfo(f)) for k, f in fields.items())
    return " ".join(f"{k} {v}" for k, v in parts if v)


def cores() -> int:
    """Cores this process may run on (``nproc``)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def machine() -> dict[str, Any]:
    """CPU model, cores, the CPU flags that matter for matrix work, RAM and library versions."""
    import numpy as np
    import torch

    ram = 0.0
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                ram = int(line.split()[1]) / 2**20
    flags = set(_cpuinfo("flags").split())
    gpu = {}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "gpu": f"{torch.cuda.device_count()} x {props.name}",
            "gpu_memory_gib": round(props.total_memory / 2**30, 1),
            "cuda": torch.version.cuda,
        }
    return {
        "cpu": _cpuinfo("model name") or platform.processor() or "unknown",
        "cpu_id": cpu_id(),
        "cores": cores(),
        "flags": [f for f in CPU_FLAGS if f in flags],
        "ram_gib": round(ram, 1),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "openblas": openblas_kernels(),
        **gpu,
    }


def product_rates(size: int = 2048, repeats: int = 3) -> dict[str, float]:
    """GFLOP/s of torch's ``size``-square matrix products at this moment (the fastest of
    ``repeats``; float32, and bfloat16 where the CPU has AVX512-BF16 or AMX), on torch's threads.
    Hosts with one model name and flag line ran them at rates twice apart, and one host's rate
    moves from hour to hour (the hypervisor's steal): this says how fast the machine was."""
    import torch

    rates: dict[str, float] = {}
    kinds = [("float32", torch.float32)]
    if {"avx512_bf16", "amx_bf16"} & set(_cpuinfo("flags").split()):
        kinds.append(("bfloat16", torch.bfloat16))
    for name, dtype in kinds:
        a = torch.randn(size, size).to(dtype)
        b = torch.randn(size, size).to(dtype)
        a @ b  # warm-up
        best = float("inf")
        for _ in range(repeats):
            clock = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - clock)
        rates[name] = round(2 * size**3 / best / 1e9)
    return rates


def conditions_line(c: dict[str, Any]) -> str:
    """``matrix products at the start: float32 190, bfloat16 430 GFLOP/s; hypervisor steal 31%
    of the CPUs over the run``."""
    rates = ", ".join(f"{k} {v:,}" for k, v in c.get("product_gflops", {}).items())
    parts = (
        [
            f"matrix products at the start ({c.get('product_size', 2048)}-square, torch): "
            f"{rates} GFLOP/s"
        ]
        if rates
        else []
    )
    if "steal_share" in c:
        parts.append(f"hypervisor steal {c['steal_share']:.0%} of the CPUs over the run")
    return "; ".join(parts)


def openblas_kernels() -> str:
    """The kernels NumPy's and SciPy's OpenBLAS run (``0.3.31 SkylakeX``), with the environment's
    ``OPENBLAS_CORETYPE`` where one chose them: on the same CPU, AVX2 ("Haswell") kernels run
    float32 products at about half the rate of the AVX-512 ("SkylakeX") ones."""
    import scipy.linalg  # noqa: F401  (loads SciPy's OpenBLAS beside NumPy's)
    from threadpoolctl import threadpool_info

    kernels = sorted(
        {
            f"{info.get('version')} {info.get('architecture')}"
            for info in threadpool_info()
            if info.get("internal_api") == "openblas"
        }
    )
    chosen = os.environ.get("OPENBLAS_CORETYPE")
    return ", ".join(kernels) + (f" (OPENBLAS_CORETYPE={chosen})" if chosen else "")


def machine_line(m: dict[str, Any]) -> str:
    """One line for RESULTS.md (older results kept only this line, as ``summary``)."""
    if "summary" in m:
        return str(m["summary"])
    flags = ", ".join(m["flags"]) or "no AVX2/AVX-512/AMX"
    gpu = f"; GPU {m['gpu']} ({m['gpu_memory_gib']} GiB, CUDA {m['cuda']})" if "gpu" in m else ""
    return (
        f"{m['cores']} cores (nproc), {m['cpu']}"
        + (f" ({m['cpu_id']})" if m.get("cpu_id") else "")
        + f" ({flags}), {m['ram_gib']} GiB RAM; Python "
        f"{m['python']}, numpy {m['numpy']}, torch {m['torch']} ({m['torch_threads']} threads)"
        + (f"; OpenBLAS {m['openblas']}" if m.get("openblas") else "")
        + gpu
    )


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return ""
    return done.stdout.strip()


def code_version(measured: Sequence[str]) -> str:
    """The commit of the checkout, noting uncommitted changes in the measured code."""
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = _git("status", "--porcelain", "--", *measured)
    return commit + (f" + uncommitted changes in {', '.join(measured)}" if dirty else "")


def _digest(measured: Sequence[str]) -> dict[str, str]:
    out = {}
    for entry in measured:
        path = ROOT / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path] if path.is_file() else []
        for file in files:
            out[str(file.relative_to(ROOT))] = hashlib.sha256(file.read_bytes()).hexdigest()
    return out


# -- CPU share of other processes, idle waits ----------------------------------------------------
def _cpu_fields() -> list[int]:
    """The first line of ``/proc/stat``: user nice system idle iowait irq softirq steal ...
    (clock ticks since boot, all cores together); zeros where it cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return (fields + [0] * 8)[:8]
    return [0] * 8


def _busy_seconds() -> float:
    """CPU time, all cores and processes together, spent running this machine's processes
    since boot: neither idle nor stolen by the hypervisor."""
    fields = _cpu_fields()
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:7]) - idle) / os.sysconf("SC_CLK_TCK")


def steal_seconds() -> float:
    """CPU time the hypervisor gave to other guests while this machine's CPUs wanted to run
    (``steal`` in ``/proc/stat``, all cores together, since boot). On a shared virtual host
    it is the part of a slowdown no process here can see."""
    return _cpu_fields()[7] / os.sysconf("SC_CLK_TCK")


def _own_cpu_seconds() -> float:
    """CPU time of this process and of its children it has waited for (a contender's job
    processes, once joined, are its own work, not other processes')."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class CpuWatch:
    """CPU time of this process, and the share of all CPUs other processes took, since made."""

    def __init__(self) -> None:
        self.wall, self.busy, self.own = time.perf_counter(), _busy_seconds(), _own_cpu_seconds()
        self.steal = steal_seconds()

    def stop(self, own: float | None = None) -> dict[str, float]:
        """``own``: CPU seconds of what was measured, when it is not this process (a child).
        ``steal_share``: the share of all CPUs the hypervisor took meanwhile (not in others')."""
        wall = time.perf_counter() - self.wall
        own = _own_cpu_seconds() - self.own if own is None else own
        others = max(0.0, _busy_seconds() - self.busy - own)
        capacity = wall * (os.cpu_count() or 1)
        return {
            "own_cpu_s": own,
            "others_cpu_s": others,
            "others_share": others / capacity,
            "steal_share": (steal_seconds() - self.steal) / capacity,
        }


def wait_for_idle(
    threshold: float = 0.1, window: float = 3.0, timeout: float | None = None
) -> float:
    """Wait (up to ``timeout`` s, default ``--idle-timeout``) until the CPUs are less than
    ``threshold`` busy over ``window`` seconds; returns the last share seen. With a timeout of
    0 (no waiting) the share is taken over a tenth of a second."""
    timeout = IDLE["timeout"] if timeout is None else timeout
    window = window if timeout > 0 else 0.1
    deadline = time.perf_counter() + timeout
    while True:
        before = _busy_seconds()
        time.sleep(window)
        share = (_busy_seconds() - before) / (window * (os.cpu_count() or 1))
        if share < threshold or time.perf_counter() > deadline:
            return share


@contextlib.contextmanager
def competing_process(count: int = 1) -> Iterator[None]:
    """``count`` processes spinning on the CPU for the duration: another user's job on a shared
    host, which takes one core each. Measurements under it say what a phase loses when it gets
    less than the whole machine (``wait_for_idle`` would wait for them to end: do not call it)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    time.sleep(0.5)  # started and scheduled
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


# -- memory ---------------------------------------------------------------------------------------
def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def rss_mib() -> float:
    return _status_mib("VmRSS")


def peak_rss_mib() -> float:
    """Peak RSS of this process since start or the last :func:`reset_peak_rss`."""
    try:
        return _status_mib("VmHWM")
    except (OSError, KeyError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS; False where not possible."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def release_memory() -> None:
    """Return freed heap memory to the OS, so the next measurement starts from a clean floor."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# -- measuring -----------------------------------------------------------------------------------
def measure_work(work: Work) -> dict[str, Any]:
    """Time ``work()`` in this process: seconds, CPU, peak RSS over its start, others' share."""
    release_memory()
    start = rss_mib()
    before = peak_rss_mib()  # the process's peak so far (imports, untimed set-up)
    exact = reset_peak_rss()
    watch = CpuWatch()
    clock = time.perf_counter()
    output = work()
    seconds = time.perf_counter() - clock
    cpu = watch.stop()
    work_peak = peak_rss_mib() if exact else float("nan")
    return {
        "output": output,
        "seconds": seconds,
        **cpu,
        "start_rss_mib": start,
        "work_peak_rss_mib": work_peak,
        # the whole life of this process, as the kernel counted it after exec: ``wait4``'s
        # ``ru_maxrss`` would also count the parent's pages at fork (a large parent's RSS)
        "life_peak_rss_mib": max(before, work_peak) if exact else float("nan"),
    }


def run_contender(call: str, kwargs: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run contender ``module:name`` in a fresh interpreter; its :func:`measure_work` result plus
    ``peak_rss_mib``, the child's whole-life peak RSS: its own ``VmHWM`` where the kernel has it,
    else ``ru_maxrss`` from ``wait4`` (which also counts the parent's RSS at fork)."""
    WORK.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=WORK) as tmp:
        out = Path(tmp) / "result.json"
        command = [sys.executable, str(Path(__file__)), "--call", call]
        command += ["--kwargs", json.dumps(kwargs or {}), "--result", str(out)]
        proc = subprocess.Popen(command, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"contender {call} failed with exit status {proc.returncode}")
        result: dict[str, Any] = json.loads(out.read_text())
    life = result.get("life_peak_rss_mib", float("nan"))
    result["peak_rss_mib"] = life if life == life else usage.ru_maxrss / 1024  # NaN: no VmHWM
    return result


def run_command(command: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run a whole command (e.g. a ``torchrun`` launch) as the contender: wall seconds, CPU of the
    command and its children, others' CPU share meanwhile, and ``peak_rss_mib``, the peak RSS of
    its largest process (``ru_maxrss`` from ``wait4``)."""
    watch = CpuWatch()
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - watch.wall
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(command[:4])} ... failed:\n{stderr[-3000:]}")
    cpu = watch.stop(own=usage.ru_utime + usage.ru_stime)
    return {"seconds": seconds, "peak_rss_mib": usage.ru_maxrss / 1024, **cpu}


def fastest(
    run: Callable[[], dict[str, Any]],
    attempts: int = 3,
    *,
    until_clean: bool = True,
    key: str = "seconds",
    label: str = "",
) -> dict[str, Any]:
    """The fastest (lowest ``key``) of up to ``attempts`` runs, each after waiting for an idle
    machine; with ``until_clean``, stop at the first run during which other processes and the
    hypervisor's steal together took at most :data:`CLEAN` of the CPUs. Adds ``attempts`` and
    ``idle_share`` (before the kept run)."""
    best: dict[str, Any] | None = None
    for attempt in range(1, attempts + 1):
        idle = wait_for_idle()
        result = run()
        result["idle_share"] = idle
        print(
            f"  {label or 'run'} #{attempt}: {result[key]:.3f} {key}, peak RSS "
            f"{result.get('peak_rss_mib', result.get('work_peak_rss_mib', 0)):.0f} MiB, other "
            f"processes {result['others_share']:.0%} of the CPUs, hypervisor steal "
            f"{result.get('steal_share', 0.0):.0%}",
            flush=True,
        )
        if best is None or result[key] < best[key]:
            best = result
        if until_clean and result["others_share"] + result.get("steal_share", 0.0) <= CLEAN:
            break
    assert best is not None
    best["attempts"] = attempt
    return best


# -- results as data -----------------------------------------------------------------------------
def sig(x: float, digits: int = 4) -> float:
    """``x`` rounded to ``digits`` significant digits (what a figure in the JSON keeps)."""
    if x == 0 or x != x or x in (float("inf"), float("-inf")):
        return float(x)
    return float(f"{x:.{digits}g}")


def figure(
    case: str,
    unit: str,
    baseline: float,
    ours: float,
    *,
    peak_mib: tuple[float, float] | None = None,
    others_share: tuple[float, float] | None = None,
    higher_is_better: bool = False,
    cost: bool = False,
) -> dict[str, Any]:
    """One headline figure: baseline and ours in ``unit``, the ratio, peak memory (MiB, baseline
    and ours) and other processes' CPU share during each. The ratio is ours' speed-up, or with
    ``cost`` (ours does more work than the baseline, e.g. a sweep against one fit) ours' time
    over the baseline's."""
    if cost:
        ratio = baseline / ours if higher_is_better else ours / baseline
    else:
        ratio = ours / baseline if higher_is_better else baseline / ours
    out: dict[str, Any] = {
        "case": case,
        "unit": unit,
        "baseline": sig(baseline),
        "ours": sig(ours),
        "ratio": sig(ratio, 3),
        "ratio_is": "cost" if cost else "speed-up",
    }
    if peak_mib is not None:
        out["peak_mib"] = {"baseline": round(float(peak_mib[0])), "ours": round(float(peak_mib[1]))}
    if others_share is not None:
        out["others_share"] = {
            "baseline": round(float(others_share[0]), 2),
            "ours": round(float(others_share[1]), 2),
        }
    return out


def goal(what: str, met: bool, value: str) -> dict[str, Any]:
    return {"target": what, "met": bool(met), "value": value}


def table(title: str, columns: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"title": title, "columns": columns, "rows": rows}


def describe(doc: str | None) -> tuple[str, str]:
    """Title and paragraph of a benchmark from its module docstring: the first line, and the
    paragraphs after it up to the usage line (indented)."""
    title, _, rest = (doc or "").strip().partition("\n")
    paragraphs = [p for p in rest.strip().split("\n\n") if p and not p.startswith("    ")]
    return title.strip().rstrip("."), " ".join(" ".join(p.split()) for p in paragraphs)


class Session:
    """One benchmark run: notes the code version and the measured sources at the start, and
    writes the result (date, machine, code, sizes, figures) as ``results/<name>.json``."""

    def __init__(self, name: str, measured: Sequence[str]) -> None:
        self.tag = TAG["tag"]
        self.script = f"bench/{name}.py"
        self.name = f"{name}-{self.tag}" if self.tag else name
        self.measured = tuple(measured)
        self.started = time.perf_counter()
        self.code = code_version(self.measured)
        self.digest = _digest(self.measured)
        self.rates = product_rates()
        self.watch = CpuWatch()

    def save(
        self,
        doc: str | None,
        sizes: dict[str, Any],
        figures: list[dict[str, Any]],
        *,
        targets: Sequence[dict[str, Any]] = (),
        tables: Sequence[dict[str, Any]] = (),
        notes: Sequence[str] = (),
        write: bool = True,
        results_dir: Path = RESULTS_DIR,
    ) -> dict[str, Any]:
        """Build the record (title and paragraph from the script's docstring ``doc``); write it
        and re-render RESULTS.md unless ``write`` is False."""
        title, about = describe(doc)
        if self.tag:  # "Teacher inference (amx): ..."
            head, colon, rest = title.partition(":")
            title = f"{head} ({self.tag}){colon}{rest}"
        now = _digest(self.measured)
        changed = sorted(
            k for k in now.keys() | self.digest.keys() if now.get(k) != self.digest.get(k)
        )
        notes = list(notes)
        worst = max(
            (max(f.get("others_share", {}).values(), default=0.0) for f in figures), default=0.0
        )
        if worst > CLEAN:
            notes.append(
                f"Warning: other processes took up to {worst:.0%} of the CPUs during a measurement."
            )
        if changed:
            notes.append(f"Warning: measured sources changed during the run: {', '.join(changed)}.")
        record = {
            "name": self.name,
            "script": self.script,
            "title": title,
            "about": about,
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
            "machine": machine(),
            "conditions": {
                "product_size": 2048,
                "product_gflops": self.rates,
                "steal_share": round(self.watch.stop()["steal_share"], 3),
            },
            "code": self.code,
            "sizes": sizes,
            "figures": figures,
            "targets": list(targets),
            "tables": list(tables),
            "notes": notes,
            "minutes": round((time.perf_counter() - self.started) / 60, 1),
        }
        text = json.dumps(record, indent=1)
        print(text)
        if write:
            results_dir.mkdir(parents=True, exist_ok=True)
            (results_dir / f"{self.name}.json").write_text(text + "\n", encoding="utf-8")
            from render import render

            render()
        return record


# -- the child ------------------------------------------------------------------------------------
def _child() -> None:
    parser = argparse.ArgumentParser(description="Run one contender (internal to the harness).")
    parser.add_argument("--call", required=True, help="module:function in bench/")
    parser.add_argument("--kwargs", default="{}")
    parser.add_argument("--result", type=Path, required=True)
    args = parser.parse_args()
    module, name = args.call.split(":")
    work = getattr(importlib.import_module(module), name)(**json.loads(args.kwargs))
    args.result.write_text(json.dumps(measure_work(work)))


if __name__ == "__main__":
    sys.path.insert(0, str(BENCH))
    _child()
