"""A warm process that has imported torch once and forks rank processes on request.

Importing torch takes seconds; N ranks started from scratch pay it N times, all at once. The local
launcher instead keeps one server per dsx process: the server imports torch, then forks a child per
rank (each in its own session, with its own environment, stdout and stderr files) and runs the rank
module in it as ``python -m`` would. The server never initialises CUDA or a process group itself, so
its children start clean. It speaks JSON lines: requests on stdin, fork and exit reports on stdout.

Request: ``{"id": 1, "module": "steps.readiness.sweep", "args": [...], "ranks": [{"rank": 0,
"env": {...}, "stdout": PATH, "stderr": PATH}, ...]}``. Reports: ``{"id": 1, "rank": 0, "pid": 123}``
after each fork, ``{"id": 1, "rank": 0, "exit": 0, "time": T}`` when a child ends (negative exit:
killed by that signal). End of stdin: the server kills its children and exits.
"""

from __future__ import annotations

import contextlib
import json
import os
import runpy
import select
import signal
import sys
import time
import traceback
from typing import Any

__all__ = ["main"]


def _send(message: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _child(module: str, args: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    code = 1
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, 1)
        os.dup2(err, 2)
        for fd in (null, out, err):
            os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(env)
        sys.argv = [module, *args]
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            traceback.print_exc()
            code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reap(children: dict[int, tuple[int, int]]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        request, rank = children.pop(pid)
        _send(
            {"id": request, "rank": rank, "exit": os.waitstatus_to_exitcode(status), "time": time.monotonic()}
        )


def _serve(request: dict[str, Any], children: dict[int, tuple[int, int]]) -> None:
    for spec in request["ranks"]:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request["module"], request["args"], spec["env"], spec["stdout"], spec["stderr"])
        children[pid] = (request["id"], spec["rank"])
        _send({"id": request["id"], "rank": spec["rank"], "pid": pid})


def main() -> None:
    """Import torch, say ready, then fork ranks as asked until standard input closes."""
    import torch
    import torch.distributed  # noqa: F401

    _send({"ready": True, "pid": os.getpid()})
    children: dict[int, tuple[int, int]] = {}
    pending = b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.01 if children else 0.5)
        if readable:
            chunk = os.read(stdin, 1 << 16)
            if not chunk:
                break
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line.strip():
                    _serve(json.loads(line), children)
        _reap(children)
    for pid in list(children):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    while children:
        _reap(children)
        time.sleep(0.01)


if __name__ == "__main__":
    main()
