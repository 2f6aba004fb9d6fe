"""The local launcher: N rank processes on this machine, with the variables torchrun would set.

:class:`LocalLauncher` is the :class:`~steps.readiness.launchers.base.Launcher` a check runs with;
:func:`launch_local` starts and waits for the processes; :func:`local_injections` turns the simulated
fleet's faults into injected faults of the rank that stands for a node.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from steps.cluster import ClusterPort
from steps.cluster import vocabulary as vocab
from steps.cluster.fabric import FabricSource, SwitchFault
from steps.cluster.health import health_source
from steps.errors import DsxError, InputError
from steps.forkserver import ForkedChild, ForkServer
from steps.readiness.judge import subject_name, verdict
from steps.readiness.launchers.base import Launched, RankProgram
from steps.readiness.models import Subject, Verdict
from steps.readiness.ranks.rankenv import read_failure, read_phase

__all__ = [
    "LOCAL_DELAY_CAP_S",
    "LOCAL_DELAY_PER_LOST_MULTIPLE_S",
    "LaunchResult",
    "LocalLauncher",
    "RankExit",
    "ending_verdicts",
    "launch_local",
    "local_injections",
    "stderr_tail",
]

RankState = Literal["ok", "failed", "killed", "hung"]
Method = Literal["forkserver", "spawn"]
_STACK_DUMP_WAIT_S = 0.5
_SERVER_START_S = 300.0
_FORK_ANSWER_S = 30.0
_RENDEZVOUS = "rendezvous"  # in the work folder: the port rank 0's store listens on
RANK_SERVER_PRELOAD = ("torch", "torch.distributed")
"""What every rank imports: the rank fork server imports it before it forks the first."""


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

        The new one is the nested server this process was forked with, if any (a local runner's step:
        forked with torch already imported, see :mod:`steps.forkserver`), else a new process.

        Raises:
            DsxError: the server did not start or could not import torch.
        """
        with cls._lock:
            if cls._instance is not None and cls._instance.alive:
                return cls._instance
            server: ForkServer | None = None
            with tempfile.TemporaryFile() as log:
                try:
                    server = ForkServer.nested() or ForkServer(env, stderr=log, own_groups=False)
                    failed = list(server.preload(RANK_SERVER_PRELOAD, timeout=_SERVER_START_S).values())
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
    preload: list[str],
) -> dict[int, int]:
    server = _RankServer.get(server_env)
    # Once per server (a module it has imported costs nothing the next time). Should the server die or
    # hang here, starting the ranks below says so: each counts as killed.
    if preload:
        with contextlib.suppress(OSError):
            server.preload(preload, timeout=_SERVER_START_S)
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


def _rank_specs(
    world_size: int, work_dir: Path, env: dict[str, str] | None, rank_hosts: list[str] | None
) -> tuple[dict[str, str], list[dict[str, Path]], list[dict[str, Any]]]:
    """The environment shared by every rank, each rank's files, and what starts each rank.

    Each rank gets torchrun's variables but the port, which rank 0 picks and writes to the rendezvous
    file (cleared), its phase and failure files (cleared) and, when given, the node it stands for; it
    inherits this process's environment with ``env`` on top.
    """
    base = dict(os.environ)
    base.update(env or {})
    base["PYTHONPATH"] = os.pathsep.join(p for p in (_package_root(), base.get("PYTHONPATH", "")) if p)
    base["PYTHONUNBUFFERED"] = "1"
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // world_size)))
    base.update(
        {
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1",
            vocab.ENV_RENDEZVOUS_FILE: str(work_dir / _RENDEZVOUS),  # rank 0 picks the port
        }
    )
    (work_dir / _RENDEZVOUS).unlink(missing_ok=True)
    files = [
        {kind: work_dir / f"rank-{rank}.{kind}" for kind in ("stdout", "stderr", "phase", "failed")}
        for rank in range(world_size)
    ]
    specs: list[dict[str, Any]] = []
    for rank, mine in enumerate(files):
        mine["phase"].write_bytes(b"\0")
        mine["failed"].unlink(missing_ok=True)
        rank_env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
        rank_env[vocab.ENV_PHASE_FILE] = str(mine["phase"])
        rank_env[vocab.ENV_FAIL_FILE] = str(mine["failed"])
        if rank_hosts is not None:
            rank_env[vocab.ENV_NODE_NAME] = rank_hosts[rank]
        specs.append(
            {"rank": rank, "env": rank_env, "stdout": str(mine["stdout"]), "stderr": str(mine["stderr"])}
        )
    return base, files, specs


