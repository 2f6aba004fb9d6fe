"""Running one step's process: Hera runner steps in forked children, other commands as subprocesses.

Argo writes a script template's substituted ``source`` to a file and runs ``command + args + [file]``.
For dsx's steps that is ``python -m hera.workflows.runner -e module:function FILE``; importing Hera costs
about a second, so those steps are forked from a fork server (:mod:`steps.forkserver`) that has Hera
and the workflow's step modules imported already. Each child writes its stdout and stderr into the
step's log files, leads its own process group in the runner's session (so a timeout or a stop kills
everything it started, the ranks it launched included), takes the step's environment, working directory
and ``sys.path`` entries, and runs Hera's runner as ``python -m`` would. Any other command runs as an
ordinary subprocess, in its own process group too.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from steps.forkserver import ForkServer

__all__ = ["HERA_RUNNER", "Launcher", "ProcessSpec", "RunningProcess", "hera_entrypoint", "wait_for"]

HERA_RUNNER = "hera.workflows.runner"
_PRELOAD = ["hera.workflows._runner.util", "pydantic"]
FORK_SERVER_PRELOAD = tuple(_PRELOAD)
"""What the steps' server imports before any workflow's step modules: a process that runs workflows, forked
by a fork server with ``nest_for`` naming this module, gets a nested server with them imported and takes it
as its steps' server (:mod:`steps.forkserver`)."""


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


class _Steps:
    """Hera runner steps forked from a :class:`~steps.forkserver.ForkServer` that preloaded Hera: a new one,
    or the nested server this process was forked with (see :data:`FORK_SERVER_PRELOAD`)."""

    def __init__(self, preload: Sequence[str]) -> None:
        env = dict(os.environ)
        roots = [str(Path(__file__).resolve().parents[2]), os.getcwd()]
        env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
        self.server = ForkServer.nested(own_groups=True) or ForkServer(env)
        self.preloaded: set[str] = set()
        self.preload(preload)

    @property
    def alive(self) -> bool:
        return self.server.alive

    def preload(self, modules: Sequence[str]) -> None:
        missing = [m for m in modules if m not in self.preloaded]
        if missing:
            self.preloaded.update(missing)
            self.server.preload(missing, wait=False)

    def start(self, spec: ProcessSpec) -> RunningProcess:
        """Fork the step; raises OSError when the fork server is gone or cannot fork."""
        child = self.server.start(
            HERA_RUNNER,
            ["-e", str(spec.hera_entry), str(spec.script)],
            spec.env,
            spec.stdout,
            spec.stderr,
            cwd=spec.cwd,
            sys_path=spec.sys_path,
            nest_for=str(spec.hera_entry).split(":", 1)[0],  # a step that forks ranks gets a warm server
        )
        return RunningProcess(child.pid, child.wait)


class Launcher:
    """Starts step processes; Hera runner steps are forked from one fork server shared by the process."""

    _lock = threading.Lock()
    _steps: _Steps | None = None

    def __init__(self, preload: Sequence[str] = ()) -> None:
        self.preload = [*_PRELOAD, *preload]
        self.needed = bool(preload)

    def warm(self) -> None:
        """Start the fork server now (it imports Hera, about a second) so the first step does not wait."""
        with contextlib.suppress(OSError):
            self._ready()

    def _ready(self) -> _Steps:
        with Launcher._lock:
            if Launcher._steps is None or not Launcher._steps.alive:
                Launcher._steps = _Steps(self.preload)
            else:
                Launcher._steps.preload(self.preload)
            return Launcher._steps

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
                process_group=0,  # its own group, in the runner's session: killed whole with its children
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
            # A stop kills the process from another thread: its end is the stop's, not its own.
            return code, "stop" if stop.is_set() else "exit"
