"""Runs ``lmalgebra`` commands in forked children of one process that imported the toolkit once.

The fault tests kill commands with SIGKILL many times; starting Python and importing torch and
transformers for every command would take most of their time. This server imports the toolkit
(and does no computation, so no thread pool exists when it forks), then for each request forks a
child that runs ``lmalgebra.cli.main`` with the given arguments, which is what
``python -m lmalgebra ARGS`` does once its imports are done. The child is an ordinary process: it
can be killed with SIGKILL at any point and leaves on disk whatever a killed command leaves.

Protocol: one JSON object per line on stdin, one answer per line on stdout.

* ``{"run": [ARGS...], "log": PATH}`` -> ``{"pid": PID}`` (stdout and stderr go to PATH); two
  optional keys: ``"env"``, variables set in the child, ``"bound": true``, the child bound by
  file permissions (``bind_permissions``) before the command runs, and ``"memory"``, the most
  bytes of address space the child may hold (``RLIMIT_AS``: a command that tries to take more
  gets a MemoryError, not the machine's memory)
* ``{"wait": PID}`` -> ``{"status": CODE}``: the exit code, or minus the signal that ended it
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import sys
import traceback

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import accelerate  # noqa: F401  (imported here once, not in every child)
import transformers.models.albert.modeling_albert
import transformers.models.bert.modeling_bert
import transformers.models.roberta.modeling_roberta  # noqa: F401

import lmalgebra.api.merge  # what the merge commands call (stages, training, evaluation)
import lmalgebra.cli
import lmalgebra.lmd.run.decompose

PR_CAPBSET_DROP = 24  # prctl(2)
OVERRIDES = (1, 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH (linux/capability.h)
CAPABILITY_VERSION_3 = 0x20080522  # linux/capability.h: two 32-bit words per set


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def bind_permissions() -> None:
    """This process bound by file permissions: as root (uid 0, which it stays, so that it still
    reads what root owns), the capabilities that override them leave its bounding set and its
    effective, permitted and inheritable sets (capset(2)); as another user they bind already."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in OVERRIDES:
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")
    header = _CapHeader(CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    kept = ~sum(1 << capability for capability in OVERRIDES) & 0xFFFFFFFF
    for field in ("effective", "permitted", "inheritable"):
        setattr(data[0], field, getattr(data[0], field) & kept)
    if libc.capset(ctypes.byref(header), data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def _child(args: list[str], log: str, env: dict[str, str], bound: bool, memory: int | None) -> None:
    """Run one command with stdout/stderr in ``log``, ``env`` set, bound by file permissions
    when ``bound``, its address space limited to ``memory`` bytes when given; never returns."""
    code = 1
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.environ.update(env)
        if bound:
            bind_permissions()
        if memory is not None:
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        sys.argv = ["lmalgebra", *args]
        try:
            lmalgebra.cli.main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve() -> None:
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        if "run" in request:
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                env = request.get("env", {})
                bound, memory = bool(request.get("bound")), request.get("memory")
                _child(request["run"], request["log"], env, bound, memory)
            answer = {"pid": pid}
        else:
            _, status = os.waitpid(int(request["wait"]), 0)
            code = os.waitstatus_to_exitcode(status)
            answer = {"status": code}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
