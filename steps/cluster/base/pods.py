"""The port's pod calls (pods on a node, evictions and deletions pinned to a pod's uid) and Events
about nodes."""

from __future__ import annotations

import contextlib
import sys
import time

from steps.cluster import changes
from steps.cluster.base.core import EVENTS, PODS, PortCore, logged
from steps.cluster.errors import ClusterError, ConflictError
from steps.cluster.pod import EvictionResult, Pod, PodRef, pod_ref
from steps.cluster.port import NODE_EVENT_NAMESPACE
from steps.errors import DsxError, InputError

__all__ = ["PodCalls"]


class PodCalls(PortCore):
    """The pod and event calls of :class:`~steps.cluster.port.ClusterPort`."""

    @logged
    def pods_on(self, node: str) -> list[Pod]:
        """Pods bound to the node, sorted by namespace and name."""
        self._read_node("pods_on", node)
        items = self._run(
            "pods_on", f"node/{node}", True, lambda: self._list(PODS, None, None, f"spec.nodeName={node}")
        )
        return sorted((Pod.from_manifest(i) for i in items), key=lambda p: (p.namespace, p.name))

    def _pod_uid(self, call: str, pod: PodRef) -> str | None:
        """The uid the call pins: the :class:`Pod`'s own, else that of the pod there now (``None``: no pod;
        ``""``: a pod the server gave no uid)."""
        if isinstance(pod, Pod) and pod.uid:
            return pod.uid
        namespace, name = pod_ref(pod)
        data = self._run(call, f"pod/{namespace}/{name}", True, lambda: self._get(PODS, name, namespace))
        return None if data is None else str((data.get("metadata") or {}).get("uid") or "")

    def _replaced(self, call: str, pod: PodRef, uid: str) -> str | None:
        """Why the pod with ``uid`` is gone (deleted, or a new pod holds its name); ``None`` if it is not."""
        namespace, name = pod_ref(pod)
        data = self._run(call, f"pod/{namespace}/{name}", True, lambda: self._get(PODS, name, namespace))
        if data is None:
            return f'pods "{name}" not found'
        now = str((data.get("metadata") or {}).get("uid") or "")
        return None if now == uid else f'pod "{name}" {uid} is gone; a new pod of that name has uid {now}'

    @logged
    def evict(self, pod: PodRef, grace_seconds: int | None = None) -> EvictionResult:
        """Ask the API to evict a pod: evicted, blocked by a PodDisruptionBudget, or already gone.

        The Eviction names the pod's uid in its ``deleteOptions.preconditions``: a retry after a lost
        answer never evicts a new pod of the same name, and a pod replaced meanwhile reads as gone.
        """
        namespace, name = pod_ref(pod)
        ref = f"{namespace}/{name}"
        uid = self._pod_uid("evict", pod)
        if uid is None:
            return EvictionResult(pod=ref, outcome="gone", message=f'pods "{name}" not found')
        try:
            status, message = self._run(
                "evict", f"pod/{ref}", True, lambda: self._evict(namespace, name, grace_seconds, uid or None)
            )
        except ConflictError:
            why = self._replaced("evict", pod, uid) if uid else None
            if why is None:
                raise
            return EvictionResult(pod=ref, outcome="gone", message=why)
        if status == 404:
            return EvictionResult(pod=ref, outcome="gone", message=message)
        if status in (429, 500):
            return EvictionResult(pod=ref, outcome="blocked", message=message)
        return EvictionResult(pod=ref, outcome="evicted", message=message)

    @logged
    def delete_pod(self, pod: PodRef, grace_seconds: int | None = None) -> bool:
        """Delete a pod; ``False`` if it was already gone or replaced by a new pod of the same name.

        The deletion names the pod's uid as a precondition, as :meth:`evict` does.
        """
        namespace, name = pod_ref(pod)
        uid = self._pod_uid("delete_pod", pod)
        if uid is None:
            return False
        try:
            return self._run(
                "delete_pod",
                f"pod/{namespace}/{name}",
                True,
                lambda: self._delete_pod(namespace, name, grace_seconds, uid or None),
            )
        except ConflictError:
            if not uid or self._replaced("delete_pod", pod, uid) is None:
                raise
            return False

    @logged
    def record_event(self, node: str, reason: str, message: str, type_: str = "Normal") -> bool:
        """Record an Event about the node in :data:`NODE_EVENT_NAMESPACE`, best-effort.

        Events about a Node (cluster-scoped) go to ``default``: the API server refuses a core/v1
        Event without ``eventTime`` about a cluster-scoped object in any other namespace (422). An
        event is never the reason a step fails: any error is one line on stderr and ``False``.
        """
        target = f"node/{node}"
        try:
            if type_ not in ("Normal", "Warning"):
                raise InputError(f"event type must be Normal or Warning, not {type_!r}")
            stamp = changes.format_time(self._clock())
            # The name is made here, so a retry after a lost answer finds the first copy (409) instead
            # of recording the event twice.
            name = f"{node}.{time.time_ns():x}"
            manifest = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": NODE_EVENT_NAMESPACE},
                "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node},
                "reason": reason,
                "message": " ".join(message.split()),
                "type": type_,
                "source": {"component": "dsx"},
                "reportingComponent": "dsx",
                "reportingInstance": "dsx",
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
            }
            with contextlib.suppress(ConflictError):  # an earlier try went through; its answer was lost
                self._run(
                    "record_event",
                    target,
                    True,
                    lambda: self._create(EVENTS, NODE_EVENT_NAMESPACE, manifest),
                )
        except DsxError as exc:
            where = "" if isinstance(exc, ClusterError) else f"record_event {target}: "
            print(f"warning: {where}{exc} (event {reason} not recorded)", file=sys.stderr)
            return False
        return True
