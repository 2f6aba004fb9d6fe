"""What a rank process learns from its environment, and the marks it leaves for its launcher.

Both launchers set the same variables: torchrun on a cluster (``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``MASTER_ADDR``, ``MASTER_PORT``) and the local launcher of
:mod:`steps.readiness.launchers.local`, which leaves the port to rank 0 (``DSX_RENDEZVOUS_FILE`` instead
of ``MASTER_PORT``, see :func:`joined`) and adds ``DSX_NODE_NAME`` (the node a rank stands for),
``DSX_PHASE_FILE`` (a one-byte file where the rank marks whether it is inside a collective, read by
the launcher to name the rank that hangs) and ``DSX_FAIL_FILE`` (where the rank notes the time and text
of its first error, read by the launcher to name the rank whose error came first).

Both sides of those files live here, the writing (in the rank) and the reading (in the launcher), so
the launcher imports this module and never the other way round.
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from pydantic import BaseModel, ConfigDict

from steps.cluster import vocabulary as vocab
from steps.errors import InputError

__all__ = [
    "INSIDE",
    "OUTSIDE",
    "PhaseMarker",
    "RankEnv",
    "exit_rank",
    "joined",
    "node_name",
    "read_failure",
    "read_phase",
    "record_failure",
    "stacks_on_signals",
    "sync",
]

INSIDE = ord("C")
OUTSIDE = ord("O")


class RankEnv(BaseModel):
    """The place of this process in a distributed run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rank: int
    world_size: int
    local_rank: int
    host: str

    @classmethod
    def from_environ(cls) -> RankEnv:
        """Read ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` (as torchrun sets them).

        Raises:
            InputError: the variables are missing or malformed.
        """
        try:
            rank = int(os.environ["RANK"])
            world = int(os.environ["WORLD_SIZE"])
            local = int(os.environ.get("LOCAL_RANK", rank))
        except KeyError as exc:
            raise InputError(f"{exc.args[0]} is not set: start this program with torchrun or dsx") from None
        except ValueError as exc:
            raise InputError(f"RANK, WORLD_SIZE or LOCAL_RANK is not a number: {exc}") from None
        port = () if vocab.ENV_RENDEZVOUS_FILE in os.environ else ("MASTER_PORT",)  # else rank 0 picks it
        for name in ("MASTER_ADDR", *port):
            if name not in os.environ:
                raise InputError(f"{name} is not set: start this program with torchrun or dsx")
        if not 0 <= rank < world:
            raise InputError(f"RANK {rank} is outside WORLD_SIZE {world}")
        return cls(rank=rank, world_size=world, local_rank=local, host=node_name())


def node_name() -> str:
    """The node this rank runs on: ``DSX_NODE_NAME`` (the Kubernetes node, set through the downward
    API, or the node a local rank stands for), else the host name."""
    return os.environ.get(vocab.ENV_NODE_NAME) or socket.gethostname()


class PhaseMarker:
    """A one-byte shared file telling whether the rank is inside a collective (``C``) or not (``O``).

    Writing it costs a memory store, so it can be marked around every collective call. Without
    ``DSX_PHASE_FILE`` it does nothing.
    """

    def __init__(self, path: str | None = None) -> None:
        path = path if path is not None else os.environ.get(vocab.ENV_PHASE_FILE)
        self._map: mmap.mmap | None = None
        if path:
            with open(path, "r+b") as handle:
                self._map = mmap.mmap(handle.fileno(), 1)
            self._map[0] = OUTSIDE

    def inside(self) -> None:
        """Mark entry into a collective."""
        if self._map is not None:
            self._map[0] = INSIDE

    def outside(self) -> None:
        """Mark return from a collective."""
        if self._map is not None:
            self._map[0] = OUTSIDE


def read_phase(path: Path) -> str | None:
    """``inside``, ``outside`` or ``None`` (never marked) for a phase file written by :class:`PhaseMarker`."""
    try:
        data = path.read_bytes()[:1]
    except OSError:
        return None
    if data == bytes([INSIDE]):
        return "inside"
    if data == bytes([OUTSIDE]):
        return "outside"
    return None