class _Waited:
    """What waiting for the ranks found: how each ended, and the state of those still running."""

    def __init__(self) -> None:
        self.ended: dict[int, tuple[int, float]] = {}
        self.first_exit_failure: int | None = None
        self.timed_out = False
        self.phases: dict[int, str | None] = {}


def _wait(
    exits: queue.Queue[tuple[int, int, float]],
    pids: dict[int, int],
    files: list[dict[str, Path]],
    timeout_s: float,
    grace_s: float,
) -> _Waited:
    """Wait for every rank, bounded by ``timeout_s`` (or ``grace_s`` past the first failure); then stop
    the rest (a stack dump first on a timeout) and reap them. No rank outlives this call."""
    world_size = len(files)
    waited = _Waited()
    ended = waited.ended
    try:
        deadline = time.monotonic() + timeout_s
        while len(ended) < world_size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                waited.timed_out = waited.first_exit_failure is None
                break
            try:
                rank, code, when = exits.get(timeout=remaining)
            except queue.Empty:
                continue
            ended[rank] = (code, when)
            if code != 0 and waited.first_exit_failure is None:
                waited.first_exit_failure = rank
                deadline = min(deadline, time.monotonic() + grace_s)
        running = [rank for rank in range(world_size) if rank not in ended]
        waited.phases = {rank: read_phase(files[rank]["phase"]) for rank in running}
        if waited.timed_out:
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
    return waited


def _result(waited: _Waited, files: list[dict[str, Path]], hosts: list[str], start: float) -> LaunchResult:
    """The launch's result: each rank's ending, the rank whose error came first, the ranks that hang."""
    world_size = len(files)
    failures = {rank: read_failure(files[rank]["failed"]) for rank in range(world_size)}
    noted = sorted((found[0], rank) for rank, found in failures.items() if found is not None)
    first_failure = noted[0][1] if noted else waited.first_exit_failure
    hung: list[int] = []
    if waited.timed_out:
        outside = [rank for rank, phase in waited.phases.items() if phase != "inside"]
        inside = [rank for rank, phase in waited.phases.items() if phase == "inside"]
        hung = sorted(outside) if outside and inside else sorted(waited.phases)
    results: list[RankExit] = []
    for rank in range(world_size):
        status: int | None = waited.ended[rank][0] if rank in waited.ended else None
        when = waited.ended[rank][1] if rank in waited.ended else time.monotonic()
        found = failures[rank]
        results.append(
            RankExit(
                rank=rank,
                host=hosts[rank],
                state=_state(rank in waited.phases, rank in hung, status),
                returncode=status,
                seconds=round(max(when - start, 0.0), 3),
                stdout=str(files[rank]["stdout"]),
                stderr=str(files[rank]["stderr"]),
                phase=waited.phases.get(rank),
                error=found[1] if found else None,
            )
        )
    return LaunchResult(
        ranks=results,
        timed_out=waited.timed_out,
        first_failure=first_failure,
        hung=hung,
        elapsed_s=round(time.monotonic() - start, 3),
    )


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
    preload: list[str] | None = None,
) -> LaunchResult:
    """Start ``python -m module args`` as ``world_size`` ranks and wait for them, bounded by ``timeout_s``.

    Args:
        module: the rank program, e.g. ``steps.readiness.ranks.sweep``.
        args: its arguments, the same for every rank.
        world_size: how many ranks.
        work_dir: folder for ``rank-N.stdout`` and ``rank-N.stderr``.
        timeout_s: the run's limit once its ranks are started; past it every rank is killed and the
            run counts as hung.
        rank_hosts: the node each rank stands for (``DSX_NODE_NAME``), one per rank.
        grace_s: how long the other ranks may take to exit after one fails, before they are killed.
        env: extra environment variables for every rank.
        method: ``forkserver`` (fork from a warm process that imported torch once) or ``spawn``.
        preload: modules every rank imports, imported once by the fork server before it forks them (a
            module that fails to import is skipped there: the rank that needs it says why).

    Raises:
        InputError: ``world_size`` is below 1 or ``rank_hosts`` does not have one name per rank.
        DsxError: the fork server could not start.
    """
    if world_size < 1:
        raise InputError(f"--ranks must be 1 or more, not {world_size}")
    if rank_hosts is not None and len(rank_hosts) != world_size:
        raise InputError(f"{len(rank_hosts)} node names given for {world_size} ranks")
    work_dir.mkdir(parents=True, exist_ok=True)
    base, files, specs = _rank_specs(world_size, work_dir, env, rank_hosts)
    exits: queue.Queue[tuple[int, int, float]] = queue.Queue()
    if method == "forkserver":
        server_env = {k: v for k, v in base.items() if k not in ("RANK", "LOCAL_RANK")}
        pids = _start_forked(module, args, specs, exits, server_env, preload or [])
    else:
        pids = _start_spawned(module, args, specs, exits)
    start = time.monotonic()
    waited = _wait(exits, pids, files, timeout_s, grace_s)
    result = _result(waited, files, rank_hosts or [socket.gethostname()] * world_size, start)
    for entry in files:
        entry["phase"].unlink(missing_ok=True)
        entry["failed"].unlink(missing_ok=True)
    (work_dir / _RENDEZVOUS).unlink(missing_ok=True)
    return result


