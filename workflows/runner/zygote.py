"""A zygote process that forks Hera runner steps with Hera (and the step modules) already imported.

The zygote is a plain ``python -c`` process speaking line-delimited JSON on its stdin and stdout:

- ``{"op": "preload", "modules": [...]}``: import more modules (errors are ignored: a step that needs
  a broken module reports the import error in its own ``stderr.log``);
- ``{"op": "start", "id": N, ...}``: fork a step; it answers ``{"id": N, "pid": P}`` and, when the step
  exits, ``{"pid": P, "code": C}`` (negative: killed by that signal).

Unlike :mod:`multiprocessing`'s forkserver, nothing of the parent's ``__main__`` is imported in the
children, so the runner works the same under a console script, ``python -c`` or a test runner.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import sys
from typing import Any

__all__ = ["main", "run_child"]


def run_child(spec: dict[str, Any]) -> int:  # pragma: no cover - runs in a forked child
    """Run Hera's runner as ``python -m hera.workflows.runner -e ENTRY SCRIPT`` would; return its code."""
    import runpy

    for fd, path, flags in (
        (0, os.devnull, os.O_RDONLY),
        (1, spec["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, spec["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        target = os.open(path, flags, 0o644)
        if target != fd:
            os.dup2(target, fd)
            os.close(target)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding="utf-8", errors="backslashreplace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", closefd=False, buffering=1)  # noqa: SIM115
    os.environ.clear()
    os.environ.update(spec["env"])
    os.chdir(spec["cwd"])
    for entry in reversed(spec.get("sys_path") or []):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    sys.argv = ["hera.workflows.runner", "-e", spec["entry"], spec["script"]]
    code = 1
    try:
        runpy.run_module("hera.workflows.runner", run_name="__main__", alter_sys=True)
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
        import traceback

        traceback.print_exc()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    return code


def _preload(modules: list[str]) -> None:
    import importlib
    import warnings

    for module in modules:
        with contextlib.suppress(Exception), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)


def main() -> None:  # pragma: no cover - the zygote process itself
    """Serve start requests until stdin closes."""
    requests = os.fdopen(0, "rb", buffering=0)
    answers = os.fdopen(os.dup(1), "wb", buffering=0)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    _preload(sys.argv[1:])
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    os.set_blocking(wake_read, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(requests, selectors.EVENT_READ, "requests")
    selector.register(wake_read, selectors.EVENT_READ, "children")
    buffer = b""

    def send(message: dict[str, Any]) -> None:
        answers.write(json.dumps(message).encode() + b"\n")

    def reap() -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            send({"pid": pid, "code": os.waitstatus_to_exitcode(status)})

    while True:
        for key, _ in selector.select():
            if key.data == "children":
                with contextlib.suppress(BlockingIOError):
                    while os.read(wake_read, 512):
                        pass
                reap()
                continue
            chunk = requests.read(65536)
            if not chunk:
                reap()
                return
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                request = json.loads(line)
                if request.get("op") == "preload":
                    _preload(list(request.get("modules") or []))
                    continue
                pid = os.fork()
                if pid == 0:
                    code = 1
                    try:
                        os.setsid()
                        signal.set_wakeup_fd(-1)
                        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                        for fd in (wake_read, wake_write, answers.fileno(), requests.fileno()):
                            with contextlib.suppress(OSError):
                                os.close(fd)
                        code = run_child(request)
                    except BaseException:
                        import traceback

                        with contextlib.suppress(Exception), open(request["stderr"], "a") as err:
                            traceback.print_exc(file=err)
                    finally:
                        os._exit(code)
                send({"id": request["id"], "pid": pid})
        reap()


if __name__ == "__main__":  # pragma: no cover
    main()