def record_failure(exc: BaseException) -> None:
    """Note, in a rank process, the time and text of its first error (``$DSX_FAIL_FILE``).

    Called before the process group is torn down, so the rank whose error caused the others' errors
    has the earliest time. Without ``DSX_FAIL_FILE`` it does nothing.
    """
    path = os.environ.get(vocab.ENV_FAIL_FILE)
    if not path or os.path.exists(path):
        return
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:500]
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"{time.time():.6f} {text}\n")


def read_failure(path: Path) -> tuple[float, str] | None:
    """The time and text a rank noted with :func:`record_failure`, or ``None`` when it noted none."""
    try:
        stamp, _, text = path.read_text(encoding="utf-8").strip().partition(" ")
        return float(stamp), text
    except (OSError, ValueError):
        return None


@contextmanager
def joined(backend: str, env: RankEnv, timeout_s: float) -> Iterator[tuple[Any, Any, Any]]:
    """This rank in its process group: yields ``(torch, torch.distributed, device)``.

    The device is the rank's GPU (``LOCAL_RANK``) for NCCL, the CPU for gloo. An exception is noted for
    the launcher (which names the rank whose error came first) before it propagates; the group is
    destroyed on the way out.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    if backend == "nccl":
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        backend=backend,
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
        store=_store(dist, env, timeout_s),
    )
    try:
        yield torch, dist, device
    except BaseException as exc:
        record_failure(exc)
        raise
    finally:
        dist.destroy_process_group()


def _store(dist: Any, env: RankEnv, timeout_s: float) -> Any | None:
    """The run's store, its port chosen by rank 0, when the launcher asks for that (``DSX_RENDEZVOUS_FILE``);
    else ``None``, for torch's ``env://`` rendezvous at ``MASTER_ADDR:MASTER_PORT``.

    On a machine shared by many runs, a port a launcher finds free can be taken by any other process before
    rank 0 listens on it: rank 0 then fails (``EADDRINUSE``), or the other ranks join another run's store.
    Rank 0 listening on port 0 and writing the port it got (whole, by a rename) leaves nothing to race.

    Raises:
        TimeoutError: rank 0 wrote no port within ``timeout_s``.
    """
    path = os.environ.get(vocab.ENV_RENDEZVOUS_FILE)
    if not path:
        return None
    host, timeout = os.environ["MASTER_ADDR"], timedelta(seconds=timeout_s)
    if env.rank == 0:
        store = dist.TCPStore(host, 0, env.world_size, True, timeout, wait_for_workers=False)
        written = Path(f"{path}.{os.getpid()}")
        written.write_text(str(store.port), encoding="ascii")
        written.replace(path)
        return store
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            port = int(Path(path).read_text(encoding="ascii"))
        except FileNotFoundError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank 0 wrote no store port to {path} within {timeout_s:g} s") from None
            time.sleep(0.01)
            continue
        return dist.TCPStore(host, port, env.world_size, False, timeout)


def stacks_on_signals() -> None:
    """Have this rank write every thread's Python stack to stderr when it crashes (SIGSEGV, SIGABRT from a
    C++ ``std::terminate``, SIGBUS...), and when asked with SIGUSR1 (a launcher naming a rank that hangs):
    a rank that dies inside a collective otherwise leaves only its exit signal in the log."""
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)


def exit_rank(code: int) -> NoReturn:
    """End a rank process with ``code`` once its work is done and its process group destroyed, without
    the interpreter's finalisation: torch's gloo and store threads can still be running then, and a
    joinable C++ thread destroyed at exit aborts the process ("terminate called without an active
    exception", seen with no Python frame left on the main thread), which its launcher takes for a failed
    rank while the others wait for it. Output is flushed first."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # one that cannot be flushed keeps the other from nothing
            stream.flush()
    os._exit(code)


def sync(torch: Any, device: Any) -> None:
    """Wait for the device's queued work (timings on a GPU are otherwise only launch times)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
