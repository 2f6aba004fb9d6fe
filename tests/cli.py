"""Running the ``dsx`` command from a test, as a user would, or in the test's own process.

A ``dsx`` process of its own pays for its imports every time: the CLI and Hera, and for a run with ranks
a steps' server that imports torch, about 10 CPU-seconds in all. :func:`dsx` and :func:`dsx_started` fork
it instead from a warm server of this test process (a :class:`~steps.forkserver.ForkServer`, what the
runner forks its steps from), which imported them once. The child is a process of its own all the same:
its pid, signals, exit status, environment, working directory and output files are its own, and
``python -m workflows.cli`` runs as ``__main__`` in it. A run forked so gets a nested server with torch
imported for its steps (``nest_for``). What only a new interpreter shows (the console script, the
start-up path, a session and process groups of its own) is tested on new interpreters: :func:`dsx_cold`,
or ``subprocess`` itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from steps.cluster import port_modules
from steps.forkserver import ForkedChild, ForkServer
from tests.paths import REPO
from workflows.cli.main import COMMANDS, run
from workflows.compiler import trusted_steps

#: What the warm server imports besides dsx's step modules and the ports they open (:func:`_warm`): the
#: CLI, every command's module and the runner. The torch of the step modules' ranks waits for the first run
#: (``nest_for``).
_WARM = (
    "workflows.cli.main",
    *(f"workflows.cli.{module}" for module, _ in COMMANDS.values()),
    "workflows.runner.engine",
    "workflows.runner.executor",
)
_RUNS = "workflows.runner.executor"
"""``nest_for`` of the commands that fork steps or ranks (:data:`_NESTS`): a module naming the imports
their servers need."""
_NESTS = {"run", "events", "bisect", "certify", "nccl"}

_lock = threading.Lock()
_server: ForkServer | None = None


def _warm() -> ForkServer:
    global _server
    with _lock:
        if _server is None or not _server.alive:
            steps = sorted({entry.split(":", 1)[0] for entry in trusted_steps().entries})
            ports = [*port_modules("sim:"), *port_modules("kube")]
            _server = ForkServer(own_groups=False)  # its children stay in this process's group, as Popen's
            _server.preload([*_WARM, *steps, *ports], wait=False)
        return _server


class Started:
    """A ``dsx`` process forked from the warm server: :class:`subprocess.Popen`'s handle on it, its
    stdout and stderr in files of a folder of its own (removed by :meth:`close`)."""

    def __init__(self, args: list[str], child: ForkedChild, folder: tempfile.TemporaryDirectory[str]) -> None:
        self.args = args
        self.pid = child.pid
        self._child = child
        self._folder = folder
        self.stdout_path = Path(folder.name) / "stdout"
        self.stderr_path = Path(folder.name) / "stderr"

    @property
    def returncode(self) -> int | None:
        return self._child.returncode

    def poll(self) -> int | None:
        return self._child.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Its exit status (negative: killed by that signal); raises :class:`subprocess.TimeoutExpired`
        past ``timeout``."""
        code = self._child.wait(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        """Signal it, unless it has ended (as Popen does)."""
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def output(self) -> tuple[str, str]:
        """What it wrote to stdout and stderr so far."""
        read = {"encoding": "utf-8", "errors": "replace"}
        return self.stdout_path.read_text(**read), self.stderr_path.read_text(**read)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """Wait for its end, then its stdout and stderr."""
        self.wait(timeout)
        return self.output()

    def lines(self, timeout: float) -> Iterator[str]:
        """Its stdout line by line as it comes, until it ends or ``timeout`` seconds have passed."""
        deadline = time.monotonic() + timeout
        with open(self.stdout_path, encoding="utf-8", errors="replace") as stream:
            pending = ""
            while True:
                chunk = stream.readline()
                if chunk:
                    pending += chunk
                    if pending.endswith("\n"):
                        yield pending
                        pending = ""
                    continue
                if self.returncode is not None or time.monotonic() > deadline:
                    if pending:
                        yield pending
                    return
                time.sleep(0.05)

    def close(self) -> None:
        """Kill it if it still runs, wait for it and remove its output files."""
        self.kill()
        self._child.wait(60)
        self._folder.cleanup()


def dsx_started(*args: str, cwd: Path = REPO, env: Mapping[str, str] | None = None) -> Started:
    """``dsx ARGS`` started in a process of its own, forked from the warm server (see the module's text).

    Args:
        cwd: its working directory.
        env: its whole environment (default: this process's now).
    """
    folder = tempfile.TemporaryDirectory(prefix="dsx-")
    for name in ("stdout", "stderr"):  # there to read from at once; the child opens them truncating
        (Path(folder.name) / name).touch()
    argv = list(args)
    child = _warm().start(
        "workflows.cli",
        argv,
        dict(os.environ if env is None else env),
        Path(folder.name) / "stdout",
        Path(folder.name) / "stderr",
        cwd=cwd,
        sys_path=[str(REPO)],
        nest_for=_RUNS if argv[:1] and argv[0] in _NESTS else None,
    )
    return Started(argv, child, folder)


def dsx(
    *args: str,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``dsx ARGS`` in a process of its own (exit code, standard output and error as text): forked from
    the warm server, or, to be given ``stdin``, started as a new interpreter."""
    if stdin is not None:
        return dsx_cold(*args, cwd=cwd, env=env, stdin=stdin, timeout=timeout)
    started = dsx_started(*args, cwd=cwd, env=env)
    try:
        code = started.wait(timeout)
        out, err = started.output()
    finally:
        started.close()
    return subprocess.CompletedProcess(["dsx", *args], code, out, err)


def dsx_cold(
    *args: str,
    cwd: Path = REPO,
    env: Mapping[str, str] | None = None,
    stdin: str | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m workflows.cli ARGS`` as a new interpreter, start-up and all."""
    return subprocess.run(
        [sys.executable, "-m", "workflows.cli", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=None if env is None else dict(env),
        input=stdin,
        check=False,
        timeout=timeout,
    )


def dsx_here(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run ``dsx ARGS`` in this process; its exit code, stdout and stderr."""
    code = run(list(args))
    out, err = capsys.readouterr()
    return code, out, err