def ending_verdicts(launch: LaunchResult, subject: Subject, test: str, timeout_s: float) -> list[Verdict]:
    """Verdicts for a local run whose ranks did not all exit cleanly: ``hang`` or ``error``.

    A timeout gives ``hang`` naming the ranks that were not inside a collective while others were (or
    all ranks still running, when that cannot tell); a rank that failed gives ``error`` naming the
    rank whose error came first, with its stderr kept as evidence. A clean launch gives no verdict.
    """
    if launch.ok:
        return []
    if launch.timed_out:
        named = [launch.ranks[rank] for rank in launch.hung]
        who = ", ".join(f"rank {r.rank} on node {r.host}" for r in named) or "every rank"
        message = (
            f"{subject_name(subject)}: {test} did not finish within {timeout_s:g} s; "
            f"not answering: {who}; every rank was killed"
        )
        evidence = [r.stderr for r in launch.ranks]
        return [
            verdict(
                subject,
                test,
                "hang",
                message,
                measured=launch.elapsed_s,
                threshold=timeout_s,
                unit="s",
                evidence=evidence,
                named=named,
            )
        ]
    first = launch.first_failure
    culprit = launch.ranks[first] if first is not None else next(r for r in launch.ranks if r.state != "ok")
    reason = culprit.error or stderr_tail(culprit.stderr) or f"exit status {culprit.returncode}"
    others = [r.rank for r in launch.ranks if r.rank != culprit.rank and r.state != "ok"]
    after = (
        f"; {'rank' if len(others) == 1 else 'ranks'} {', '.join(map(str, others))} stopped after it"
        if others
        else ""
    )
    message = (
        f"rank {culprit.rank} on node {culprit.host} failed (exit {culprit.returncode}): {reason}{after}"
    )
    evidence = [culprit.stderr] + [r.stderr for r in launch.ranks if r.rank != culprit.rank]
    return [
        verdict(
            subject,
            test,
            "error",
            message,
            evidence=evidence,
            named=[culprit],
            injected="injected" in reason.lower(),
        )
    ]


@dataclass(frozen=True)
class LocalLauncher:
    """Runs a check's ranks as processes of this machine, its evidence in ``folder``.

    Rank 0's outputs go to ``folder`` under the program's file names, the ranks' logs to
    ``folder/ranks``; ``rank_hosts`` names the node each rank stands for (``DSX_NODE_NAME``).
    """

    folder: Path
    ranks: int
    rank_hosts: list[str] | None = None
    method: Method = "forkserver"

    def run(self, test: str, subject: Subject, program: RankProgram, timeout_s: float) -> Launched:
        """Run ``program`` as :attr:`ranks` local processes; rank 0's result is read from its file."""
        outputs = [self.folder / name for _, name in program.outputs]
        for stale in outputs:
            stale.unlink(missing_ok=True)
        args = [*program.args]
        for (flag, _), path in zip(program.outputs, outputs, strict=True):
            args += [flag, str(path)]
        launch = launch_local(
            program.module,
            args,
            self.ranks,
            self.folder / "ranks",
            timeout_s=timeout_s,
            rank_hosts=self.rank_hosts,
            method=self.method,
            preload=program.preload,
        )
        text: str | None = None
        if launch.ok:
            with contextlib.suppress(OSError, UnicodeDecodeError):
                text = outputs[0].read_text(encoding="utf-8")
        return Launched(
            text=text,
            verdicts=ending_verdicts(launch, subject, test, timeout_s),
            outputs=[str(path) for path in outputs],
            logs=[path for rank in launch.ranks for path in (rank.stdout, rank.stderr)],
            where=str(self.folder),
            elapsed_s=launch.elapsed_s,
        )


