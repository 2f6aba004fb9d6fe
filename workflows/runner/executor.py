"""Running one step's process: Hera runner steps in forked children, other commands as subprocesses.

Argo writes a script template's substituted ``source`` to a file and runs ``command + args + [file]``.
For dsx's steps that is ``python -m hera.workflows.runner -e module:function FILE``; importing Hera costs
about a second, so those steps are forked from a zygote process (:mod:`workflows.runner.zygote`) that has
Hera and the workflow's step modules imported already. Each child redirects its stdout and stderr into
the step's log files, starts its own process group (so a timeout kills everything it started) and runs
Hera's runner as ``python -m`` would. Any other command runs as an ordinary subprocess.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HERA_RUNNER", "Launcher", "ProcessSpec", "RunningProcess", "hera_entrypoint", "wait_for"]

HERA_RUNNER = "hera.workflows.runner"
_PRELOAD = ["hera.workflows._runner.util", "pydantic"]


def hera_entrypoint(command: Sequence[str], args: Sequence[str]) -> str | None:
    """``module:function`` when a script runs ``python -m hera.workflows.runner -e module:function``."""
    if not command or Path(str(command[0])).name not in ("python", "python3") or len(command) != 1:
        return None
    if len(args) == 4 and list(args[:2]) == ["-m", HERA_RUNNER] and args[2] in ("-e", "--entrypoint"):
        return str(args[3])
    return None


@dataclass
class ProcessSpec:
    """What to run for one step attempt, and where its output goes."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    stdout: Path
    stderr: Path
    hera_entry: str | None = None
    script: Path | None = None
    sys_path: list[str] = field(default_factory=list)


class RunningProcess:
    """A started step process: wait for it with a timeout, or kill it and everything it started."""

    def __init__(self, pid: int, waiter: Callable[[float | None], int | None]) -> None:
        self.pid = pid
        self._waiter = waiter

    def wait(self, timeout: float | None) -> int | None:
        """The exit code (negative: killed by that signal), or None if it still runs after ``timeout``."""
        return self._waiter(timeout)

    def kill(self) -> None:
        """Kill the process group the step started (SIGKILL), then the process itself."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        """Release the handle (kept for symmetry; nothing to free)."""


class _Zygote:
    """The parent's side of :mod:`workflows.runner.zygote`: start requests, and a thread reading answers."""

    def __init__(self, preload: Sequence[str]) -> None:
        env = dict(os.environ)
        roots = [str(Path(__file__).resolve().parents[2]), os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
        self.process = subprocess.Popen(
            [sys.executable, "-c", "from workflows.runner.zygote import main; main()", *preload],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.preloaded = set(preload)
        self.lock = threading.Lock()
        self.send_lock = threading.Lock()
        self.next_id = 0
        self.started: dict[int, tuple[threading.Event, list[int]]] = {}
        self.exits: dict[int, tuple[threading.Event, list[int]]] = {}
        self.reader = threading.Thread(target=self._read, name="dsx-zygote", daemon=True)
        self.reader.start()

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            message = json.loads(line)
            with self.lock:
                if "id" in message:
                    event, box = self.started.pop(message["id"])
                    self.exits[message["pid"]] = (threading.Event(), [])
                    box.append(message["pid"])
                    event.set()
                else:
                    exit_event, code = self.exits.setdefault(message["pid"], (threading.Event(), []))
                    code.append(int(message["code"]))
                    exit_event.set()
        with self.lock:  # the zygote is gone: nothing more will start or exit
            for event, _ in self.started.values():
                event.set()
            for event, code in self.exits.values():
                if not code:
                    code.append(-int(signal.SIGKILL))
                event.set()

    def _send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        with self.send_lock:
            self.process.stdin.write(json.dumps(message).encode() + b"\n")
            self.process.stdin.flush()

    def preload(self, modules: Sequence[str]) -> None:
        missing = [m for m in modules if m not in self.preloaded]
        if missing:
            self.preloaded.update(missing)
            self._send({"op": "preload", "modules": missing})

    def start(self, spec: ProcessSpec) -> RunningProcess:
        event, box = threading.Event(), list[int]()
        with self.lock:
            self.next_id += 1
            request_id = self.next_id
            self.started[request_id] = (event, box)
        try:
            self._send(
                {
                    "op": "start",
                    "id": request_id,
                    "entry": spec.hera_entry,
                    "script": str(spec.script),
                    "env": spec.env,
                    "cwd": spec.cwd,
                    "stdout": str(spec.stdout),
                    "stderr": str(spec.stderr),
                    "sys_path": spec.sys_path,
                }
            )
        except OSError as exc:
            with self.lock:
                self.started.pop(request_id, None)
            raise OSError(f"the step launcher is gone ({exc})") from exc
        event.wait()
        if not box:
            raise OSError("the step launcher stopped before starting the step")
        pid = box[0]
        with self.lock:
            exit_event, code = self.exits[pid]

        def waiter(timeout: float | None) -> int | None:
            if not exit_event.wait(timeout):
                return None
            with self.lock:
                self.exits.pop(pid, None)
            return code[0]

        return RunningProcess(pid, waiter)


class Launcher:
    """Starts step processes; Hera runner steps are forked from one zygote shared by the process."""

    _lock = threading.Lock()
    _zygote: _Zygote | None = None

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self.preload = [*_PRELOAD, *preload]
        self.needed = bool(preload)

    def warm(self) -> None:
        """Start the zygote now (it imports Hera, about a second) so the first step does not wait."""
        with contextlib.suppress(OSError):
            self._ready()

    def _ready(self) -> _Zygote:
        with Launcher._lock:
            if Launcher._zygote is None or not Launcher._zygote.alive:
                Launcher._zygote = _Zygote(self.preload)
            else:
                Launcher._zygote.preload(self.preload)
            return Launcher._zygote

    def start(self, spec: ProcessSpec) -> RunningProcess:
        """Start the step; raises OSError when the command cannot be started."""
        if spec.hera_entry is not None:
            return self._ready().start(spec)
        return self._start_subprocess(spec)

    def _start_subprocess(self, spec: ProcessSpec) -> RunningProcess:
        with open(spec.stdout, "wb") as out, open(spec.stderr, "wb") as err:
            popen = subprocess.Popen(
                spec.argv,
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=spec.env,
                cwd=spec.cwd,
                start_new_session=True,
            )
        pidfd: int | None = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(popen.pid)

        def waiter(timeout: float | None) -> int | None:
            if pidfd is not None and timeout is not None:
                ready, _, _ = select.select([pidfd], [], [], timeout)
                if not ready:
                    return None
            try:
                code = popen.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
            if pidfd is not None:
                with contextlib.suppress(OSError):
                    os.close(pidfd)
            return code

        return RunningProcess(popen.pid, waiter)


def wait_for(
    process: RunningProcess, deadline: float | None, stop: threading.Event
) -> tuple[int | None, str]:
    """Wait until the process exits, the deadline passes or ``stop`` is set.

    Returns the exit code (None when it had to be killed) and why it stopped: ``exit``, ``deadline``
    or ``stop``.
    """
    while True:
        now = time.monotonic()
        if stop.is_set():
            process.kill()
            process.wait(None)
            return None, "stop"
        if deadline is not None and now >= deadline:
            process.kill()
            process.wait(None)
            return None, "deadline"
        slice_ = 0.25 if deadline is None else max(0.0, min(0.25, deadline - now))
        code = process.wait(slice_)
        if code is not None:
            return code, "exit"
