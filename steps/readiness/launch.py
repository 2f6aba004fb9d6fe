"""The local launcher: N rank processes on this machine, with the variables torchrun would set.

Ranks are forked from a warm server that has imported torch once (:mod:`steps.forkserver`), or,
with ``method="spawn"``, started as fresh interpreters. Either way the launcher never hangs: when a
rank fails, the others get a short grace period to exit on their own, then are killed; when the run
outlasts its timeout, every rank still running gets SIGUSR1 (a stack dump into its stderr, kept as
evidence) and is killed. The rank named as failed is the one whose error came first (each rank notes
the time of its first exception in ``rank-N.failed``); on a timeout, the ranks that were outside a
collective while others waited inside one are named as the ones that hang.

Every rank stays in the launcher's process group and session (no ``setsid``): when the local runner
kills a step's process group, or a terminal's Ctrl-C or a ``kill`` reaches the launcher's group, the
ranks go with it instead of holding their devices and ports into the next run. The launcher signals
a rank by its pid, never its group, which is the step's own.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from steps.cluster import vocabulary as vocab
from steps.errors import DsxError, InputError
from steps.forkserver import ForkedChild, ForkServer
from steps.readiness.rankenv import read_phase

__all__ = ["LaunchResult", "RankExit", "launch_local", "record_failure", "stderr_tail"]

RankState = Literal["ok", "failed", "killed", "hung"]
Method = Literal["forkserver", "spawn"]
_STACK_DUMP_WAIT_S = 0.5
_SERVER_START_S = 300.0
_FORK_ANSWER_S = 30.0
_PRELOAD = ("torch", "torch.distributed")
FAIL_FILE_ENV = vocab.ENV_FAIL_FILE


class RankExit(BaseModel):
    """How one rank process ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    host: str
    state: RankState
    returncode: int | None = None
    seconds: float
    stdout: str
    stderr: str
    phase: str | None = Field(default=None, description="inside or outside a collective when killed")
    error: str | None = Field(default=None, description="the rank's own first error, if it noted one")


class LaunchResult(BaseModel):
    """How the whole local run ended."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    ranks: list[RankExit]
    timed_out: bool
    first_failure: int | None = None
    hung: list[int] = Field(default_factory=list)
    elapsed_s: float

    @property
    def ok(self) -> bool:
        """Every rank exited with status 0."""
        return all(rank.state == "ok" for rank in self.ranks)


def record_failure(exc: BaseException) -> None:
    """Note, in a rank process, the time and text of its first error (``$DSX_FAIL_FILE``).

    Called before the process group is torn down, so the rank whose error caused the others' errors
    has the earliest time.
    """
    path = os.environ.get(FAIL_FILE_ENV)
    if not path or os.path.exists(path):
        return
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"{time.time():.6f} {text}\n")


def _read_failure(path: Path) -> tuple[float, str] | None:
    try:
        stamp, _, text = path.read_text(encoding="utf-8").strip().partition(" ")
        return float(stamp), text
    except (OSError, ValueError):
        return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _package_root() -> str:
    import steps

    return str(Path(steps.__file__).resolve().parent.parent)


def stderr_tail(path: str | Path, lines: int = 3) -> str:
    """The last non-empty lines of a rank's stderr, joined by `` | `` (for one-line messages)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:])


def _signal(pid: int | None, sig: signal.Signals) -> None:
    """Signal one rank (its group is the launcher's: signalling that would reach the launcher too)."""
    if pid is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def _state(running: bool, hung: bool, status: int | None) -> RankState:
    if running:
        return "hung" if hung else "killed"
    return "ok" if status == 0 else "failed"