# ----------------------------------------------------------------------------- the simulated fleet's faults

#: A local rank standing for a node whose links give a quarter of their nominal bandwidth is delayed
#: by this much per collective for each multiple of the bandwidth it lost (a quarter: 3 x 10 ms), up to
#: the cap, so that a badly degraded node still finishes within the group test's timeout.
LOCAL_DELAY_PER_LOST_MULTIPLE_S = 0.010
LOCAL_DELAY_CAP_S = 0.100

#: A local rank standing for a node whose GPUs compute at half speed is delayed by this much per training
#: step for each multiple of its compute it lost. A local step is mostly waiting (its own work is a couple
#: of milliseconds), so a slower GPU is played as a delay that shows above a busy machine's noise, as a
#: quarter-speed NIC's 30 ms does.
LOCAL_COMPUTE_DELAY_PER_LOST_MULTIPLE_S = 0.030


def _delay_ms(lost_multiples: float, compute_multiples: float = 0.0) -> int:
    delay = lost_multiples * LOCAL_DELAY_PER_LOST_MULTIPLE_S
    delay += compute_multiples * LOCAL_COMPUTE_DELAY_PER_LOST_MULTIPLE_S
    return round(min(delay, LOCAL_DELAY_CAP_S) * 1000)


def local_injections(
    port: ClusterPort, node: str, rank: int, scope: Literal["node", "group", "train"]
) -> list[str]:
    """The injected faults that make a local rank play ``node`` as the simulated fleet has it.

    A group test feels the node's scale-out links as a ring does (``slow-nic``, a slow or down rail,
    ``hang``; ``flaky-nic``, played as a failure every time so that a local run repeats) and a faulty leaf
    switch above it; a training run feels those and its GPUs' compute (``slow-gpu``: a rank that spends
    longer on every step, which no all-reduce shows); a single-node test feels its NVLink
    (``slow-nvlink``) and a failed GPU (``failing-gpu``). Real clusters have no such model: empty.
    """
    source = health_source(port)
    if source is None:
        return []
    health = source.node_report(node)
    specs: list[str] = []
    if scope in ("group", "train"):
        switches = [w for w in _switches(port) if node in w.nodes]
        link = health.ring_gbps * min((w.speed for w in switches), default=1.0)
        lost = health.nominal_link_gbps / max(link, 1e-9) - 1 if link > 0 else 0.0
        computed = min((g.compute_share for g in health.gpus), default=1.0)
        compute_lost = 1 / computed - 1 if scope == "train" else 0.0
        if health.link_hangs or any(w.hangs for w in switches):
            specs.append(f"{rank}:hang")
        elif health.link_failure_rate > 0 or link <= 0 or any(w.failure_rate > 0 for w in switches):
            specs.append(f"{rank}:fail")
        elif lost > 1e-9 or compute_lost > 1e-9:
            specs.append(f"{rank}:delay={_delay_ms(lost, compute_lost)}ms")
    else:
        if any(not gpu.healthy for gpu in health.gpus):
            specs.append(f"{rank}:fail")
        else:
            slowest = min(
                (g.nvlink_gbps / g.nominal_nvlink_gbps for g in health.gpus if g.nominal_nvlink_gbps > 0),
                default=1.0,
            )
            if slowest < 1.0:
                lost = 1 / max(slowest, 1e-9) - 1
                specs.append(f"{rank + 1}:delay={_delay_ms(lost)}ms")
    return specs


def _switches(port: ClusterPort) -> tuple[SwitchFault, ...]:
    """The faulty leaf switches of a port whose fabric is modelled (none for any other)."""
    return port.fabric_settings().switches if isinstance(port, FabricSource) else ()
