"""The port's state and lock calls: dsx's state ConfigMaps and the per-node Lease locks, each a
read-modify-write that re-reads and re-applies its change on a conflict."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

from steps.cluster import changes
from steps.cluster import vocabulary as vocab
from steps.cluster.base.core import CONFIGMAPS, LEASES, PortCore, logged
from steps.cluster.errors import ConflictError
from steps.cluster.patches import merge_patch
from steps.cluster.port import StateChange
from steps.errors import InputError

__all__ = ["StateCalls", "lease_name"]


def lease_name(node: str) -> str:
    """The name of the Lease that locks ``node``."""
    return f"dsx-node-{node}"


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
        self, call: str, node: str, holder: str, decide: Callable[[dict[str, Any] | None], Any]
    ) -> bool:
        """Read the node's Lease, let ``decide`` give the new spec (or ``False``), write it back."""
        name, ns = lease_name(node), self.namespace
        target = f"lease/{ns}/{name}"
        if not holder:
            raise InputError(f"{call} node/{node}: no lock holder given")
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
                        "metadata": {
                            "name": name,
                            "namespace": ns,
                            "labels": {vocab.LABEL_LOCKED_NODE: node},
                        },
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
        now = self._clock()

        def decide(spec: dict[str, Any] | None) -> Any:
            if (
                spec
                and spec.get("holderIdentity") not in (None, "", holder)
                and not changes.lease_expired(spec, now)
            ):
                return False
            return changes.lease_spec(spec, holder, ttl_seconds, now)

        return self._lease_write("acquire_lock", node, holder, decide)

    @logged
    def renew_lock(self, node: str, holder: str, ttl_seconds: int) -> bool:
        """Extend the Lease if ``holder`` still holds it."""
        now = self._clock()

        def decide(spec: dict[str, Any] | None) -> Any:
            if not spec or spec.get("holderIdentity") != holder:
                return False
            return changes.lease_spec(spec, holder, ttl_seconds, now)

        return self._lease_write("renew_lock", node, holder, decide)

    @logged
    def release_lock(self, node: str, holder: str) -> bool:
        """Give the Lease up if ``holder`` holds it."""

        def decide(spec: dict[str, Any] | None) -> Any:
            if not spec or spec.get("holderIdentity") != holder:
                return False
            return {k: v for k, v in spec.items() if k not in ("holderIdentity", "renewTime", "acquireTime")}

        return self._lease_write("release_lock", node, holder, decide)