class _RankServer:
    """One :class:`~steps.forkserver.ForkServer` per process with torch imported, started on first use."""

    _lock = threading.Lock()
    _instance: ForkServer | None = None

    @classmethod
    def get(cls, env: dict[str, str]) -> ForkServer:
        """The running server, or a new one once it has imported torch (within ``_SERVER_START_S``).

        Raises:
            DsxError: the server did not start or could not import torch.
        """
        with cls._lock:
            if cls._instance is not None and cls._instance.alive:
                return cls._instance
            server: ForkServer | None = None
            with tempfile.TemporaryFile() as log:
                try:
                    server = ForkServer(env, stderr=log, own_groups=False)
                    failed = list(server.preload(_PRELOAD, timeout=_SERVER_START_S).values())
                except (KeyboardInterrupt, SystemExit):
                    # Stopped (Ctrl-C, or SIGTERM turned into one) while torch loads: an import does
                    # not read its stdin, so the server would only notice it is orphaned once done.
                    if server is not None:
                        server.process.kill()
                        server.process.wait()
                    raise
                except OSError as exc:  # the server died (its stderr says why) or did not answer
                    log.seek(0)
                    said = log.read().decode(errors="replace").strip().splitlines()
                    failed = said[-1:] if server is not None and not server.alive and said else [str(exc)]
                if failed or server is None:
                    if server is not None:
                        server.close(timeout=1)
                    raise DsxError(f"the rank fork server did not start: {failed[0]}")
            atexit.register(server.close)
            cls._instance = server
            return server


def _start_spawned(
    module: str, args: list[str], specs: list[dict[str, Any]], exits: queue.Queue[tuple[int, int, float]]
) -> dict[int, int]:
    pids: dict[int, int] = {}
    for spec in specs:
        with open(spec["stdout"], "wb") as stdout, open(spec["stderr"], "wb") as stderr:
            proc = subprocess.Popen(
                [sys.executable, "-m", module, *args],
                stdout=stdout,
                stderr=stderr,
                stdin=subprocess.DEVNULL,
                env=spec["env"],
            )
        pids[spec["rank"]] = proc.pid

        def wait(rank: int = spec["rank"], proc: subprocess.Popen[bytes] = proc) -> None:
            exits.put((rank, proc.wait(), time.monotonic()))

        threading.Thread(target=wait, daemon=True).start()
    return pids


def _start_forked(
    module: str,
    args: list[str],
    specs: list[dict[str, Any]],
    exits: queue.Queue[tuple[int, int, float]],
    server_env: dict[str, str],
) -> dict[int, int]:
    server = _RankServer.get(server_env)
    pids: dict[int, int] = {}
    for spec in specs:
        try:
            child = server.start(
                module, args, spec["env"], spec["stdout"], spec["stderr"], timeout=_FORK_ANSWER_S
            )
        except OSError:  # the server died or hung: the rank counts as killed
            exits.put((spec["rank"], -int(signal.SIGKILL), time.monotonic()))
            continue
        pids[spec["rank"]] = child.pid

        def wait(rank: int = spec["rank"], child: ForkedChild = child) -> None:
            code = child.wait()
            exits.put(
                (rank, -int(signal.SIGKILL) if code is None else code, child.ended_at or time.monotonic())
            )

        threading.Thread(target=wait, daemon=True).start()
    return pids


