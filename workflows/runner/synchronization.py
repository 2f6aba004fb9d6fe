"""``synchronization``: mutexes held by a workflow or by one template, as Argo's ``workflow/sync`` does.

Argo v4 reads ``synchronization.mutexes`` (each with a ``name``, templated, and an optional
``namespace``); the lock's key is ``NAMESPACE/Mutex/NAME``. A workflow-level mutex is taken before the
entrypoint starts and let go after the exit handler ends; a template-level one is taken before the
template's node runs and let go when it ends. While it waits, the node (or the run) says
``Waiting for KEY lock. Lock status: 0/1`` (``workflow/sync/semaphore.go``).

Every run of this process shares its locks (the local runner's tests, the event player). A run on a
cluster that other processes share, a fleet's state file (``state:PATH``) or a real cluster (``kube``),
also holds each mutex as a Lease there (:meth:`~steps.cluster.port.ClusterPort.acquire_mutex`), so two
``dsx run --local`` in two shells, or on two machines, wait for each other as two Workflows do. The
Lease's holder names the host, the process and the run; it is renewed while the run holds it and
expires :data:`MUTEX_TTL_S` after its process died, so a run that was killed never holds a mutex for
good. Semaphores (a ConfigMap's count) and database locks are refused by :mod:`workflows.runner.validate`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from steps.cluster import ClusterPort
from steps.errors import DsxError
from workflows.runner.resource import connect_run
from workflows.runner.state import RunState, Stopped

__all__ = ["MUTEX_TTL_S", "hold", "lock_keys"]

_REGISTRY_LOCK = threading.Lock()
_LOCKS: dict[str, threading.Lock] = {}
_POLL_S = 0.05
MUTEX_TTL_S = 30
"""How long a mutex Lease lives unrenewed: the wait after a holder's process died."""
_RENEW_S = MUTEX_TTL_S / 3
_CLUSTER_POLL_S = 0.5


def lock_keys(sync: Mapping[str, Any] | None, namespace: str) -> list[str]:
    """The keys of the mutexes a (rendered) ``synchronization`` names, sorted (taken in that order, so two
    runs that need the same two never deadlock)."""
    keys = {
        f"{m.get('namespace') or namespace}/Mutex/{m['name']}"
        for m in (sync or {}).get("mutexes") or []
        if isinstance(m, Mapping) and m.get("name")
    }
    return sorted(keys)


def _lock(key: str) -> threading.Lock:
    with _REGISTRY_LOCK:
        return _LOCKS.setdefault(key, threading.Lock())


@contextlib.contextmanager
def hold(
    state: RunState, sync: Mapping[str, Any] | None, namespace: str, waiting: Callable[[str], None]
) -> Iterator[list[str]]:
    """Hold every mutex of ``sync`` for the block; ``waiting(message)`` is told while one is busy.

    Raises:
        Stopped: the run stopped while waiting.
    """
    taken: list[threading.Lock] = []
    keys = lock_keys(sync, namespace)
    shared = _shared_cluster(state) if keys else None
    holder = f"{socket.gethostname()}/pid-{os.getpid()}/{state.workflow}"
    held: list[tuple[ClusterPort, str]] = []
    renewing = threading.Event()
    try:
        for key in keys:
            lock = _lock(key)
            told = False
            while not lock.acquire(timeout=_POLL_S):
                if not told:
                    waiting(f"Waiting for {key} lock. Lock status: 0/1")
                    told = True
                if state.stop.is_set():
                    raise Stopped
            taken.append(lock)
            if shared is not None:
                port = shared(key.split("/", 1)[0])  # the Lease lives in the mutex's namespace
                while not port.acquire_mutex(key, holder, MUTEX_TTL_S):
                    if not told:
                        waiting(f"Waiting for {key} lock. Lock status: 0/1")
                        told = True
                    if state.stop.wait(_CLUSTER_POLL_S):
                        raise Stopped
                held.append((port, key))
        if held:
            threading.Thread(
                target=_renew, args=(holder, held, renewing), daemon=True, name="dsx-mutex-renew"
            ).start()
        yield keys
    finally:
        renewing.set()
        for port, key in reversed(held):
            with contextlib.suppress(DsxError):  # unreleased, it expires after MUTEX_TTL_S
                port.release_mutex(key, holder)
        for lock in reversed(taken):
            lock.release()


def _shared_cluster(state: RunState) -> Callable[[str], ClusterPort] | None:
    """Ports by namespace of a cluster other processes share (a fleet's state file, a real cluster); None
    for a run's own simulated fleet (``sim:...``: no other process sees it)."""
    given = state.options.cluster or ""
    if not (given.startswith("state:") or given == "kube" or state.options.kubeconfig):
        return None
    return lambda namespace: connect_run(state, namespace)


def _renew(holder: str, held: list[tuple[ClusterPort, str]], done: threading.Event) -> None:
    """Renew the run's mutex Leases until ``done``; one lost (expired and taken) is said."""
    while not done.wait(_RENEW_S):
        for port, key in held:
            try:
                if not port.renew_mutex(key, holder, MUTEX_TTL_S):
                    print(f"warning: mutex {key} was lost (its Lease expired and was taken)", file=sys.stderr)
            except DsxError as exc:
                print(f"warning: mutex {key} not renewed: {exc}", file=sys.stderr)
