"""Runs ``lmalgebra`` commands in forked children of one process that imported the toolkit once.

The fault tests kill commands with SIGKILL many times; starting Python and importing torch and
transformers for every command would take most of their time. This server imports the toolkit
(and does no computation, so no thread pool exists when it forks), then for each request forks a
child that runs ``lmalgebra.cli.main`` with the given arguments, which is what
``python -m lmalgebra ARGS`` does once its imports are done. The child is an ordinary process: it
can be killed with SIGKILL at any point and leaves on disk whatever a killed command leaves.

Protocol: one JSON object per line on stdin, one answer per line on stdout.

* ``{"run": [ARGS...], "log": PATH}`` -> ``{"pid": PID}`` (stdout and stderr go to PATH)
* ``{"wait": PID}`` -> ``{"status": CODE}``: the exit code, or minus the signal that ended it
"""

from __future__ import annotations

import json
import os
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


def _child(args: list[str], log: str) -> None:
    """Run one command with stdout/stderr in ``log``; never returns."""
    code = 1
    try:
        out = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(out, 2)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
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
                _child(request["run"], request["log"])
            answer = {"pid": pid}
        else:
            _, status = os.waitpid(int(request["wait"]), 0)
            code = os.waitstatus_to_exitcode(status)
            answer = {"status": code}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    serve()