def launch_local(
    module: str,
    args: list[str],
    world_size: int,
    work_dir: Path,
    timeout_s: float,
    rank_hosts: list[str] | None = None,
    grace_s: float = 2.0,
    env: dict[str, str] | None = None,
    method: Method = "forkserver",
) -> LaunchResult:
    """Start ``python -m module args`` as ``world_size`` ranks and wait for them, bounded by ``timeout_s``.

    Args:
        module: the rank program, e.g. ``steps.readiness.sweep``.
        args: its arguments, the same for every rank.
        world_size: how many ranks.
        work_dir: folder for ``rank-N.stdout`` and ``rank-N.stderr``.
        timeout_s: the run's limit once its ranks are started; past it every rank is killed and the
            run counts as hung.
        rank_hosts: the node each rank stands for (``DSX_NODE_NAME``), one per rank.
        grace_s: how long the other ranks may take to exit after one fails, before they are killed.
        env: extra environment variables for every rank.
        method: ``forkserver`` (fork from a warm process that imported torch once) or ``spawn``.

    Raises:
        InputError: ``world_size`` is below 1 or ``rank_hosts`` does not have one name per rank.
        DsxError: the fork server could not start.
    """
    if world_size < 1:
        raise InputError(f"--ranks must be 1 or more, not {world_size}")
    if rank_hosts is not None and len(rank_hosts) != world_size:
        raise InputError(f"{len(rank_hosts)} node names given for {world_size} ranks")
    work_dir.mkdir(parents=True, exist_ok=True)
    base = dict(os.environ)
    base.update(env or {})
    base["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), base.get("PYTHONPATH", "")) if p)
    base["PYTHONUNBUFFERED"] = "1"
    threads = max(1, (os.cpu_count() or 1) // world_size)
    base.setdefault("OMP_NUM_THREADS", str(threads))
    base.update(
        {
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(_free_port()),
        }
    )
    hosts = rank_hosts or [socket.gethostname()] * world_size
    files = [
        {kind: work_dir / f"rank-{rank}.{kind}" for kind in ("stdout", "stderr", "phase", "failed")}
        for rank in range(world_size)
    ]
    specs: list[dict[str, Any]] = []
    for rank in range(world_size):
        files[rank]["phase"].write_bytes(b"\0")
        files[rank]["failed"].unlink(missing_ok=True)
        rank_env = dict(
            base,
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            **{
                vocab.ENV_PHASE_FILE: str(files[rank]["phase"]),
                vocab.ENV_FAIL_FILE: str(files[rank]["failed"]),
            },
        )
        if rank_hosts is not None:
            rank_env[vocab.ENV_NODE_NAME] = rank_hosts[rank]
        specs.append(
            {
                "rank": rank,
                "env": rank_env,
                "stdout": str(files[rank]["stdout"]),
                "stderr": str(files[rank]["stderr"]),
            }
        )
    exits: queue.Queue[tuple[int, int, float]] = queue.Queue()
    if method == "forkserver":
        server_env = {k: v for k, v in base.items() if k not in ("RANK", "LOCAL_RANK")}
        pids = _start_forked(module, args, specs, exits, server_env)
    else:
        pids = _start_spawned(module, args, specs, exits)
    start = time.monotonic()
    ended: dict[int, tuple[int, float]] = {}
    first_exit_failure: int | None = None
    timed_out = False
    phases: dict[int, str | None] = {}
    try:
        deadline = start + timeout_s
        while len(ended) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = first_exit_failure is None
                break
            try:
                rank, code, when = exits.get(timeout=remaining)
            except queue.Empty:
                continue
            ended[rank] = (code, when)
            if code != 0 and first_exit_failure is None:
                first_exit_failure = rank
                deadline = min(deadline, time.monotonic() + grace_s)
        running = [rank for rank in range(world_size) if rank not in ended]
        phases = {rank: read_phase(files[rank]["phase"]) for rank in running}
        if timed_out:
            for rank in running:
                _signal(pids.get(rank), signal.SIGUSR1)
            time.sleep(_STACK_DUMP_WAIT_S)
        for rank in running:
            _signal(pids.get(rank), signal.SIGKILL)
        reap_deadline = time.monotonic() + 10
        while len(ended) < world_size and time.monotonic() < reap_deadline:
            try:
                rank, code, when = exits.get(timeout=0.1)
            except queue.Empty:
                continue
            ended.setdefault(rank, (code, when))
    finally:
        for rank in range(world_size):
            if rank not in ended:
                _signal(pids.get(rank), signal.SIGKILL)
    failures = {rank: _read_failure(files[rank]["failed"]) for rank in range(world_size)}
    noted = sorted((found[0], rank) for rank, found in failures.items() if found is not None)
    first_failure = noted[0][1] if noted else first_exit_failure
    hung: list[int] = []
    if timed_out:
        outside = [rank for rank, phase in phases.items() if phase != "inside"]
        inside = [rank for rank, phase in phases.items() if phase == "inside"]
        hung = sorted(outside) if outside and inside else sorted(phases)
    results: list[RankExit] = []
    for rank in range(world_size):
        status: int | None = ended[rank][0] if rank in ended else None
        when = ended[rank][1] if rank in ended else time.monotonic()
        state: RankState = _state(rank in phases, rank in hung, status)
        found = failures[rank]
        results.append(
            RankExit(
                rank=rank,
                host=hosts[rank],
                state=state,
                returncode=status,
                seconds=round(max(when - start, 0.0), 3),
                stdout=str(files[rank]["stdout"]),
                stderr=str(files[rank]["stderr"]),
                phase=phases.get(rank),
                error=found[1] if found else None,
            )
        )
    for entry in files:
        entry["phase"].unlink(missing_ok=True)
        entry["failed"].unlink(missing_ok=True)
    return LaunchResult(
        ranks=results,
        timed_out=timed_out,
        first_failure=first_failure,
        hung=hung,
        elapsed_s=round(time.monotonic() - start, 3),
    )
