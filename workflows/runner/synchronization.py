"""``synchronization``: mutexes held by a workflow or by one template, as Argo's ``workflow/sync`` does.

Argo v4 reads ``synchronization.mutexes`` (each with a ``name``, templated, and an optional
``namespace``); the lock's key is ``NAMESPACE/Mutex/NAME``. A workflow-level mutex is taken before the
entrypoint starts and let go after the exit handler ends; a template-level one is taken before the
template's node runs and let go when it ends. While it waits, the node (or the run) says
``Waiting for KEY lock. Lock status: 0/1`` (``workflow/sync/semaphore.go``).

On one machine the locks are shared by every run of this process (the local runner's tests, the event
player), which is where two runs can meet. Semaphores (a ConfigMap's count) and database locks are
refused by :mod:`workflows.runner.validate`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from workflows.runner.state import RunState, Stopped

__all__ = ["hold", "lock_keys"]

_REGISTRY_LOCK = threading.Lock()
_LOCKS: dict[str, threading.Lock] = {}
_POLL_S = 0.05


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
        yield keys
    finally:
        for lock in reversed(taken):
            lock.release()
