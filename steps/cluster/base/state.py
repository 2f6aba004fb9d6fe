"""The port's state and lock calls: dsx's state ConfigMaps, the per-node Lease locks and the named
mutexes (Leases too) that hold between processes, each a read-modify-write that re-reads and re-applies
its change on a conflict."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Mapping
from typing import Any

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.base.core import CONFIGMAPS, LEASES, PortCore, logged
from steps.cluster.errors import ConflictError
from steps.cluster.patches import merge_patch
from steps.cluster.port import StateChange
from steps.errors import InputError

__all__ = ["StateCalls", "lease_name", "mutex_lease_name"]


def lease_name(node: str) -> str:
    """The name of the Lease that locks ``node``."""
    return f"dsx-node-{node}"


def mutex_lease_name(key: str) -> str:
    """The name of the Lease that holds the mutex ``key`` (``NAMESPACE/Mutex/NAME``): ``dsx-mutex-``, the
    key's name as a DNS label may read it, and a hash of the whole key (two keys never share one)."""
    readable = re.sub(r"[^a-z0-9-]+", "-", key.rsplit("/", 1)[-1].lower()).strip("-")[:40]
    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"dsx-mutex-{readable}-{digest}" if readable else f"dsx-mutex-{digest}"


class StateCalls(PortCore):
    """The state and lock calls of :class:`~steps.cluster.port.ClusterPort`."""

    @logged
    def get_state(self, name: str) -> dict[str, str]:
        """The data of the state ConfigMap (empty if it does not exist)."""
        target = f"configmap/{self.namespace}/{name}"
        data = self._run("get_state", target, True, lambda: self._get(CONFIGMAPS, name, self.namespace))
        return dict((data or {}).get("data") or {})

    @logged
    def update_state(
        self, name: str, change: StateChange, labels: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Read-modify-write the state ConfigMap; on a conflict read again and re-apply ``change``.
        ``labels`` are merged into the ConfigMap's own (on the create, or with the next write)."""
        call, target, ns = "update_state", f"configmap/{self.namespace}/{name}", self.namespace
        wanted = dict(labels or {})
        for attempt in range(self._retry.conflict_attempts):
            current = self._run(call, target, True, lambda: self._get(CONFIGMAPS, name, ns))
            old = dict((current or {}).get("data") or {})
            new = change(dict(old))
            if not all(isinstance(k, str) and isinstance(v, str) for k, v in new.items()):
                raise InputError(f"{call} {target}: state keys and values must be strings")
            had = dict(((current or {}).get("metadata") or {}).get("labels") or {})
            if new == old and (not new if current is None else wanted.items() <= had.items()):
                return new
            try:
                if current is None:
                    metadata: dict[str, Any] = {"name": name, "namespace": ns}
                    if wanted:
                        metadata["labels"] = dict(sorted(wanted.items()))
                    body = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata}
                    body["data"] = dict(sorted(new.items()))
                    self._run(call, target, True, functools.partial(self._create, CONFIGMAPS, ns, body))
                else:
                    body = merge_patch(current, {"data": None})
                    if wanted:
                        body["metadata"]["labels"] = dict(sorted({**had, **wanted}.items()))
                    body["data"] = dict(sorted(new.items()))
                    self._run(
                        call, target, True, functools.partial(self._replace, CONFIGMAPS, name, ns, body)
                    )
            except ConflictError:
                self._retry.wait_conflict(attempt)
                continue
            return new
        raise ConflictError(call, target, "conflict (409): the state kept changing under dsx; try again", 409)

    def _lease_write(
        self,
        call: str,
        node: str,
        holder: str,
        decide: Callable[[dict[str, Any] | None], Any],
        mutex: str | None = None,
    ) -> bool:
        """Read the node's Lease (or the ``mutex``'s), let ``decide`` give the new spec (or ``False``),
        write it back."""
        ns = self.namespace
        name = lease_name(node) if mutex is None else mutex_lease_name(mutex)
        labels = {vocab.LABEL_LOCKED_NODE: node} if mutex is None else {"app.kubernetes.io/part-of": "dsx"}
        target = f"lease/{ns}/{name}"
        if not holder:
            what = f"node/{node}" if mutex is None else f"mutex {mutex}"
            raise InputError(f"{call} {what}: no lock holder given")
        for attempt in range(self._retry.conflict_attempts):
            current = self._run(call, target, True, lambda: self._get(LEASES, name, ns))
            spec = decide(None if current is None else dict(current.get("spec") or {}))
            if spec is False:
                return False
            try:
                if current is None:
                    body = {
                        "apiVersion": "coordination.k8s.io/v1",
                        "kind": "Lease",
                        "metadata": {"name": name, "namespace": ns, "labels": labels},
                        "spec": spec,
                    }
                    self._run(call, target, True, functools.partial(self._create, LEASES, ns, body))
                else:
                    body = merge_patch(current, {"spec": None})
                    body["spec"] = spec
                    self._run(call, target, True, functools.partial(self._replace, LEASES, name, ns, body))
            except ConflictError:
                self._retry.wait_conflict(attempt)
                continue
            return True
        return False

    @logged
    def acquire_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Take the node's Lease for ``holder`` unless someone else holds it and it has not expired."""
        return self._lease_write("acquire_lock", node, holder, _acquire(holder, ttl_seconds, self._clock()))

    @logged
    def renew_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the Lease if ``holder`` still holds it."""
        return self._lease_write("renew_lock", node, holder, _renew(holder, ttl_seconds, self._clock()))

    @logged
    def release_lock(self, node: str, holder: str) -> bool:
        """Give the Lease up if ``holder`` holds it."""
        return self._lease_write("release_lock", node, holder, _release(holder))

    @logged
    def acquire_mutex(self, key: str, holder: str, ttl_seconds: int) -> bool:
        """Take the mutex ``key`` for ``holder`` unless someone else holds it and it has not expired."""
        return self._lease_write(
            "acquire_mutex", "", holder, _acquire(holder, ttl_seconds, self._clock()), key
        )

    @logged
    def renew_mutex(self, key: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the mutex if ``holder`` still holds it."""
        return self._lease_write("renew_mutex", "", holder, _renew(holder, ttl_seconds, self._clock()), key)

    @logged
    def release_mutex(self, key: str, holder: str) -> bool:
        """Give the mutex up if ``holder`` holds it."""
        return self._lease_write("release_mutex", "", holder, _release(holder), key)


def _acquire(holder: str, ttl_seconds: int, now: Any) -> Callable[[dict[str, Any] | None], Any]:
    def decide(spec: dict[str, Any] | None) -> Any:
        if (
            spec
            and spec.get("holderIdentity") not in (None, "", holder)
            and not changes.lease_expired(spec, now)
        ):
            return False
        return changes.lease_spec(spec, holder, ttl_seconds, now)

    return decide


def _renew(holder: str, ttl_seconds: int, now: Any) -> Callable[[dict[str, Any] | None], Any]:
    def decide(spec: dict[str, Any] | None) -> Any:
        if not spec or spec.get("holderIdentity") != holder:
            return False
        return changes.lease_spec(spec, holder, ttl_seconds, now)

    return decide


def _release(holder: str) -> Callable[[dict[str, Any] | None], Any]:
    def decide(spec: dict[str, Any] | None) -> Any:
        if not spec or spec.get("holderIdentity") != holder:
            return False
        return {k: v for k, v in spec.items() if k not in ("holderIdentity", "renewTime", "acquireTime")}

    return decide
